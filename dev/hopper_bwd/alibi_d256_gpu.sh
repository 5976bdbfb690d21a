#!/usr/bin/env bash
# GPU machine (session 45): ALiBi in the Hopper backward at head dim 256 (flash_bwd_d256_alibi.cu),
# the bias multiplier rule in one helper (scores.cuh's bias_mul_of: both Hopper launchers) and
# the CUDA flash backward's dQ step in one helper (flash_common.cuh's add_dq_rows: head dims up
# to 128 and the wide kernels). Build on the CPU machine first: the wheel (README) and
# scripts/cuda_tests.sh build; carry .whl and .carry/fusedattn_cuda_tests.gz (stripped, gzipped:
# the two pass the carry's 64 MiB only so). Then here:
#   STEP=kernel (default): the Hopper kernel tests and EmptyRows, memcheck on the d256_alibi cases;
#   STEP=python: the Python tests the change touches, in parallel shards; STEP=wide_fwd: the
#     wide forward's tests (head dims 384 and 192 with Dv 128, TF32 with GQA at 192); STEP=none: none;
#   TIME=1: dev/hopper_bwd/softcap_bias_time.py for ALiBi at head dim 256 (DIMS) alone, with a
#     bias, with learnable slopes (the route before: the Hopper backward off);
#   WIDE=1: dev/cuda_flash/wide_bwd_time.py (the wide CUDA flash backward, head dims > 128).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
if [ "${STEP:-kernel}" = kernel ]; then
  [ -f .carry/fusedattn_cuda_tests.gz ] && gunzip -cf .carry/fusedattn_cuda_tests.gz > .carry/fusedattn_cuda_tests &&
    chmod +x .carry/fusedattn_cuda_tests
  timeout 240 scripts/cuda_tests.sh run --gtest_filter='*Hopper*:EmptyRows*' > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/kernel_tests.log") ok"
  grep "^\[  FAILED" "$OUT/kernel_tests.log" | head
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck .carry/fusedattn_cuda_tests \
    --gtest_filter='*d256_alibi*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -c '^\[       OK' "$OUT/memcheck.log") ok; $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
elif [ "$STEP" = python ]; then
  timeout ${SHARD_LIMIT:-500} scripts/gpu_shards.sh \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -v -k 'd256 or d384 or d160 or d512 or d192 or d320'" \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -v -k 'd128 or d96 or d100 or d72'" \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -v -k tf32" \
    "tests/python/attention/test_hopper_bwd_gpu.py -v -k alibi" \
    "tests/python/attention/test_hopper_bwd_gpu.py -v -k 'bias and not alibi'" \
    "tests/python/score_mod/test_score_mod_gpu.py -v -k 'alibi_slopes or alibi_with'" \
    "tests/python/score_mod/test_score_mod_gpu.py -v -k softcap_with_a_bias" \
    "tests/python/attention/test_hopper_fwd_gpu.py -v -k 'bias and bf16'"
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
elif [ "$STEP" = wide_fwd ]; then  # the float32 wide forward's 256-column chunks (session 45's last call)
  timeout 250 scripts/gpu_shards.sh "tests/python/attention/test_cuda_flash_gpu.py -m gpu -k 'd384 or d192'" \
    "tests/python/attention/test_cuda_flash_gpu.py -m gpu -k tf32"
fi
if [ -n "${TIME:-}" ]; then
  source scripts/gpu_env.sh > /dev/null
  for args in "--no-bias" "" "--slopes-grad"; do
    timeout 120 "$PY" dev/hopper_bwd/softcap_bias_time.py --mod alibi --before bwd --dims ${DIMS:-256} --repeats 2 $args \
      > "$OUT/alibi_time${args// /}.log" 2>&1
    grep -v "^E1201\|slow_operation\|^$" "$OUT/alibi_time${args// /}.log" | tail -6
  done
fi
if [ -n "${WIDE:-}" ]; then  # the wide CUDA flash backward's times (dev/cuda_flash/wide_bwd_time.py)
  source scripts/gpu_env.sh > /dev/null
  timeout 200 "$PY" dev/cuda_flash/wide_bwd_time.py --repeats 2 > "$OUT/wide_bwd_time.log" 2>&1
  grep -v "^E1201\|slow_operation\|^$" "$OUT/wide_bwd_time.log" | tail -6
fi
