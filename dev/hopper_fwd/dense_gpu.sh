#!/usr/bin/env bash
# GPU machine (session 26; carry .whl and .carry): dense boolean masks in the Hopper forward.
#   1. the kernel tests alone (scripts/cuda_tests.sh run: the mask_ cases among them) beside
#      the Python GPU tests of SELECTIONS (one pytest selection a line) in parallel shards;
#   2. python -m fusedattn bench dense_mask at the issue's shape (bf16, B 4, S 4096, H 16,
#      D 128, a causal mask and a 512-key window; dense / typed / jax xla / jax cudnn);
#   3. BENCH=1: python -m fusedattn bench attention at head dims $BENCH_DIMS (the table's
#      choice beside jax's cuDNN), to see that calls without a mask did not move.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
T=tests/python/attention/test_hopper_fwd_gpu.py
if [ -z "${SKIP_TESTS:-}" ]; then
  mapfile -t sels <<< "${SELECTIONS:-$T -k 'dense and bf16 or mask_equals'
$T -k 'dense and fp16 or get_backend or other_calls'
tests/python/attention/test_dot_product_attention.py -k 'dense or masked'
$T -k 'plain and causal-gqa or max_logit or sinks and bf16'}"
  OUT=$OUT timeout "${TEST_TIMEOUT:-420}" scripts/gpu_shards.sh "${sels[@]}" > "$OUT/shards.txt" 2>&1 &
  shards=$!
fi
timeout 200 scripts/cuda_tests.sh run > "$OUT/cuda_tests.log" 2>&1
echo "cuda_tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure|Expected|bad" "$OUT/cuda_tests.log" | head -20
if [ -n "${shards:-}" ]; then
  wait $shards
  cat "$OUT/shards.txt"
  grep -hE "^FAILED|^E  " "$OUT"/shard-*.log | head -30
fi
if [ -z "${SKIP_DENSE:-}" ]; then
  timeout "${DENSE_TIMEOUT:-200}" "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads 16 \
      --head-dim "${DENSE_D:-128}" --seq 4096 --window 512 --json "$OUT/dense_mask.json" \
      --out-dir "$OUT" > "$OUT/dense_mask.log" 2>&1
  grep -v "^wrote" "$OUT/dense_mask.log" | tail -8
fi
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-200}" "$PY" -m fusedattn bench attention --head-dims ${BENCH_DIMS:-128} \
      --seqlens ${SEQLENS:-4096 16384} --xla-max-seq 0 --no-plot --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  grep -v "^plot\|^wrote" "$OUT/bench.log" | tail -24
fi
