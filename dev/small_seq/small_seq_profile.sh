#!/usr/bin/env bash
# GPU machine: each small-seq kernel's time and DRAM traffic in one forward+backward of the
# bench's THD call (Nsight Compute), for the head dims and kv lengths given:
#   OUT=/tmp/prof bash dev/small_seq/small_seq_profile.sh "128 4" "256 16"
# Prints, per kernel (making the inputs, then two calls): time, DRAM bytes read / written, GB/s.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
source scripts/gpu_env.sh >/dev/null
for point in "$@"; do
  set -- $point
  csv="$OUT/ncu-d$1-skv$2.csv"
  ncu --clock-control none --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    "$PY" dev/small_seq/small_seq_kernels.py --dim "$1" --skv "$2" > "$csv" 2> "$OUT/ncu-d$1-skv$2.err"
  "$PY" - "$csv" "$1" "$2" <<'PYEOF'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
kern = {}
for r in body:
    k = kern.setdefault(int(r[col["ID"]]), {"name": r[col["Kernel Name"]]})
    unit, val = r[col["Metric Unit"]], float(r[col["Metric Value"]].replace(",", ""))
    scale = {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "msecond": 1e-3, "nsecond": 1e-9,
             "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
    k[r[col["Metric Name"]]] = val * scale
ids = sorted(kern)
last = ids  # inputs, then the first (cold) and the second call
print(f"D {sys.argv[2]} Skv {sys.argv[3]}")
for i in last:
    k = kern[i]
    t = k.get("gpu__time_duration.sum", 0)
    rd, wr = k.get("dram__bytes_read.sum", 0), k.get("dram__bytes_write.sum", 0)
    print(f"  {k['name'][:60]:60s} {t * 1e6:9.1f} us  read {rd / 1e6:8.1f} MB  write {wr / 1e6:8.1f} MB"
          f"  {(rd + wr) / max(t, 1e-12) / 1e9:7.0f} GB/s")
PYEOF
done
