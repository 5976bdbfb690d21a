#!/usr/bin/env bash
# Multi-GPU machine (e.g. nvidia-h100-x2): fused_attn sharded over every local GPU against
# one GPU (tests/python/sharding/test_multi_gpu.py: dp, tp, cp ring, cp all-gather) and
# `bench multi` (their scaling, fwd and fwd+bwd). Carry .whl as for scripts/gpu_test.sh.
# Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
status=0
"$PY" -m pytest tests/python/sharding/test_multi_gpu.py -q -p no:cacheprovider 2>&1 \
  | tee "$OUT/multi-gpu-tests.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
"$PY" -m fusedattn bench multi --repeats "${BENCH_REPEATS:-5}" --json "$OUT/bench-multi.json" \
  2>&1 | tee "$OUT/bench-multi.log" | tail -20
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
