#!/usr/bin/env bash
# GPU machine (session 39): dbias through shared memory (FlashBwdParams::dbias_tile: the
# group's dS tile into the stage's free bias buffer, whole rows out). Build on the CPU
# machine: scripts/cuda_tests.sh build, the wheel, and bwd_time (nvcc line in
# dev/hopper_bwd/bwd_time.cu, -lcuda) as .carry/bwd_time. Here:
#   1. the backward kernel tests (every dbias case: both store paths);
#   2. bwd_time, dbias written per element (FA_BIAS_B=1) and summed over the batch,
#      FA_DBIAS_TILE 0 (the pairs' stores) against 1, D 128 and 64, causal and full,
#      two alternating rounds -> $OUT/bwd_time_ab.log and a median table;
#   3. through jax: dev/hopper_bwd/bias_vs_cudnn.py --dbias (with and without
#      --bias-batch) against cuDNN's backward, and bench fallback's alibi row.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
timeout 150 scripts/cuda_tests.sh run --gtest_filter='*HopperBwd*' > "$OUT/bwd_tests.log" 2>&1
echo "bwd kernel tests rc=$? $(grep -c '^\[       OK' "$OUT/bwd_tests.log") ok"
grep "^\[  FAILED" "$OUT/bwd_tests.log" | head
for r in 1 2; do
  for d in 128 64; do
    for bb in 1 0; do
      for c in 1 0; do
        for t in 0 1; do
          FA_BIAS=1 FA_DBIAS=1 FA_BIAS_B=$bb FA_DBIAS_TILE=$t timeout 60 .carry/bwd_time 4 4096 $((2048 / d)) $((2048 / d)) $c -1 0 0 $d |
            sed "s/^/d$d bb$bb c$c tile$t r$r /"
        done
      done
    done
  done
done > "$OUT/bwd_time_ab.log" 2>&1
python3 - "$OUT/bwd_time_ab.log" <<'PY'
import collections, re, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m = re.match(r"(d\d+) bb(\d) c(\d) tile(\d) r\d .*?: ([\d.]+) ms", line)
    if m:
        t[m.groups()[:4]].append(float(m.group(5)))
print("D    bias        mask    pairs ms  tile ms  speed-up")
for d in ("d128", "d64"):
    for bb in ("1", "0"):
        for c in ("1", "0"):
            a, b = t.get((d, bb, c, "0")), t.get((d, bb, c, "1"))
            if a and b:
                a, b = statistics.median(a), statistics.median(b)
                print(f"{d:4} {'[B,H,S,S]' if bb == '1' else '[1,H,S,S]':11} {'causal' if c == '1' else 'full':7} {a:8.3f} {b:8.3f} {a / b:8.2f}")
PY
source scripts/gpu_env.sh > /dev/null
for bb in "" --bias-batch; do
  timeout 150 "$PY" dev/hopper_bwd/bias_vs_cudnn.py --dbias $bb --head-dims 128 64 --rounds 2 > "$OUT/bias_vs_cudnn$bb.log" 2>&1
  cat "$OUT/bias_vs_cudnn$bb.log"
done
timeout 150 "$PY" -m fusedattn bench fallback --kinds alibi --repeats 3 --no-plot --json "$OUT/fallback_alibi.json" \
  > "$OUT/fallback_alibi.log" 2>&1; grep "^alibi" "$OUT/fallback_alibi.log"
