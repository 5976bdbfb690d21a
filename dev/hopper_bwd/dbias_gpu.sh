#!/usr/bin/env bash
# GPU machine (carry .whl and .carry): dbias in the Hopper backward (session 34). On the CPU
# machine first: the wheel (README's `pip wheel . ... FUSEDATTN_CUDA=ON`), the kernel tests
# (`scripts/cuda_tests.sh build`), bwd_time (its header's line). PART=1: kernel tests (four
# dbias_* cases among them), bwd_time with and without dbias; PART=2: the Python tests in
# shards. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
T=tests/python
if [ "${PART:-1}" = 1 ]; then
  timeout 200 .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/cuda_tests.log" 2>&1
  echo "kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED|dbias:' "$OUT/cuda_tests.log" | head -20
  for shape in "4 4096 16 16 1" "4 4096 16 16 0" "4 4096 32 32 1 -1 0 0 64"; do
    FA_BIAS=1 .carry/bwd_time $shape
    FA_BIAS=1 FA_DBIAS=1 .carry/bwd_time $shape
    FA_BIAS=2 FA_DBIAS=1 .carry/bwd_time $shape
  done 2>&1 | tee "$OUT/bwd_time.log" | grep -E "^bwd" | sed 's/sums.*//'
else
  timeout 560 scripts/gpu_shards.sh \
    "$T/attention/test_hopper_bwd_gpu.py -k 'with_dbias and bf16'" "$T/attention/test_hopper_bwd_gpu.py -k 'with_dbias and fp16'" \
    "$T/attention/test_hopper_fwd_gpu.py -k 'bias_forward_and_gradients and bf16'" \
    "$T/attention/test_hopper_fwd_gpu.py -k 'bias_forward_and_gradients and fp16'" \
    "$T/attention/test_hopper_bwd_gpu.py -k 'without_dbias'" "$T/attention/test_hopper_fwd_gpu.py -k 'dense'"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
fi
