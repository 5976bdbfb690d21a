#!/usr/bin/env bash
# GPU machine: TransformerEngine's attention test grid (run_grid.py) on the GPU, as TE's
# own tests run, in SHARDS parallel processes (default 16; the calls are compile-bound),
# each stopped after LIMIT_S seconds (default 500): every finished case is in its JSONL
# file, all of them in $OUT/grid-$TEST-all.jsonl, and the merged counts cover them. DONE=
# "a.jsonl b.jsonl" (files in the tree) resumes: their cases are skipped, and counted.
# Carry .whl/ (scripts/gpu_env.sh).
#   OUT=... TEST=backward|forward|both [DONE=...] bash dev/te_grid/gpu_grid.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the shards share the GPU's memory
N=${SHARDS:-16}
TEST=${TEST:-backward}
for i in $(seq 0 $((N - 1))); do
  timeout "${LIMIT_S:-500}" "$PY" dev/te_grid/run_grid.py --test "$TEST" --shard "$i/$N" \
    --out "$OUT/grid-$TEST-$i.jsonl" ${DONE:+--skip-done $DONE} > "$OUT/grid-$TEST-$i.log" 2>&1 &
done
wait
cat ${DONE:-} "$OUT"/grid-"$TEST"-[0-9]*.jsonl > "$OUT/grid-$TEST-all.jsonl"
tail -n 3 "$OUT"/grid-"$TEST"-[0-9]*.log > "$OUT/grid-$TEST-shards.log"
rm -f "$OUT"/grid-"$TEST"-[0-9]*.jsonl "$OUT"/grid-"$TEST"-[0-9]*.log
"$PY" dev/te_grid/run_grid.py --merge "$OUT/grid-$TEST-all.jsonl" | tee "$OUT/grid-$TEST-summary.txt"
