#!/usr/bin/env bash
# GPU machine (session 44): softcap beside a bias in the Hopper kernels (the forward's
# WithBiasTile<SoftcapScores>, the backward's dense variants with softcap). Build on the CPU
# machine first: scripts/cuda_tests.sh build and the wheel (README), carry
# .carry/fusedattn_cuda_tests (or, stripped and gzipped, .carry/fusedattn_cuda_tests.gz: the
# wheel and the binary together pass the carry's 64 MiB only so) and .whl. Then here:
#   1. the Hopper kernel tests (softcap_bias_* among them) and EmptyRows; memcheck on the
#      softcap_bias cases;
#   2. test_score_mod_gpu.py (whole), test_hopper_bwd_gpu.py / test_hopper_fwd_gpu.py's softcap
#      and bias selections, in parallel shards;
#   3. BENCH=1: bench fallback's softcap and alibi rows -> $OUT/fallback.json; BEFORE=1 the
#      softcap row with the Hopper kernels off (the CUDA flash kernels, the route before).
# TIME=1: dev/hopper_bwd/softcap_bias_time.py (head dims 64, 128, 256; the Hopper kernels on and
# off). PY_SEL=hopper_fwd runs only step 2's test_hopper_fwd_gpu shards, PY_SEL=softcap_bias
# test_score_mod_gpu's softcap-with-a-bias tests; BENCH_ONLY=1 step 3 alone,
# SKIP_KERNEL_TESTS=1 all but step 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
if [ -z "${SKIP_KERNEL_TESTS:-}" ]; then
  [ -f .carry/fusedattn_cuda_tests.gz ] && gunzip -cf .carry/fusedattn_cuda_tests.gz > .carry/fusedattn_cuda_tests &&
    chmod +x .carry/fusedattn_cuda_tests
  timeout 240 scripts/cuda_tests.sh run --gtest_filter='*Hopper*:EmptyRows*' > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/kernel_tests.log") ok"
  grep "^\[  FAILED" "$OUT/kernel_tests.log" | head
  grep -A3 "softcap_bias" "$OUT/kernel_tests.log" | grep "dbias:\|OK \]" | head -20
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck .carry/fusedattn_cuda_tests \
    --gtest_filter='*softcap_bias*' > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -c '^\[       OK' "$OUT/memcheck.log") ok; $(grep 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
fi
FWD_SHARDS=("tests/python/attention/test_hopper_fwd_gpu.py -k softcap"
            "tests/python/attention/test_hopper_fwd_gpu.py -k 'bias_forward_and_gradients and bf16'"
            "tests/python/attention/test_hopper_fwd_gpu.py -k '(bias and not bias_forward) or (bias_forward_and_gradients and fp16)'")
if [ -z "${BENCH_ONLY:-}" ]; then
  if [ "${PY_SEL:-all}" = hopper_fwd ]; then  # (session 44's second call: the first ran the others)
    timeout 400 scripts/gpu_shards.sh "${FWD_SHARDS[@]}"
  elif [ "${PY_SEL:-all}" = softcap_bias ]; then  # (the third: head dim 256's backward added)
    timeout 170 scripts/gpu_shards.sh \
      "tests/python/score_mod/test_score_mod_gpu.py -k 'softcap_with_a_bias and bf16'" \
      "tests/python/score_mod/test_score_mod_gpu.py -k 'softcap_with_a_bias and fp16'" \
      "tests/python/score_mod/test_score_mod_gpu.py -k 'with_a_bias_runs and softcap'"
  else
    timeout 400 scripts/gpu_shards.sh \
      "tests/python/score_mod/test_score_mod_gpu.py -k 'softcap_with_a_bias or with_a_bias_runs or match_the_reference'" \
      "tests/python/score_mod/test_score_mod_gpu.py -k 'not softcap_with_a_bias and not with_a_bias_runs and not match_the_reference'" \
      "tests/python/attention/test_hopper_bwd_gpu.py -k 'softcap or bias'" "${FWD_SHARDS[@]}"
  fi
  grep -hE "^(FAILED|ERROR)" "$OUT"/shard-*.log | head -20
fi
if [ -n "${TIME:-}" ]; then  # softcap + bias at head dims 64 / 128 / 256, Hopper kernels on / off
  source scripts/gpu_env.sh > /dev/null
  timeout 220 "$PY" dev/hopper_bwd/softcap_bias_time.py --repeats 2 > "$OUT/softcap_bias_time.log" 2>&1
  grep -v "^E1201\|slow_operation\|^$" "$OUT/softcap_bias_time.log" | tail -20
fi
if [ -n "${BENCH:-}${BENCH_ONLY:-}" ]; then
  source scripts/gpu_env.sh > /dev/null
  timeout 300 "$PY" -m fusedattn bench fallback --kinds softcap alibi --repeats 3 --json "$OUT/fallback.json" --no-plot \
    > "$OUT/fallback.log" 2>&1; tail -8 "$OUT/fallback.log"
  # BEFORE=1: the softcap row as it ran before (the Hopper kernels off: the CUDA flash
  # kernels both ways, softcap's closed form there)
  if [ -n "${BEFORE:-}" ]; then
    FUSEDATTN_HOPPER_FWD=0 FUSEDATTN_HOPPER_BWD=0 timeout 200 "$PY" -m fusedattn bench fallback --kinds softcap \
      --skip reference jax_xla --repeats 3 --json "$OUT/fallback_before.json" --no-plot \
      > "$OUT/fallback_before.log" 2>&1; tail -4 "$OUT/fallback_before.log"
  fi
fi
