#!/usr/bin/env bash
# GPU machine (carry .carry): classify_vec.patch (the mask classification's 16-byte loads,
# session 35, compiled, not yet run): the kernel tests of dense masks (forward and backward;
# keys in 8-key units take the new loads, the others the old), then the classification kernel
# alone by Nsight Compute inside bwd_time (.carry/bwd_time_cols: main's bwd_time; bwd_time_vec:
# the patch's) and both bwd_time totals. Build: dev/hopper_fwd/README.md. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
timeout 120 .carry/fusedattn_cuda_tests --gtest_filter='*mask*:*det*:*dbias*:*bias_post*' > "$OUT/cuda_tests_mask.log" 2>&1
echo "kernel tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda_tests_mask.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$OUT/cuda_tests_mask.log" | head
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in bwd_time_cols bwd_time_vec; do
  for shape in "4 4096 16 16 1 -1 0 1" "4 4096 16 16 1 512 0 1"; do
    echo "$b $shape: $(.carry/$b $shape 2>&1 | sed 's/sums.*//')"
    timeout 40 "$NCU" --clock-control none -k regex:classify --launch-skip 3 --launch-count 3 \
      --metrics gpu__time_duration.sum .carry/$b $shape 2>&1 | grep -E "gpu__time_duration" | tr -s ' ' | tr '\n' ';'
    echo
  done
done 2>&1 | tee "$OUT/classify_ab.log"
