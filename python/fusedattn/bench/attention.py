"""python -m fusedattn bench attention: fused_attn against jax.nn.dot_product_attention.

Cases (--cases):
  plain   BSHD, causal and not (the CPU table of bench/RESULTS.md)
  thd     THD_THD_THD rows packed with ragged causal segments (PADDING_CAUSAL_MASK); the
          anchors get the same block-diagonal causal mask as a boolean mask argument
  window  causal sliding window (--window keys to the left); anchors use local_window_size
This is the CPU grid; on a GPU, `bench attention` runs attention_gpu.py (BENCH.md's grid).

Timing method in common.py. FLOPs count the kept (query, key) pairs: 4*D*H per pair
forward (the dense causal Sq == Skv case is the usual half of 4*B*H*S*S*D), forward+backward
3.5x forward; every implementation of a row is credited with the same count. Peak memory
(CPU): the process's resident-set high water mark during the timed calls, above what was
resident before them (Linux /proc/self/clear_refs resets the mark), so the number includes
what the kernels allocate internally, not just XLA's buffers.

--clock process times CPU seconds per call instead of wall time (common.cpu_time_fn): for
comparing two builds on a shared, loaded machine; its GFLOP/s are work rates, not speeds.

Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor

from . import report
from .common import cpu_time_fn, run_info, time_fn


@dataclasses.dataclass(frozen=True)
class Row:
    case: str
    dtype: str
    B: int
    S: int
    H: int
    Hkv: int
    D: int
    causal: bool
    window: int = -1


def thd_segments(S: int, seed: int) -> list[int]:
    """Ragged segment lengths that fill a row of S tokens: uniform in [S/16, S/2]."""
    rng = np.random.default_rng(seed)
    lens, total = [], 0
    while total < S:
        n = int(min(rng.integers(max(S // 16, 1), max(S // 2, 2) + 1), S - total))
        lens.append(n)
        total += n
    return lens


def kept_pairs(row: Row, segments=None) -> float:
    """(query, key) pairs the mask keeps, summed over the batch."""
    S = row.S
    if row.case == "thd":
        return row.B * sum(n * (n + 1) / 2 for n in segments)
    if row.case == "window":
        i = np.arange(S)
        return row.B * float(np.minimum(i + 1, row.window + 1).sum())
    return row.B * (S * (S + 1) / 2 if row.causal else S * S)


def _impls(row: Row, segments, anchors):
    """name -> f(q, k, v, *extra), and the extra arrays the anchors need."""
    causal_mask = AttnMaskType.CAUSAL_MASK if row.causal else AttnMaskType.NO_MASK
    extra = ()
    if row.case == "thd":
        ids = np.repeat(np.arange(1, len(segments) + 1), segments)
        sd = SequenceDescriptor.from_seqlens(jnp.array([segments] * row.B, jnp.int32))
        mask = (ids[:, None] == ids[None, :]) & np.tril(np.ones((row.S, row.S), bool))
        extra = (jnp.asarray(mask[None, None]),)

        def ours(q, k, v, mask):
            return fusedattn.fused_attn((q, k, v), None, sd, None, qkv_layout=QKVLayout.THD_THD_THD,
                                        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                                        max_segments_per_seq=len(segments))

        def anchor(impl):
            return lambda q, k, v, mask: jax.nn.dot_product_attention(q, k, v, mask=mask,
                                                                      implementation=impl)
    elif row.case == "window":
        def ours(q, k, v):
            return fusedattn.fused_attn((q, k, v), None, None, None,
                                        attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                        window_size=(row.window, 0))

        def anchor(impl):
            return lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, is_causal=True, local_window_size=(row.window, 0), implementation=impl)
    else:
        def ours(q, k, v):
            return fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=causal_mask)

        def anchor(impl):
            return lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=row.causal,
                                                                implementation=impl)
    impls = {"fusedattn": ours}
    for a in anchors:
        impls[a] = anchor(a)
    return impls, extra


def _fwd_bwd(f):
    def loss(q, k, v, dout, *extra):
        return jnp.sum(f(q, k, v, *extra).astype(jnp.float32) * dout)

    return jax.grad(loss, argnums=(0, 1, 2))


def grid(args):
    rows = []
    for case in args.cases:
        for dtype in args.dtypes:
            for S in args.seqlens or (512, 1024, 2048, 4096):
                if case == "plain":
                    rows += [Row("plain", dtype, args.batch, S, args.heads, args.heads,
                                 args.head_dim, c) for c in (False, True)]
                elif case == "thd":
                    rows.append(Row("thd", dtype, args.batch, S, args.heads, args.heads,
                                    args.head_dim, True))
                else:
                    rows.append(Row("window", dtype, args.batch, S, args.heads, args.heads,
                                    args.head_dim, True, args.window))
    return rows


def run(args):
    anchors = ("xla",)
    print(_header(anchors))
    results = []
    for row in grid(args):
        dtype = jnp.dtype(row.dtype)
        segments = thd_segments(row.S, row.S) if row.case == "thd" else None
        ks = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), row.S), 4)
        q = jax.random.normal(ks[0], (row.B, row.S, row.H, row.D), jnp.float32).astype(dtype)
        k, v = (jax.random.normal(kk, (row.B, row.S, row.Hkv, row.D), jnp.float32).astype(dtype)
                for kk in ks[1:3])
        dout = jax.random.normal(ks[3], (row.B, row.S, row.H, row.D), jnp.float32)
        impls, extra = _impls(row, segments, anchors)
        flops = 4.0 * row.D * row.H * kept_pairs(row, segments)
        for mode in args.modes:
            backward = mode == "fwd+bwd"
            r = dict(dataclasses.asdict(row), mode=mode,
                     segments=len(segments) if segments else None)
            for name, f in impls.items():
                fn = jax.jit(_fwd_bwd(f)) if backward else jax.jit(f)
                fargs = (q, k, v, dout, *extra) if backward else (q, k, v, *extra)
                try:
                    if args.clock == "process":
                        sec, mem = cpu_time_fn(fn, fargs, repeats=args.repeats)
                    else:
                        sec, mem = time_fn(fn, fargs, repeats=args.repeats, track_rss=True)
                except Exception as e:  # an anchor that does not serve this row
                    r[f"{name}_error"] = str(e).splitlines()[0][:120]
                    continue
                r[f"{name}_ms"] = sec * 1e3
                r[f"{name}_gflops"] = flops * (3.5 if backward else 1.0) / sec / 1e9
                r[f"{name}_peak_mib"] = mem / 2**20
            for a in anchors:
                if f"{a}_ms" in r and "fusedattn_ms" in r:
                    r[f"speedup_vs_{a}"] = r[f"{a}_ms"] / r["fusedattn_ms"]
            results.append(r)
            print(_fmt_row(r, anchors), flush=True)
    return results


def _header(anchors):
    cols = " | ".join(f"{n + ' ms':>10} {'GFLOP/s':>9} {'MiB':>6}" for n in ("ours",) + anchors)
    return (f"{'case':6} {'dtype':9} {'B':>3} {'S':>6} {'H':>4}/{'Hkv':<3} {'D':>4} {'causal':>6} "
            f"{'win':>4} {'mode':8} | {cols} | " + " ".join(f"{'x' + a:>7}" for a in anchors))


def _fmt_row(r, anchors):
    def cell(n):
        if f"{n}_ms" not in r:
            return f"{'n/a':>10} {'':>9} {'':>6}"
        return f"{r[f'{n}_ms']:10.2f} {r[f'{n}_gflops']:9.1f} {r[f'{n}_peak_mib']:6.0f}"
    cols = " | ".join(cell(n) for n in ("fusedattn",) + anchors)
    speed = " ".join(f"{r.get(f'speedup_vs_{a}', float('nan')):6.2f}x" for a in anchors)
    return (f"{r['case']:6} {r['dtype']:9} {r['B']:3d} {r['S']:6d} {r['H']:4d}/{r['Hkv']:<3d} "
            f"{r['D']:4d} {str(r['causal']):>6} {r['window']:4d} {r['mode']:8} | {cols} | {speed}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["plain"], choices=["plain", "thd", "window"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--window", type=int, default=256, help="keys to the left (window case)")
    p.add_argument("--seqlens", type=int, nargs="+", default=None,
                   help="default: 512 1024 2048 4096")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], help="CPU grid only")
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="process: CPU seconds per call, min of the repeats (common.cpu_time_fn); "
                        "steady on a loaded machine, for before/after comparisons")
    report.add_output_args(p)
    args = p.parse_args(argv)

    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print("speedup x<anchor> = anchor time / ours; FLOPs count kept (query, key) pairs")
    rows = run(args)
    report.finish("attention", args, dict(info=info, rows=rows), rows,
                  {"fusedattn vs jax xla": "speedup_vs_xla"}, row_label)
    return 0


def row_label(r) -> str:
    win = f" w{r['window']}" if r["window"] >= 0 else ""
    return (f"{r['case']} {r['dtype']} S{r['S']}{' causal' if r['causal'] else ''}{win} "
            f"{r['mode']}")
