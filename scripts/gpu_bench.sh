#!/usr/bin/env bash
# GPU machine: installs fusedattn (as scripts/gpu_test.sh does, from a carried .whl/) and
# runs the GPU benchmarks: attention (cuDNN grid), small_seq, softmax, score_mod (and cp_ring, the
# context-parallel ring simulated on one GPU, when BENCHES names it). Each writes its
# table to $OUT/bench-<name>.log and its rows to $OUT/bench-<name>.json; attention also
# $OUT/attention.png. BENCH_REPEATS (default 5) sets the repeats of every timing;
# BENCHES (default "attention small_seq softmax score_mod") picks which run. OUT defaults to
# bench/runs/<today>/, where the runs that bench/RESULTS.md cites are kept.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/runs/$(date +%Y-%m-%d)}
mkdir -p "$OUT"
source scripts/gpu_env.sh
R=${BENCH_REPEATS:-5}
status=0
for b in ${BENCHES:-attention small_seq softmax score_mod}; do
  extra=()
  [ "$b" = attention ] && extra=(--plot "$OUT/attention.png")
  "$PY" -m fusedattn bench "$b" --repeats "$R" --json "$OUT/bench-$b.json" "${extra[@]}" \
    > "$OUT/bench-$b.log" 2>&1 || status=1
  tail -40 "$OUT/bench-$b.log"
done
exit $status
