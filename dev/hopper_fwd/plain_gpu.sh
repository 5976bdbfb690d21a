#!/usr/bin/env bash
# GPU machine (session 22): the Hopper forward on plain calls and sliding windows.
#   1. scripts/tune_hopper.py: the measurement select_backend reads (-> $OUT/measured.h),
#   2. its GPU tests (tests/python/attention/test_hopper_fwd_gpu.py) in 4 parallel shards
#      (TEST_SELECTIONS: one -k expression a line; each under TEST_TIMEOUT seconds),
#   3. the attention bench at head dim 128 with the Hopper forward forced on every call it
#      can run (FUSEDATTN_HOPPER_FWD=1) and off (=0), beside jax's cuDNN in each run.
# SKIP_TESTS=1 / SKIP_TUNE=1 / SKIP_BENCH=1 leave a step out.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
if [ -z "${SKIP_TUNE:-}" ]; then
  "$PY" scripts/tune_hopper.py --out "$OUT/measured.h" > "$OUT/tune.log" 2>&1
  cat "$OUT/tune.log"
fi
# The tests after the measurement (it wants an idle GPU), in parallel shards (mostly compile time).
if [ -z "${SKIP_TESTS:-}" ]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  T=tests/python/attention/test_hopper_fwd_gpu.py
  pids=()
  i=0
  while IFS= read -r sel; do
    i=$((i + 1))
    timeout "${TEST_TIMEOUT:-1800}" "$PY" -m pytest "$T" -k "$sel" -q -p no:cacheprovider \
        > "$OUT/tests-$i.log" 2>&1 &
    pids+=($!)
  done <<< "${TEST_SELECTIONS:-plain and bf16
plain and fp16
softcap_with_window or measurement
not plain and not window and not measurement}"
  for j in "${!pids[@]}"; do wait "${pids[$j]}"; echo "tests $((j + 1)): $(tail -1 "$OUT/tests-$((j + 1)).log")"; done
  cat "$OUT"/tests-*.log > "$OUT/tests.log"; rm -f "$OUT"/tests-*.log
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  for mode in 1 0; do
    FUSEDATTN_HOPPER_FWD=$mode "$PY" -m fusedattn bench attention --head-dims 128 \
        --seqlens ${SEQLENS:-4096 16384} --xla-max-seq 0 --no-plot --json "$OUT/bench-hopper$mode.json" \
        > "$OUT/bench-hopper$mode.log" 2>&1
    echo "== FUSEDATTN_HOPPER_FWD=$mode"; grep -v "^plot\|^wrote" "$OUT/bench-hopper$mode.log" | tail -16
  done
fi
