#!/usr/bin/env bash
# GPU machine (session 39): ALiBi with a bias, its dbias and the slopes' gradient in the
# Hopper backward. Build on the CPU machine first: scripts/cuda_tests.sh build and the wheel
# (README), carry .carry and .whl. Then here:
#   1. the Hopper kernel tests (alibi_bias_*, *_dslopes among them) and EmptyRows;
#   2. test_score_mod_gpu.py (test_alibi_slopes_gradient_in_the_hopper_backward,
#      test_alibi_with_a_constant_bias_runs_the_hopper_kernels) in 4 processes;
#   3. BENCH=1 (BENCH_ONLY=1: that alone; SKIP_KERNEL_TESTS=1: not step 1): bench fallback's alibi and slopes rows (ALiBi + a bias with its gradient;
#      learnable slopes) -> $OUT/fallback.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
if [ -z "${SKIP_KERNEL_TESTS:-}" ]; then
  timeout 240 scripts/cuda_tests.sh run --gtest_filter='*Hopper*:EmptyRows*' > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/kernel_tests.log") ok"
  grep "^\[  FAILED" "$OUT/kernel_tests.log" | head
  grep -A3 "dslopes\|alibi_bias" "$OUT/kernel_tests.log" | grep "dslopes\[\|dbias:" | head -12
fi
source scripts/gpu_env.sh > /dev/null
if [ -z "${BENCH_ONLY:-}" ]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 280 "$PY" -m pytest -q -p no:cacheprovider -n 4 tests/python/score_mod/test_score_mod_gpu.py \
    > "$OUT/score_mod_gpu.log" 2>&1; tail -1 "$OUT/score_mod_gpu.log"
  grep -E "^(FAILED|ERROR)" "$OUT/score_mod_gpu.log" | head
fi
if [ -n "${BENCH:-}${BENCH_ONLY:-}" ]; then
  timeout 400 "$PY" -m fusedattn bench fallback --kinds alibi slopes --repeats 3 --json "$OUT/fallback.json" --no-plot \
    > "$OUT/fallback.log" 2>&1; tail -12 "$OUT/fallback.log"
fi
