#!/usr/bin/env bash
# GPU machine (session 41; carry .whl): head dim 256's Hopper backward through jax.
#   1. STEP=tests: Python GPU tests in parallel shards (gpu_shards.sh), then `bench
#      dense_mask` at head dim 256 (the dense mask against its type, issue 23's ratio);
#   2. STEP=measure: scripts/tune_hopper.py --backward --head-dims 256 --merge (rewrites the
#      tree's hopper/measured_bwd.h, copied to $OUT) and bias_vs_cudnn.py at head dim 256
#      (a bias without and with dbias against cuDNN's backward); PYTEST: one more selection;
#   3. STEP=final (after the wheel is rebuilt with the table): tests, `bench attention` at head
#      dim 256, softcap's backward against cuDNN's.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh > /dev/null
A=tests/python/attention
case "${STEP:-tests}" in
  tests)
    OUT=$OUT timeout "${TEST_TIMEOUT:-420}" scripts/gpu_shards.sh \
        "$A/test_cudnn_gpu.py -k vmap" \
        "$A/test_hopper_bwd_gpu.py -k 'd256 or other_calls or compiled'" \
        "$A/test_hopper_fwd_gpu.py -k 'dense'" \
        "$A/test_hopper_bwd_gpu.py -k 'bf16 and not d256'" > "$OUT/shards.txt" 2>&1
    cat "$OUT/shards.txt"
    grep -hE "^FAILED|^E  " "$OUT"/shard-*.log | head -30
    timeout 150 "$PY" -m fusedattn bench dense_mask --dtype bfloat16 --batch 4 --heads 8 --head-dim 256 \
        --seq 4096 --window 512 --kinds causal window padding > "$OUT/dense_mask_d256.log" 2>&1
    tail -12 "$OUT/dense_mask_d256.log" ;;
  measure)
    timeout 330 "$PY" scripts/tune_hopper.py --backward --head-dims 256 --merge \
        --json "$OUT/measured_bwd.json" > "$OUT/tune.log" 2>&1
    cp csrc/fusedattn/attention/hopper/measured_bwd.h "$OUT/"
    tail -12 "$OUT/tune.log"
    for flags in "" "--dbias --bias-batch"; do
      timeout 80 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --head-dims 256 $flags > "$OUT/bias${flags// /}.log" 2>&1
      echo "bias_vs_cudnn $flags:"; tail -4 "$OUT/bias${flags// /}.log"
    done
    [ -n "${PYTEST:-}" ] && timeout 90 "$PY" -m pytest -q -p no:cacheprovider $PYTEST 2>&1 | tail -3 ;;
  final)  # the build with the measured table: tests, then bench attention and softcap
    OUT=$OUT timeout 240 scripts/gpu_shards.sh \
        "$A/test_hopper_bwd_gpu.py -k 'd256 or follow or other_calls'" \
        "$A/test_hopper_fwd_gpu.py -k 'get_backend or holes or follow'" > "$OUT/shards.txt" 2>&1
    cat "$OUT/shards.txt"
    grep -hE "^FAILED|^E  " "$OUT"/shard-*.log | head -20
    timeout 200 "$PY" -m fusedattn bench attention --head-dims 256 --seqlens 4096 16384 --xla-max-seq 0 \
        --no-plot --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    grep -v "^plot\|^wrote" "$OUT/bench.log" | tail -16
    timeout 100 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --head-dims 256 --softcap 30 > "$OUT/softcap.log" 2>&1
    tail -4 "$OUT/softcap.log" ;;
esac
