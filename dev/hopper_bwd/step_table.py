"""Reads ncu CSV logs (--metrics gpu__time_duration.sum --csv --log-file X.csv) of a program that
repeats one kernel sequence REPS times (step_kernels.py; bwd_time with --launch-skip/--launch-count)
and prints each position's median time and the sequence's total.
  python dev/hopper_bwd/step_table.py REPS X.csv [Y.csv ...]"""
import csv
import statistics
import sys

UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}


def rows(path):
    with open(path) as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return []
    out = []
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        out.append((r["Kernel Name"], value * UNITS.get(r["Metric Unit"], 1e-6)))
    return out


def main():
    reps = int(sys.argv[1])
    for path in sys.argv[2:]:
        rs = rows(path)
        print(f"== {path}: {len(rs)} kernels")
        if not rs or len(rs) % reps:
            print("   (not a whole number of repeats)")
            continue
        n = len(rs) // reps
        total = 0.0
        for i in range(n):
            t = statistics.median(rs[i + j * n][1] for j in range(reps))
            total += t
            print(f"   {t:8.4f} ms  {rs[i][0][:90]}")
        print(f"   {total:8.4f} ms  total")


main()
