#!/usr/bin/env bash
# Dev A/B on the GPU machine: f32_ab.py's variants in the carried wheel (.whl), two rounds;
# the first variant is the reference (session 43: "1,4" = the landed kernels of 474b1a3).
# Logs in $OUT. VARS: the variants, "fwd,bwd" each.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
VARS=${VARS:-0,0}
source scripts/gpu_env.sh > /dev/null
for round in 1 2; do
  x=""; [ $round = 1 ] && x=--xla
  $PY dev/cuda_flash/f32_ab.py --label "r$round" $x --vars $VARS 2>&1 | tee -a $OUT/f32_ab.log
done
grep -E "\] fwd var|xla:|\] float32" $OUT/f32_ab.log
