"""python -m fusedattn bench fallback: the calls cuDNN declines (issue 24), beside XLA.

Before issue 24 every GPU call that cuDNN and the Hopper forward decline ran reference.py
under XLA (materialized [B, H, Sq, Skv] scores); fusedattn's generic CUDA flash attention
("cuda_flash") serves them now. Each row times fused_attn (its backend, from get_backend,
in the table: a row that still falls back shows "xla_reference") beside anchors measured in
the same run, forward and forward+backward (gradients of q, k, v; a bias is a constant, so
no dbias: on an H100 / H200 the Hopper backward then adds it):
  f32      float32 causal, B 1, S 8192, H 8, D 64 (fusedattn's matmuls follow jax's matmul
           precision: TF32 by default as XLA's, 3xTF32 under "highest") vs
           jax.nn.dot_product_attention(implementation="xla") at the default precision
  pre_bias bf16 PRE_SCALE_BIAS [1, H, S, S], causal, B 2, S 4096, H 8, D 128 vs XLA (the
           same math: bias * scale added after scaling) and vs jax's cuDNN with a
           POST_SCALE bias (the nearest call cuDNN serves)
  d512     bf16 head dim 512, causal, B 1, S 4096, H 8 vs XLA and vs jax's cuDNN at head
           dim 256 (the nearest it serves: half the FLOPs; TF/s in the table)
  alibi    bf16 score_mod s + slope_h * (k - q) with a learnable slope operand [1, H, 1, 1],
           plus a POST_SCALE bias [1, H, S, S], causal, B 2, S 4096, H 8, D 128 vs XLA on
           materialized scores and vs jax's cuDNN with the bias alone (the nearest call it
           serves: cuDNN would add the bias after the score_mod)
  softcap  bf16 score_mod 30 tanh(s / 30) (Gemma-2's cap) plus a POST_SCALE bias [1, H, S,
           S], causal, B 2, S 4096, H 8, D 128 vs XLA on materialized scores and vs jax's
           cuDNN with the bias alone (cuDNN would add the bias after the score_mod)
  slopes   the same score_mod without the bias, forward+backward taking the slopes'
           gradient too (cuDNN computes none: the CUDA flash kernels run that call, or
           with FUSEDATTN_FLASH_SCORE_MOD=0 cuDNN and XLA's reference vjp over the
           materialized scores) vs XLA and vs jax's cuDNN on the plain causal call
Every row also has the reference anchor: fusedattn.attention_reference under jit, what
fused_attn ran before (the score_mod row: the same, with the fn over the scores).
ratio = anchor time / fusedattn time (> 1: fusedattn is faster). Without a GPU the same
rows run at S / --cpu-divisor on the CPU engine (no cuDNN anchor), to check the program.
Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType
from fusedattn import score_mod as _sm

from . import report
from .common import run_info, time_fn

CAUSAL = AttnMaskType.CAUSAL_MASK


def _cases(gpu: bool, divisor: int):
    cases = [
        dict(kind="f32", dtype="float32", B=1, S=8192, H=8, D=64),
        dict(kind="pre_bias", dtype="bfloat16", B=2, S=4096, H=8, D=128),
        dict(kind="d512", dtype="bfloat16", B=1, S=4096, H=8, D=512),
        dict(kind="alibi", dtype="bfloat16", B=2, S=4096, H=8, D=128),
        dict(kind="softcap", dtype="bfloat16", B=2, S=4096, H=8, D=128),
        dict(kind="slopes", dtype="bfloat16", B=2, S=4096, H=8, D=128),
    ]
    if not gpu:
        for c in cases:
            c["S"] = max(c["S"] // divisor, 64)
    return cases


def alibi(s, b, h, q, k, slope):
    """ALiBi-like with a learnable per-head slope (score_mod operand [1, H, 1, 1])."""
    return s + slope * (k - q).astype(jnp.float32)


def softcap(s, b, h, q, k):
    """Gemma-2's logit cap."""
    return 30.0 * jnp.tanh(s / 30.0)


def _inputs(c, key):
    B, S, H, D = c["B"], c["S"], c["H"], c["D"]
    dt = jnp.dtype(c["dtype"])
    ks = jax.random.split(key, 6)
    n = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(dt)
    q, k, v, do = (n(kk, (B, S, H, D)) for kk in ks[:4])
    bias = n(ks[4], (1, H, S, S)) if c["kind"] in ("pre_bias", "alibi", "softcap") else None
    slope = (-jax.random.uniform(ks[5], (1, H, 1, 1), minval=0.01, maxval=0.1)
             if c["kind"] in ("alibi", "slopes") else None)
    return q, k, v, do, bias, slope


def _causal_mask(S):
    return jnp.tril(jnp.ones((S, S), bool))


def _impls(c, bias, slope):
    """name -> (fn(q, k, v, *extra), inputs(q, k, v, dout) -> its own (q, k, v, *extra,
    dout)): fusedattn, the reference fallback, jax xla, jax cudnn. extra: the slopes of the
    "slopes" row (differentiated too), else nothing."""
    kind, D, S = c["kind"], c["D"], c["S"]
    scale = D ** -0.5
    bias_type = {"pre_bias": AttnBiasType.PRE_SCALE_BIAS, "alibi": AttnBiasType.POST_SCALE_BIAS,
                 "softcap": AttnBiasType.POST_SCALE_BIAS}.get(kind, AttnBiasType.NO_BIAS)
    learn = kind == "slopes"
    sm = (dict(score_mod=alibi, score_mod_operands=(slope,)) if kind in ("alibi", "slopes")
          else dict(score_mod=softcap) if kind == "softcap" else {})

    def ours(q, k, v, *extra):
        kw = dict(sm, score_mod_operands=extra) if learn else sm
        return fusedattn.fused_attn((q, k, v), bias, None, None, attn_bias_type=bias_type,
                                    attn_mask_type=CAUSAL, **kw)

    def reference(q, k, v, *extra):
        score_mod = None
        slope_ = extra[0] if learn else slope
        if kind in ("alibi", "slopes", "softcap"):
            fn, ops = (softcap, ()) if kind == "softcap" else (alibi, (slope_,))
            m, arrays4 = _sm.make_score_mod(fn, ops, None, (c["B"], c["H"], S, S))
            score_mod = lambda s, qp, kp, index_base=None: _sm.apply_reference(
                m.fn, s, arrays4, index_base=index_base)
        return fusedattn.attention_reference(
            q, k, v, attn_mask_type=CAUSAL, bias=bias, attn_bias_type=bias_type
            if bias is not None else AttnBiasType.POST_SCALE_BIAS, score_mod=score_mod)[0]

    def jax_xla(q, k, v, *extra):
        if kind in ("alibi", "slopes", "softcap"):  # materialized scores, fn over the grid
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
            if bias is not None:
                s = s + bias.astype(jnp.float32)
            if kind == "softcap":
                s = softcap(s, None, None, None, None)
            else:
                rel = (jnp.arange(S)[None, :] - jnp.arange(S)[:, None]).astype(jnp.float32)
                s = s + (extra[0] if learn else slope) * rel
            s = jnp.where(_causal_mask(S), s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
            return jnp.einsum("bhqk,bkhd->bqhd", p, v)
        b = None
        if bias is not None:  # PRE_SCALE: (q.k + bias) * scale = q.k * scale + bias * scale
            b = (bias.astype(jnp.float32) * scale).astype(bias.dtype)
        return jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=True, implementation="xla")

    same = (lambda q, k, v, do: (q, k, v, slope, do)) if learn else (lambda *a: a)
    impls = {"fusedattn": (ours, same), "reference": (reference, same),
             "jax_xla": (jax_xla, same)}
    if jax.default_backend() == "gpu" and kind in ("pre_bias", "d512", "alibi", "softcap", "slopes"):
        def jax_cudnn(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=True,
                                                implementation="cudnn")
        # d512: the nearest cuDNN serves is head dim 256 (inputs cut before timing)
        cut = (lambda *a: tuple(x[..., :256] for x in a)) if kind == "d512" else (lambda *a: a)
        impls["jax_cudnn"] = (jax_cudnn, cut)
    return impls, bias_type, sm


def _fwd_bwd(f, n: int):
    """The gradients of sum(f(*a) * dout) in f's n arguments."""
    def loss(*a):
        return jnp.sum(f(*a[:-1]).astype(jnp.float32) * a[-1].astype(jnp.float32))
    return jax.grad(loss, argnums=tuple(range(n)))


def _backend(c, q, bias, bias_type, sm, training):
    grads = dict(score_mod_grads=True) if c["kind"] == "slopes" else {}
    info = fusedattn.get_backend((q, q, q), bias, None, None, attn_bias_type=bias_type,
                                 attn_mask_type=CAUSAL, is_training=training, bias_grads=False,
                                 **sm, **grads)
    # The kernels that run (forward / backward), not the family: a call cuDNN declines
    # ("cuda_flash") may run both passes on the Hopper kernels.
    fwd, bwd = info.forward or info.name, info.backward or info.name
    return fwd if not training or fwd == bwd else f"{fwd}/{bwd}"


def run(args):
    gpu = jax.default_backend() == "gpu"
    rows = []
    for i, c in enumerate(_cases(gpu, args.cpu_divisor)):
        if args.kinds and c["kind"] not in args.kinds:
            continue
        q, k, v, do, bias, slope = _inputs(c, jax.random.PRNGKey(i))
        impls, bias_type, sm = _impls(c, bias, slope)
        pairs = c["S"] * (c["S"] + 1) // 2  # causal
        for mode in args.modes:
            backward = mode == "fwd+bwd"
            row = dict(c, mode=mode, backend=_backend(c, q, bias, bias_type, sm, backward))
            for name, (f, inputs) in impls.items():
                if name in args.skip:
                    continue
                fargs = jax.block_until_ready(inputs(q, k, v, do))
                D = fargs[0].shape[-1]
                flops = 4.0 * c["B"] * c["H"] * D * pairs * (3.5 if backward else 1.0)
                fn = jax.jit(_fwd_bwd(f, len(fargs) - 1)) if backward else jax.jit(f)
                fargs = fargs if backward else fargs[:-1]
                try:
                    sec, _ = time_fn(fn, fargs, repeats=args.repeats)
                except Exception as e:  # out of memory, a shape an anchor rejects: in the row
                    row[f"{name}_error"] = str(e).splitlines()[0][:160]
                    continue
                row[f"{name}_ms"] = sec * 1e3
                row[f"{name}_tflops"] = flops / sec / 1e12
            for name in ("reference", "jax_xla", "jax_cudnn"):
                if f"{name}_ms" in row and "fusedattn_ms" in row:
                    row[f"ratio_{name}"] = row[f"{name}_ms"] / row["fusedattn_ms"]
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


_HEADER = (f"{'case':8} {'dtype':8} {'B':>2} {'S':>5} {'H':>2} {'D':>3} {'mode':8} "
           f"{'backend':13} | {'ours ms':>8} {'TF/s':>5} | {'ref ms':>8} {'xla ms':>8} "
           f"{'cudnn ms':>8} | {'x ref':>6} {'x xla':>6} {'x cudnn':>7}")


def _fmt(r):
    ms = lambda n: f"{r[f'{n}_ms']:.2f}" if f"{n}_ms" in r else ("err" if f"{n}_error" in r
                                                                 else "-")
    x = lambda n: f"{r[f'ratio_{n}']:.2f}" if f"ratio_{n}" in r else "-"
    tf = f"{r['fusedattn_tflops']:.0f}" if "fusedattn_tflops" in r else "-"
    return (f"{r['kind']:8} {r['dtype']:8} {r['B']:2d} {r['S']:5d} {r['H']:2d} {r['D']:3d} "
            f"{r['mode']:8} {r['backend']:13} | {ms('fusedattn'):>8} {tf:>5} | "
            f"{ms('reference'):>8} {ms('jax_xla'):>8} {ms('jax_cudnn'):>8} | "
            f"{x('reference'):>6} {x('jax_xla'):>6} {x('jax_cudnn'):>7}")


RATIOS = {"fusedattn vs the old fallback (reference.py)": "ratio_reference",
          "fusedattn vs jax xla": "ratio_jax_xla",
          "fusedattn vs jax cudnn (nearest config)": "ratio_jax_cudnn"}


def _label(r) -> str:
    return f"{r['kind']} {r['dtype']} S{r['S']} D{r['D']} {r['mode']}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench fallback", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", nargs="+", choices=["f32", "pre_bias", "d512", "alibi", "softcap", "slopes"],
                   help="only these rows (default: all)")
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--skip", nargs="+", default=[],
                   choices=["reference", "jax_xla", "jax_cudnn"], help="anchors not to run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cpu-divisor", type=int, default=16,
                   help="without a GPU, each row's S is divided by this (default 16)")
    report.add_output_args(p)
    args = p.parse_args(argv)
    info = run_info()
    info["default_matmul_precision"] = str(jax.config.jax_default_matmul_precision)
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print(_HEADER)
    rows = run(args)
    report.finish("fallback", args, dict(info=info, rows=rows), rows, RATIOS, _label)
    return 0
