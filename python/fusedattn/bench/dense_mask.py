"""python -m fusedattn bench dense_mask: a mask passed densely against the same mask as a type.

Model libraries pass causal, sliding-window and padding masks as one dense boolean array
(jax.nn.dot_product_attention(mask=...)). fusedattn.dot_product_attention folds it into a
bias and tells the engine so (_lib.REQUEST_MASK_BIAS): the CPU engine drops the masked keys
and skips the key tiles a mask empties. Each row times, on the same inputs, forward and
forward+backward (gradients of q, k, v):
  dense   fusedattn.dot_product_attention(mask=the dense mask)
  typed   the same call with the mask type (is_causal=True, local_window_size=(W, 0); padding:
          is_causal=True with query and key lengths)
  jax     jax.nn.dot_product_attention(mask=the dense mask, implementation="xla")
ratio typed / dense (the issue's goal: the dense mask at most 1.3x the type's time, i.e.
>= 0.77) and jax / dense (> 1: fusedattn is faster). Defaults: B 1, S 2048 (--seq), H 8,
D 64 (--batch, --heads, --head-dim), float32 on the CPU (bf16 with --dtype bfloat16). On a
GPU the Hopper forward (sm_90, bf16 / fp16, head dims 64 / 128 / 256) skips the tiles the
mask empties too, and cuDNN's backward adds it over every tile; there the row also times
  cudnn   jax.nn.dot_product_attention(mask=the dense mask, implementation="cudnn")
(ratio cudnn / dense).
--kinds padding (not by default): a causal mask that also drops every odd batch entry's last
quarter of queries and keys, as a 2-D padding mask does, so those queries keep nothing (the
engine's average of the values over those rows: kRequestAverageEmptyRows; the typed call
gives them 0, as jax does past query_seq_lengths).
Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn

from . import report
from .common import run_info, time_fn


def _lengths(B: int, S: int):
    """The padding kind's sequence lengths: every odd batch entry keeps 3/4 of S."""
    return jnp.asarray([S - (S // 4) * (b % 2) for b in range(B)], jnp.int32)


def _mask(kind: str, S: int, window: int, B: int = 1):
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    m = j <= i
    if kind == "window":
        m &= j >= i - window
    if kind == "padding":  # [B, 1, S, S]: queries and keys past the length dropped
        n = np.asarray(_lengths(B, S))[:, None, None]
        return jnp.asarray(m[None] & (i[None] < n) & (j[None] < n))[:, None]
    return jnp.asarray(m)[None, None]


def run(args):
    rows = []
    dt = jnp.dtype(args.dtype)
    B, S, H, D = args.batch, args.seq, args.heads, args.head_dim
    gpu = jax.default_backend() == "gpu"
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(x, (B, S, H, D), jnp.float32).astype(dt) for x in ks)
    for kind in args.kinds:
        mask = _mask(kind, S, args.window, B)
        typed_kw = {"causal": dict(is_causal=True),
                    "window": dict(is_causal=True, local_window_size=(args.window, 0)),
                    "padding": dict(is_causal=True, query_seq_lengths=_lengths(B, S),
                                    key_value_seq_lengths=_lengths(B, S))}[kind]
        impls = {
            "dense": lambda q, k, v, mask: fusedattn.dot_product_attention(q, k, v, mask=mask),
            "typed": lambda q, k, v, mask: fusedattn.dot_product_attention(q, k, v, **typed_kw),
            "jax": lambda q, k, v, mask: jax.nn.dot_product_attention(q, k, v, mask=mask,
                                                                      implementation="xla"),
        }
        if gpu and dt != jnp.float32:
            impls["cudnn"] = lambda q, k, v, mask: jax.nn.dot_product_attention(
                q, k, v, mask=mask, implementation="cudnn")
        for mode in args.modes:
            row = dict(kind=kind, dtype=dt.name, B=B, S=S, H=H, D=D, mode=mode)
            for name, f in impls.items():
                # The mask and the cotangent are arguments, as a model's are (a constant
                # would be folded into the program: minutes of XLA time at S 4096).
                if mode == "fwd+bwd":
                    fn = jax.jit(lambda q, k, v, mask, do, f=f: jax.grad(
                        lambda q, k, v: jnp.sum(f(q, k, v, mask).astype(jnp.float32) *
                                                do.astype(jnp.float32)), (0, 1, 2))(q, k, v))
                    fargs = (q, k, v, mask, do)
                else:
                    fn, fargs = jax.jit(f), (q, k, v, mask)
                row[f"{name}_ms"] = time_fn(fn, fargs, repeats=args.repeats)[0] * 1e3
            row["ratio_typed"] = row["typed_ms"] / row["dense_ms"]
            row["ratio_jax"] = row["jax_ms"] / row["dense_ms"]
            cudnn = ""
            if "cudnn_ms" in row:
                row["ratio_cudnn"] = row["cudnn_ms"] / row["dense_ms"]
                cudnn = f" | cudnn {row['cudnn_ms']:.2f} ms, cudnn/d {row['ratio_cudnn']:.2f}"
            rows.append(row)
            print(f"{kind:7} {dt.name:9} {S:6d} {mode:8} | {row['dense_ms']:9.2f} "
                  f"{row['typed_ms']:9.2f} {row['jax_ms']:9.2f} | {row['ratio_typed']:7.2f} "
                  f"{row['ratio_jax']:7.2f}{cudnn}", flush=True)
    return rows


RATIOS = {"typed mask / dense mask": "ratio_typed", "jax xla / fusedattn dense": "ratio_jax",
          "jax cudnn / fusedattn dense": "ratio_cudnn"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench dense_mask", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", nargs="+", default=["causal", "window"],
                   choices=["causal", "window", "padding"])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--window", type=int, default=256, help="the window's left size (default 256)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    report.add_output_args(p)
    args = p.parse_args(argv)
    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print(f"{'kind':7} {'dtype':9} {'S':>6} {'mode':8} | {'dense ms':>9} {'typed ms':>9} "
          f"{'jax ms':>9} | {'typed/d':>7} {'jax/d':>7}")
    rows = run(args)
    report.finish("dense_mask", args, dict(info=info, rows=rows), rows, RATIOS,
                  lambda r: f"{r['kind']} {r['dtype']} S{r['S']} {r['mode']}")
    return 0
