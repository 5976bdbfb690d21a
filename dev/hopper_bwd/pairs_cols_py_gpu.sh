#!/usr/bin/env bash
# GPU machine (carry .whl: a wheel with dbias_pairs and dense_cols): timings first
# (bench dense_mask at head dims 128 and 64, dense_cost.py, bias_vs_cudnn.py --dbias), then the
# Python tests the two changes touch, in shards. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
T=tests/python
source scripts/gpu_env.sh
for d in 128 64; do
  timeout 150 "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads $((2048 / d)) \
    --head-dim $d --seq 4096 --window 512 2>&1 | tee "$OUT/dense_mask_d$d.log" | tail -8
done
timeout 80 "$PY" dev/hopper_fwd/dense_cost.py 2>&1 | tee "$OUT/dense_cost.log"
for flags in "--dbias" "--dbias --bias-batch"; do
  timeout 90 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --rounds 1 $flags 2>&1 | tee -a "$OUT/bias_vs_cudnn_dbias.log"
done
timeout 300 scripts/gpu_shards.sh \
  "$T/attention/test_hopper_bwd_gpu.py -k 'with_dbias and bf16'" "$T/attention/test_hopper_bwd_gpu.py -k 'with_dbias and fp16'" \
  "$T/attention/test_hopper_fwd_gpu.py -k 'dense_mask_forward or dense_mask_with_a_learned or dense_causal_mask_equals'" \
  "$T/attention/test_dot_product_attention.py -k 'dense or masked or mask'" \
  "$T/attention/test_determinism_gpu.py -k dense"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/shard-*.log | tail -12
