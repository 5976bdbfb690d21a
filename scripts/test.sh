#!/usr/bin/env bash
# Every test on this machine, in this order:
#   1. scripts/setup.sh: .venv with the package (nothing is rebuilt when .venv already holds
#      this source, e.g. after scripts/demo.sh; CPU engine only on a machine without a GPU);
#   2. the CUDA compile check: every CUDA file compiled (to PTX) and linked into the library, and the
#      CUDA kernel tests (tests/cuda, run on a GPU by scripts/cuda_tests.sh) built, in
#      build/cuda-check (FUSEDATTN_CUDA=ON; the log is build/cuda-check.log, shown on failure),
#      so a CUDA build break fails here without a GPU; FUSEDATTN_CUDA_CHECK=0 skips it;
#   3. the GoogleTest suite (build/cpptests, reused between runs; ctest prints only failures
#      and its summary);
#   4. the pytest suite, spread over one worker per core (pytest-xdist; FUSEDATTN_TEST_WORKERS
#      sets the count, 0 runs it in this process; extra arguments go to pytest; skips are
#      listed with their reasons);
#   5. the sanitizer job (scripts/sanitize.sh: ctest and a pytest selection under ASan + UBSan;
#      a report fails it; FUSEDATTN_SANITIZE=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo; echo "== test: $* ($(date +%H:%M:%S))"; }

step "setup"
scripts/setup.sh
mkdir -p build

if [ "${FUSEDATTN_CUDA_CHECK:-1}" != 0 ]; then
  step "CUDA compile check: every CUDA file, in build/cuda-check (log: build/cuda-check.log)"
  t0=$(date +%s)
  {
    # The cudnn-frontend headers (a CPU-only setup does not install them); nothing else of it.
    .venv/bin/python -m pip install -q --no-deps "nvidia-cudnn-frontend>=1.14" &&
    # PTX only: every instantiation goes through nvcc's front end (cicc) once, the generic
    # kernels for compute_80, the Hopper ones (and their tests) for compute_90a; ptxas, half
    # of a full build's time, runs where a wheel is built for a GPU (README).
    cmake -S . -B build/cuda-check -DFUSEDATTN_CUDA=ON -DFUSEDATTN_BUILD_TESTS=ON \
      -DFUSEDATTN_BUILD_CUDA_TESTS=ON -DPython_EXECUTABLE="$PWD/.venv/bin/python" \
      -DFUSEDATTN_CUDA_ARCHS=80-virtual -DFUSEDATTN_HOPPER_ARCHS=90a-virtual \
      -DFUSEDATTN_CUDA_TESTS_ARCHS=90a-virtual &&
    cmake --build build/cuda-check -j "$(nproc)" --target fusedattn fusedattn_cuda_tests
  } > build/cuda-check.log 2>&1 || { cat build/cuda-check.log; echo "test: the CUDA build failed (above)"; exit 1; }
  echo "CUDA library and kernel tests (tests/cuda: they run on a GPU) built in $(( $(date +%s) - t0 )) s"
fi

step "C++ tests (build/cpptests, log: build/cpptests.log)"
{
  cmake -S . -B build/cpptests -DFUSEDATTN_BUILD_TESTS=ON -DFUSEDATTN_CUDA=OFF \
    -DPython_EXECUTABLE="$PWD/.venv/bin/python" &&
  cmake --build build/cpptests -j "$(nproc)" --target fusedattn_cpp_tests
} > build/cpptests.log 2>&1 || { cat build/cpptests.log; exit 1; }
# One line per test would be hundreds of passing lines: only failures (with their output) and
# the summary are printed.
(cd build/cpptests && ctest --output-on-failure -j "$(nproc)" 2>&1 |
   grep --line-buffered -v -e '^ *Start ' -e ' Passed ')

step "Python tests"
# Most of the suite's time is tracing and compiling, one core per process: two workers on the
# 2-core CI machine take about half the time of one.
# The 15 slowest tests are listed at the end (where to look when the suite grows slow).
.venv/bin/python -m pytest tests/python -q -rs -n "${FUSEDATTN_TEST_WORKERS:-auto}" --dist worksteal \
  --durations=15 "$@"

if [ "${FUSEDATTN_SANITIZE:-1}" != 0 ]; then
  step "sanitizer job (scripts/sanitize.sh)"
  PYTHON="$PWD/.venv/bin/python" scripts/sanitize.sh
fi
