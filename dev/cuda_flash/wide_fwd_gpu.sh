#!/usr/bin/env bash
# GPU machine (session 48): the wide CUDA flash forward (head dims > 128, flash_mma.cu's
# wide_fwd_kernel) with the query tile held whole in shared memory (QRES) against the streamed
# kernel it replaces where it fits. Build the wheel here first (README: `python -m pip wheel
# ...`, carry .whl). Then there:
#   STEP=time (default): dev/cuda_flash/wide_bwd_time.py at the device's limit (QRES) and under
#      FUSEDATTN_CUDA_SMEM_LIMIT=$AB_LIMIT, 190000 by default (neither QRES layout fits: the
#      streamed kernel, as before; the float32 backward drops to 128-column chunks there, so
#      compare the forward column), two rounds alternating. AB_LIMIT=220000: the 16-bit wide
#      backward with K and V held whole (KVR, 216 KiB; session 48) against the streamed one,
#      the forwards (QRES) alike;
#   STEP=tests: test_cuda_flash_gpu.py's wide cases (head dims past 128, q/k and v dims apart)
#      and test_sm80_shared_memory, in shards;
#   STEP=sanitize: compute-sanitizer memcheck and racecheck of one forced call, serially:
#      float32 D 256 and bf16 D 512 forwards (QRES) by default, SAN_CASES (';'-separated
#      one_call.py arguments) else.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
STEP=${STEP:-time}
if [ "$STEP" = tests ]; then
  FUSEDATTN_SITE=/tmp/fa-site2 timeout ${SHARD_LIMIT:-420} scripts/gpu_shards.sh \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -k 'float32 and (d256 or d384 or d64_dv)'" \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -k 'low_precision and (d512 or d384 or d320 or d160 or d64_dv)'" \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -k 'low_precision and (d256 or d192)'" \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -k 'tf32 or sm80'" \
    "tests/python/score_mod/test_score_mod_gpu.py -m gpu -k head_dim_256"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
  exit 0
fi
source scripts/gpu_env.sh > /dev/null
if [ "$STEP" = sanitize ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    IFS=';' read -ra cases <<< "${SAN_CASES:---f32 --shape 1,200,2,256;--shape 1,200,2,512}"
    for args in "${cases[@]}"; do
      log="$OUT/cs-$tool-$(echo $args | tr -dc 'a-z0-9').log"
      XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 \
        "$CS" --tool $tool --error-exitcode 97 "$PY" dev/cuda_flash/one_call.py $args > "$log" 2>&1
      echo "$tool $args rc=$? $(grep 'ERROR SUMMARY\|RACECHECK SUMMARY' "$log" | tail -1)"
    done
  done
  exit 0
fi
unset XLA_PYTHON_CLIENT_ALLOCATOR
for round in 1 2; do
  for lim in "" ${AB_LIMIT:-190000}; do
    echo "== round $round, FUSEDATTN_CUDA_SMEM_LIMIT=${lim:-unset}"
    env ${lim:+FUSEDATTN_CUDA_SMEM_LIMIT=$lim} timeout 200 "$PY" dev/cuda_flash/wide_bwd_time.py \
      $([ $round = 1 ] && [ -z "$lim" ] || echo --no-xla) 2>&1 | tee "$OUT/time-$round-${lim:-device}.log" | tail -5
  done
done
