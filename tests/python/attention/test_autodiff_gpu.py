"""On the GPU: every transformation of fused_attn (cuDNN forward/backward for first-order
reverse mode, the reference's derivatives for the rest), float64 through the float32
kernels, head dims above 256 (the reference where the kernels decline), and install()."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType
from fusedattn.reference import attention_reference

pytestmark = pytest.mark.gpu
B, Sq, Skv, Hq, Hkv, D = 2, 128, 192, 4, 2, 64


def inputs(key, dtype=jnp.float32, d=D):
    kq, kk, kv, kb = jax.random.split(key, 4)
    return (normal(kq, (B, Sq, Hq, d), dtype), normal(kk, (B, Skv, Hkv, d), dtype),
            normal(kv, (B, Skv, Hkv, d), dtype), normal(kb, (1, Hq, Sq, Skv), dtype))


def fused(q, k, v, bias):
    return fusedattn.fused_attn((q, k, v), bias, None, None,
                                attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                                attn_mask_type=AttnMaskType.CAUSAL_MASK)


def ref(q, k, v, bias):
    return attention_reference(q, k, v, bias=bias,
                               attn_mask_type=AttnMaskType.CAUSAL_MASK)[0]


def close(got, want, tol, what):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g / scale, w / scale, atol=tol, rtol=0, err_msg=f"{what}[{i}]")


def test_first_order_grad_is_fused_on_gpu(key):
    q, k, v, bias = inputs(key, jnp.bfloat16)
    loss = lambda q, k, v: jnp.sum(fused(q, k, v, bias).astype(jnp.float32) ** 2)
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()
    assert "fusedattn_attn_fwd_cuda" in hlo and "fusedattn_attn_bwd_cuda" in hlo


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_jvp_hessian_vector_product_on_gpu(key, dtype):
    # bfloat16: cuDNN's forward and backward inside (float32 runs the reference on the
    # GPU); compared with the float32 reference of the rounded inputs.
    tol = 2e-5 if dtype == jnp.float32 else 3e-2
    q, k, v, bias = inputs(key, dtype)
    t = inputs(jax.random.fold_in(key, 1), dtype)
    with jax.default_matmul_precision("highest"):
        out, tan = jax.jit(lambda p, t: jax.jvp(fused, p, t))((q, k, v, bias), t)
        q, k, v, bias = (x.astype(jnp.float32) for x in (q, k, v, bias))
        t = tuple(x.astype(jnp.float32) for x in t)
        rout, rtan = jax.jit(lambda p, t: jax.jvp(ref, p, t))((q, k, v, bias), t)
        close((out, tan), (rout, rtan), tol, "jvp")
        if dtype != jnp.float32:
            return

        def hvp(f):
            g = lambda q: jax.grad(lambda q: jnp.sum(jnp.sin(f(q, k, v, bias))))(q)
            return jax.jit(lambda q, t: jax.jvp(g, (q,), (t,))[1])(q, t[0])

        close(hvp(fused), hvp(ref), 1e-4, "hvp")
        gg = lambda f: jax.jit(jax.grad(lambda k: jnp.sum(
            jax.grad(lambda q: jnp.sum(f(q, k, v, bias) ** 2))(q) ** 2)))(k)
        close(gg(fused), gg(ref), 1e-4, "grad of grad")


def test_float64_runs_the_float32_path_on_gpu(key):
    with jax.enable_x64(True):
        q, k, v, bias = (x.astype(jnp.float64) for x in inputs(key))
        out, vjp = jax.vjp(jax.jit(fused), q, k, v, bias)
        assert out.dtype == jnp.float64
        r32 = [x.astype(jnp.float32) for x in (q, k, v, bias)]
        with jax.default_matmul_precision("highest"):
            rout, rvjp = jax.vjp(ref, *r32)
        close(out, rout, 2e-5, "out")
        dout = jnp.ones_like(out)
        close(vjp(dout), rvjp(dout.astype(jnp.float32)), 1e-4, "grads")


@pytest.mark.parametrize("d", [384, 512])
def test_head_dims_above_256_on_gpu(key, d):
    q, k, v, bias = inputs(key, jnp.bfloat16, d)
    out, vjp = jax.vjp(jax.jit(fused), q, k, v, bias)
    r32 = [x.astype(jnp.float32) for x in (q, k, v, bias)]
    with jax.default_matmul_precision("highest"):
        rout, rvjp = jax.vjp(ref, *r32)
    close(out, rout, 2e-2, "out")
    dout = normal(jax.random.fold_in(key, 5), out.shape, jnp.bfloat16)
    close(vjp(dout), rvjp(dout.astype(jnp.float32)), 5e-2, "grads")


def test_install_runs_the_engine_on_gpu(key):
    q, k, v, _ = inputs(key, jnp.bfloat16)
    with fusedattn.installed():
        hlo = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="cudnn")).lower(q, k, v).as_text()
    assert "fusedattn_attn_fwd_cuda" in hlo
