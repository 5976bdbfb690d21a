#!/usr/bin/env bash
# GPU machine (carry .carry holding bins.tgz: fusedattn_cuda_tests and bwd_time, see below):
# head dim 64's keep-only dense variant (FlashBwdParams::mask_keep_only, kBwdKeep: a folded
# mask without values in 128-query blocks, session 37). The backward kernel tests (the new
# d64_keep_* / det_d64_keep_* cases and every earlier one), the keep cases under
# compute-sanitizer memcheck, then bwd_time at B 4, S 4096, H 32, D 64: the causal type,
# a dense causal mask and a dense 512-key window, each 64-query (FA_KEEP=0) and keep-only
# (FA_KEEP=1), two rounds. Build here first:
#   scripts/cuda_tests.sh build && nvcc -std=c++17 -O3 -lineinfo -arch=sm_90a -Icsrc \
#     --expt-relaxed-constexpr dev/hopper_bwd/bwd_time.cu csrc/fusedattn/attention/hopper/flash_bwd.cu \
#     csrc/fusedattn/attention/hopper/tma_map.cu -o bwd_time -lcuda
#   tar czf .carry/bins.tgz -C .carry fusedattn_cuda_tests -C .. bwd_time  (then only bins.tgz in .carry)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
[ -f .carry/bins.tgz ] && tar xzf .carry/bins.tgz -C .carry
timeout 200 .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*' > "$OUT/bwd_tests.log" 2>&1
echo "bwd tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/bwd_tests.log" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$OUT/bwd_tests.log" | head -8
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 "$CS" --tool memcheck .carry/fusedattn_cuda_tests --gtest_filter='*HopperBwd*keep*' \
  > "$OUT/memcheck_keep.log" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/memcheck_keep.log" | tr '\n' ' ')"
for r in 1 2; do
  .carry/bwd_time 4 4096 32 32 1 -1 0 0 64 | sed "s/^/r$r /"
  for keep in 0 1; do
    FA_KEEP=$keep .carry/bwd_time 4 4096 32 32 1 -1 0 1 64 | sed "s/^/r$r /"
    FA_KEEP=$keep .carry/bwd_time 4 4096 32 32 1 512 0 1 64 | sed "s/^/r$r /"
  done
done 2>&1 | tee "$OUT/keep_ab.log" | cut -c1-150
