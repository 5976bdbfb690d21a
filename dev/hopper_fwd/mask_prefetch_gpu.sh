#!/usr/bin/env bash
# GPU machine (carry .carry): mask_prefetch.patch (session 36, compiled, not yet run): the
# Hopper forward loads a dense mask's class and bits of a key block before the wait for S
# instead of after it. Build here (the objects of scripts/cuda_tests.sh build; without
# flash_bwd's so that two binaries fit the carry):
#   H="nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc dev/hopper_fwd/dense_groups_time.cu -lcuda"
#   O() { find build/cudatest/CMakeFiles/fusedattn_hopper.dir -name '*.o' | grep -v flash_bwd; }
#   scripts/cuda_tests.sh build && $H $(O) -o .carry/dense_time_main
#   git apply dev/hopper_fwd/mask_prefetch.patch && scripts/cuda_tests.sh build && \
#     $H $(O) -o .carry/dense_time_prefetch
# then move .carry/fusedattn_cuda_tests aside for PART=time (the carry's 64 MiB), or the two
# timing binaries aside for PART=tests. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
if [ "${PART:-time}" = tests ]; then  # the patched kernel's tests
  timeout 200 scripts/cuda_tests.sh run --gtest_filter='*HopperMode*' > "$OUT/cuda_tests.log" 2>&1
  echo "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests.log" | tr '\n' ' ')"
  grep FAILED "$OUT/cuda_tests.log" | head -5
  exit 0
fi
for r in 1 2; do
  for d in 128 64; do
    for b in dense_time_main dense_time_prefetch; do
      .carry/$b $d | grep "^r1" | sed "s/^r1/$b d$d r$r/"
    done
  done
done | tee "$OUT/ab.log"
