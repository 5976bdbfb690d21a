#!/usr/bin/env bash
# GPU machine (carry .whl): where a dense mask's time goes, kernel by kernel (dense_kernels.py
# under dev/ncu_kernels.sh), then bench dense_mask at head dims 128 and 64 and the
# dot_product_attention tests on the GPU (NO_BENCH=1: the profile alone). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
RUNS=${RUNS:-"causal:typed:fwd causal:kernel:fwd causal:dense:fwd window:typed:fwd window:kernel:fwd window:dense:fwd causal:typed:fwdbwd causal:dense:fwdbwd"}
# shellcheck disable=SC2086
OUT=$OUT NAME=dense_kernels bash dev/ncu_kernels.sh dev/hopper_fwd/dense_kernels.py $RUNS
[ -n "${NO_BENCH:-}" ] && exit 0
source scripts/gpu_env.sh > /dev/null
for d in 128 64; do
  timeout 150 "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads $((2048 / d)) \
    --head-dim $d --seq 4096 --window 512 2>&1 | tee "$OUT/dense_mask_d$d.log" | grep -E "bfloat16|summary"
done
timeout 240 scripts/gpu_shards.sh "tests/python/attention/test_dot_product_attention.py"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/shard-*.log | tail -4
