#!/usr/bin/env bash
# GPU machine (carry .whl): the plain calls' Hopper forward on the instances without the
# bias-read and dense-mask code (PlainScores, the default) against those with it
# (FUSEDATTN_HOPPER_BIAS_READS=1, BiasReadScores: what plain calls ran before session 38),
# through jax (scripts/tune_hopper.py's harness: cuDNN's forward timed in the same process
# as an anchor), processes alternating, ROUNDS each; S 4096, B 4, H 2048 / D.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
for r in $(seq "${ROUNDS:-2}"); do
  for reads in 0 1; do
    FUSEDATTN_HOPPER_BIAS_READS=$reads $PY scripts/tune_hopper.py --seqlens 4096 \
      --classes full causal window --out "$OUT/ab_$reads.h" --json "$OUT/ab_${reads}_$r.json" \
      > "$OUT/ab_${reads}_$r.log" 2>&1 || echo "round $r reads $reads failed"
  done
done
$PY - "$OUT" "${ROUNDS:-2}" <<'PY'
import collections, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
t = collections.defaultdict(list)
for reads in (0, 1):
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/ab_{reads}_{r}.json"))["rows"]:
            t[(row["D"], row["mask"], reads)].append((row["hopper_ms"], row["cudnn_ms"]))
print("D   mask    | plain ms  with reads ms | reads / plain | cuDNN / plain")
for D, mask in sorted({k[:2] for k in t}):
    a = statistics.median(h for h, _ in t[(D, mask, 0)])
    b = statistics.median(h for h, _ in t[(D, mask, 1)])
    c = statistics.median(c for _, c in t[(D, mask, 0)] + t[(D, mask, 1)])
    print(f"{D:3d} {mask:7s} | {a:8.3f} {b:13.3f} | {b / a:13.3f} | {c / a:13.3f}")
PY
