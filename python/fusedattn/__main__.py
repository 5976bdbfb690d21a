"""python -m fusedattn {demo, bench} [options]"""

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ("demo", "bench")
    if not argv or argv[0] not in commands:
        print(f"usage: python -m fusedattn {{{', '.join(commands)}}} [options]  (--help for each)")
        return 2
    if argv[0] == "demo":
        from .demo import main as run
    else:
        from .bench import main as run
    return run(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
