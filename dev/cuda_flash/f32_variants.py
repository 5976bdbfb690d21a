"""Dev A/B of float32 (TF32) kernel variants in one wheel (session 42): each variant's output
and gradients against variant 0, then its time, causal B1 S8192 H8 D64 (issue 24's row),
causal S4000 (partial tiles) and full S4096. The variants live in f32_variants.patch (on
1a17544's kernels; env FA_F32FWD_VAR / FA_F32BWD_VAR, read at each launch): forward 1 TF32
tiles rounded once in shared memory, 2 + k-permuted 8-byte loads, 3 = 1 + heaviest-first
order over every head; backward 1 rounded once, 2 + 8-byte loads, 3 / 4 + the S^T k loop
unrolled 2x / fully, 5 = 1 + heaviest-first order, 6 = 5 + a plain element step, 7 = 6 with
one Q/dO buffer and 3 blocks an SM. Results: README.md, session 42.

    git apply dev/cuda_flash/f32_variants.patch   # on 1a17544's csrc, then build the wheel
    source scripts/gpu_env.sh && $PY dev/cuda_flash/f32_variants.py
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import probe  # noqa: E402

import fusedattn  # noqa: E402
from fusedattn import AttnMaskType  # noqa: E402


def run(S, causal, fwd_vars, bwd_vars):
    B, H, D = 1, 8, 64
    ks = jax.random.split(jax.random.PRNGKey(3), 4)
    q, k, v, do = (jax.random.normal(x, (B, S, H, D), jnp.float32) for x in ks)
    mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK
    f = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, 0, attn_mask_type=mask))
    g = jax.jit(lambda q, k, v: jax.vjp(f, q, k, v)[1](do))
    xla = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla"))
    gx = jax.jit(lambda q, k, v: jax.vjp(xla, q, k, v)[1](do))
    print(f"float32 {'causal' if causal else 'full'} B{B} S{S} H{H} D{D}", flush=True)
    ref_o = ref_g = None
    for fv, bv in zip(fwd_vars, bwd_vars):
        os.environ["FA_F32FWD_VAR"], os.environ["FA_F32BWD_VAR"] = str(fv), str(bv)
        o = np.asarray(f(q, k, v))
        gr = [np.asarray(x) for x in g(q, k, v)]
        if ref_o is None:
            ref_o, ref_g = o, gr
        do_ = np.abs(o - ref_o).max() / np.abs(ref_o).max()
        dg = max(np.abs(a - b).max() / np.abs(b).max() for a, b in zip(gr, ref_g))
        nan = np.isnan(o).any() or any(np.isnan(x).any() for x in gr)
        tf = probe.timeit(f, q, k, v)
        tg = probe.timeit(g, q, k, v, n=5)
        print(f"  fwd var {fv} bwd var {bv}: out diff {do_:.2e} grads diff {dg:.2e} nan {nan}"
              f"   fwd {tf:7.3f} ms  vjp {tg:7.3f} ms", flush=True)
    os.environ["FA_F32FWD_VAR"] = os.environ["FA_F32BWD_VAR"] = "0"
    print(f"  xla: fwd {probe.timeit(xla, q, k, v):7.3f} ms  vjp {probe.timeit(gx, q, k, v, n=5):7.3f} ms", flush=True)


if __name__ == "__main__":
    run(8192, True, [0, 1, 1, 1, 1, 3, 3, 0], [0, 1, 5, 6, 7, 6, 7, 0])
    run(4000, True, [0, 3, 3], [0, 6, 7])
    run(4096, False, [0, 1, 3, 3], [0, 1, 6, 7])
