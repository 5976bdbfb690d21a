#!/usr/bin/env bash
# GPU machine (carry .carry): an A/B of the mask classification (session 36: its 16-byte
# loads against the 2-byte ones): the kernel tests of dense masks (forward and backward;
# keys in 8-key units take the new loads, the others the old) and both bwd_time builds
# (.carry/bwd_time_cols: main's bwd_time; bwd_time_vec: the patch's) by dev/hopper_bwd/ab_gpu.sh,
# then the classification kernel alone by Nsight Compute inside each. Build:
# dev/hopper_fwd/README.md. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
SHAPES=$'4 4096 16 16 1 -1 0 1\n4 4096 16 16 1 512 0 1'
OUT=$OUT TESTS=1 TEST_FILTER='*mask*:*det*:*dbias*:*bias_post*' BINS="bwd_time_cols bwd_time_vec" \
  SHAPES=$SHAPES bash dev/hopper_bwd/ab_gpu.sh | sed 's/sums.*//'
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
while read -r shape; do
  for b in bwd_time_cols bwd_time_vec; do
    echo "$b $shape classify: $(timeout 40 "$NCU" --clock-control none -k regex:classify --launch-skip 3 \
      --launch-count 3 --metrics gpu__time_duration.sum .carry/$b $shape 2>&1 |
      grep -E "gpu__time_duration" | tr -s ' ' | tr '\n' ';')"
  done
done <<< "$SHAPES" | tee "$OUT/classify_ncu.log"
