"""Measures where the Hopper flash forward (--backward: backward) beats cuDNN's on plain calls
and writes the table select_backend reads (csrc/fusedattn/attention/hopper/measured.h;
measured_bwd.h).

Run on an sm_90 GPU with fusedattn installed (scripts/gpu_env.sh), then rebuild:
    python scripts/tune_hopper.py [--out csrc/fusedattn/attention/hopper/measured.h]
    python scripts/tune_hopper.py --classes thd --merge   # one class again, the rest kept
    python scripts/tune_hopper.py --head-dims 64 --merge  # one head dim again
    python scripts/tune_hopper.py --backward             # the backward's table (head dims 64, 128)
The grid is the BENCH one for head dims 64, 128 and 256 (bf16, B * S = 16384 tokens, 2048 / D heads):
full, causal, a causal 512-key sliding window, and THD (rows packed with ragged causal
segments of S/16 .. S/2 tokens, the bench's) at S 1024 ... 16384. Each call is timed
with the forward forced onto each kernel (_lib.set_hopper_fwd "always" / "off") in
alternating rounds of the same compiled function; a row's ratio is the median cuDNN time
over the median Hopper time. select_backend takes the Hopper forward for a call when the
row of its mask class and head dim at the largest measured S <= its Sq has ratio >= kMargin
(1.02: the run-to-run spread of the same kernels). --backward times forward + backward (jax.grad
of sum(out * dout), the forward left to its measured choice) with the backward forced onto each
kernel (_lib.set_hopper_bwd), over full, causal and window calls.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor, _lib
from fusedattn.bench.attention import thd_segments
from fusedattn.bench.common import time_fn

CLASSES = {"full": (0, AttnMaskType.NO_MASK, None), "causal": (1, AttnMaskType.CAUSAL_MASK, None),
           "window": (2, AttnMaskType.CAUSAL_MASK, (512, 0)),
           "thd": (3, AttnMaskType.PADDING_CAUSAL_MASK, None)}
NAMES = {"full": "kFull", "causal": "kCausal", "window": "kWindow", "thd": "kThd"}


def measure(name, D, S, tokens, heads, rounds, backward=False):
    _, mask, window = CLASSES[name]
    B = max(1, tokens // S)
    heads = heads or 2048 // D
    ks = jax.random.split(jax.random.PRNGKey(S), 3)
    q, k, v = (jax.random.normal(kk, (B, S, heads, D), jnp.float32).astype(jnp.bfloat16)
               for kk in ks)
    kw = {}
    if name == "thd":
        segments = thd_segments(S, S)
        kw = dict(qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=len(segments))
        sd = SequenceDescriptor.from_seqlens(jnp.array([segments] * B, jnp.int32))
    else:
        sd = None
    attn = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask,
                                                window_size=window, **kw)
    if backward:
        dout = jax.random.normal(jax.random.PRNGKey(S + 1), q.shape, jnp.float32).astype(jnp.bfloat16)
        loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
        fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    else:
        fn = jax.jit(attn)
    setter, launches = ((_lib.set_hopper_bwd, _lib.hopper_bwd_launches) if backward
                        else (_lib.set_hopper_fwd, _lib.hopper_fwd_launches))
    what = "backward" if backward else "forward"
    times = {"always": [], "off": []}
    for _ in range(rounds):
        for mode in times:
            setter(mode)
            before = launches()
            times[mode].append(time_fn(fn, (q, k, v), repeats=3)[0])
            ran = launches() > before
            if ran != (mode == "always"):
                raise SystemExit(f"{name} D {D} S {S}: the Hopper {what} {'did not run' if not ran else 'ran'}"
                                 f" with set_hopper_{what[:3]}({mode!r})")
    setter(None)
    hopper, cudnn = statistics.median(times["always"]), statistics.median(times["off"])
    return dict(mask=name, D=D, S=S, B=B, H=heads, hopper_ms=hopper * 1e3, cudnn_ms=cudnn * 1e3,
                ratio=cudnn / hopper)


def header(rows, device, date, argv, backward=False):
    """hopper/measured.h (measured_bwd.h): the rows alone (their types and the rule:
    hopper/table.h)."""
    what, sfx = ("backward", "Bwd") if backward else ("forward", "")
    ratio = ("cuDNN's forward+backward time / with the Hopper backward (the same forward)" if backward
             else "cuDNN's forward time / the Hopper forward's")
    lines = [
        f"// Where the Hopper flash {what} runs plain calls (no score_mod) faster than cuDNN's {what}",
        "// graph: written by scripts/tune_hopper.py from its measurement (device, date and command",
        "// below); select_backend reads it by the rule of hopper/table.h.",
        f"// Measured on {device}, {date}: python scripts/tune_hopper.py {' '.join(argv)}".rstrip(),
        f"// bf16, B x S = 16384 tokens, 2048 / D heads; ratio = {ratio}.",
        "#pragma once", "", '#include "fusedattn/attention/hopper/table.h"', "",
        "namespace fusedattn::hopper_rules {", "",
        f'inline constexpr const char* kMeasured{sfx}On = "{device}, {date}";',
        f"inline constexpr Measured kMeasured{sfx}[] = {{"]
    for r in rows:
        lines.append(f"    {{{NAMES[r['mask']]}, {r['D']}, {r['S']}, {r['ratio']:.3f}}},  // hopper "
                     f"{r['hopper_ms']:.3f} ms, cuDNN {r['cudnn_ms']:.3f} ms"
                     + (f" ({r['on']})" if r.get("on") else ""))
    lines += ["};", f"inline constexpr int kMeasured{sfx}Rows = {len(rows)};", "",
              "}  // namespace fusedattn::hopper_rules", ""]
    return "\n".join(lines)


ROW = re.compile(r"\{(k\w+), (\d+), (\d+), ([\d.]+)\},\s*// hopper ([\d.]+) ms, cuDNN ([\d.]+) ms"
                 r"(?: \((.*)\))?")


def kept_rows(path, device, date, measured):
    """The rows of path's table whose (class, head dim) is not in `measured` now, each
    naming the device and date it was measured on (--merge)."""
    try:
        text = open(path).read()
    except FileNotFoundError:
        return []
    on = re.search(r'kMeasured(?:Bwd)?On = "(.*)";', text)
    on = on.group(1) if on else "?"
    by_name = {v: k for k, v in NAMES.items()}
    rows = []
    for m in ROW.finditer(text):
        name, D = by_name[m.group(1)], int(m.group(2))
        if (name, D) in measured:
            continue
        rows.append(dict(mask=name, D=D, S=int(m.group(3)), ratio=float(m.group(4)),
                         hopper_ms=float(m.group(5)), cudnn_ms=float(m.group(6)),
                         on=m.group(7) or (on if on != f"{device}, {date}" else None)))
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backward", action="store_true",
                   help="the backward's table (measured_bwd.h): head dims 64, 128 and 256, no THD")
    p.add_argument("--out", default=None, help="default hopper/measured.h (measured_bwd.h)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--classes", nargs="+", default=None, choices=list(CLASSES))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--head-dims", type=int, nargs="+", default=None, choices=[64, 128, 256])
    p.add_argument("--heads", type=int, default=None, help="default 2048 / head dim")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of --out for the classes not measured now")
    args = p.parse_args(argv)
    args.out = args.out or ("csrc/fusedattn/attention/hopper/measured_bwd.h" if args.backward
                            else "csrc/fusedattn/attention/hopper/measured.h")
    args.classes = args.classes or (["full", "causal", "window"] if args.backward else list(CLASSES))
    args.head_dims = args.head_dims or ([64, 128] if args.backward else [64, 128, 256])
    if args.backward and "thd" in args.classes:
        raise SystemExit("--backward: the Hopper backward takes no THD")
    device = jax.devices()[0].device_kind
    if getattr(jax.devices()[0], "compute_capability", "") != "9.0":
        raise SystemExit(f"needs an sm_90 GPU; got {device}")
    date = datetime.date.today().isoformat()
    measured = {(c, D) for c in args.classes for D in args.head_dims}
    rows = kept_rows(args.out, device, date, measured) if args.merge else []
    print(f"{'mask':7} {'D':>3} {'S':>6} {'B':>3} | {'hopper ms':>9} {'cudnn ms':>9} | {'ratio':>6}")
    for D in args.head_dims:
        for name in args.classes:
            for S in args.seqlens:
                r = measure(name, D, S, args.tokens, args.heads, args.rounds, args.backward)
                rows.append(r)
                print(f"{name:7} {D:3d} {S:6d} {r['B']:3d} | {r['hopper_ms']:9.3f} {r['cudnn_ms']:9.3f} | "
                      f"{r['ratio']:6.3f}", flush=True)
                rows.sort(key=lambda r: (r["D"], list(NAMES).index(r["mask"]), r["S"]))
                with open(args.out, "w") as f:  # after each row: a run cut short keeps them
                    f.write(header(rows, device, date, argv, args.backward))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, date=date, rows=rows), f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
