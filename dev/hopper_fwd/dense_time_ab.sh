#!/usr/bin/env bash
# GPU machine: an A/B of two builds of the Hopper forward, each linked into
# dense_groups_time.cu (typed causal / window / full rows and a dense mask's rows, two and
# three consumer groups at head dim 64), three alternating rounds at head dims 256, 128 and
# 64; the medians and A / B last. Build each side on the CPU machine from its tree
# (scripts/cuda_tests.sh build there), carry the two binaries in .carry:
#   O() { find build/cudatest/CMakeFiles/fusedattn_hopper.dir -name '*.o' | grep -v flash_bwd; }
#   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc dev/hopper_fwd/dense_groups_time.cu $(O) -lcuda -o .carry/dense_time_a
# (and dense_time_b from the other tree). Usage: [SOFTCAP=50] [ROUNDS=3] [DIMS="256 128 64"] dev/hopper_fwd/dense_time_ab.sh [A B]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
A=${1:-dense_time_a} B=${2:-dense_time_b}
for r in $(seq ${ROUNDS:-3}); do
  for d in ${DIMS:-256 128 64}; do
    for sc in 0 ${SOFTCAP:-}; do  # SOFTCAP=50: the typed rows with softcap too
      for b in "$A" "$B"; do
        .carry/$b $d $sc | grep "^r1" | sed "s/^r1/$b d$d r$r/"
      done
    done
  done
done > "$OUT/dense_time_ab.log"
python3 - "$OUT/dense_time_ab.log" "$A" "$B" <<'PY'
import collections, statistics, sys
log, a, b = sys.argv[1:]
t = collections.defaultdict(list)
for line in open(log):  # "<bin> d128 r1 causal typed groups 2: 0.476 ms ..."
    w = line.split()
    t[(w[1], w[3], w[4], w[6].rstrip(":"), w[0])].append(float(w[7]))
for k in sorted({k[:4] for k in t}):
    ta, tb = t.get(k + (a,)), t.get(k + (b,))
    if not (ta and tb):  # a row only one build has (a new mode): its median alone
        print(*k, f"{a if ta else b} {statistics.median(ta or tb):.3f} ms (one side only)")
        continue
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(*k, f"{a} {ma:.3f} ms  {b} {mb:.3f} ms  {a}/{b} {ma / mb:.3f}")
PY
