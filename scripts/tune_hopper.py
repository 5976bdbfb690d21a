"""Measures where the Hopper flash forward beats cuDNN's forward graph on plain calls and
writes the table select_backend reads (csrc/fusedattn/attention/hopper/measured.h).

Run on an sm_90 GPU with fusedattn installed (scripts/gpu_env.sh), then rebuild:
    python scripts/tune_hopper.py [--out csrc/fusedattn/attention/hopper/measured.h]
The grid is the BENCH one for head dim 128 (bf16, B * S = 16384 tokens, 16 heads):
full, causal and a causal 512-key sliding window at S 1024 ... 16384. Each call is timed
with the forward forced onto each kernel (_lib.set_hopper_fwd "always" / "off") in
alternating rounds of the same compiled function; a row's ratio is the median cuDNN time
over the median Hopper time. select_backend takes the Hopper forward for a call when the
row of its mask class at the largest measured S <= its Sq has ratio >= kMargin (1.02: the
run-to-run spread of the same kernels).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, _lib
from fusedattn.bench.common import time_fn

CLASSES = {"full": (0, AttnMaskType.NO_MASK, None), "causal": (1, AttnMaskType.CAUSAL_MASK, None),
           "window": (2, AttnMaskType.CAUSAL_MASK, (512, 0))}


def measure(name, S, tokens, heads, rounds):
    _, mask, window = CLASSES[name]
    B = max(1, tokens // S)
    ks = jax.random.split(jax.random.PRNGKey(S), 3)
    q, k, v = (jax.random.normal(kk, (B, S, heads, 128), jnp.float32).astype(jnp.bfloat16)
               for kk in ks)
    fn = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                      attn_mask_type=mask, window_size=window))
    times = {"always": [], "off": []}
    for _ in range(rounds):
        for mode in times:
            _lib.set_hopper_fwd(mode)
            before = _lib.hopper_fwd_launches()
            times[mode].append(time_fn(fn, (q, k, v), repeats=3)[0])
            ran = _lib.hopper_fwd_launches() > before
            if ran != (mode == "always"):
                raise SystemExit(f"{name} S {S}: the Hopper forward {'did not run' if not ran else 'ran'}"
                                 f" with set_hopper_fwd({mode!r})")
    _lib.set_hopper_fwd(None)
    hopper, cudnn = statistics.median(times["always"]), statistics.median(times["off"])
    return dict(mask=name, S=S, B=B, H=heads, hopper_ms=hopper * 1e3, cudnn_ms=cudnn * 1e3,
                ratio=cudnn / hopper)


def header(rows, device, date, argv):
    """hopper/measured.h: the rows alone (their types and the rule: hopper/table.h)."""
    names = {"full": "kFull", "causal": "kCausal", "window": "kWindow"}
    lines = [
        "// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward",
        "// graph: written by scripts/tune_hopper.py from its measurement (device, date and command",
        "// below); select_backend reads it by the rule of hopper/table.h.",
        f"// Measured on {device}, {date}: python scripts/tune_hopper.py {' '.join(argv)}".rstrip(),
        "// bf16, head dim 128, B x S = 16384 tokens; ratio = cuDNN's forward time / the Hopper forward's.",
        "#pragma once", "", '#include "fusedattn/attention/hopper/table.h"', "",
        "namespace fusedattn::hopper_rules {", "",
        f'inline constexpr const char* kMeasuredOn = "{device}, {date}";',
        "inline constexpr Measured kMeasured[] = {"]
    for r in rows:
        lines.append(f"    {{{names[r['mask']]}, {r['S']}, {r['ratio']:.3f}}},  // hopper "
                     f"{r['hopper_ms']:.3f} ms, cuDNN {r['cudnn_ms']:.3f} ms")
    lines += ["};", f"inline constexpr int kMeasuredRows = {len(rows)};", "",
              "}  // namespace fusedattn::hopper_rules", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="csrc/fusedattn/attention/hopper/measured.h")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--classes", nargs="+", default=list(CLASSES), choices=list(CLASSES))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    device = jax.devices()[0].device_kind
    if getattr(jax.devices()[0], "compute_capability", "") != "9.0":
        raise SystemExit(f"needs an sm_90 GPU; got {device}")
    date = datetime.date.today().isoformat()
    rows = []
    print(f"{'mask':7} {'S':>6} {'B':>3} | {'hopper ms':>9} {'cudnn ms':>9} | {'ratio':>6}")
    for name in args.classes:
        for S in args.seqlens:
            r = measure(name, S, args.tokens, args.heads, args.rounds)
            rows.append(r)
            print(f"{name:7} {S:6d} {r['B']:3d} | {r['hopper_ms']:9.3f} {r['cudnn_ms']:9.3f} | "
                  f"{r['ratio']:6.3f}", flush=True)
    with open(args.out, "w") as f:
        f.write(header(rows, device, date, argv))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=device, date=date, rows=rows), f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
