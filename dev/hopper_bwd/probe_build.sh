#!/usr/bin/env bash
# Builds bwd_time with parts of the backward's loop cut out (probe.patch applied to a copy of
# csrc): base; nosoft (no softmax: P = S, dS = dP); noreduce (dQ's parts written to shared
# memory but not added to dq_acc); nosoft_noreduce; nodq (no dQ product, part or
# reduction); gemm4 (no softmax, no dQ: the four other products alone).
set -euo pipefail
cd "$(dirname "$0")/../.."
TMP=$(mktemp -d)
cp -r csrc "$TMP/"
patch -s -d "$TMP" -p1 < dev/hopper_bwd/probe.patch
mkdir -p .carry
build() {
  nvcc -std=c++17 -O3 -arch=sm_90a -I"$TMP/csrc" --expt-relaxed-constexpr $2 dev/hopper_bwd/bwd_time.cu \
    "$TMP/csrc/fusedattn/attention/hopper/flash_bwd.cu" "$TMP/csrc/fusedattn/attention/hopper/tma_map.cu" \
    -o ".carry/probe_$1"
}
build base "" & build nosoft "-DBWD_PROBE_NO_SOFTMAX=1" & wait
build noreduce "-DBWD_PROBE_NO_REDUCE=1" & build nosoft_noreduce "-DBWD_PROBE_NO_SOFTMAX=1 -DBWD_PROBE_NO_REDUCE=1" & wait
build nodq "-DBWD_PROBE_NO_DQ=1" & build gemm4 "-DBWD_PROBE_NO_SOFTMAX=1 -DBWD_PROBE_NO_DQ=1" & wait
rm -rf "$TMP"
