#!/usr/bin/env bash
# GPU machine (session 24; carry .whl and .carry): head dim 64 in the Hopper forward.
#   1. the kernel tests alone (scripts/cuda_tests.sh run: the d64_ cases among them) and, at
#      the same time, the Python GPU tests given by TEST_SELECTIONS (one -k expression a line;
#      default: head dim 64, the backend's names, one head dim 128 shard) in parallel shards;
#   2. SKIP_TUNE unset: scripts/tune_hopper.py --head-dims $TUNE_DIMS --merge (default 64 128,
#      all four classes) on the idle GPU -> $OUT/measured.h and $OUT/tune.log;
#   3. BENCH=1: python -m fusedattn bench attention at head dims 64 and 128 (S $SEQLENS) with
#      the table's choice, beside jax's cuDNN -> $OUT/bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
# The shards: plain_gpu.sh's test step alone, in a site of its own, beside the kernel tests.
if [ -z "${SKIP_TESTS:-}" ]; then
  FUSEDATTN_SITE=/tmp/fa-site2 OUT=$OUT SKIP_TUNE=1 SKIP_BENCH=1 TEST_TIMEOUT=${TEST_TIMEOUT:-400} \
  TEST_SELECTIONS="${TEST_SELECTIONS:-head_dims_64_256 and bf16
head_dims_64_256 and fp16
get_backend or other_calls or measurement or packed
plain and causal-gqa or plain and causal-window and not window-5 or thd and bf16}" \
      bash dev/hopper_fwd/plain_gpu.sh > "$OUT/shards.txt" 2>&1 &
  shards=$!
fi
timeout 150 scripts/cuda_tests.sh run > "$OUT/cuda_tests.log" 2>&1
echo "cuda_tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure|Expected|bad" "$OUT/cuda_tests.log" | head -20
if [ -n "${shards:-}" ]; then
  wait $shards
  grep -v "^NVIDIA\|^jax " "$OUT/shards.txt"
  grep -E "^FAILED|Error" "$OUT/tests.log" | head
fi
if [ -z "${SKIP_TUNE:-}" ]; then
  cp csrc/fusedattn/attention/hopper/measured.h "$OUT/measured.h"
  timeout ${TUNE_TIMEOUT:-300} "$PY" scripts/tune_hopper.py --head-dims ${TUNE_DIMS:-64 128} --classes ${TUNE_CLASSES:-full causal window thd} \
      --merge --out "$OUT/measured.h" > "$OUT/tune.log" 2>&1
  cat "$OUT/tune.log"
fi
if [ -n "${BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-200} "$PY" -m fusedattn bench attention --head-dims ${BENCH_DIMS:-64 128} --seqlens ${SEQLENS:-4096 16384} \
      --xla-max-seq 0 --no-plot --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  grep -v "^plot\|^wrote" "$OUT/bench.log" | tail -40
fi
