#!/usr/bin/env bash
# GPU machine (session 28; carry .whl and .carry): the Hopper backward on plain calls.
#   1. the kernel tests (scripts/cuda_tests.sh run --gtest_filter='*HopperBwd*') beside the
#      Python GPU tests of SELECTIONS (one pytest selection a line) in parallel shards;
#   2. TUNE=1: scripts/tune_hopper.py --backward $TUNE_ARGS (rewrites the tree's
#      hopper/measured_bwd.h, copied to $OUT: bring it back and rebuild);
#   3. BENCH=1: python -m fusedattn bench attention at head dims $BENCH_DIMS.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
A=tests/python/attention
if [ -z "${SKIP_TESTS:-}" ]; then
  mapfile -t sels <<< "${SELECTIONS:-$A/test_hopper_bwd_gpu.py -k 'bf16 or compiled or other'
$A/test_hopper_bwd_gpu.py -k fp16
$A/test_hopper_fwd_gpu.py -k 'dense or get_backend or other_calls or follow'
$A/test_dot_product_attention.py -k 'dense or masked or mask or causal'}"
  OUT=$OUT timeout "${TEST_TIMEOUT:-400}" scripts/gpu_shards.sh "${sels[@]}" > "$OUT/shards.txt" 2>&1 &
  shards=$!
fi
timeout 200 scripts/cuda_tests.sh run --gtest_filter='*HopperBwd*' > "$OUT/cuda_tests.log" 2>&1
echo "cuda_tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
if [ -n "${shards:-}" ]; then
  wait $shards
  cat "$OUT/shards.txt"
  grep -hE "^FAILED|^E  " "$OUT"/shard-*.log | head -30
fi
if [ -n "${TUNE:-}" ]; then
  timeout "${TUNE_TIMEOUT:-300}" "$PY" scripts/tune_hopper.py --backward \
      --json "$OUT/measured_bwd.json" ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1
  cp csrc/fusedattn/attention/hopper/measured_bwd.h "$OUT/"
  cat "$OUT/tune.log"
fi
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-200}" "$PY" -m fusedattn bench attention --head-dims ${BENCH_DIMS:-128} \
      --seqlens ${SEQLENS:-4096 16384} --xla-max-seq 0 --no-plot --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  grep -v "^plot\|^wrote" "$OUT/bench.log" | tail -30
fi
