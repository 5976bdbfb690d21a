"""A scaling_factor traced under jit or grad (as jax.nn.dot_product_attention's scale):
fused_attn folds it into q (and a PRE_SCALE_BIAS) and runs the kernels with scale 1.0.
Forward, the statistics and every gradient, the scale's included, match the reference
called with the same traced scale; dot_product_attention and small_seq follow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SmallSeqDescriptor
from fusedattn.reference import attention_reference

B, S, H, D = 2, 24, 2, 16
TOL = dict(rtol=2e-5, atol=2e-5)


def _inputs(seed=0):
    ks = jax.random.split(jax.random.key(seed), 5)
    q, k, v = (jax.random.normal(kk, (B, S, H, D), jnp.float32) for kk in ks[:3])
    bias = jax.random.normal(ks[3], (1, H, S, S), jnp.float32)
    dout = jax.random.normal(ks[4], (B, S, H, D), jnp.float32)
    return q, k, v, bias, dout


@pytest.mark.parametrize("bias_type", list(AttnBiasType), ids=lambda b: b.name)
@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK],
                         ids=lambda m: m.name)
def test_traced_scale_matches_the_reference(bias_type, mask):
    q, k, v, bias, dout = _inputs()
    bias = None if bias_type == AttnBiasType.NO_BIAS else bias

    def fused(q, k, v, bias, scale):
        out, aux = fusedattn.fused_attn((q, k, v), bias, None, None, attn_bias_type=bias_type,
                                        attn_mask_type=mask, scaling_factor=scale,
                                        return_aux=True, return_max_logit=True)
        return jnp.vdot(out, dout), (out, aux)

    def ref(q, k, v, bias, scale):
        out, lse, max_logit = attention_reference(
            q, k, v, attn_mask_type=mask, scaling_factor=scale, bias=bias,
            attn_bias_type=bias_type if bias is not None else AttnBiasType.POST_SCALE_BIAS)
        return jnp.vdot(out, dout), (out, lse, max_logit)

    argnums = (0, 1, 2, 4) if bias is None else (0, 1, 2, 3, 4)
    scale = jnp.float32(0.37)
    (_, (out, aux)), grads = jax.jit(jax.value_and_grad(fused, argnums, has_aux=True))(
        q, k, v, bias, scale)
    (_, (out_r, lse_r, max_r)), grads_r = jax.jit(jax.value_and_grad(ref, argnums, has_aux=True))(
        q, k, v, bias, scale)
    np.testing.assert_allclose(out, out_r, **TOL)
    np.testing.assert_allclose(aux["softmax_aux"][..., 0], lse_r, **TOL)
    np.testing.assert_allclose(aux["max_logit"], jnp.max(max_r, axis=0), **TOL)
    for g, g_r in zip(grads, grads_r):
        np.testing.assert_allclose(g, g_r, rtol=1e-4, atol=1e-4)
    assert abs(float(grads[-1])) > 1e-3  # the scale gets a real gradient


def test_traced_scale_equals_the_static_one():
    q, k, v, _, _ = _inputs(1)
    static = fusedattn.fused_attn((q, k, v), None, None, None, scaling_factor=0.37)
    traced = jax.jit(lambda s: fusedattn.fused_attn((q, k, v), None, None, None,
                                                    scaling_factor=s))(jnp.float32(0.37))
    np.testing.assert_allclose(traced, static, **TOL)


def test_traced_scale_in_a_packed_layout():
    q, k, v, _, _ = _inputs(2)
    qkv = jnp.stack([q, k, v], axis=2)  # [B, S, 3, H, D]
    f = lambda qkv, s: fusedattn.fused_attn(qkv, None, None, None, qkv_layout=QKVLayout.BS3HD,
                                            scaling_factor=s).sum()
    r = lambda qkv, s: attention_reference(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                                           scaling_factor=s)[0].sum()
    g = jax.jit(jax.grad(f, (0, 1)))(qkv, jnp.float32(0.5))
    g_r = jax.jit(jax.grad(r, (0, 1)))(qkv, jnp.float32(0.5))
    for a, b in zip(g, g_r):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_dot_product_attention_takes_a_traced_scale_like_jax():
    q, k, v, _, dout = _inputs(3)
    loss = lambda impl: lambda q, s: jnp.vdot(impl(q, k, v, scale=s, is_causal=True), dout)
    ours = jax.jit(jax.value_and_grad(loss(fusedattn.dot_product_attention), (0, 1)))
    jaxs = jax.jit(jax.value_and_grad(loss(jax.nn.dot_product_attention), (0, 1)))
    (val, (dq, ds)), (val_j, (dq_j, ds_j)) = ours(q, 0.3), jaxs(q, 0.3)
    np.testing.assert_allclose(val, val_j, rtol=1e-4)
    np.testing.assert_allclose(dq, dq_j, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ds, ds_j, rtol=1e-4, atol=1e-4)


def test_small_seq_takes_a_traced_scale():
    n, w, d = 4, 3, 64
    ks = jax.random.split(jax.random.key(4), 3)
    q = jax.random.normal(ks[0], (n, H, d), jnp.float32)
    k = jax.random.normal(ks[1], (n * w, H, d), jnp.float32)
    v = jax.random.normal(ks[2], (n * w, H, d), jnp.float32)
    sd = SmallSeqDescriptor.from_cu_seqlens(np.arange(n + 1, dtype=np.int32),
                                            np.arange(n + 1, dtype=np.int32) * w,
                                            max_segment_seqlen_kv=w)
    f = lambda q, s, scale: fusedattn.fused_attn_small_seq((q, k, v), None, sd, None,
                                                           scaling_factor=scale).sum() * s
    static = jax.grad(lambda q: f(q, 1.0, 0.2))(q)
    traced, dscale = jax.jit(jax.grad(lambda q, s: f(q, 1.0, s), (0, 1)))(q, jnp.float32(0.2))
    np.testing.assert_allclose(traced, static, rtol=1e-5, atol=1e-5)
    # d/ds by central differences of the static calls
    eps = 1e-3
    fd = (f(q, 1.0, 0.2 + eps) - f(q, 1.0, 0.2 - eps)) / (2 * eps)
    np.testing.assert_allclose(dscale, fd, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("scale", [jnp.ones((2,)), jnp.array(1 + 1j), jnp.array(True)],
                         ids=["vector", "complex", "bool"])
def test_a_traced_scale_must_be_a_real_scalar(scale):
    q = jnp.ones((B, S, H, D))
    with pytest.raises(TypeError, match="scaling_factor must be a real scalar"):
        jax.jit(lambda s: fusedattn.fused_attn((q, q, q), None, None, None,
                                               scaling_factor=s))(scale)
