"""dot_product_attention with rows that keep nothing (the engine's average of the values,
backend.h's kRequestAverageEmptyRows) on the GPU, forward and gradients, against jax's XLA
path in float32: bf16 at head dim 128 (the Hopper forward and backward), float32 (the CUDA
flash kernels), with a dense mask that empties rows and key lengths that empty a batch
entry. Prints each result's error relative to the reference's largest element
(empty_rows_gpu.sh PART=tests)."""

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn

B, T, S, N, K = 2, 200, 232, 4, 2


def check(dtype, D):
    ks = jax.random.split(jax.random.PRNGKey(D), 5)
    q = jax.random.normal(ks[0], (B, T, N, D), dtype)
    k = jax.random.normal(ks[1], (B, S, K, D), dtype)
    v = jax.random.normal(ks[2], (B, S, K, D), dtype)
    dout = jax.random.normal(ks[3], (B, T, N, D), dtype)
    mask = jax.random.bernoulli(ks[4], 0.7, (B, 1, T, S)).at[0, 0, 3].set(False).at[1, 0, 150:].set(False)
    kv_lens = jnp.array([0, S - 9], jnp.int32)
    f32 = lambda *x: tuple(a.astype(jnp.float32) for a in x)
    for kw in (dict(mask=mask), dict(key_value_seq_lengths=kv_lens, is_causal=True)):
        def run(f, q, k, v):
            loss = lambda q, k, v: jnp.sum(f(q, k, v, **kw).astype(jnp.float32) * dout.astype(jnp.float32))
            return (f(q, k, v, **kw),) + jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
        ours = jax.jit(lambda q, k, v: run(fusedattn.dot_product_attention, q, k, v))(q, k, v)
        ref = jax.jit(lambda q, k, v: run(
            lambda *a, **k2: jax.nn.dot_product_attention(*a, **k2, implementation="xla"),
            *f32(q, k, v)))(q, k, v)
        for what, a, r in zip(("out", "dq", "dk", "dv"), ours, ref):
            a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
            err = float(np.abs(a - r).max()) / max(1.0, float(np.abs(r).max()))
            tol = 2e-3 if dtype == jnp.float32 else 2e-2  # float32: TF32 matmuls, both sides
            print(f"{jnp.dtype(dtype).name} D{D} {sorted(kw)} {what}: rel err {err:.2e}"
                  f"{'' if err <= tol and not np.isnan(a).any() else '  FAIL'}")


check(jnp.bfloat16, 128)
check(jnp.float32, 64)
