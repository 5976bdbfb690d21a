#!/usr/bin/env bash
# The main job: installs the package (scripts/setup.sh) and trains a tiny causal
# transformer with fused_attn inside. Extra arguments go to `python -m fusedattn demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python -m fusedattn demo "$@"
