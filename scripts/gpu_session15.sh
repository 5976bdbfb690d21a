#!/usr/bin/env bash
# GPU machine, one call: the GPU tests of issue 23's transformations / drop-in and issue 20's
# NaN rows (shards), the fuzz test on the GPU (dev/fuzz/run.sh with FUSEDATTN_FUZZ_DEVICE=gpu),
# dev/autodiff/step_probe.py, and the main job on the GPU, at once; logs in $OUT.
# Carry .whl/ (see README). DEMO=0 skips the main job.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT" build
source scripts/gpu_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
(FUSEDATTN_FUZZ_DEVICE=gpu PYTHON=$PY timeout ${FUZZ_S:-420} bash dev/fuzz/run.sh ${FUZZ_N:-40} \
   > "$OUT/fuzz-gpu.log" 2>&1; cp build/fuzz_summary.json build/fuzz_run.log "$OUT/" 2>/dev/null) &
if [ "${DEMO:-1}" != 0 ]; then
  (timeout ${DEMO_S:-420} "$PY" -m fusedattn demo --out "$OUT/demo" > "$OUT/demo-gpu.log" 2>&1;
   echo "demo exit $?" >> "$OUT/demo-gpu.log") &
fi
FUSEDATTN_SITE=/tmp/fusedattn-site-shards timeout ${SHARDS_S:-480} bash scripts/gpu_shards.sh \
  "tests/python/attention/test_autodiff_gpu.py" "tests/python/attention/test_cudnn_gpu.py -k nan"
timeout 300 "$PY" dev/autodiff/step_probe.py > "$OUT/step_probe.log" 2>&1
wait
echo "--- fuzz"; tail -n 14 "$OUT/fuzz-gpu.log"
[ "${DEMO:-1}" != 0 ] && { echo "--- demo"; tr '\r' '\n' < "$OUT/demo-gpu.log" | grep -v "^\s*$" | tail -n 12 | cut -c1-200; }
echo "--- step probe"; cat "$OUT/step_probe.log"
