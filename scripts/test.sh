#!/usr/bin/env bash
# Every test on this machine: installs the package (scripts/setup.sh), builds and runs
# the GoogleTest suite (ctest), then the pytest suite, then the sanitizer job
# (scripts/sanitize.sh: ctest and a pytest selection under ASan + UBSan; a report fails it;
# FUSEDATTN_SANITIZE=0 skips it). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p build
{
  cmake -S . -B build/cpptests -DFUSEDATTN_BUILD_TESTS=ON -DFUSEDATTN_CUDA=OFF \
    -DPython_EXECUTABLE="$PWD/.venv/bin/python" &&
  cmake --build build/cpptests -j "$(nproc)" --target fusedattn_cpp_tests
} > build/cpptests.log 2>&1 || { cat build/cpptests.log; exit 1; }
(cd build/cpptests && ctest --output-on-failure)
.venv/bin/python -m pytest tests/python -q "$@"
if [ "${FUSEDATTN_SANITIZE:-1}" != 0 ]; then
  PYTHON="$PWD/.venv/bin/python" scripts/sanitize.sh
fi
