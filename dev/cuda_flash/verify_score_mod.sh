#!/usr/bin/env bash
# GPU machine, one call: the CUDA flash kernels' score_mod path (issue 24, session 19) and
# the head dims run zero-padded (session 21) --
# its GPU tests (the file turns FUSEDATTN_FLASH_SCORE_MOD on), the flash kernels' existing
# dropout / bias / context-parallel tests (the FULL variant and REQUEST_NO_DBIAS changed
# under them), compute-sanitizer memcheck of score_mod calls on the flash kernels, and
# `bench fallback --kinds alibi slopes` (the path is on by default). Carry .whl/ (scripts/gpu_env.sh).
#   OUT=... bash dev/cuda_flash/verify_score_mod.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
SM=tests/python/score_mod/test_score_mod_gpu.py
A=tests/python/attention
status=0
scripts/gpu_shards.sh \
  "$SM -k 'flash_kernels_match and bf16'" "$SM -k 'flash_kernels_match and fp16'" \
  "$SM -k 'flash_kernels_match and f32'" "$SM -k 'not flash_kernels_match'" \
  "$A/test_cuda_flash_gpu.py -k 'dropout or index'" "$A/test_cuda_flash_gpu.py -k 'block or bias'" \
  "$A/test_head_dim_padding.py $A/test_cuda_flash_gpu.py -k 'low_precision or padded or head_dims'" \
  "$A/test_cudnn_gpu.py -k 'backend_reports or unserved'" ||
  status=1
source scripts/gpu_env.sh
timeout 240 "$PY" -m fusedattn bench fallback --kinds alibi slopes --out-dir "$OUT" \
  > "$OUT/bench-fallback.log" 2>&1 || status=1
# A/B: BASE=<dir with an older wheel> times the same rows with that library (no anchors).
if [ -n "${BASE:-}" ]; then
  rm -rf /tmp/fusedattn-base && "$PY" -m pip install -q --no-index --no-deps \
    --target /tmp/fusedattn-base "$BASE"/fusedattn-*.whl &&
  FUSEDATTN_FLASH_SCORE_MOD=1 PYTHONPATH=/tmp/fusedattn-base timeout 200 "$PY" -m fusedattn bench \
    fallback --kinds alibi slopes --skip reference jax_xla jax_cudnn --out-dir "$OUT/base" \
    > "$OUT/bench-fallback-base.log" 2>&1 || status=1
  echo "base ($BASE):"; grep -E "^(alibi|slopes) " "$OUT/bench-fallback-base.log"
fi
echo "this tree:"; grep -E "^(case|alibi|slopes) " "$OUT/bench-fallback.log"
# head dims not whole 16-byte chunks: zero-padded now (and with BASE: what ran them before)
timeout 120 "$PY" dev/cuda_flash/odd_dims_probe.py > "$OUT/odd-dims.log" 2>&1 || status=1
[ -n "${BASE:-}" ] && { PYTHONPATH=/tmp/fusedattn-base timeout 200 "$PY" \
  dev/cuda_flash/odd_dims_probe.py > "$OUT/odd-dims-base.log" 2>&1 || status=1; }
# memcheck last (its own allocator setting: one cudaMalloc per buffer)
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false \
  timeout "${MEMCHECK_TIMEOUT:-600}" "$CS" --tool memcheck --error-exitcode 97 --log-file "$OUT/cs-memcheck-sm.log" \
  "$PY" -m pytest -q -p no:cacheprovider "$SM" -k "(flash_kernels_match and f32 and (alibi or two_arrays)) or thd_segments and flash or with_a_bias and pre" \
  > "$OUT/cs-memcheck-sm.pytest.log" 2>&1 || status=1
echo "memcheck score_mod: $(tail -1 "$OUT/cs-memcheck-sm.pytest.log"), $(grep -ho 'ERROR SUMMARY: [0-9]* error' "$OUT/cs-memcheck-sm.log" | tail -1)"
exit $status
