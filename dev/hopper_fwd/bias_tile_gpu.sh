#!/usr/bin/env bash
# GPU machine (carry .whl, .carry): the bias through the copy engine's tiles in the Hopper
# forward (BiasTileScores, session 34) and dbias in the Hopper backward. PART=1: Python test
# shards (dbias, the forward with a bias, dense masks, NaN); PART=2: timings
# (dev/hopper_fwd/bias_time.py: the forward with a bias against cuDNN's; bias_vs_cudnn.py
# --dbias: the backward with dbias against cuDNN's / the flash kernels'); PART=3: the tests
# whose routing assertions changed with the bias's default routes, one a shard, then
# `bench attention` at S 4096 (its bias row); PART=4: the fallback test again (Hopper off for
# its pre-scale bias) and `bench attention` at S 4096 with its bias as a jit argument; PART=5:
# bias_time.py --fwd-only at S 1024 and 8192 (the routing's range); PART=6: a bias past
# cuDNN's 32-bit indexing on the Hopper forward (test_bias_past_cudnns_indexing, its time).
# Logs in $OUT.
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
elif [ "${PART:-1}" = 3 ]; then
  F=$T/attention/test_hopper_fwd_gpu.py; W=$T/attention/test_hopper_bwd_gpu.py
  sels=()
  for id in pre-causal-1h pre-full-b1-d64 pre-window-bh-d256 post-full-1h post-bottom-right-11-d64 \
            post-causal-b1-d64 pre-bottom-right-1h-d256; do
    sels+=("$F::test_bias_forward_and_gradients[$id-bf16]")
  done
  sels+=("$W -k 'without_dbias and pre and bf16'" "$W -k 'without_dbias and post and bf16'"
         "$F -k 'learned_bias or bias_nan'" "$T/attention/test_cuda_flash_gpu.py -k 'low_precision and gpu and bias'"
         "$T/attention/test_cudnn_gpu.py -k 'fallback or unserved'")
  timeout 420 scripts/gpu_shards.sh "${sels[@]}"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
  source scripts/gpu_env.sh
  timeout 150 "$PY" -m fusedattn bench attention --seqlens 4096 --repeats 3 2>&1 | tee "$OUT/bench_attention.log" | tail -40
elif [ "${PART:-1}" = 4 ]; then
  timeout 150 scripts/gpu_shards.sh "$T/attention/test_cudnn_gpu.py -k 'fallback or unserved'"
  source scripts/gpu_env.sh
  timeout 300 "$PY" -m fusedattn bench attention --seqlens 4096 --repeats 3 2>&1 | tee "$OUT/bench_attention.log" | tail -30
elif [ "${PART:-1}" = 5 ]; then
  source scripts/gpu_env.sh
  timeout 250 "$PY" dev/hopper_fwd/bias_time.py --fwd-only --seqlens 1024 8192 2>&1 | tee "$OUT/bias_time_seqlens.log"
elif [ "${PART:-1}" = 6 ]; then
  timeout 150 scripts/gpu_shards.sh "$T/attention/test_hopper_fwd_gpu.py -k past_cudnns"
  grep -hE "^(FAILED|ERROR|E  )" "$OUT"/shard-*.log | head -20
  source scripts/gpu_env.sh
  timeout 60 "$PY" dev/hopper_fwd/bias_time.py --fwd-only --dims 64 --seqlens 8192 2>&1 | tee "$OUT/bias_time_2g.log"
else
  source scripts/gpu_env.sh
  timeout 330 "$PY" dev/hopper_fwd/bias_time.py --seqlens 4096 2>&1 | tee "$OUT/bias_time.log"
  for flags in "--dbias" "--dbias --pre" "--dbias --bias-batch"; do
    timeout 80 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --head-dims 128 --rounds 1 $flags 2>&1 | tee -a "$OUT/bias_vs_cudnn_dbias.log"
  done
fi
