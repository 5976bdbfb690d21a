"""The wide CUDA flash backward (head dims > 128, flash_mma_bwd_wide.cu) timed alone: forward and
forward+backward ms through fused_attn, the backward as their difference (one process), beside
XLA's attention (jax.nn.dot_product_attention, implementation="xla") for the float32 rows.

    python dev/cuda_flash/wide_bwd_time.py [--repeats 3] [--no-xla]

Rows: bf16 D 512 causal S 4096 (issue 24's training row), float32 (TF32) D 256 full S 4096 and
causal S 8192, float32 D 384 / Dv 128 full S 4096 (B 1, H 8; no XLA row there).
"""
import argparse

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType
from fusedattn.bench.common import time_fn

ROWS = [("bf16 D512 causal S4096", jnp.bfloat16, 512, 512, 4096, True),
        ("f32 D256 full S4096", jnp.float32, 256, 256, 4096, False),
        ("f32 D256 causal S8192", jnp.float32, 256, 256, 8192, True),
        ("f32 D384/128 full S4096", jnp.float32, 384, 128, 4096, False)]


def times(f, args, repeats):
    loss = lambda *a: jnp.sum(f(*a[:3]).astype(jnp.float32) * a[3].astype(jnp.float32))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    t_f = time_fn(jax.jit(f), args[:3], repeats=repeats)[0] * 1e3
    t_fb = time_fn(grad, args, repeats=repeats)[0] * 1e3
    return t_f, t_fb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-xla", action="store_true")
    a = ap.parse_args()
    print("ms: forward / forward+backward (backward alone)")
    for name, dtype, D, Dv, S, causal in ROWS:
        ks = jax.random.split(jax.random.PRNGKey(D), 4)
        n = lambda k, d: jax.random.normal(k, (1, S, 8, d), jnp.float32).astype(dtype)
        args = (n(ks[0], D), n(ks[1], D), n(ks[2], Dv), n(ks[3], Dv))
        mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK
        ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)
        info = fusedattn.get_backend(args[:3], attn_mask_type=mask, is_training=True, platform="gpu")
        t_f, t_fb = times(ours, args, a.repeats)
        line = f"{name:24s} {info.forward}/{info.backward}: {t_f:.3f} / {t_fb:.3f} ({t_fb - t_f:.3f})"
        if dtype == jnp.float32 and D == Dv and not a.no_xla:
            xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
            x_f, x_fb = times(xla, args, a.repeats)
            line += f"; XLA {x_f:.3f} / {x_fb:.3f} ({x_f / t_f:.2f}x / {x_fb / t_fb:.2f}x)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
