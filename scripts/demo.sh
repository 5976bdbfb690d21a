#!/usr/bin/env bash
# The main job: installs the package (scripts/setup.sh) and trains a small character-level
# GPT of fusedattn.flax modules on pydoc_data.topics. Extra arguments go to
# `python -m fusedattn demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python -m fusedattn demo "$@"
