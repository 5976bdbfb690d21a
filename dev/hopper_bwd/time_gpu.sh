#!/usr/bin/env bash
# The Hopper backward's timing beside jax's cuDNN (the GPU machine; carry .carry with
# bwd_time built: see bwd_time.cu). SHAPES: "B S H Hkv causal [left]" lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
SHAPES=${SHAPES:-"4 4096 16 16 1
4 4096 16 16 0
4 4096 16 16 1 512
2 8192 16 16 1
8 2048 16 16 1
4 4096 32 8 1"}
while read -r line; do
  [ -z "$line" ] && continue
  .carry/bwd_time $line
  $PY dev/hopper_bwd/cudnn_time.py $line
done <<< "$SHAPES"
