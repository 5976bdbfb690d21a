#!/usr/bin/env bash
# GPU machine (prepared in session 39, compiled, not yet run): dbias_zeros.patch -- where
# dbias is written per element (no float32 sums), each backward block zeros the rows of its
# keys that no iteration visits (query blocks outside its band, a dense mask's empty tiles)
# instead of a pass over the whole tensor before the kernel (2.1 GB at B 4, H 16, S 4096:
# ~0.6 ms of a 2.9 ms D128 causal backward; half of it rewritten by the kernel when causal).
# Build on the CPU machine: a tree with the patch (git apply dev/hopper_bwd/dbias_zeros.patch),
# scripts/cuda_tests.sh build there, and bwd_time from both trees (nvcc line in bwd_time.cu,
# -lcuda) as .carry/bwd_time_a (main) and .carry/bwd_time_b (patched). Here: the backward
# kernel tests (every dbias case; NaN-poisoned dbias shows a row nobody wrote), then
# bwd_time A/B, dbias of the call's extents (FA_BIAS_B=1), D 128 and 64, causal and full.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
timeout 150 scripts/cuda_tests.sh run --gtest_filter='*HopperBwd*' > "$OUT/bwd_tests.log" 2>&1
echo "bwd kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/bwd_tests.log") ok"
grep "^\[  FAILED" "$OUT/bwd_tests.log" | head
for r in 1 2; do
  for d in 128 64; do
    for c in 1 0; do
      for v in a b; do
        FA_BIAS=1 FA_DBIAS=1 FA_BIAS_B=1 timeout 60 .carry/bwd_time_$v 4 4096 $((2048 / d)) $((2048 / d)) $c -1 0 0 $d |
          sed "s/^/d$d c$c $v r$r /"
      done
    done
  done
done > "$OUT/bwd_time_zeros.log" 2>&1
grep -o "^d[0-9]* c[01] [ab] r[12] \|: [0-9.]* ms" "$OUT/bwd_time_zeros.log" | paste - -
