#!/usr/bin/env bash
# GPU machine: installs fusedattn and runs the whole pytest suite there (the `gpu`-marked
# tests run, the rest run on the CPU device of that machine) and the demo on the GPU.
# The machine has no network: build the wheel here first and carry it in .whl/:
#   python -m pip wheel . --no-deps -w .whl -C cmake.define.FUSEDATTN_CUDA=ON
# (the flag: this machine has no GPU, so without it only the CPU engine is built; then run
# this script there with .whl carried)
# Without a carried wheel it builds in place (needs jaxlib, scikit-build-core, cmake there).
# Logs go to $OUT (or ./gpu-logs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
status=0
"$PY" -m pytest tests/python -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
# shellcheck disable=SC2086  # DEMO_ARGS is a list of words
"$PY" -m fusedattn demo ${DEMO_ARGS:-} 2>&1 | tee "$OUT/demo.log" | tail -4
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
