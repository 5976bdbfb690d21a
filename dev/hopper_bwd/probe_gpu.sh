#!/usr/bin/env bash
# Where the Hopper backward's time goes (the GPU machine; carry .carry): the kernel built with
# parts of its loop cut out (probe.patch's macros, built by probe_build.sh), timed by
# bwd_time beside the full kernel. SHAPES: bwd_time's argument lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
SHAPES=${SHAPES:-"4 4096 16 16 0 -1 0 0 128
4 4096 16 16 1 -1 0 0 128
4 4096 16 16 0 -1 0 0 64"}
while read -r line; do
  [ -z "$line" ] && continue
  for v in base nosoft noreduce nosoft_noreduce nodq gemm4; do
    printf '%-14s ' "$v"; .carry/probe_$v $line
  done
done <<< "$SHAPES"
