"""Dev A/B of float32 (TF32) kernel variants (session 43) in one wheel: each variant's
output and gradients against the first, then its time: causal B1 S8192 H8 D64 (issue 24's
row), causal S4000 (partial tiles), full S4096; --xla adds XLA's times. The variants live
in f32_ab.patch (`git apply` on 474b1a3's csrc, then build the wheel; env FA_F32FWD_VAR /
FA_F32BWD_VAR, read at each launch): forward 0 TF32 fragments by ldmatrix, 1 scalar loads
(474b1a3's); backward (plain TF32 instance, head dim 64) 0 ldmatrix + dQ's loads k-permuted
(no bank conflicts), 1 the permutation alone, 2 = 0 + the warp's K / V A fragments in
registers, 3 = 0 with one Q / dO buffer and 3 blocks an SM, 4 474b1a3's kernel. Results:
README.md, session 43; f32_ab.sh runs it on the GPU machine (two rounds). Session 42's
variants (f32_variants.patch, on 1a17544's csrc; the same env variables) replay with
`--vars 0,0 1,1 1,5 1,6 1,7 3,6 3,7`.

    VARS="1,4 0,0 1,1 0,2 0,3" bash dev/cuda_flash/f32_ab.sh
"""
import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import probe  # noqa: E402

import fusedattn  # noqa: E402
from fusedattn import AttnMaskType  # noqa: E402

SHAPES = [(8192, True), (4000, True), (4096, False)]


def run(S, causal, variants, label, xla, D=64):
    B, H = 1, 8
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    q, k, v, do = (jax.random.normal(x, (B, S, H, D), jnp.float32) for x in ks)
    mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK
    f = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, 0, attn_mask_type=mask))
    g = jax.jit(lambda q, k, v: jax.vjp(f, q, k, v)[1](do))
    name = f"{'causal' if causal else 'full'}_S{S}_D{D}"
    print(f"[{label}] float32 {name} B{B} H{H} D{D}", flush=True)
    first = None
    for fv, bv in variants:
        os.environ["FA_F32FWD_VAR"], os.environ["FA_F32BWD_VAR"] = str(fv), str(bv)
        o = np.asarray(f(q, k, v))
        gr = [np.asarray(x) for x in g(q, k, v)]
        if first is None:
            first = (o, gr)
        rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())  # noqa: E731
        do_ = rel(o, first[0])
        dg = max(rel(a, b) for a, b in zip(gr, first[1]))
        nan = np.isnan(o).any() or any(np.isnan(x).any() for x in gr)
        tf = probe.timeit(f, q, k, v)
        tg = probe.timeit(g, q, k, v, n=5)
        print(f"  [{label}] fwd var {fv} bwd var {bv}: fwd {tf:7.3f} ms  vjp {tg:7.3f} ms"
              f"   out diff {do_:.2e} grads diff {dg:.2e} nan {nan}", flush=True)
    os.environ["FA_F32FWD_VAR"] = os.environ["FA_F32BWD_VAR"] = "0"
    if xla:
        fx = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla"))
        gx = jax.jit(lambda q, k, v: jax.vjp(fx, q, k, v)[1](do))
        print(f"  xla: fwd {probe.timeit(fx, q, k, v):7.3f} ms  vjp {probe.timeit(gx, q, k, v, n=5):7.3f} ms",
              flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="")
    ap.add_argument("--vars", nargs="+", default=["0,0"])
    ap.add_argument("--xla", action="store_true")
    ap.add_argument("--shapes", type=int, default=len(SHAPES))
    ap.add_argument("--dims", type=int, nargs="+", default=[64])
    a = ap.parse_args()
    variants = [tuple(int(x) for x in s.split(",")) for s in a.vars]
    for D in a.dims:
        for S, causal in SHAPES[: a.shapes]:
            run(S, causal, variants, a.label, a.xla, D)
