#!/usr/bin/env bash
# GPU machine (session 39): dbias through shared memory (FlashBwdParams::dbias_tile: the
# group's dS tile into the stage's free bias buffer, whole rows out). Build on the CPU
# machine: scripts/cuda_tests.sh build, the wheel, and two builds of bwd_time (nvcc line in
# dev/hopper_bwd/bwd_time.cu, -lcuda) as .carry/bwd_time_a and _b. Here:
#   1. the backward kernel tests (every dbias case: both store paths);
#   2. bwd_time, dbias written per element (FA_BIAS_B=1) and summed over the batch,
#      A against B with FA_DBIAS_TILE 0 (the pairs' stores) and 1, D 128 and 64, causal
#      and full, two alternating rounds -> $OUT/bwd_time_ab.log and a median table;
#   3. PYTEST=1: test_hopper_bwd_gpu.py -k bias;
#   4. through jax: dev/hopper_bwd/bias_vs_cudnn.py --dbias (with and without
#      --bias-batch) against cuDNN's backward, and bench fallback's alibi row.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
timeout 150 scripts/cuda_tests.sh run --gtest_filter='*HopperBwd*' > "$OUT/bwd_tests.log" 2>&1
echo "bwd kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/bwd_tests.log") ok"
grep "^\[  FAILED" "$OUT/bwd_tests.log" | head
# A: .carry/bwd_time_a (the dbias pass an element a thread, as before); B: .carry/bwd_time_b
# (the pass a row a block). B with FA_DBIAS_TILE 0 and 1. (SKIP_AB=1: not this step.)
[ -n "${SKIP_AB:-}" ] || for r in 1 2; do
  for d in 128 64; do
    for bb in 1 0; do
      for c in 1 0; do
        for v in a0 b0 b1; do
          FA_BIAS=1 FA_DBIAS=1 FA_BIAS_B=$bb FA_DBIAS_TILE=${v:1} timeout 60 .carry/bwd_time_${v:0:1} 4 4096 \
            $((2048 / d)) $((2048 / d)) $c -1 0 0 $d | sed "s/^/d$d bb$bb c$c $v r$r /"
        done
      done
    done
  done
done > "$OUT/bwd_time_ab.log" 2>&1
[ -n "${SKIP_AB:-}" ] || python3 - "$OUT/bwd_time_ab.log" <<'PY'
import collections, re, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(d\d+) bb(\d) c(\d) (\w\d) r\d .*?: ([\d.]+) ms", line)
    if m:
        t[m.groups()[:4]].append(float(m.group(5)))
print("D    bias        mask    A (ms)  B pairs  B tile  A/B pairs  A/B tile")
for d in ("d128", "d64"):
    for bb in ("1", "0"):
        for c in ("1", "0"):
            v = [t.get((d, bb, c, x)) for x in ("a0", "b0", "b1")]
            if all(v):
                a, b0, b1 = (statistics.median(x) for x in v)
                print(f"{d:4} {'[B,H,S,S]' if bb == '1' else '[1,H,S,S]':11} {'causal' if c == '1' else 'full':7} "
                      f"{a:7.3f} {b0:8.3f} {b1:7.3f} {a / b0:9.2f} {a / b1:9.2f}")
PY
source scripts/gpu_env.sh > /dev/null
if [ -n "${PYTEST:-}" ]; then  # PYTEST=1: test_hopper_bwd_gpu.py's bias tests, 4 processes
  XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 200 "$PY" -m pytest -q -p no:cacheprovider -n 4 \
    tests/python/attention/test_hopper_bwd_gpu.py -k bias > "$OUT/hopper_bwd_bias.log" 2>&1
  tail -1 "$OUT/hopper_bwd_bias.log"; grep -E "^(FAILED|ERROR)" "$OUT/hopper_bwd_bias.log" | head
fi
for bb in "" --bias-batch; do
  timeout 150 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --dbias $bb --head-dims 128 64 --rounds 2 > "$OUT/bias_vs_cudnn$bb.log" 2>&1
  cat "$OUT/bias_vs_cudnn$bb.log"
done
timeout 150 "$PY" -m fusedattn bench fallback --kinds alibi --repeats 3 --no-plot --json "$OUT/fallback_alibi.json" \
  > "$OUT/fallback_alibi.log" 2>&1; grep "^alibi" "$OUT/fallback_alibi.log"
