"""python -m fusedattn bench [NAME] [options]: the benchmarks (NAME below; default attention).

Benchmarks are programs, not tests (docs/BENCH.md): each prints a table whose figures are
ratios against anchors measured in the same run, then a one-line summary (the geometric mean
of each ratio), and writes the rows as JSON and the ratios as a PNG (report.py; default
directory bench_out/). common.py holds the timing method and the device ceilings.
`python -m fusedattn bench NAME --help` lists a benchmark's options.
"""

from __future__ import annotations

import importlib
import sys

# name -> what it measures (one line each, for --help).
BENCHMARKS = {
    "attention": "fused_attn vs jax.nn.dot_product_attention (xla; cudnn on a GPU), fwd and fwd+bwd",
    "softmax": "fusedattn.softmax vs XLA's softmax of the same semantics, with the copy bandwidth",
    "small_seq": "small-sequence cross attention vs jax xla / cudnn and fused_attn, bytes-based",
    "score_mod": "flex attention (softcap, ALiBi) vs plain fused_attn and vs XLA's materialized scores",
    "fallback": "the calls cuDNN declines (f32, PRE_SCALE bias, D 512, score_mod + bias) vs XLA, cuDNN",
    "dense_mask": "a causal / window mask passed densely vs the same mask type, and vs jax xla",
    "cp_ring": "the context-parallel ring's schedule simulated on one device (efficiency, speedup)",
    "deterministic": "deterministic mode's backward vs the default one and jax cudnn (bitwise repeat checked)",
    "multi": "fused_attn sharded over every local device (dp, tp, cp) vs one device",
}
SUBCOMMANDS = tuple(BENCHMARKS)


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"  {name:{width}}  {what}" for name, what in BENCHMARKS.items()]
    return ("usage: python -m fusedattn bench [NAME] [options]   (NAME default: attention)\n\n"
            "benchmarks:\n" + "\n".join(lines) + "\n\n"
            "Each prints a table, then a summary line (geomean of anchor time / fusedattn time),\n"
            "and writes bench_out/bench-NAME.json and .png (--out-dir DIR, --json PATH, --no-plot).\n"
            "python -m fusedattn bench NAME --help lists its options.")


def main(argv=None) -> int:
    argv = list(argv or [])
    if argv and argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name = "attention"
    if argv and not argv[0].startswith("-"):
        name = argv.pop(0)
    if name not in BENCHMARKS:
        print(usage(), file=sys.stderr)
        print(f"\nerror: unknown benchmark {name!r}; allowed: {', '.join(BENCHMARKS)}",
              file=sys.stderr)
        return 2
    if name == "attention":
        import jax
        if jax.default_backend() == "gpu":
            name = "attention_gpu"  # the GPU grid of docs/BENCH.md; the CPU grid otherwise
    module = importlib.import_module(f"{__name__}.{name}")
    return module.main(argv) or 0
