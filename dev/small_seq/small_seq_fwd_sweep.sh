#!/usr/bin/env bash
# The small-seq forward variant sweep (dev/small_seq/small_seq_fwd_sweep.cu: copy-ahead depth,
# blocks per SM, keys per step, beside copy and read-only kernels of the same process).
#   bash dev/small_seq/small_seq_fwd_sweep.sh build            # here: writes .carry/small_seq_fwd_sweep
#   bash dev/small_seq/small_seq_fwd_sweep.sh run [D [Skv]]    # GPU machine (carry .carry)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.carry/small_seq_fwd_sweep
case "${1:-}" in
  build)
    mkdir -p .carry
    nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc/fusedattn -Icsrc dev/small_seq/small_seq_fwd_sweep.cu \
      -o "$BIN" ;;
  run)
    shift
    "$BIN" "$@" ;;
  *)
    echo "usage: $0 build | run [D [Skv]]" >&2
    exit 2 ;;
esac
