#!/usr/bin/env bash
# GPU machine (session 22): the Hopper forward on plain calls and sliding windows.
#   1. its GPU tests (tests/python/attention/test_hopper_fwd_gpu.py),
#   2. scripts/tune_hopper.py: the measurement select_backend reads (-> $OUT/measured.h),
#   3. the attention bench at head dim 128 with the Hopper forward forced on every call it
#      can run (FUSEDATTN_HOPPER_FWD=1) and off (=0), beside jax's cuDNN in each run.
# SKIP_TESTS=1 / SKIP_TUNE=1 / SKIP_BENCH=1 leave a step out.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
if [ -z "${SKIP_TESTS:-}" ]; then
  "$PY" -m pytest tests/python/attention/test_hopper_fwd_gpu.py -q -p no:cacheprovider \
      > "$OUT/tests.log" 2>&1
  echo "tests: $(tail -1 "$OUT/tests.log")"
fi
if [ -z "${SKIP_TUNE:-}" ]; then
  "$PY" scripts/tune_hopper.py --out "$OUT/measured.h" > "$OUT/tune.log" 2>&1
  cat "$OUT/tune.log"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  for mode in 1 0; do
    FUSEDATTN_HOPPER_FWD=$mode "$PY" -m fusedattn bench attention --head-dims 128 \
        --seqlens ${SEQLENS:-4096 16384} --xla-max-seq 0 --no-plot --json "$OUT/bench-hopper$mode.json" \
        > "$OUT/bench-hopper$mode.log" 2>&1
    echo "== FUSEDATTN_HOPPER_FWD=$mode"; grep -v "^plot\|^wrote" "$OUT/bench-hopper$mode.log" | tail -16
  done
fi
