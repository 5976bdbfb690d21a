#!/usr/bin/env bash
# GPU machine (session 23; carry .whl and .carry): THD in the Hopper forward.
#   1. the kernel tests alone (scripts/cuda_tests.sh run: THD cases among them),
#   2. scripts/tune_hopper.py --classes $TUNE_CLASSES --merge (default: all four): the table
#      (-> $OUT/measured.h); then causal calls again with FUSEDATTN_HOPPER_PERSISTENT=1 (the
#      dynamic scheduler against a block a tile: -> $OUT/tune-persistent.log),
#   3. the Python GPU tests given by TEST_SELECTIONS (one -k expression a line; default: THD
#      and padding), in parallel shards; LARGE=1: test_large_gpu.py beside them (-> large.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
timeout 120 scripts/cuda_tests.sh run > "$OUT/cuda_tests.log" 2>&1
echo "cuda_tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure|Expected|bad" "$OUT/cuda_tests.log" | head -20
source scripts/gpu_env.sh > /dev/null
if [ -z "${SKIP_TUNE:-}" ]; then
  cp csrc/fusedattn/attention/hopper/measured.h "$OUT/measured.h"
  "$PY" scripts/tune_hopper.py --classes ${TUNE_CLASSES:-full causal window thd} --merge \
      --out "$OUT/measured.h" > "$OUT/tune.log" 2>&1
  cat "$OUT/tune.log"
  FUSEDATTN_HOPPER_PERSISTENT=1 "$PY" scripts/tune_hopper.py --classes causal \
      --out "$OUT/measured-persistent.h" > "$OUT/tune-persistent.log" 2>&1
  echo "== causal, persistent (dynamic scheduler)"; cat "$OUT/tune-persistent.log"
fi
if [ -n "${LARGE:-}" ]; then  # the long-call tests beside the shards
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m pytest tests/python/attention/test_large_gpu.py -q \
      -p no:cacheprovider > "$OUT/large.log" 2>&1 &
  large=$!
fi
# The shards: plain_gpu.sh's test step alone, in a site of its own.
FUSEDATTN_SITE=/tmp/fa-site2 OUT=$OUT SKIP_TUNE=1 SKIP_BENCH=1 TEST_SELECTIONS="${TEST_SELECTIONS:-thd and bf16
thd and fp16
padding or measurement}" bash dev/hopper_fwd/plain_gpu.sh | grep -v "^NVIDIA\|^jax "
if [ -n "${LARGE:-}" ]; then wait $large; echo "test_large_gpu: $(tail -1 "$OUT/large.log")"; fi
