#!/usr/bin/env bash
# GPU machine: forward time of plain attention, softcap and ALiBi under each cuDNN plan of the
# heuristics' lists (dev/cudnn/cudnn_plans.py, one process per setting: the graph cache keeps
# the first plan built). The plans' names go to $OUT/cudnn_plans.err.
#   OUT=/tmp/plans bash dev/cudnn/cudnn_plans.sh [S] [max plans] [engine] [kernel configs]
# With an engine: also that engine's plan at kernel config 0 .. configs - 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null
S=${1:-4096}
N=${2:-4}
export FUSEDATTN_CUDNN_PLAN_LOG=1
"$PY" dev/cudnn/cudnn_plans.py "$S" 2>>"$OUT/cudnn_plans.err"
for heur in A B; do
  for ((i = 0; i < N; i++)); do
    FUSEDATTN_CUDNN_HEUR=$heur FUSEDATTN_CUDNN_PLAN=$i "$PY" dev/cudnn/cudnn_plans.py "$S" \
      2>>"$OUT/cudnn_plans.err"
  done
done
if [ -n "${3:-}" ]; then
  for ((c = 0; c < ${4:-16}; c++)); do
    FUSEDATTN_CUDNN_ENGINE=$3 FUSEDATTN_CUDNN_KERNEL_CFG=$c "$PY" dev/cudnn/cudnn_plans.py "$S" \
      2>>"$OUT/cudnn_plans.err" | sed "s/plan default/eng $3 cfg $c/"
  done
fi
grep -o "fusedattn cudnn.*" "$OUT/cudnn_plans.err" | sort | uniq -c | sort -rn | head -20
