"""The kernels of one jitted dense-mask call, each timed by Nsight Compute inside the call:
where a dense mask's time goes beside the mask type's (the fold of the mask into a bias,
the classification, the kernel, the rebuild of rows that keep nothing).

  OUT=... bash dev/ncu_kernels.sh dev/hopper_fwd/dense_kernels.py KIND:PATH:MODE[:D] ...

KIND: causal, window (512 keys, causal) or padding (causal; every odd batch entry keeps 3/4 of
its queries and keys, so a quarter of its rows keep nothing: bench dense_mask's kinds); PATH: dense (dot_product_attention(mask=...)),
typed (dot_product_attention with is_causal / local_window_size), kernel (fused_attn with the
folded mask as its bias: no wrapper); MODE: fwd or fwdbwd. bf16, B 4, S 4096, H 2048 / D (bench
dense_mask's shape). The region profiled: dev/ncu_region.py; dev/ncu_kernels.sh runs it and
tabulates."""
import os
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType
from fusedattn.bench.dense_mask import _lengths, _mask
from fusedattn.dot_product import _large_negative

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ncu_region import REPS, profile  # noqa: E402


def main():
    kind, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    D = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    B, S, H, W = 4, 4096, 2048 // D, 512
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, dout = (jax.random.normal(x, (B, S, H, D), jnp.float32).astype(jnp.bfloat16) for x in ks)
    mask = _mask(kind, S, W, B)
    if path == "dense":
        f = lambda q, k, v, m: fusedattn.dot_product_attention(q, k, v, mask=m)
    elif path == "typed":
        kw = {"causal": dict(is_causal=True), "window": dict(is_causal=True, local_window_size=(W, 0)),
              "padding": dict(is_causal=True, query_seq_lengths=_lengths(B, S),
                              key_value_seq_lengths=_lengths(B, S))}[kind]
        f = lambda q, k, v, m: fusedattn.dot_product_attention(q, k, v, **kw)
    else:
        mask = jnp.where(mask, jnp.zeros((), jnp.bfloat16), jnp.asarray(_large_negative(jnp.bfloat16), jnp.bfloat16))
        f = lambda q, k, v, m: fusedattn.fused_attn(
            (q, k, v), m, None, None, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
            attn_mask_type=AttnMaskType.NO_MASK, _mask_bias=True)
    if mode == "fwd":
        fn = jax.jit(f)
        args = (q, k, v, mask)
    else:
        fn = jax.jit(lambda q, k, v, m, do: jax.grad(
            lambda q, k, v: jnp.sum(f(q, k, v, m).astype(jnp.float32) * do.astype(jnp.float32)),
            (0, 1, 2))(q, k, v))
        args = (q, k, v, mask, dout)
    profile(fn, args)
    print(f"{kind} {path} {mode} D {D}: {REPS} calls")


main()
