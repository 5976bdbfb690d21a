#!/usr/bin/env bash
# GPU machine (carry .whl and .carry), session 33: a bias (no dbias) in the Hopper backward,
# and session 32's owed ALiBi tests. Built on the CPU machine: the wheel (README: `pip wheel .
# ... -C cmake.define.FUSEDATTN_CUDA=ON`), the kernel tests (`scripts/cuda_tests.sh build`) and
# bwd_time (its header's line). PART=1: kernel tests, bwd_time (plain / bias / pre-scale bias /
# softcap / ALiBi), `bench fallback --kinds pre_bias`, a post-scale bias's
# forward+backward with either backward (bias_vs_cudnn.py); PART=2: the Python GPU tests in shards
# (each compiles for a minute or more: keep them split). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
T=tests/python
if [ "${PART:-1}" = 1 ]; then
  timeout 170 .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/cuda_tests.log" 2>&1
  echo "kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$OUT/cuda_tests.log" | head
  for round in 1 2; do
    for shape in "4 4096 16 16 1" "4 4096 16 16 0" "4 4096 32 32 1 -1 0 0 64" "4 4096 32 32 0 -1 0 0 64"; do
      .carry/bwd_time $shape
      FA_BIAS=1 .carry/bwd_time $shape
      FA_BIAS=2 .carry/bwd_time $shape
    done
    FA_SOFTCAP=30 .carry/bwd_time 4 4096 16 16 1
    FA_ALIBI=0.1 .carry/bwd_time 4 4096 16 16 1
  done 2>&1 | tee "$OUT/bwd_time.log" | grep -E "^bwd" | sed 's/sums.*//'
  source scripts/gpu_env.sh
  timeout 300 "$PY" -m fusedattn bench fallback --kinds pre_bias --repeats 3 --out "$OUT/bench-fallback.json" \
    > "$OUT/bench-fallback.log" 2>&1
  echo "bench rc=$?"; tail -4 "$OUT/bench-fallback.log"
  timeout 230 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --rounds 1 2>&1 | tee "$OUT/bias_vs_cudnn.log" | tail -8
else
  timeout 560 scripts/gpu_shards.sh \
    "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and bf16 and hopper-fwd'" "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and bf16 and cudnn-fwd'" \
    "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and fp16 and hopper-fwd'" "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and fp16 and cudnn-fwd'" \
    "$T/score_mod/test_score_mod_gpu.py -k 'alibi'" \
    "$T/attention/test_hopper_bwd_gpu.py -k 'without_dbias and bf16'" "$T/attention/test_hopper_bwd_gpu.py -k 'without_dbias and fp16'" \
    "$T/attention/test_cudnn_gpu.py -k 'unserved or backend'"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
fi
