#!/usr/bin/env bash
# GPU machine (session 40; carry .whl and the kernel tests' binary in .carry): a boolean mask
# alone reaches the engine as bytes (kRequestMaskKeepOnly), the Hopper kernels classify its
# tiles from them, and a dense mask's mixed tiles inside the band test the bits alone.
#   1. the kernel tests (scripts/cuda_tests.sh run: the keep_ cases among them) beside the
#      Python GPU tests of dense masks, the Hopper backward's bias cases and determinism;
#   2. bench dense_mask at head dims $DIMS (bf16, B 4, S 4096, H 2048 / D, a 512-key window,
#      causal, window and padding masks: dense / typed / jax).
# Build on the CPU machine: scripts/cuda_tests.sh build, and the wheel (python -m pip wheel .
# --no-deps --no-build-isolation -w .whl -C cmake.define.FUSEDATTN_CUDA=ON).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
T=tests/python/attention
if [ -z "${SKIP_TESTS:-}" ]; then
  OUT=$OUT/shards timeout "${TEST_TIMEOUT:-330}" scripts/gpu_shards.sh \
    "$T/test_hopper_fwd_gpu.py -k 'dense or mask_equals'" "$T/test_hopper_bwd_gpu.py -k bias" \
    "$T/test_determinism_gpu.py" \
    "$T/test_dot_product_attention.py -k 'dense or masked or booleans or keep_only or empty'" \
    > "$OUT/shards.txt" 2>&1 &
  shards=$!
  timeout 200 scripts/cuda_tests.sh run --gtest_filter='*Hopper*:EmptyRows*' > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/kernel_tests.log") ok"
  grep -E '^\[  FAILED' "$OUT/kernel_tests.log" | head
  wait $shards; cat "$OUT/shards.txt"
  grep -hE "^FAILED|^E  " "$OUT"/shards/shard-*.log | head -20
fi
source scripts/gpu_env.sh > /dev/null
for d in ${DIMS:-128 64}; do
  timeout 110 "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads $((2048 / d)) \
    --head-dim "$d" --seq 4096 --window 512 --kinds causal window padding --no-plot \
    --json "$OUT/dense_mask_d$d.json" > "$OUT/dense_mask_d$d.log" 2>&1
  grep -v "^wrote" "$OUT/dense_mask_d$d.log" | tail -8
done
