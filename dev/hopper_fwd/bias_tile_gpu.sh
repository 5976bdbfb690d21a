#!/usr/bin/env bash
# GPU machine (carry .whl, .carry): the bias through the copy engine's tiles in the Hopper
# forward (BiasTileScores, session 34) and dbias in the Hopper backward. PART=1: Python test
# shards (dbias, the forward with a bias, dense masks, NaN); PART=2: timings
# (dev/hopper_fwd/bias_time.py: the forward with a bias against cuDNN's; bias_vs_cudnn.py
# --dbias: the backward with dbias against cuDNN's / the flash kernels'). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
T=tests/python
if [ "${PART:-1}" = 1 ]; then
  timeout 570 scripts/gpu_shards.sh \
    "$T/attention/test_hopper_bwd_gpu.py -k 'with_dbias and bf16'" "$T/attention/test_hopper_bwd_gpu.py -k 'with_dbias and fp16'" \
    "$T/attention/test_hopper_fwd_gpu.py -k 'bias_forward_and_gradients and bf16'" \
    "$T/attention/test_hopper_fwd_gpu.py -k 'bias_forward_and_gradients and fp16'" \
    "$T/attention/test_hopper_fwd_gpu.py -k 'bias_nan or dense_mask_with_a_learned'" \
    "$T/attention/test_hopper_bwd_gpu.py -k 'without_dbias'" "$T/attention/test_hopper_fwd_gpu.py -k 'dense_mask_forward'"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
else
  source scripts/gpu_env.sh
  timeout 330 "$PY" dev/hopper_fwd/bias_time.py --seqlens 4096 2>&1 | tee "$OUT/bias_time.log"
  for flags in "--dbias" "--dbias --pre" "--dbias --bias-batch"; do
    timeout 80 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --head-dims 128 --rounds 1 $flags 2>&1 | tee -a "$OUT/bias_vs_cudnn_dbias.log"
  done
fi
