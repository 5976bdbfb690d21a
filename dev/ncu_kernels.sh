#!/usr/bin/env bash
# GPU machine (carry .whl): each kernel of a jitted call timed by Nsight Compute inside it.
#   OUT=... [NAME=kernels] bash dev/ncu_kernels.sh SCRIPT RUN [RUN ...]
# SCRIPT: a Python script that profiles its call with dev/ncu_region.py's profile(); each RUN
# is its arguments joined by ':' ("causal:dense:fwd"). The medians per kernel and the
# call's total go to $OUT/$NAME.txt (dev/hopper_bwd/step_table.py), the CSVs to $OUT/$NAME-raw.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; NAME=${NAME:-kernels}; mkdir -p "$OUT/raw"
source scripts/gpu_env.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
script=$1; shift
csvs=()
for run in "$@"; do
  f=$OUT/raw/${run//:/_}.csv
  timeout 150 "$NCU" --clock-control none --cache-control none --profile-from-start off \
    --metrics gpu__time_duration.sum --csv --log-file "$f" "$PY" "$script" ${run//:/ } 2>&1 | tail -1
  csvs+=("$f")
done
"$PY" dev/hopper_bwd/step_table.py 3 "${csvs[@]}" > "$OUT/$NAME.txt"
tar czf "$OUT/$NAME-raw.tgz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$OUT/$NAME.txt"
