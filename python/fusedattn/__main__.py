"""python -m fusedattn COMMAND [options]: the main job (demo) and the benchmarks (bench)."""

import sys

COMMANDS = {
    "demo": "the main job: trains a small model with fused_attn inside (demo --help: its options)",
    "bench": "the benchmarks: a table, a summary line, JSON and a PNG (bench --help: the list)",
}


def usage() -> str:
    from .bench import BENCHMARKS
    cmds = "\n".join(f"  {name:6} {what}" for name, what in COMMANDS.items())
    width = max(map(len, BENCHMARKS))
    benches = "\n".join(f"  {name:{width}}  {what}" for name, what in BENCHMARKS.items())
    return (f"usage: python -m fusedattn {{{','.join(COMMANDS)}}} [options]\n\n"
            f"commands:\n{cmds}\n\n"
            f"benchmarks (python -m fusedattn bench NAME [options]; NAME --help for each):\n"
            f"{benches}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        print(f"\nerror: unknown command {argv[0]!r}; allowed: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    if argv[0] == "demo":
        from .demo import main as run
    else:
        from .bench import main as run
    return run(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
