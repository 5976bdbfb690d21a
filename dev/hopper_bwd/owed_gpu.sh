#!/usr/bin/env bash
# GPU machine (carry .whl and .carry): what session 32 owes the Hopper backward, in one call.
# Built on the CPU machine: the wheel (README: `pip wheel . ... -C cmake.define.FUSEDATTN_CUDA=ON`)
# and the kernel tests (`scripts/cuda_tests.sh build`). Runs the kernel tests, then the ALiBi
# gradient tests that the last call's time limit cut (12 of 16) and test_score_mod_gpu's ALiBi
# cases, in parallel shards (each compiles for minutes: keep them split). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
timeout 150 .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/cuda_tests.log" 2>&1
echo "kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
T=tests/python
timeout 500 scripts/gpu_shards.sh \
  "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and bf16 and hopper-fwd'" "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and bf16 and cudnn-fwd'" \
  "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and fp16 and hopper-fwd'" "$T/attention/test_hopper_bwd_gpu.py -k 'alibi and fp16 and cudnn-fwd'" \
  "$T/score_mod/test_score_mod_gpu.py -k 'alibi'"
grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
