#!/usr/bin/env bash
# GPU machine (carry .whl): where a dense mask's time goes, kernel by kernel (Nsight Compute
# inside the jitted call: dense_kernels.py, step_table.py), then bench dense_mask at head dims
# 128 and 64 and the dot_product_attention tests on the GPU. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT/raw"
source scripts/gpu_env.sh > /dev/null
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
N=("$NCU" --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv)
csvs=()
RUNS=${RUNS:-"causal:typed:fwd causal:kernel:fwd causal:dense:fwd window:typed:fwd window:kernel:fwd window:dense:fwd causal:typed:fwdbwd causal:dense:fwdbwd"}
for run in $RUNS; do
  IFS=: read -r kind path mode <<< "$run"
  f=$OUT/raw/${kind}_${path}_${mode}.csv
  timeout 120 "${N[@]}" --log-file "$f" "$PY" dev/hopper_fwd/dense_kernels.py $kind $path $mode 2>&1 | tail -1
  csvs+=("$f")
done
"$PY" dev/hopper_bwd/step_table.py 3 "${csvs[@]}" > "$OUT/dense_kernels.txt"
tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$OUT/raw"
cat "$OUT/dense_kernels.txt"
[ -n "${NO_BENCH:-}" ] && exit 0
for d in 128 64; do
  timeout 150 "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads $((2048 / d)) \
    --head-dim $d --seq 4096 --window 512 2>&1 | tee "$OUT/dense_mask_d$d.log" | grep -E "bfloat16|summary"
done
timeout 240 scripts/gpu_shards.sh "tests/python/attention/test_dot_product_attention.py"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/shard-*.log | tail -4
