#!/usr/bin/env bash
# GPU machine (carry .carry): session 35's A/B of dbias_pairs.patch and dense_cols.patch.
# .carry/fusedattn_cuda_tests: both patches; .carry/bwd_time: main; bwd_time_pairs /
# bwd_time_cols: one patch each. Kernel tests, memcheck of the cases the patches touch, then
# bwd_time with dbias (the [1, H] bias summed over B 4: float2 sums) and with dense masks.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
timeout 200 .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/cuda_tests_bwd.log" 2>&1
echo "bwd kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests_bwd.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$OUT/cuda_tests_bwd.log" | head
timeout 240 compute-sanitizer --tool memcheck .carry/fusedattn_cuda_tests \
  --gtest_filter='*HopperBwd*dbias*:*HopperBwd*mask*:*HopperBwd*det*' > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED)' "$OUT/memcheck.log" | tr '\n' ' ')"
for r in 1 2; do
  for shape in "4 4096 16 16 1" "4 4096 16 16 0" "4 4096 32 32 1 -1 0 0 64" "4 4096 16 16 1 512"; do
    for b in bwd_time bwd_time_pairs; do
      echo "dbias $b r$r $shape: $(FA_BIAS=1 FA_DBIAS=1 .carry/$b $shape 2>&1)"
    done
  done
  for shape in "4 4096 16 16 1 -1 0 1" "4 4096 16 16 1 512 0 1" "4 4096 32 8 1 -1 0 1" \
               "4 4096 32 32 1 -1 0 1 64" "4 4096 16 16 0 -1 0 1"; do
    for b in bwd_time bwd_time_cols; do
      echo "dense $b r$r $shape: $(.carry/$b $shape 2>&1)"
    done
  done
  for shape in "4 4096 16 16 1 -1 0 1"; do
    for b in bwd_time bwd_time_cols; do
      echo "dense det $b r$r $shape: $(FA_DETERMINISTIC=1 .carry/$b $shape 2>&1)"
    done
  done
done > "$OUT/ab.log"
sed 's/sums.*//' "$OUT/ab.log"
