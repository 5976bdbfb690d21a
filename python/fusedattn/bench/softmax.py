"""python -m fusedattn bench softmax: fusedattn.softmax against XLA's softmax of the same
semantics (fusedattn.softmax_fallback: where, max, exp, sum, divide, compiled by XLA),
forward and backward, scaled / masked / causal, with the device copy bandwidth measured in
the same run as the ceiling.

Bytes (docs/BENCH.md): forward = read logits (+ the bool mask, [B, 1, Sq, Skv], once) +
write y; backward = read y and dy + write dx. Causal rows count in full although our
kernel reads only the kept half (it still writes every element): its TB/s is effective.
Reported: ms, TB/s, fraction of the measured copy bandwidth, speedup = XLA time / ours,
and whether our custom call is in the compiled program (kernel=yes) or the fallback ran.
Causal rows also time XLA's *masked* softmax fed the causal mask as a [1, 1, S, S] bool
array (the way an unfused model often runs causal attention): "vs mask" = its time / ours.

GPU grid: BENCH.md's [16, 16, 2048, 2048] and [4, 16, 4096, 4096] bf16. CPU grid (when jax
has no GPU): smaller shapes that run on a 2-core machine. Prints a table and a summary line;
writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import SoftmaxFusionType

from . import report
from .common import copy_bandwidth, run_info, time_fn

sm = importlib.import_module("fusedattn.softmax")  # the module (fusedattn.softmax is the function)

GPU_SHAPES = [(16, 16, 2048, 2048), (4, 16, 4096, 4096)]
CPU_SHAPES = [(2, 8, 1024, 1024), (1, 8, 2048, 2048)]  # past the caches: DRAM-bound
KINDS = {"scaled": SoftmaxFusionType.SCALED, "masked": SoftmaxFusionType.SCALED_MASKED,
         "causal": SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED}
SCALE = 0.125


def _inputs(shape, dtype, kind, seed=0):
    kx, kd, km = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = (4.0 * jax.random.normal(kx, shape, jnp.float32)).astype(dtype)  # logits O(1) after scale
    dy = jax.random.normal(kd, shape, jnp.float32).astype(dtype)
    mask = None
    if kind == SoftmaxFusionType.SCALED_MASKED:
        mask = jax.random.bernoulli(km, 0.2, (shape[0], 1) + shape[2:])
    return x, dy, mask


def _fns(kind, x, mask):
    """{(impl, mode): (jitted fn, needs)} and whether ours runs our custom calls. needs
    names the inputs: "x" (logits, mask), "y" (y, dy), "xm" (logits, the causal mask)."""
    cfg = sm._check(x, mask, SCALE, kind)
    fns = {
        ("ours", "fwd"): (jax.jit(lambda x, m: fusedattn.softmax(x, m, SCALE, kind)), "x"),
        ("xla", "fwd"): (jax.jit(lambda x, m: fusedattn.softmax_fallback(x, m, SCALE, kind)), "x"),
        ("ours", "bwd"): (jax.jit(lambda y, dy: sm._backward(y, dy, cfg)), "y"),
        ("xla", "bwd"): (jax.jit(lambda y, dy: sm._softmax_grad_fallback(y, dy, cfg)), "y"),
    }
    if kind == SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED:
        masked = SoftmaxFusionType.SCALED_MASKED
        cfg_m = dataclasses.replace(cfg, softmax_type=masked)
        fns[("xla_mask", "fwd")] = (
            jax.jit(lambda x, m: fusedattn.softmax_fallback(x, m, SCALE, masked)), "xm")
        fns[("xla_mask", "bwd")] = (
            jax.jit(lambda y, dy: sm._softmax_grad_fallback(y, dy, cfg_m)), "y")
    hlo = fns[("ours", "fwd")][0].lower(x, mask).compile().as_text()
    return fns, "fusedattn_softmax_fwd" in hlo


def run(shapes, dtypes, kinds, modes, repeats, copy_bw):
    hold = jax.default_backend() == "cpu"  # see time_fn: a GPU cannot hold N outputs of 2 GiB
    rows = []
    for dtype_name in dtypes:
        dtype = jnp.dtype(dtype_name)
        for shape in shapes:
            n = 1
            for d in shape:
                n *= d
            for kind_name in kinds:
                kind = KINDS[kind_name]
                x, dy, mask = _inputs(shape, dtype, kind)
                fns, kernel = _fns(kind, x, mask)
                y = jax.block_until_ready(fns[("ours", "fwd")][0](x, mask))
                causal_mask = jnp.arange(shape[-1])[None, :] > jnp.arange(shape[-2])[:, None]
                inputs = {"x": (x, mask), "y": (y, dy), "xm": (x, causal_mask[None, None])}
                for mode in modes:
                    nbytes = (2 * n * dtype.itemsize + (0 if mask is None else mask.size)
                              if mode == "fwd" else 3 * n * dtype.itemsize)
                    row = dict(dtype=dtype_name, shape=list(shape), kind=kind_name, mode=mode,
                               kernel=kernel, bytes=nbytes)
                    for (name, fmode), (fn, needs) in fns.items():
                        if fmode != mode:
                            continue
                        sec, _ = time_fn(fn, inputs[needs], repeats=repeats, hold_outputs=hold)
                        row[f"{name}_ms"] = sec * 1e3
                        row[f"{name}_tbs"] = nbytes / sec / 1e12
                        row[f"{name}_of_copy"] = nbytes / sec / copy_bw
                    row["speedup"] = row["xla_ms"] / row["ours_ms"]
                    if "xla_mask_ms" in row:
                        row["speedup_vs_mask"] = row["xla_mask_ms"] / row["ours_ms"]
                    rows.append(row)
                    print(_fmt_row(row), flush=True)
                del x, dy, mask, y, inputs
    return rows


_HEADER = (f"{'dtype':8} {'shape':>20} {'kind':7} {'mode':4} {'kernel':6} | {'ours ms':>8} "
           f"{'TB/s':>6} {'of copy':>7} | {'xla ms':>8} {'TB/s':>6} {'of copy':>7} | "
           f"{'speedup':>7} | {'mask ms':>8} {'vs mask':>7}")


def _fmt_row(r):
    shape = "x".join(map(str, r["shape"]))
    mask = (f"{r['xla_mask_ms']:8.3f} {r['speedup_vs_mask']:6.2f}x" if "xla_mask_ms" in r
            else f"{'-':>8} {'-':>7}")
    return (f"{r['dtype']:8} {shape:>20} {r['kind']:7} {r['mode']:4} "
            f"{'yes' if r['kernel'] else 'NO':6} | {r['ours_ms']:8.3f} {r['ours_tbs']:6.3f} "
            f"{r['ours_of_copy']:6.1%} | {r['xla_ms']:8.3f} {r['xla_tbs']:6.3f} "
            f"{r['xla_of_copy']:6.1%} | {r['speedup']:6.2f}x | {mask}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench softmax", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", help="B,H,Sq,Skv shapes (default: the device's grid)")
    p.add_argument("--dtypes", nargs="+", help="default: bfloat16 (GPU); bfloat16 float32 (CPU)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--modes", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    p.add_argument("--repeats", type=int, default=5)
    report.add_output_args(p)
    args = p.parse_args(argv)

    gpu = jax.default_backend() != "cpu"
    shapes = ([tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes
              else GPU_SHAPES if gpu else CPU_SHAPES)
    dtypes = args.dtypes or (["bfloat16"] if gpu else ["bfloat16", "float32"])
    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    copy_bw = copy_bandwidth(1 << 30 if gpu else 1 << 28)
    print(f"device copy bandwidth (read + write): {copy_bw / 1e12:.3f} TB/s; "
          f"scale {SCALE}; speedup = XLA time / ours")
    print(_HEADER)
    rows = run(shapes, dtypes, args.kinds, args.modes, args.repeats, copy_bw)
    report.finish("softmax", args, dict(info=info, copy_bandwidth_tbs=copy_bw / 1e12, rows=rows),
                  rows, {"fusedattn vs xla softmax": "speedup",
                         "causal vs xla masked softmax": "speedup_vs_mask"},
                  lambda r: f"{r['dtype']} {'x'.join(map(str, r['shape']))} {r['kind']} {r['mode']}")
    return 0
