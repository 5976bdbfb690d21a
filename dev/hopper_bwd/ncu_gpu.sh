#!/usr/bin/env bash
# GPU machine: Nsight Compute's full set on one launch of the backward kernel in bwd_time
# (built with -lineinfo: per-instruction stall reasons) and on cuDNN's backward kernel inside
# a jitted step (step_kernels.py), for the same call (ARGS: bwd_time's; STEP: step_kernels').
# Writes details_*.csv (every section's metrics) and sass_ours.csv (the source page, SASS).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
ARGS=${ARGS:-"4 4096 16 16 0"}
STEP=${STEP:-"128 4096 0"}
timeout 200 "$NCU" --clock-control none --set full --import-source yes -k regex:flash_bwd_kernel \
    --launch-skip 3 --launch-count 1 -f -o "$OUT/ours" .carry/${BIN:-bwd_time} $ARGS > "$OUT/ncu_ours.log" 2>&1
echo "ours rc=$?"
"$NCU" --import "$OUT/ours.ncu-rep" --page details --csv > "$OUT/details_ours.csv" 2>&1
"$NCU" --import "$OUT/ours.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_ours.csv" 2>&1
timeout 200 "$NCU" --clock-control none --set full -k regex:bprop --launch-count 1 --profile-from-start off \
    -f -o "$OUT/cudnn" "$PY" dev/hopper_bwd/step_kernels.py $STEP cudnn > "$OUT/ncu_cudnn.log" 2>&1
echo "cudnn rc=$?"
"$NCU" --import "$OUT/cudnn.ncu-rep" --page details --csv > "$OUT/details_cudnn.csv" 2>&1
rm -f "$OUT"/*.ncu-rep
gzip -f "$OUT/sass_ours.csv"
ls -la "$OUT"
