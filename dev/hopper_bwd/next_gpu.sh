#!/usr/bin/env bash
# GPU machine (carry .carry): session 31's hand-over in one call. Built on the CPU machine:
#   .carry/fusedattn_cuda_tests        main's kernel tests       (scripts/cuda_tests.sh build)
#   .carry/fusedattn_cuda_tests_next   with det_descending.patch + sinks_bwd.patch applied
#   .carry/bwd_time, .carry/bwd_time_desc   bwd_time of main / with det_descending.patch
# Prints each test binary's summary, then the deterministic A/B (main's ascending order vs the
# descending one; each line's "repeat" must be 0 and the sums equal), the default mode beside it,
# and memcheck of the descending build. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
for t in fusedattn_cuda_tests fusedattn_cuda_tests_next; do
  timeout 240 .carry/$t --gtest_filter='*HopperBwd*' > "$OUT/$t.log" 2>&1
  echo "$t rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$OUT/$t.log" | head
done
SHAPES=${SHAPES:-"4 4096 16 16 1
4 4096 16 16 1 512
4 4096 16 16 0
4 4096 32 8 1
4 4096 32 32 1 -1 0 0 64
4 4096 32 32 0 -1 0 0 64
1 16384 16 16 1
4 4096 16 16 1 -1 0 1"}
while read -r line; do
  [ -z "$line" ] && continue
  echo "default: $(FA_DETERMINISTIC=0 .carry/bwd_time $line)"
  for b in bwd_time bwd_time_desc; do echo "det $b: $(FA_DETERMINISTIC=1 timeout 60 .carry/$b $line)"; done
done <<< "$SHAPES" | sed 's/ TFLOP.s//' | tee "$OUT/det_ab.log"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for line in "1 512 2 2 1 -1 0 1 64" "1 1024 2 2 1 300" "2 700 4 2 1 -1 0 0 64"; do
  echo "memcheck desc $line: $(FA_DETERMINISTIC=1 timeout 120 $CS --tool memcheck .carry/bwd_time_desc $line 2>&1 | grep -E 'SUMMARY' | tr '\n' ' ')"
done | tee -a "$OUT/det_ab.log"
