"""python -m fusedattn bench attention: fused_attn against jax.nn.dot_product_attention.

Timing method in common.py. FLOPs: forward 4*B*H*Sq*Skv*D (halved when causal with Sq == Skv),
forward+backward 3.5x forward. Peak memory: the process's resident-set high
water mark during the timed calls, above what was resident before them
(Linux /proc/self/clear_refs resets the mark), so the number includes what the
kernels allocate internally, not just XLA's buffers.

Prints a table and writes JSON (--json).
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType

from .common import run_info, time_fn


def attention_flops(B, H, Sq, Skv, D, causal, backward):
    f = 4.0 * B * H * Sq * Skv * D
    if causal and Sq == Skv:
        f /= 2
    return f * (3.5 if backward else 1.0)


def _impls(causal: bool):
    mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK

    def ours(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)

    def xla(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")

    return {"fusedattn": ours, "xla": xla}


def _fwd_bwd(f):
    def loss(q, k, v, dout):
        return jnp.sum(f(q, k, v).astype(jnp.float32) * dout)

    return jax.grad(loss, argnums=(0, 1, 2))


def run_cpu(args):
    B, H, D = args.batch, args.heads, args.head_dim
    rows = []
    key = jax.random.PRNGKey(0)
    for dtype_name in args.dtypes:
        dtype = jnp.dtype(dtype_name)
        for S in args.seqlens:
            ks = jax.random.split(jax.random.fold_in(key, S), 4)
            q, k, v = (jax.random.normal(kk, (B, S, H, D), jnp.float32).astype(dtype)
                       for kk in ks[:3])
            dout = jax.random.normal(ks[3], (B, S, H, D), jnp.float32)
            for causal in (False, True):
                for mode in args.modes:
                    backward = mode == "fwd+bwd"
                    row = dict(dtype=dtype_name, B=B, H=H, S=S, D=D, causal=causal, mode=mode)
                    for name, f in _impls(causal).items():
                        fn = jax.jit(_fwd_bwd(f)) if backward else jax.jit(f)
                        fargs = (q, k, v, dout) if backward else (q, k, v)
                        sec, mem = time_fn(fn, fargs, repeats=args.repeats, track_rss=True)
                        row[f"{name}_ms"] = sec * 1e3
                        row[f"{name}_gflops"] = attention_flops(B, H, S, S, D, causal, backward) / sec / 1e9
                        row[f"{name}_peak_mib"] = mem / 2**20
                    row["speedup"] = row["xla_ms"] / row["fusedattn_ms"]
                    rows.append(row)
                    print(_fmt_row(row), flush=True)
    return rows


_HEADER = (f"{'dtype':9} {'S':>5} {'causal':>6} {'mode':8} | {'ours ms':>9} {'GFLOP/s':>8} "
           f"{'peak MiB':>8} | {'xla ms':>9} {'GFLOP/s':>8} {'peak MiB':>8} | {'speedup':>7}")


def _fmt_row(r):
    return (f"{r['dtype']:9} {r['S']:5d} {str(r['causal']):>6} {r['mode']:8} | "
            f"{r['fusedattn_ms']:9.2f} {r['fusedattn_gflops']:8.1f} {r['fusedattn_peak_mib']:8.0f} | "
            f"{r['xla_ms']:9.2f} {r['xla_gflops']:8.1f} {r['xla_peak_mib']:8.0f} | "
            f"{r['speedup']:6.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the rows to this JSON file")
    args = p.parse_args(argv)

    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print(f"B={args.batch} H={args.heads} D={args.head_dim}; speedup = xla time / ours")
    print(_HEADER)
    rows = run_cpu(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(info=info, rows=rows), f, indent=1)
    return 0
