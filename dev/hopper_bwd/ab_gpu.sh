#!/usr/bin/env bash
# GPU machine: an A/B of bwd_time builds (BINS: names under .carry, each built from a variant
# of the kernel) over SHAPES (bwd_time argument lines), ROUNDS alternating rounds; prints each
# line with its binary's name. Kernel tests of the tree's build first (TESTS=1; TEST_FILTER, a
# gtest filter, default the backward's).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
if [ -n "${TESTS:-}" ]; then
  timeout 200 scripts/cuda_tests.sh run --gtest_filter="${TEST_FILTER:-*HopperBwd*}" > "$OUT/cuda_tests.log" 2>&1
  echo "cuda_tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
  grep -E "FAILED|max err" "$OUT/cuda_tests.log" | grep FAILED | head
fi
SHAPES=${SHAPES:-"4 4096 16 16 0
4 4096 16 16 1
4 4096 16 16 1 512
4 4096 32 32 0 -1 0 0 64
4 4096 32 32 1 -1 0 0 64"}
for r in $(seq "${ROUNDS:-2}"); do
  while read -r line; do
    [ -z "$line" ] && continue
    for b in ${BINS:-bwd_time}; do
      echo "$b r$r: $(.carry/$b $line)"
    done
  done <<< "$SHAPES"
done | tee "$OUT/ab.log"
