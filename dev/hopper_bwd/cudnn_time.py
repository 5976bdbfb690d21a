"""jax's cuDNN attention at the shapes bwd_time.cu takes: forward and forward+backward ms
(median), and the backward as their difference: the anchor the Hopper backward is read
against. python dev/hopper_bwd/cudnn_time.py B S H Hkv causal [left] [head dim]"""
import sys
import time

import jax
import jax.numpy as jnp


def median_ms(fn, *args, reps=20):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[len(ts) // 2]


def main():
    b, s, h, hkv, causal = (int(x) for x in sys.argv[1:6])
    left = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    d = int(sys.argv[7]) if len(sys.argv) > 7 else 128
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (b, s, h, d), jnp.bfloat16)
    k = jax.random.normal(ks[1], (b, s, hkv, d), jnp.bfloat16)
    v = jax.random.normal(ks[2], (b, s, hkv, d), jnp.bfloat16)
    do = jax.random.normal(ks[3], (b, s, h, d), jnp.bfloat16)
    window = (left, 0) if left >= 0 else None

    def attn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=bool(causal) or left >= 0,
                                            local_window_size=window, implementation="cudnn")

    fwd = jax.jit(attn)

    @jax.jit
    def fwd_bwd(q, k, v, do):
        out, vjp = jax.vjp(attn, q, k, v)
        return out, vjp(do)

    f = median_ms(fwd, q, k, v)
    fb = median_ms(fwd_bwd, q, k, v, do)
    print(f"cudnn D {d} B {b} S {s} H {h} Hkv {hkv} {'causal' if causal else 'full'}"
          f"{' window %d' % left if left >= 0 else ''}: fwd {f:.3f} ms  fwd+bwd {fb:.3f} ms  bwd {fb - f:.3f} ms")


main()
