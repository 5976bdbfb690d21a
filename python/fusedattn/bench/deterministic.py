"""python -m fusedattn bench deterministic: what deterministic mode costs (determinism.py).

Each row times one compiled fused_attn forward+backward (gradients of q, k, v; bf16,
B * S = 16384, H * D = 2048) three ways in the same run:
  default        fusedattn as shipped (dQ by float32 atomics: the last bits vary run to run)
  deterministic  the same call traced under fusedattn.deterministic(): the Hopper backward's
                 ordered dQ where it runs (head dims 64, 128), cuDNN's deterministic
                 algorithm elsewhere (head dim 256)
  det_cudnn      where the Hopper backward took the deterministic call: the same call with it
                 off (fusedattn._lib.set_hopper_bwd("off") while traced and timed), so
                 cuDNN's deterministic algorithm runs it (its dP workspace: O(S^2) memory)
  jax_cudnn      jax.nn.dot_product_attention(implementation="cudnn") (jax's default, not
                 deterministic), the anchor of the other tables
with each compiled gradient's temporary memory ("temp MiB", memory_analysis: cuDNN's
deterministic dP workspace shows there), and checks the deterministic gradients bitwise
against one more call of the same function ("repeat": dq values that differ, 0 expected; the
default's count beside it). "x dflt" = default time / deterministic time (< 1: the mode's
cost); "x detcud" = det_cudnn time / deterministic time (> 1: the Hopper backward's ordered dQ
is the faster deterministic backward). Needs a GPU (on the CPU the engine is deterministic in
either mode: nothing to measure).
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

_MASKS = {"causal": AttnMaskType.CAUSAL_MASK, "full": AttnMaskType.NO_MASK,
          "window": AttnMaskType.CAUSAL_MASK}


def _cases(head_dims, seqlens, masks):
    for D in head_dims:
        for S in seqlens:
            for m in masks:
                yield dict(D=D, S=S, B=max(1, 16384 // S), H=2048 // D, mask=m)


def _loss(c):
    mask, window = _MASKS[c["mask"]], (512, 0) if c["mask"] == "window" else None

    def loss(q, k, v, do):
        out = fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                   window_size=window)
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
    return loss


def _jax_loss(c):
    window = (512, 0) if c["mask"] == "window" else None

    def loss(q, k, v, do):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=c["mask"] != "full",
                                           local_window_size=window, implementation="cudnn")
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
    return loss


def _differ(g, args) -> int:
    a, b = (np.asarray(jax.block_until_ready(g(*args))[0]) for _ in range(2))
    return int(np.sum(a.view(np.uint16) != b.view(np.uint16)))


def _temp_mib(g, args) -> float:
    """The compiled gradient's temporary memory (XLA's buffers, the kernels' workspaces
    among them), MiB."""
    try:
        return g.lower(*args).compile().memory_analysis().temp_size_in_bytes / 2 ** 20
    except Exception:  # a backend without memory_analysis
        return float("nan")


def run(args):
    rows = []
    for i, c in enumerate(_cases(args.head_dims, args.seqlens, args.masks)):
        ks = jax.random.split(jax.random.PRNGKey(i), 4)
        shape = (c["B"], c["S"], c["H"], c["D"])
        qkvd = [jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16) for k in ks]
        row = dict(c)
        grads = {}
        # A fresh function for each mode: jax caches traces by the function.
        with fusedattn.deterministic(False):
            grads["default"] = jax.jit(jax.grad(_loss(c), argnums=(0, 1, 2)))
            jax.block_until_ready(grads["default"](*qkvd))  # traced in the mode
            info = fusedattn.get_backend(tuple(qkvd[:3]), attn_mask_type=_MASKS[c["mask"]],
                                         is_training=True)
            row["default_kernels"] = f"{info.forward}/{info.backward}"
        with fusedattn.deterministic():
            grads["deterministic"] = jax.jit(jax.grad(_loss(c), argnums=(0, 1, 2)))
            jax.block_until_ready(grads["deterministic"](*qkvd))  # traced in the mode
            info = fusedattn.get_backend(tuple(qkvd[:3]), attn_mask_type=_MASKS[c["mask"]],
                                         is_training=True)
            row["det_kernels"] = f"{info.forward}/{info.backward}"
        if not args.no_jax:
            grads["jax_cudnn"] = jax.jit(jax.grad(_jax_loss(c), argnums=(0, 1, 2)))
        for name, g in grads.items():
            try:
                sec, _ = time_fn(g, qkvd, repeats=args.repeats)
            except Exception as e:  # an anchor that rejects the call: in the row
                row[f"{name}_error"] = str(e).splitlines()[0][:160]
                continue
            row[f"{name}_ms"] = sec * 1e3
            if name != "jax_cudnn":
                row[f"{name}_temp_mib"] = _temp_mib(g, qkvd)
        if row["det_kernels"].endswith("/hopper") and not args.no_det_cudnn:
            _lib.set_hopper_bwd("off")  # traced and run with cuDNN's deterministic backward
            try:
                with fusedattn.deterministic():
                    g = jax.jit(jax.grad(_loss(c), argnums=(0, 1, 2)))
                    jax.block_until_ready(g(*qkvd))
                sec, _ = time_fn(g, qkvd, repeats=args.repeats)
                row["det_cudnn_ms"] = sec * 1e3
                row["det_cudnn_temp_mib"] = _temp_mib(g, qkvd)
                row["repeat_det_cudnn"] = _differ(g, qkvd)
            except Exception as e:  # e.g. its dP workspace out of memory
                row["det_cudnn_error"] = str(e).splitlines()[0][:160]
            finally:
                _lib.set_hopper_bwd(None)
        row["repeat_det"] = _differ(grads["deterministic"], qkvd)
        row["repeat_default"] = _differ(grads["default"], qkvd)
        for name in ("default", "jax_cudnn", "det_cudnn"):  # anchor time / deterministic time
            if "deterministic_ms" in row and f"{name}_ms" in row:
                row[f"ratio_{name}"] = row[f"{name}_ms"] / row["deterministic_ms"]
        rows.append(row)
        print(_fmt(row), flush=True)
    return rows


_HEADER = (f"{'mask':6} {'D':>3} {'S':>5} {'B':>2} {'H':>2} | {'default':>8} {'determ.':>8} "
           f"{'det cud':>8} {'cudnn':>8} ms | {'x dflt':>6} {'x detcud':>8} {'x cudnn':>7} | "
           f"{'repeat':>9} | {'temp MiB: dflt':>14} {'det':>6} {'det cud':>7} | kernels (det)")


def _fmt(r):
    ms = lambda n: f"{r[f'{n}_ms']:.3f}" if f"{n}_ms" in r else ("err" if f"{n}_error" in r else "-")
    x = lambda n: f"{r[f'ratio_{n}']:.2f}" if f"ratio_{n}" in r else "-"
    rep = f"{r['repeat_det']}/{r['repeat_default']}"
    mib = lambda n: f"{r[f'{n}_temp_mib']:.0f}" if f"{n}_temp_mib" in r else "-"
    return (f"{r['mask']:6} {r['D']:3d} {r['S']:5d} {r['B']:2d} {r['H']:2d} | "
            f"{ms('default'):>8} {ms('deterministic'):>8} {ms('det_cudnn'):>8} {ms('jax_cudnn'):>8}    | "
            f"{x('default'):>6} {x('det_cudnn'):>8} {x('jax_cudnn'):>7} | {rep:>9} | "
            f"{mib('default'):>6} {mib('deterministic'):>6} {mib('det_cudnn'):>7} | {r['det_kernels']}")


RATIOS = {"deterministic vs default fusedattn": "ratio_default",
          "hopper ordered dQ vs cuDNN deterministic": "ratio_det_cudnn",
          "deterministic vs jax cudnn (not deterministic)": "ratio_jax_cudnn"}


def _label(r) -> str:
    return f"{r['mask']} D{r['D']} S{r['S']}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench deterministic",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128, 256])
    p.add_argument("--seqlens", nargs="+", type=int, default=[4096])
    p.add_argument("--masks", nargs="+", default=["causal", "full"], choices=list(_MASKS))
    p.add_argument("--no-jax", action="store_true", help="skip the jax cuDNN anchor")
    p.add_argument("--no-det-cudnn", action="store_true",
                   help="skip cuDNN's deterministic backward where the Hopper one ran")
    p.add_argument("--repeats", type=int, default=5)
    report.add_output_args(p)
    args = p.parse_args(argv)
    if jax.default_backend() != "gpu":
        print("bench deterministic needs a GPU: the CPU engine is deterministic in either mode")
        return 2
    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print(_HEADER)
    rows = run(args)
    report.finish("deterministic", args, dict(info=info, rows=rows), rows, RATIOS, _label)
    return 0
