#!/usr/bin/env bash
# GPU machine: head dim 256's Hopper backward (session 41): the kernel tests, then bwd_time at
# B 4, S 4096, H 8 (D 256) beside jax's cuDNN backward (cudnn_time.py), and head dim 128's
# rows from this build and main's (the D64 / D128 variants must not move). Binaries xz'd in
# .carry1/ (fusedattn_cuda_tests, bwd_time_new, bwd_time_main), built here as:
#   scripts/cuda_tests.sh build
#   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc --expt-relaxed-constexpr dev/hopper_bwd/bwd_time.cu \
#     $(find build/cudatest/CMakeFiles/fusedattn_hopper.dir -name 'flash_bwd*.o' -o -name 'tma_map*.o') -lcuda -o bwd_time_new
# (bwd_time_main: the same from main's flash_bwd.cu and tma_map.cu.)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p .carry "$OUT"
for f in .carry1/*.xz; do xz -dc "$f" > ".carry/$(basename "$f" .xz)"; done
chmod +x .carry/*
PY=${PY:-python3}
if [ -z "${SKIP_TESTS:-}" ]; then
  .carry/fusedattn_cuda_tests --gtest_filter="${FILTER:-*HopperBwd*}" > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/kernel_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$OUT/kernel_tests.log" | head -20
fi
row() {  # label, env, args
  local label=$1 envs=$2
  shift 2
  echo "$label new: $(env $envs .carry/bwd_time_new "$@" 2>&1 | head -1)"
  [ -x .carry/bwd_time_main ] && [ "${9:-128}" != 256 ] &&
    echo "$label main: $(env $envs .carry/bwd_time_main "$@" 2>&1 | head -1)"
}
{
  row "d256 causal" "" 4 4096 8 8 1 -1 0 0 256
  row "d256 full" "" 4 4096 8 8 0 -1 0 0 256
  row "d256 dense causal" "" 4 4096 8 8 0 -1 0 1 256
  row "d256 dense window 512" "" 4 4096 8 8 0 512 0 1 256
  row "d256 dbias BH full" "FA_BIAS=1 FA_DBIAS=1 FA_BIAS_B=1" 4 4096 8 8 0 -1 0 0 256
  row "d128 causal" "" 4 4096 16 16 1 -1 0 0 128
  row "d128 full" "" 4 4096 16 16 0 -1 0 0 128
  row "d128 dense window 512" "" 4 4096 16 16 0 512 0 1 128
  row "d128 dbias BH causal" "FA_BIAS=1 FA_DBIAS=1 FA_BIAS_B=1" 4 4096 16 16 1 -1 0 0 128
  row "d64 causal" "" 4 4096 32 32 1 -1 0 0 64
  for c in 1 0; do
    echo "cudnn d256 causal=$c: $($PY dev/hopper_bwd/cudnn_time.py 4 4096 8 8 $c -1 256 2>&1 | tail -1)"
  done
  echo "cudnn d128 causal=1: $($PY dev/hopper_bwd/cudnn_time.py 4 4096 16 16 1 -1 128 2>&1 | tail -1)"
} 2>&1 | tee "$OUT/times.log"
