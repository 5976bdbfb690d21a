#!/usr/bin/env bash
# GPU machine (prepared in session 38, not yet run): exp2_poly.patch, every K-th score's
# exponential in the Hopper forward on the FMA pipe (FlashAttention-4's emulation,
# dev/hopper_fwd/exp2_poly_fit.py) instead of the multi-function unit, which takes 16 a
# cycle an SM: the tensor cores' pace at head dim 64, and softcap's tanh shares it (softcap
# forward 0.73x plain at head dim 64, 0.85x at 128, session 38). Build here, one tree per K:
#   git worktree add /tmp/poly HEAD && cd /tmp/poly && git apply dev/hopper_fwd/exp2_poly.patch
#   for K in 2 4; do cmake -S . -B build/poly$K -DFUSEDATTN_CUDA=ON -DFUSEDATTN_BUILD_TESTS=ON \
#     -DFUSEDATTN_BUILD_CUDA_TESTS=ON -DFUSEDATTN_CUDA_ARCHS=90a -DFUSEDATTN_HOPPER_DEFINES=FA_EXP2_POLY=$K
#     cmake --build build/poly$K -j2 --target fusedattn_cuda_tests   # (about 10 min)
#     O() { find build/poly$K/CMakeFiles/fusedattn_hopper.dir -name '*.o' | grep -v flash_bwd; }
#     nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc dev/hopper_fwd/dense_groups_time.cu $(O) -lcuda \
#       -o /work/main/.carry/dense_time_poly$K
#     cp build/poly$K/tests/cuda/fusedattn_cuda_tests /work/main/.carry/cuda_tests_poly$K; done
# and dense_time_a from main's scripts/cuda_tests.sh build (dense_time_ab.sh's header).
# Here: the forward kernel tests of each (the error bounds hold with the emulation), then
# the typed rows with and without softcap, K 4 and 2 against none.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
for K in 4 2; do
  .carry/cuda_tests_poly$K --gtest_filter='*HopperFwd*:Cases/HopperMode.*' > "$OUT/tests_poly$K.log" 2>&1
  echo "K=$K kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/tests_poly$K.log") ok"
  SOFTCAP=50 OUT=$OUT/poly$K bash dev/hopper_fwd/dense_time_ab.sh dense_time_a dense_time_poly$K | grep typed
done
