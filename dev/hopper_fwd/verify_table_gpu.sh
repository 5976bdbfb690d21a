#!/usr/bin/env bash
# GPU machine (session 22), after the measured table (hopper/measured.h) is built in:
#   1. the tests that the table decides what runs (get_backend == the kernel that ran);
#   2. A/B: the Hopper forward's windowed and causal calls with persistent blocks
#      (FUSEDATTN_HOPPER_PERSISTENT=1) against one block a tile (the default), each
#      against cuDNN in the same run (scripts/tune_hopper.py rows);
#   3. the attention bench at head dim 128 as a user gets it (the table decides).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
"$PY" -m pytest tests/python/attention/test_hopper_fwd_gpu.py -k "measurement or get_backend" \
    -q -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "tests: $(tail -1 "$OUT/tests.log")"
for pers in 1 default; do
  if [ "$pers" = 1 ]; then export FUSEDATTN_HOPPER_PERSISTENT=1; else unset FUSEDATTN_HOPPER_PERSISTENT; fi
  "$PY" scripts/tune_hopper.py --classes window causal --seqlens 4096 16384 \
      --out "$OUT/measured-persistent-$pers.h" > "$OUT/tune-persistent-$pers.log" 2>&1
  echo "== persistent $pers"; cat "$OUT/tune-persistent-$pers.log"
done
rm -f "$OUT"/measured-persistent-*.h
"$PY" -m fusedattn bench attention --head-dims 128 --seqlens 4096 16384 --xla-max-seq 0 \
    --no-plot --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
grep -v "^plot\|^wrote" "$OUT/bench.log" | tail -16
