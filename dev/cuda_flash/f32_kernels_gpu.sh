#!/usr/bin/env bash
# GPU machine (carry .whl): float32 attention (issue 24's row) kernel by kernel, ours and XLA's,
# forward and forward+backward (f32_kernels.py under Nsight Compute). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT/raw"
source scripts/gpu_env.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
N=("$NCU" --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv)
csvs=()
for run in ${RUNS:-ours:fwd ours:fwdbwd}; do  # xla: its autotuning did not finish under ncu
  IFS=: read -r who mode <<< "$run"
  f=$OUT/raw/f32_${who}_${mode}.csv
  timeout 150 "${N[@]}" --log-file "$f" "$PY" dev/cuda_flash/f32_kernels.py $who $mode 2>&1 | tail -1
  csvs+=("$f")
done
"$PY" dev/hopper_bwd/step_table.py 3 "${csvs[@]}" > "$OUT/f32_kernels.txt"
tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$OUT/f32_kernels.txt"
