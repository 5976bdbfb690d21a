"""Where does a training step's attention time go on the GPU? fused_attn fwd+bwd at the
main job's GPU shapes (B 64, S 256, H 6, D 64, bf16, causal; and a long one), with and
without the NaN-row guard (_nan_rows.nan_exact) and max_logit, beside jax.nn's cuDNN."""
import sys, time
import jax, jax.numpy as jnp
import fusedattn
from fusedattn import attention as A, _nan_rows

def bench(f, *a, n=50):
    f(*a)[0].block_until_ready()
    t = time.perf_counter()
    for _ in range(n):
        r = f(*a)
    jax.block_until_ready(r)
    return (time.perf_counter() - t) / n * 1e3

def run(B, S, H, D, label):
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(kk, (B, S, H, D), jnp.bfloat16) for kk in ks)
    def ours(ml):
        def f(q, k, v):
            r = fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=fusedattn.AttnMaskType.CAUSAL_MASK,
                                     return_max_logit=ml)
            out = r[0] if ml else r
            return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    def theirs(q, k, v):
        return jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=True,
                       implementation="cudnn").astype(jnp.float32) * do.astype(jnp.float32))
    rows = {"jax.nn cudnn": jax.jit(jax.value_and_grad(theirs, argnums=(0, 1, 2)))}
    rows["fused"] = ours(False)
    rows["fused+max_logit"] = ours(True)
    t = {name: bench(f, q, k, v) for name, f in rows.items()}
    keep = _nan_rows.nan_exact
    _nan_rows.nan_exact = lambda bwd: bwd
    try:
        t["fused, no NaN guard"] = bench(ours(False), q, k, v)
        t["fused+max_logit, no NaN guard"] = bench(ours(True), q, k, v)
    finally:
        _nan_rows.nan_exact = keep
    base = t["jax.nn cudnn"]
    for name, ms in t.items():
        print(f"{label:22s} {name:32s} {ms:8.3f} ms  {base / ms:5.2f}x jax")

run(64, 256, 6, 64, "B64 S256 H6 D64")
run(4, 4096, 16, 128, "B4 S4096 H16 D128")
