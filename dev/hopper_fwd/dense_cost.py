"""Where a dense mask's forward time goes on the Hopper forward (session 26): bf16, B 4,
S 4096, H 16, D 128 (bench dense_mask's shape), a causal mask and a 512-key causal window.
Per row, forward ms of
  typed    fused_attn with the mask type (the Hopper forward, the band from the type)
  kernel   fused_attn with the folded mask as its bias (_mask_bias: the classes, the bits and
           the kernel; no wrapper)
  noskip   the same bias without _mask_bias: cuDNN adds it over every tile
  dense    dot_product_attention(mask=...) (kernel + the wrapper's fold and its rebuild of
           rows that keep nothing)
The bias is an argument of the jitted call (not a constant XLA folds), as a model's is.
python dev/hopper_fwd/dense_cost.py [--seq S] [--head-dim D]"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType
from fusedattn.bench.common import time_fn
from fusedattn.dot_product import _large_negative


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=512)
    args = p.parse_args()
    B, S, H, D = 4, args.seq, 16, args.head_dim
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(x, (B, S, H, D), jnp.float32).astype(jnp.bfloat16) for x in ks)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    print(f"B {B} S {S} H {H} D {D} bf16 forward ms ({jax.devices()[0].device_kind})")
    print(f"{'mask':7} {'typed':>7} {'kernel':>7} {'noskip':>7} {'dense':>7}")
    for kind in ("causal", "window"):
        keep = j <= i if kind == "causal" else (j <= i) & (j >= i - args.window)
        mask = jnp.asarray(keep)[None, None]
        bias = jnp.where(mask, jnp.zeros((), jnp.bfloat16),
                         jnp.asarray(_large_negative(jnp.bfloat16), jnp.bfloat16))
        window = None if kind == "causal" else (args.window, 0)
        calls = {
            "typed": (lambda q, k, v, b: fusedattn.fused_attn(
                (q, k, v), None, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK,
                window_size=window)),
            "kernel": (lambda q, k, v, b: fusedattn.fused_attn(
                (q, k, v), b, None, None, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                _mask_bias=True)),
            "noskip": (lambda q, k, v, b: fusedattn.fused_attn(
                (q, k, v), b, None, None, attn_bias_type=AttnBiasType.POST_SCALE_BIAS)),
            "dense": (lambda q, k, v, m: fusedattn.dot_product_attention(q, k, v, mask=m)),
        }
        ms = {}
        for name, f in calls.items():
            arg = mask if name == "dense" else bias
            ms[name] = time_fn(jax.jit(f), (q, k, v, arg), repeats=5)[0] * 1e3
        print(f"{kind:7} " + " ".join(f"{ms[n]:7.3f}" for n in calls), flush=True)


if __name__ == "__main__":
    main()
