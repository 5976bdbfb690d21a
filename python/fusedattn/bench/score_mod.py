"""python -m fusedattn bench score_mod: flex attention (score_mod) beside plain attention.

docs/BENCH.md's flex grid: softcap (tanh(s / 50) * 50) and ALiBi (per-head slopes) at
head dim 128 (--head-dims), causal, forward and forward+backward, beside fused_attn without
score_mod (the same mask) and beside XLA running the same fn on materialized scores (the
reference path). The GPU grid is S 4096 and 16384 (--seqlens; B * S = 16384 tokens, H = 2048
/ D, bf16); the CPU grid is smaller (B = 1, H = 4, S 512 and 1024, float32). ratio_plain =
plain time / score_mod time (goal on the GPU: >= 0.85; issue 25's for softcap and ALiBi
forward+backward: >= 0.95); vs_xla = XLA time / ours (goal: >= 3). Where the Hopper
backward runs a score_mod's gradients, its forward+backward is timed again with it off
(cuDNN's backward: the <name>_cudnn_bwd columns, the same run's anchor for that kernel).
Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from fusedattn import AttnMaskType, _lib

from . import report
from .common import run_info, time_fn


def softcap(s, b, h, q, k):
    return jnp.tanh(s / 50.0) * 50.0


def alibi(s, b, h, q, k, slopes):
    return s - slopes * (q - k).astype(jnp.float32)


def _cases(gpu, head_dims, seqlens):
    if gpu:
        return [dict(S=S, B=max(1, 16384 // S), H=2048 // D, D=D, dtype=jnp.bfloat16)
                for D in head_dims for S in (seqlens or (4096, 16384))]
    return [dict(S=S, B=1, H=4, D=D, dtype=jnp.float32) for D in head_dims
            for S in (seqlens or (512, 1024))]


def _impls(c):
    H = c["H"]
    slopes = jnp.exp2(-8.0 * jnp.arange(1, H + 1, dtype=jnp.float32) / H).reshape(1, H, 1, 1)
    mods = {"softcap": (softcap, ()), "alibi": (alibi, (slopes,))}
    causal = AttnMaskType.CAUSAL_MASK

    def plain(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=causal)

    out = {"plain": plain}
    for name, (fn, ops) in mods.items():
        out[name] = lambda q, k, v, fn=fn, ops=ops: fusedattn.fused_attn(
            (q, k, v), None, None, None, attn_mask_type=causal, score_mod=fn,
            score_mod_operands=ops)
        out[f"{name}_xla"] = lambda q, k, v, fn=fn, ops=ops: _xla(q, k, v, fn, ops)
    return out


def _xla(q, k, v, fn, ops):
    """The same attention in plain XLA: scores materialized, fn applied over the grid."""
    from fusedattn import score_mod as sm
    B, S, H, D = q.shape
    m, arrays4 = sm.make_score_mod(fn, ops, None, (B, H, S, S))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * D ** -0.5
    s = sm.apply_reference(m.fn, s, arrays4)
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def run(args):
    gpu = jax.default_backend() == "gpu"
    rows = []
    for i, c in enumerate(_cases(gpu, args.head_dims, args.seqlens)):
        ks = jax.random.split(jax.random.PRNGKey(i), 4)
        shape = (c["B"], c["S"], c["H"], c["D"])
        q, k, v, do = (jax.random.normal(kk, shape, jnp.float32).astype(c["dtype"]) for kk in ks)
        for mode in args.modes:
            row = dict(S=c["S"], B=c["B"], H=c["H"], D=c["D"], dtype=jnp.dtype(c["dtype"]).name,
                       mode=mode)
            for name, f in _impls(c).items():
                if name.endswith("_xla") and c["S"] > args.xla_max_seq:
                    continue
                if mode == "fwd+bwd":  # do is an argument: a constant would be folded
                    loss = lambda q, k, v, do, f=f: jnp.sum(f(q, k, v).astype(jnp.float32) * do)
                    fn, fargs = jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v, do)
                else:
                    fn, fargs = jax.jit(f), (q, k, v)
                launches, bwd_launches = _lib.hopper_fwd_launches(), _lib.hopper_bwd_launches()
                row[f"{name}_ms"] = time_fn(fn, fargs, repeats=args.repeats)[0] * 1e3
                # whether its forward / backward ran fusedattn's Hopper kernels (attention/hopper)
                row[f"{name}_hopper_fwd"] = _lib.hopper_fwd_launches() > launches
                row[f"{name}_hopper_bwd"] = _lib.hopper_bwd_launches() > bwd_launches
                if name in ("softcap", "alibi") and row[f"{name}_hopper_bwd"]:
                    _lib.set_hopper_bwd("off")  # the same compiled function, cuDNN's backward
                    try:
                        row[f"{name}_cudnn_bwd_ms"] = time_fn(fn, fargs, repeats=args.repeats)[0] * 1e3
                    finally:
                        _lib.set_hopper_bwd(None)
            slopes = jnp.ones((1, c["H"], 1, 1), jnp.float32)
            for name, fn_, ops in (("softcap", softcap, ()), ("alibi", alibi, (slopes,))):
                # which backend ran it (a fallback to the reference must show in the table)
                row[f"{name}_backend"] = fusedattn.get_backend(
                    (q, k, v), attn_mask_type=AttnMaskType.CAUSAL_MASK, score_mod=fn_,
                    score_mod_operands=ops, is_training=mode != "fwd").name
            for name in ("softcap", "alibi"):
                if f"{name}_cudnn_bwd_ms" in row:
                    row[f"{name}_vs_cudnn_bwd"] = row[f"{name}_cudnn_bwd_ms"] / row[f"{name}_ms"]
                row[f"{name}_vs_plain"] = row["plain_ms"] / row[f"{name}_ms"]
                if f"{name}_xla_ms" in row:
                    row[f"{name}_vs_xla"] = row[f"{name}_xla_ms"] / row[f"{name}_ms"]
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


def _fmt(r):
    g = lambda k, f="{:.2f}": f.format(r[k]) if k in r else "-"
    # the backend get_backend names, and "fwd hopper" when the forward ran attention/hopper
    b = lambda n: (r.get(f"{n}_backend", "-") + (", fwd hopper" if r.get(f"{n}_hopper_fwd") else "")
                   + (", bwd hopper" if r.get(f"{n}_hopper_bwd") else ""))
    cudnn_bwd = lambda n: (f"; with cuDNN's backward {g(n + '_cudnn_bwd_ms')} ms, "
                           f"{g(n + '_vs_cudnn_bwd')}x" if f"{n}_cudnn_bwd_ms" in r else "")
    return (f"D {r['D']:3d} S {r['S']:6d} B {r['B']:3d} {r['mode']:8} | plain {g('plain_ms')} ms | "
            f"softcap [{b('softcap')}] {g('softcap_ms')} ms ({g('softcap_vs_plain')}x "
            f"plain, {g('softcap_vs_xla')}x xla{cudnn_bwd('softcap')}) | alibi [{b('alibi')}] "
            f"{g('alibi_ms')} ms ({g('alibi_vs_plain')}x plain, {g('alibi_vs_xla')}x xla"
            f"{cudnn_bwd('alibi')})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench score_mod", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--xla-max-seq", type=int, default=4096)
    p.add_argument("--head-dims", nargs="+", type=int, default=[128])
    p.add_argument("--seqlens", nargs="+", type=int, default=None,
                   help="default: 4096 16384 on the GPU, 512 1024 on the CPU")
    report.add_output_args(p)
    args = p.parse_args(argv)
    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    rows = run(args)
    report.finish("score_mod", args, dict(info=info, rows=rows), rows,
                  {"softcap vs plain fused_attn": "softcap_vs_plain",
                   "alibi vs plain fused_attn": "alibi_vs_plain",
                   "softcap vs xla": "softcap_vs_xla", "alibi vs xla": "alibi_vs_xla",
                   "softcap: Hopper backward vs cuDNN's": "softcap_vs_cudnn_bwd",
                   "alibi: Hopper backward vs cuDNN's": "alibi_vs_cudnn_bwd"},
                  lambda r: f"D{r['D']} S{r['S']} B{r['B']} {r['mode']}")
    return 0
