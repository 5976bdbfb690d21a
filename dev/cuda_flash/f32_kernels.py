"""The kernels of one jitted float32 attention call (the CUDA flash kernels' TF32 path, issue
24's row: causal, B 1, S 8192, H 8, D 64), each timed by Nsight Compute inside the call, and
the same call through jax.nn.dot_product_attention(implementation="xla") beside it.

  OUT=... NAME=f32_kernels bash dev/ncu_kernels.sh dev/cuda_flash/f32_kernels.py ours:fwd ours:fwdbwd
(xla:fwdbwd, XLA's call, did not finish under ncu within a call: its autotuning under the
profiler; time XLA apart.)

The region profiled: dev/ncu_region.py; dev/ncu_kernels.sh runs it and tabulates."""
import os
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ncu_region import REPS, profile  # noqa: E402


def main():
    who, mode = sys.argv[1], sys.argv[2]
    B, S, H, D = 1, 8192, 8, 64
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, dout = (jax.random.normal(x, (B, S, H, D), jnp.float32) for x in ks)
    if who == "ours":
        f = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                 attn_mask_type=AttnMaskType.CAUSAL_MASK)
    else:
        f = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    if mode == "fwd":
        fn, args = jax.jit(f), (q, k, v)
    else:
        fn = jax.jit(lambda q, k, v, do: jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * do), (0, 1, 2))(q, k, v))
        args = (q, k, v, dout)
    profile(fn, args)
    print(f"{who} {mode} f32 B {B} S {S} H {H} D {D} causal: {REPS} calls")


main()
