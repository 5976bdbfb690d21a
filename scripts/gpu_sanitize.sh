#!/usr/bin/env bash
# GPU machine: compute-sanitizer over a representative selection of the GPU tests: memcheck
# (out-of-bounds and misaligned accesses, bad frees, CUDA API errors) for the cuDNN path with
# its fixup kernels, the Hopper forward, the generic CUDA flash attention (cuda_flash),
# small-seq and softmax; racecheck (shared-memory hazards) for our kernels that use shared
# memory (Hopper forward, cuda_flash, small-seq, softmax).
# XLA allocates each buffer with its own cudaMalloc here (XLA_PYTHON_CLIENT_ALLOCATOR=platform),
# so an access past one of our buffers is seen, not hidden inside XLA's memory pool.
# One line per run: the tool, the selection, pytest's summary and the sanitizer's error count;
# logs in $OUT/cs-<tool>-<name>.log (H100, 2026-11-25: memcheck of the Hopper, small-seq and
# softmax selections 0 errors; with cuDNN's graphs in the process compute-sanitizer 2025.3.1
# itself crashes (SIGSEGV), and so did every run with --target-processes all).
# The runs go in parallel (their time is mostly compiling on
# the CPU); on an H200 (2026-11-25) six of the seven parallel runs crashed in
# compute-sanitizer itself (SIGSEGV, 0 errors reported) where one run alone (memcheck of the
# softmax selection) finished with 0 errors: SERIAL=1 runs them one after another. Exit status 1 when a run reports anything or a test fails.
#   OUT=... bash scripts/gpu_sanitize.sh            (carry .whl/ as for scripts/gpu_test.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh
export XLA_PYTHON_CLIENT_ALLOCATOR=platform XLA_PYTHON_CLIENT_PREALLOCATE=false
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
status=0

run() {  # run TOOL NAME PYTEST-ARGS...
  local tool=$1 name=$2
  shift 2
  "$CS" --tool "$tool" --error-exitcode 97 ${CS_OPTS:-} \
    --log-file "$OUT/cs-$tool-$name.log" \
    "$PY" -m pytest -q -p no:cacheprovider "$@" > "$OUT/cs-$tool-$name.pytest.log" 2>&1
  local rc=$? errors
  errors=$(grep -ho "ERROR SUMMARY: [0-9]* error" "$OUT/cs-$tool-$name.log" |
           awk '{s += $3} END {print s + 0}')
  echo "$tool $name: rc=$rc, $(tail -1 "$OUT/cs-$tool-$name.pytest.log"), sanitizer errors: $errors" \
    > "$OUT/cs-$tool-$name.summary"
  [ "$rc" -eq 0 ] && [ "$errors" -eq 0 ]
}

A=tests/python/attention
pids=()
bg() {  # each run in the background (SERIAL=1: in turn)
  if [ "${SERIAL:-0}" = 1 ]; then run "$@" || status=1; else run "$@" & pids+=($!); fi
}
# cuDNN's graphs (CUDNN_MEMCHECK=1): with blocking launches and XLA without CUDA graphs
# (command buffers) compute-sanitizer no longer crashes, but it did not finish one test in
# 5 min (H200, 2026-11-25); without them it crashes (SIGSEGV, above).
if [ "${CUDNN_MEMCHECK:-0}" = 1 ]; then
  CS_OPTS="--force-blocking-launches" XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" \
    bg memcheck cudnn "$A/test_cudnn_gpu.py" -k "layouts or nan or thd_invalid or window_and_sink"
fi
bg memcheck hopper "$A/test_hopper_fwd_gpu.py" -k "packed_layout or nan"
# cuda_flash (issue 24): ragged (THD, padding, bottom-right) rows, biases, head dims not a
# multiple of 8 and 512, context-parallel blocks and a dropout shard ("not cpu": the GPU params)
bg memcheck cuda_flash "$A/test_cuda_flash_gpu.py" -k "not cpu and (thd_segments or t3hd or padding_bottom_right or pre_bias_b1 or d100 or d512 or block or shard)"
bg memcheck small_seq tests/python/small_seq/test_small_seq_gpu.py -k "thd_masks or broken_promises_among or nan"
bg memcheck softmax tests/python/softmax/test_softmax_gpu.py -k "causal_square_longest or nan or fully_masked"
bg racecheck hopper "$A/test_hopper_fwd_gpu.py" -k "packed_layout"
bg racecheck cuda_flash "$A/test_cuda_flash_gpu.py" -k "not cpu and (thd_segments or causal_window or d512 or d36)"
bg racecheck small_seq tests/python/small_seq/test_small_seq_gpu.py -k "thd_masks"
bg racecheck softmax tests/python/softmax/test_softmax_gpu.py -k "causal_square_longest"
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
cat "$OUT"/cs-*.summary
exit $status
