#!/usr/bin/env bash
# The CUDA kernel tests (tests/cuda: each kernel alone against a reference kernel, on the GPU).
#   scripts/cuda_tests.sh build   # any machine with nvcc: build/cudatest, binary copied to .carry/
#   scripts/cuda_tests.sh run     # the GPU machine (carry .carry): runs it; skips without sm_90
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.carry/fusedattn_cuda_tests
case "${1:-}" in
  build)
    if [ -x .venv/bin/python ]; then PY="$PWD/.venv/bin/python"; else PY=$(command -v "${PYTHON:-python3}"); fi
    cmake -S . -B build/cudatest -DFUSEDATTN_CUDA=ON -DFUSEDATTN_BUILD_TESTS=ON \
      -DFUSEDATTN_BUILD_CUDA_TESTS=ON -DFUSEDATTN_CUDA_ARCHS=90a -DPython_EXECUTABLE="$PY" > /dev/null
    cmake --build build/cudatest -j "$(nproc)" --target fusedattn_cuda_tests
    mkdir -p .carry && cp build/cudatest/tests/cuda/fusedattn_cuda_tests "$BIN"
    echo "built $BIN" ;;
  run)
    "$BIN" "${@:2}" ;;
  *)
    echo "usage: $0 build | run [gtest flags]" >&2
    exit 2 ;;
esac
