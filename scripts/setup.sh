#!/usr/bin/env bash
# Creates .venv (Python 3.10+) and installs fusedattn into it with its test and demo
# dependencies; pip builds libfusedattn.so with CMake on the way (scikit-build-core).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q ".[test]"
