#!/usr/bin/env bash
# GPU machine (carry .carry with dense_time_main and dense_time_nomask): what the dense-mask
# and score-at-a-time bias code in the Hopper forward's PlainScores instances costs calls
# that use neither (full, causal, window types). mask_code.patch compiles that code out
# (FA_NO_MASK_CODE; checked with -Xptxas -v, session 37: plain noncausal bf16 d128 spills
# 40 -> 8 bytes, causal 16 -> 8). Build here (the objects of scripts/cuda_tests.sh build, six
# plain bf16 instances recompiled with the define against a patched copy of csrc):
#   scripts/cuda_tests.sh build && rm -rf /tmp/nm && mkdir -p /tmp/nm /tmp/nmobj && cp -r csrc /tmp/nm/ &&
#   (cd /tmp/nm && patch -p1 < /work/main/dev/hopper_fwd/mask_code.patch)
#   for v in plain_{causal,noncausal}_bf16_{d128,d64g2,d64g3}; do nvcc -DFA_NO_MASK_CODE -O3 -DNDEBUG \
#     "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]" --expt-relaxed-constexpr -std=c++17 \
#     -I/tmp/nm/csrc -c build/cudatest/generated/hopper_fwd_$v.cu -o /tmp/nmobj/hopper_fwd_$v.cu.o; done
#   O() { find build/cudatest/CMakeFiles/fusedattn_hopper.dir -name '*.o' | grep -v flash_bwd; }
#   H="nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc dev/hopper_fwd/dense_groups_time.cu -lcuda"
#   $H $(O) -o .carry/dense_time_main
#   $H $(for o in $(O); do b=$(basename $o); [ -f /tmp/nmobj/$b ] && echo /tmp/nmobj/$b || echo $o; done) \
#     -o .carry/dense_time_nomask
# The "typed" rows are the A/B (the nomask binary's dense rows are wrong by construction:
# its mask code is gone). Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
for r in 1 2 3; do
  for d in 128 64; do
    for b in dense_time_main dense_time_nomask; do
      .carry/$b $d | grep "^r1" | grep typed | sed "s/^r1/$b d$d r$r/"
    done
  done
done | tee "$OUT/mask_code_ab.log"
