#!/usr/bin/env bash
# GPU machine (prepared in session 38, not yet run): ALiBi with a bias in the Hopper backward
# (alibi_bias.patch: the dense variants' bias stages with ALiBi's score, no dbias; the flash
# branch then gives an ALiBi call whose bias takes no gradient the Hopper backward, where
# the flash kernels ran it: 7.2 of the 7.4 ms forward+backward of bench fallback's alibi
# row). Build on the CPU machine from a tree with the patch applied
# (git apply dev/hopper_bwd/alibi_bias.patch): scripts/cuda_tests.sh build and the wheel
# (README), carry .carry and .whl. Then here:
#   1. the backward kernel tests (three new alibi_bias cases among them);
#   2. test_score_mod_gpu.py (test_alibi_with_a_constant_bias_runs_the_hopper_kernels new);
#   3. bench fallback's alibi row (its bias does take a gradient: the flash kernels'
#      backward still) and bias_time of a constant bias through dev/hopper_bwd/bias_vs_cudnn.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
scripts/cuda_tests.sh run --gtest_filter='*HopperBwd*' > "$OUT/bwd_tests.log" 2>&1
echo "bwd kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/bwd_tests.log") ok"
grep "^\[  FAILED" "$OUT/bwd_tests.log" | head
source scripts/gpu_env.sh > /dev/null
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/python/score_mod/test_score_mod_gpu.py \
  > "$OUT/score_mod_gpu.log" 2>&1; tail -1 "$OUT/score_mod_gpu.log"
