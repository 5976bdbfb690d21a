#!/usr/bin/env bash
# The sanitizer job (scripts/test.sh runs it after the normal suite): the GoogleTest suite and a
# pytest selection on the engine built with AddressSanitizer + UndefinedBehaviorSanitizer
# (cmake -DFUSEDATTN_SANITIZE=ON, CPU only). No report is recoverable: the first one aborts
# its process, so the job fails on any report. PYTHON: the interpreter with jax and the package
# (default .venv/bin/python); FUSEDATTN_SANITIZE_PYTEST=0 runs the C++ suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
mkdir -p build
{
  # -O1: the sanitizers need no more, and the build is half as long on CI's two cores.
  cmake -S . -B build/asan -DFUSEDATTN_SANITIZE=ON -DFUSEDATTN_BUILD_TESTS=ON \
    -DFUSEDATTN_CUDA=OFF -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DPython_EXECUTABLE="$PYTHON" &&
  cmake --build build/asan -j "$(nproc)" --target fusedattn fusedattn_cpp_tests
} > build/asan.log 2>&1 || { cat build/asan.log; exit 1; }

export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Only failures (with their output) and the summary: not a line per passing test.
(cd build/asan && ctest --output-on-failure -j "$(nproc)" 2>&1 |
   grep --line-buffered -v -e '^ *Start ' -e ' Passed ')

[ "${FUSEDATTN_SANITIZE_PYTEST:-1}" = 0 ] && exit 0
# Python is not instrumented: the sanitizer runtimes go first in the process (LD_PRELOAD), the
# package loads the sanitized library (FUSEDATTN_LIBRARY), and leak checking stays off (the
# interpreter never frees some of what it allocates). A selection, not the whole suite: THD
# segments (the descriptor rule's index arithmetic), threads, and the fuzz test.
LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libubsan.so)" \
FUSEDATTN_LIBRARY="$PWD/build/asan/libfusedattn.so" FUSEDATTN_FUZZ_EXAMPLES=8 \
  "$PYTHON" -m pytest -q -p no:cacheprovider -n "${FUSEDATTN_TEST_WORKERS:-auto}" --dist worksteal \
    tests/python/attention/test_thd.py tests/python/attention/test_threads.py \
    tests/python/attention/test_fuzz.py
