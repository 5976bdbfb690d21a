"""What every benchmark writes at its end: the JSON of its rows, a PNG of its ratios and one
summary line (the geometric mean of each ratio against an anchor over the rows).

A ratio is always anchor time / fusedattn time (> 1: fusedattn is faster), so rows of any
size weigh alike in the geometric mean. Files go to --out-dir (default bench_out/ under the
current directory) as bench-<name>.json and bench-<name>.png; --json PATH names the JSON
file instead, and the PNG goes beside it (PATH with .png); --no-plot skips the PNG. The PNG needs matplotlib (Agg: no display); without
it a line says the plot was skipped.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Mapping, Sequence

DEFAULT_OUT_DIR = "bench_out"


def add_output_args(parser, *json_aliases: str) -> None:
    """--out-dir, --json (and json_aliases of it) and --no-plot, the same for every benchmark."""
    parser.add_argument("--out-dir", default=DEFAULT_OUT_DIR,
                        help=f"where bench-<name>.json and .png go (default: {DEFAULT_OUT_DIR}/)")
    parser.add_argument("--json", *json_aliases, dest="json",
                        help="write the JSON here instead (the PNG beside it, .png)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _values(rows, key):
    return [float(r[key]) for r in rows
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and r[key] > 0]


def summarize(rows: Sequence[Mapping], ratios: Mapping[str, str]) -> dict:
    """ratios: label ("fusedattn / jax xla") -> the rows' key holding that ratio. -> label ->
    {geomean, min, max, rows}, for the labels some row has a ratio for."""
    out = {}
    for label, key in ratios.items():
        vals = _values(rows, key)
        if vals:
            out[label] = dict(key=key, geomean=geomean(vals), min=min(vals), max=max(vals),
                              rows=len(vals))
    return out


def summary_line(summary: Mapping[str, Mapping]) -> str:
    if not summary:
        return "summary: no ratio to report (no row has one: see the table)"
    parts = [f"{label} geomean {s['geomean']:.2f}x over {s['rows']} rows "
             f"(min {s['min']:.2f}x, max {s['max']:.2f}x)" for label, s in summary.items()]
    return "summary: " + "; ".join(parts) + " [anchor time / fusedattn time: > 1 is faster]"


def plot(path: str, title: str, rows: Sequence[Mapping], ratios: Mapping[str, str],
         label: Callable[[Mapping], str]) -> str:
    """A bar per (row, ratio), log scale, a line at 1. -> the line to print."""
    try:
        import matplotlib
    except ImportError:
        return "plot: skipped (matplotlib is not installed; pip install matplotlib)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(name, key) for name, key in ratios.items() if _values(rows, key)]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows) * max(len(keys), 1) + 2), 4.5))
    width = 0.8 / max(len(keys), 1)
    for j, (name, key) in enumerate(keys):
        xs = [i + (j - (len(keys) - 1) / 2) * width for i in range(len(rows))]
        ys = [r.get(key) if isinstance(r.get(key), (int, float)) and r.get(key) > 0 else 0.0
              for r in rows]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    if keys:
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(rows)), [label(r) for r in rows], rotation=90, fontsize=7)
    ax.set_ylabel("anchor time / fusedattn time")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def finish(name: str, args, payload: dict, rows: Sequence[Mapping], ratios: Mapping[str, str],
           label: Callable[[Mapping], str]) -> dict:
    """Writes the JSON (payload plus the summary) and the PNG, prints where, and prints the
    summary line last. -> the summary."""
    summary = summarize(rows, ratios)
    path = args.json or os.path.join(args.out_dir, f"bench-{name}.json")
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(payload, summary=summary), f, indent=1)
    print(f"json: {path}")
    if not args.no_plot:
        info = payload.get("info") or payload.get("run") or {}
        title = f"bench {name}: {info.get('device', '')} {info.get('date', '')}".strip()
        print(plot(os.path.splitext(path)[0] + ".png", title, rows, ratios, label))
    print(summary_line(summary), flush=True)
    return summary
