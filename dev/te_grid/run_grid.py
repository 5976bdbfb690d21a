"""Runs TransformerEngine's whole attention test grid on fusedattn (the shared code:
tests/python/attention/te_grid.py; README.md beside this file has what it showed).

    PYTHONPATH=<fusedattn's site> python dev/te_grid/run_grid.py [--test backward|forward|both]
        [--shard I/N] [--limit N] [--out results.jsonl] [-v]

Prints the counts (cases, TE's own skips, calls, rejected with their messages grouped,
mismatched with the failed check, passed) and, with --out, one JSON line per case.
--shard I/N runs every N-th case from the I-th (several processes; merge their --out files
with --merge a.jsonl b.jsonl ...).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python", "attention"))

import te_grid  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test", choices=["backward", "forward", "both"], default="backward")
    ap.add_argument("--shard", default="0/1", help="I/N: every N-th case from the I-th")
    ap.add_argument("--limit", type=int, default=None, help="at most N cases (after --shard)")
    ap.add_argument("--out", help="write one JSON line per case here")
    ap.add_argument("--merge", nargs="+", help="summarize these --out files instead of running")
    ap.add_argument("--skip-done", nargs="+", default=[],
                    help="skip the cases these --out files hold (to resume a stopped run)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = ap.parse_args()
    by_id = {c.id: c for t in ("backward", "forward") for c in te_grid.cases(t)}
    if args.merge:
        results = []
        for path in args.merge:
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    results.append((by_id[r["id"]], r["status"], r["detail"]))
        print(te_grid.summarize(results))
        return
    tests = ["backward", "forward"] if args.test == "both" else [args.test]
    todo = [c for t in tests for c in te_grid.cases(t)]
    i, n = (int(x) for x in args.shard.split("/"))
    done = set()
    for path in args.skip_done:
        with open(path) as f:
            done.update(json.loads(line)["id"] for line in f if line.strip())
    todo = [c for c in todo[i::n] if c.id not in done][:args.limit]
    out = open(args.out, "w") if args.out else None
    results, start = [], time.time()
    for k, case in enumerate(todo):
        status, detail = te_grid.outcome(case)
        results.append((case, status, detail))
        if out:
            out.write(json.dumps(dict(id=case.id, status=status, detail=detail)) + "\n")
            out.flush()
        if args.verbose or status in ("rejected", "mismatched"):
            print(f"[{k + 1}/{len(todo)} {time.time() - start:.0f}s] {status} {case.id}"
                  + (f": {detail}" if detail and status != "skipped" else ""), flush=True)
    print(te_grid.summarize(results))
    print(f"{time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
