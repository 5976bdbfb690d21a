"""python -m fusedattn bench [attention | softmax | small_seq | score_mod | cp_ring | multi] [options]

Benchmarks are programs, not tests (shared/BENCH.md): each subcommand prints a
table whose figures are ratios against anchors measured in the same run, and
writes the rows as JSON with --json. common.py holds the timing method and the
device ceilings every subcommand shares. Without a subcommand: attention.
"""

from __future__ import annotations

import importlib

SUBCOMMANDS = ("attention", "softmax", "small_seq", "score_mod", "cp_ring", "multi")


def main(argv=None) -> int:
    argv = list(argv or [])
    name = "attention"
    if argv and not argv[0].startswith("-"):
        name = argv.pop(0)
    if name not in SUBCOMMANDS:
        print(f"usage: python -m fusedattn bench [{' | '.join(SUBCOMMANDS)}] [options]")
        return 2
    if name == "attention":
        import jax
        if jax.default_backend() == "gpu":
            name = "attention_gpu"  # the GPU grid of BENCH.md; the CPU grid otherwise
    module = importlib.import_module(f"{__name__}.{name}")
    return module.main(argv) or 0
