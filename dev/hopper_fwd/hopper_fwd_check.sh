#!/usr/bin/env bash
# The Hopper flash forward's own check and timing (dev/hopper_fwd/hopper_fwd_check.cu).
#   bash dev/hopper_fwd/hopper_fwd_check.sh build   # here: writes .carry/hopper_fwd_check
#   bash dev/hopper_fwd/hopper_fwd_check.sh run     # GPU machine (carry .carry)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=.carry/hopper_fwd_check
case "${1:-}" in
  build)
    mkdir -p .carry
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -DFA_HOPPER_SWEEP \
      dev/hopper_fwd/hopper_fwd_check.cu csrc/fusedattn/attention/hopper/flash_fwd.cu -o "$BIN" ;;
  build-profile)  # the same with FA_HOPPER_PROFILE: cycles by phase of the consumer loop
    mkdir -p .carry
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -DFA_HOPPER_SWEEP \
      -DFA_HOPPER_PROFILE dev/hopper_fwd/hopper_fwd_check.cu csrc/fusedattn/attention/hopper/flash_fwd.cu \
      -o .carry/hopper_fwd_profile ;;
  run-profile)
    .carry/hopper_fwd_profile ;;
  run)
    "$BIN" ;;
  *)
    echo "usage: $0 build | run | build-profile | run-profile" >&2
    exit 2 ;;
esac
