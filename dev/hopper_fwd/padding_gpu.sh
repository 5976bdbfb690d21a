#!/usr/bin/env bash
# GPU machine (session 23; carry .whl and .carry): the Hopper forward's kernel tests
# (scripts/cuda_tests.sh run), its Python GPU tests in 4 shards (padding included), and the
# long-call test (a plain call past 2^31 elements that the table sends to the Hopper forward).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -m pytest tests/python/attention/test_large_gpu.py -q \
    -p no:cacheprovider > "$OUT/large.log" 2>&1 &
large=$!
scripts/cuda_tests.sh run > "$OUT/cuda_tests.log" 2>&1
echo "cuda_tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
FUSEDATTN_SITE=/tmp/fa-site2 OUT=$OUT SKIP_TUNE=1 SKIP_BENCH=1 TEST_SELECTIONS="padding and bf16
padding and fp16
plain or window or measurement
not plain and not window and not measurement and not padding" bash dev/hopper_fwd/plain_gpu.sh
wait $large
echo "test_large_gpu: $(tail -1 "$OUT/large.log")"
