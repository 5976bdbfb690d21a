#!/usr/bin/env bash
# GPU machine: runs several pytest selections at once (each argument is one selection,
# split into words: files and -k expressions), the rest of scripts/gpu_test.sh's setup
# alike. The GPU tests spend most of their time compiling on the CPU, so shards in
# parallel finish several times sooner. Logs: $OUT/shard-N.log; a summary line each.
#   scripts/gpu_shards.sh "tests/python/softmax/test_softmax_gpu.py" \
#       "tests/python/small_seq/test_small_seq_gpu.py -k widths" "tests/python/small_seq/test_small_seq_gpu.py -k 'not widths'"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the shards share the GPU's memory
pids=()
i=0
for sel in "$@"; do
  i=$((i + 1))
  eval "args=($sel)"
  "$PY" -m pytest "${args[@]}" -q -p no:cacheprovider > "$OUT/shard-$i.log" 2>&1 &
  pids+=($!)
done
status=0
i=0
for pid in "${pids[@]}"; do
  i=$((i + 1))
  wait "$pid" || status=1
  echo "shard $i: $(tail -1 "$OUT/shard-$i.log")"
done
exit $status
