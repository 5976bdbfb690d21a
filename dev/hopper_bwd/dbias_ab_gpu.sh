#!/usr/bin/env bash
# GPU machine (carry .carry): session 34 A/B — kernel tests (.carry/fusedattn_cuda_tests: the
# dbias build; .carry/fusedattn_cuda_tests_fwd: the forward bias tile build) and bwd_time of
# HEAD~ (.carry/bwd_time_base) against the dbias build, without and with dbias.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
timeout 200 .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/cuda_tests_bwd.log" 2>&1
echo "bwd kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests_bwd.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$OUT/cuda_tests_bwd.log" | head
timeout 300 .carry/fusedattn_cuda_tests_fwd --gtest_filter='*Hopper*:-*HopperBwd*' > "$OUT/cuda_tests_fwd.log" 2>&1
echo "fwd kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests_fwd.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|max \|out' "$OUT/cuda_tests_fwd.log" | head -20
for shape in "4 4096 16 16 1" "4 4096 16 16 0" "4 4096 32 32 1"; do
  FA_BIAS=1 .carry/bwd_time_base $shape | sed 's/^/base /'
  FA_BIAS=1 .carry/bwd_time $shape | sed 's/^/new  /'
  FA_BIAS=1 FA_DBIAS=1 .carry/bwd_time $shape | sed 's/^/new  /'
done 2>&1 | tee "$OUT/bwd_time_ab.log" | grep -E "bwd" | sed 's/sums.*//'
