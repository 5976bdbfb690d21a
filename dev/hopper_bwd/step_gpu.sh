#!/usr/bin/env bash
# GPU machine (carry .whl and .carry): the backward's kernels timed by Nsight Compute inside a
# jitted fused_attn step (step_kernels.py) and in bwd_time (the harness; L2 warm, then flushed),
# then compute-sanitizer memcheck of the backward's kernel tests (MEMCHECK=1).
#   STEPS: "D S causal hopper|cudnn normal|uniform" lines; HARNESS: bwd_time argument lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT/raw"
source scripts/gpu_env.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
N=("$NCU" --clock-control none --metrics gpu__time_duration.sum --csv)
STEPS=${STEPS:-"128 4096 0 hopper normal
128 4096 0 cudnn normal
128 4096 0 hopper uniform
128 4096 1 hopper normal
128 4096 1 cudnn normal"}
csvs=()
while read -r D S c bwd dist; do
  [ -z "$D" ] && continue
  f=$OUT/raw/step_${D}_${S}_${c}_${bwd}_${dist}.csv
  timeout 120 "${N[@]}" --cache-control none --profile-from-start off --log-file "$f" \
      "$PY" dev/hopper_bwd/step_kernels.py "$D" "$S" "$c" "$bwd" "$dist" 2>&1 | tail -2
  csvs+=("$f")
done <<< "$STEPS"
HARNESS=${HARNESS:-"4 4096 16 16 0
4 4096 16 16 1"}
hcsvs=()
i=0
while read -r line; do
  [ -z "$line" ] && continue
  for cc in none all; do
    f=$OUT/raw/harness_${i}_${cc}.csv
    timeout 60 "${N[@]}" --cache-control $cc -k regex:bwd --launch-skip 15 --launch-count 9 \
        --log-file "$f" .carry/bwd_time $line | tail -1
    hcsvs+=("$f")
  done
  i=$((i + 1))
done <<< "$HARNESS"
$PY dev/hopper_bwd/step_table.py 3 "${csvs[@]}" > "$OUT/step_table.txt"
$PY dev/hopper_bwd/step_table.py 3 "${hcsvs[@]}" >> "$OUT/step_table.txt"
if [ -n "${MEMCHECK:-}" ]; then
  timeout "${MEMCHECK_TIMEOUT:-240}" compute-sanitizer --tool memcheck --print-limit 20 \
      .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/memcheck.log" | tr '\n' ' ')"
fi
tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$OUT/step_table.txt"
