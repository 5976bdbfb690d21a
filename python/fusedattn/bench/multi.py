"""python -m fusedattn bench multi: fused_attn on every local device (issues 21 and 22).

For each configuration (bf16, H 16, D 128, causal; the global batch and sequence fixed)
it times, forward and forward+backward (the gradient of sum(out * proj)):
  one device        the whole call on device 0 (the anchor)
  dp                the batch sharded over all devices
  tp                the heads sharded over all devices
  cp ring / cp ag   the sequence sharded (context parallelism, load-balanced dual chunks)
and prints the time, the speedup over one device and the scaling efficiency
(speedup / devices), with each sharded output's largest difference from the one-device
output (bf16; the cp rows reorder back first). On one device only the anchor runs.
Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fusedattn
from fusedattn.context_parallel import (ReorderStrategy, inverse_reorder_causal_load_balancing,
                                        reorder_causal_load_balancing)

from . import report
from .common import run_info, time_fn

CONFIGS = [(8, 4096), (2, 16384), (1, 32768)]  # (B, S): B * S tokens per call
H, D = 16, 128


def _fn(kw, proj, grad: bool):
    def fwd(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, 0,
                                    attn_mask_type=fusedattn.AttnMaskType.CAUSAL_MASK, **kw)

    if not grad:
        return jax.jit(fwd)

    def loss(q, k, v, p):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * p)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusedattn bench multi", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    report.add_output_args(ap)
    ap.add_argument("--quick", action="store_true", help="one small configuration")
    args = ap.parse_args(argv)
    devs = jax.devices()
    n = len(devs)
    configs = [(2, 2048)] if args.quick else CONFIGS
    mesh = Mesh(np.array(devs), ("x",))
    rows = []
    print(f"{n} x {devs[0].device_kind}; bf16, H {H}, D {D}, causal; times in ms")
    print(f"{'B':>3} {'S':>6} {'mode':<8} {'fwd':>8} {'x1dev':>6} {'eff':>5} "
          f"{'fwd+bwd':>8} {'x1dev':>6} {'eff':>5} {'max|diff|':>9}")
    for B, S in configs:
        ks = jax.random.split(jax.random.key(0), 4)
        q, k, v = (jax.random.normal(x, (B, S, H, D), jnp.bfloat16) for x in ks[:3])
        proj = jax.random.normal(ks[3], (B, S, H, D), jnp.float32)
        modes = [("1 device", None, {}, False)]
        if n > 1:
            modes += [("dp", P("x"), {}, False), ("tp", P(None, None, "x"), {}, False),
                      ("cp ring", P(None, "x"), dict(context_parallel_axis="x",
                                                     context_parallel_strategy="ring",
                                                     context_parallel_causal_load_balanced=True),
                       True),
                      ("cp ag", P(None, "x"), dict(context_parallel_axis="x",
                                                   context_parallel_strategy="all_gather",
                                                   context_parallel_causal_load_balanced=True),
                       True)]
        base = None
        for name, spec, kw, balanced in modes:
            if spec is not None and (B % n if spec == P("x") else 0):
                continue
            order = ((lambda x: reorder_causal_load_balancing(x, ReorderStrategy.DualChunkSwap,
                                                              n, 1)) if balanced else
                     (lambda x: x))
            put = ((lambda x: jax.device_put(order(x), NamedSharding(mesh, spec)))
                   if spec is not None else (lambda x: jax.device_put(x, devs[0])))
            a = [put(x) for x in (q, k, v)]
            pa = put(proj)
            f, g = _fn(kw, pa, False), _fn(kw, pa, True)
            out = f(*a)
            if balanced:
                out = inverse_reorder_causal_load_balancing(out, ReorderStrategy.DualChunkSwap,
                                                            n, 1)
            tf = time_fn(f, a, repeats=args.repeats)[0] * 1e3
            tg = time_fn(lambda *x: g(*x, pa), a, repeats=args.repeats)[0] * 1e3
            if base is None:
                base, ref = (tf, tg), np.asarray(out, np.float32)
            diff = float(np.max(np.abs(np.asarray(out, np.float32) - ref)))
            sf, sg = base[0] / tf, base[1] / tg
            nd = 1 if spec is None else n
            rows.append(dict(B=B, S=S, mode=name, devices=nd, fwd_ms=tf, fwdbwd_ms=tg,
                             fwd_speedup=sf, fwdbwd_speedup=sg, max_abs_diff=diff))
            print(f"{B:>3} {S:>6} {name:<8} {tf:8.3f} {sf:6.2f} {sf / nd:5.2f} "
                  f"{tg:8.3f} {sg:6.2f} {sg / nd:5.2f} {diff:9.2e}")
    sharded = [r for r in rows if r["devices"] > 1]
    report.finish("multi", args, dict(run=run_info(), rows=rows), sharded,
                  {f"{n} devices vs 1 (fwd)": "fwd_speedup",
                   f"{n} devices vs 1 (fwd+bwd)": "fwdbwd_speedup"},
                  lambda r: f"B{r['B']} S{r['S']} {r['mode']}")
    return 0
