#!/usr/bin/env bash
# GPU machine (carry .whl): the engine's average of rows that keep nothing
# (kRequestAverageEmptyRows, session 36). PART=tests: the Python tests it touches in shards,
# then empty_rows_check.py. PART=kernels (carry .carry): the passes' kernel tests alone and
# under compute-sanitizer memcheck and racecheck (compute-sanitizer itself crashed, SIGSEGV,
# on empty_rows_check.py: twice on the H200). PART=bench: bench
# dense_mask at head dims 128 and 64, and the same with the jnp rebuild it replaced where
# OLD_DOT_PRODUCT names a copy of session 35's python/fusedattn/dot_product.py (the A/B: `git
# show dda632d:python/fusedattn/dot_product.py > old_dot_product.py` in the tree, untracked),
# then the dense calls kernel by kernel (dense_kernels.py under ncu). KINDS: bench dense_mask's
# kinds ("causal window"; "padding" times calls with many empty rows). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
T=tests/python
if [ "${PART:-tests}" = tests ]; then
  timeout 330 scripts/gpu_shards.sh \
    "$T/attention/test_dot_product_attention.py -k 'not same_results'" \
    "$T/attention/test_dot_product_attention.py -k same_results" \
    "$T/attention/test_hopper_fwd_gpu.py -k 'dense'" \
    "$T/attention/test_determinism_gpu.py -k dense" \
    "$T/attention/test_features_gpu.py -k dot_product" "$T/attention/test_autodiff_gpu.py"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -12
  source scripts/gpu_env.sh > /dev/null
  timeout 120 "$PY" dev/hopper_fwd/empty_rows_check.py 2>&1 | tee "$OUT/empty_rows_check.log"
  echo "empty_rows_check: $(grep -c FAIL "$OUT/empty_rows_check.log") FAIL lines"
  exit 0
fi
if [ "$PART" = kernels ]; then  # carry .carry: the passes alone, then under memcheck and racecheck
  scripts/cuda_tests.sh run --gtest_filter='EmptyRows*' 2>&1 | grep -E "OK|FAILED|PASSED|Failure"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    timeout 120 "$CS" --tool $tool .carry/fusedattn_cuda_tests --gtest_filter='EmptyRows*' \
      > "$OUT/${tool}_empty_rows.log" 2>&1
    echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$OUT/${tool}_empty_rows.log" | tr '\n' ' ')"
  done
  exit 0
fi
source scripts/gpu_env.sh > /dev/null
bench() {
  for d in 128 64; do
    timeout 150 "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads $((2048 / d)) \
      --head-dim $d --seq 4096 --window 512 --kinds ${KINDS:-causal window} 2>&1 | tee "$OUT/dense_mask_d$d$1.log" |
      grep -E "bfloat16|summary"
  done
}
bench ""
if [ -n "${OLD_DOT_PRODUCT:-}" ]; then
  echo "== before: the jnp rebuild ($OLD_DOT_PRODUCT)"
  cp "$SITE/fusedattn/dot_product.py" "$OUT/.new_dot_product.py"
  cp "$OLD_DOT_PRODUCT" "$SITE/fusedattn/dot_product.py"
  bench _before
  cp "$OUT/.new_dot_product.py" "$SITE/fusedattn/dot_product.py" && rm "$OUT/.new_dot_product.py"
fi
RUNS=${RUNS:-"causal:typed:fwd causal:dense:fwd window:dense:fwd causal:dense:fwdbwd"}
# shellcheck disable=SC2086
OUT=$OUT NAME=dense_kernels bash dev/ncu_kernels.sh dev/hopper_fwd/dense_kernels.py $RUNS
