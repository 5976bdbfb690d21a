#!/usr/bin/env bash
# GPU machine (session 47): the float32 wide backward's 128-column chunks (flash_mma_bwd_wide.cu,
# DO = 128: 155 KiB, what an sm_80 has room for) run on an H100/H200 by emulating sm_80's
# shared memory (FUSEDATTN_CUDA_SMEM_LIMIT=166912, options.h). Build the wheel here first
# (README: `python -m pip wheel ...`, carry .whl). Then there:
#   STEP=tests (default): test_sm80_shared_memory (test_cuda_flash_gpu.py's float32 cases at
#      head dims >= 128 under sm_80's limit) beside compute-sanitizer memcheck and racecheck of
#      its float32 D 256 case under the limit (the wide cases at the device's own limit:
#      -m gpu -k 'd256 or d384 or d160 or d512 or d192 or d320', 11 passed, session 47);
#   STEP=time: dev/cuda_flash/wide_bwd_time.py three ways: the device's limit (DO = 256), sm_80's
#      (DO = 128), and 150000 bytes (DO = 128 does not fit: flash.cu's wmma backward, what an
#      sm_80 ran before).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
if [ "${STEP:-tests}" = tests ]; then
  source scripts/gpu_env.sh > /dev/null
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    (FUSEDATTN_CUDA_SMEM_LIMIT=166912 XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false \
       timeout 400 "$CS" --tool $tool --error-exitcode 97 "$PY" -m pytest \
       tests/python/attention/test_cuda_flash_gpu.py -q -p no:cacheprovider -m gpu \
       -k 'test_float32_against and d256_causal_gqa_dropout' > "$OUT/cs-$tool.log" 2>&1
     echo "$tool rc=$? $(grep -E 'passed|failed' "$OUT/cs-$tool.log" | tail -1); $(grep 'ERROR SUMMARY' "$OUT/cs-$tool.log" | tail -1)") &
  done
  FUSEDATTN_SITE=/tmp/fa-site2 timeout ${SHARD_LIMIT:-420} scripts/gpu_shards.sh \
    "tests/python/attention/test_cuda_flash_gpu.py -v -k sm80"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
  wait
  exit 0
fi
source scripts/gpu_env.sh > /dev/null
unset XLA_PYTHON_CLIENT_ALLOCATOR
for lim in "" 166912 150000; do
  echo "== FUSEDATTN_CUDA_SMEM_LIMIT=${lim:-unset}"
  env ${lim:+FUSEDATTN_CUDA_SMEM_LIMIT=$lim} timeout 200 "$PY" dev/cuda_flash/wide_bwd_time.py --no-xla 2>&1 | tee "$OUT/time-${lim:-device}.log" | tail -6
done
