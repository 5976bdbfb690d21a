"""The drop-in, complete: install() routes jax.nn.dot_product_attention to the engine for
every implementation hint, fusedattn never calls itself through jax.nn, float16 masks stay
finite, float64 runs in float64 on the CPU with every derivative, head dims up to 512."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType
from fusedattn.reference import attention_reference

JAX_DPA = jax.nn.dot_product_attention
B, T, S, N, K, H = 2, 24, 32, 4, 2, 16


def inputs(key, dtype=jnp.float32, h=H):
    kq, kk, kv = jax.random.split(key, 3)
    return (normal(kq, (B, T, N, h), dtype), normal(kk, (B, S, K, h), dtype),
            normal(kv, (B, S, K, h), dtype))


def model(x, w):
    """A one-layer model written against jax.nn, as model libraries write it (Keras
    passes implementation="xla")."""
    q = jnp.einsum("btd,dnh->btnh", x, w[0])
    k = jnp.einsum("btd,dnh->btnh", x, w[1])
    v = jnp.einsum("btd,dnh->btnh", x, w[2])
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    return jnp.sum(o ** 2)


def test_install_routes_jax_nn_to_the_engine(key):
    x = normal(key, (B, T, 32))
    w = normal(jax.random.fold_in(key, 1), (3, 32, N, H)) * 0.2
    want, want_g = jax.value_and_grad(model, argnums=1)(x, w)
    assert "fusedattn" not in jax.jit(model).lower(x, w).as_text()
    with fusedattn.installed():
        assert fusedattn.is_installed()
        hlo = jax.jit(jax.value_and_grad(model, argnums=1)).lower(x, w).as_text()
        assert "fusedattn_attn_fwd" in hlo and "fusedattn_attn_bwd" in hlo
        got, got_g = jax.jit(jax.value_and_grad(model, argnums=1))(x, w)
        for hint in (None, "cudnn"):  # any hint jax takes runs the engine
            lowered = jax.jit(lambda q: jax.nn.dot_product_attention(
                q, q, q, implementation=hint)).lower(x[..., None, :16].repeat(2, 2))
            assert "fusedattn_attn_fwd" in lowered.as_text()
        with pytest.raises(ValueError, match="Unsupported implementation"):
            jax.nn.dot_product_attention(*inputs(key), implementation="triton")
    assert jax.nn.dot_product_attention is JAX_DPA and not fusedattn.is_installed()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(got_g, want_g, rtol=1e-4, atol=1e-5)
    fusedattn.install()
    try:
        assert jax.nn.dot_product_attention is not JAX_DPA
    finally:
        fusedattn.uninstall()
    assert jax.nn.dot_product_attention is JAX_DPA


def test_literal_monkeypatch_never_recurses(key, monkeypatch):
    # The literal swap: an "xla" hint then calls jax's own function (kept at import).
    q, k, v = inputs(key)
    want = JAX_DPA(q, k, v, is_causal=True)
    monkeypatch.setattr(jax.nn, "dot_product_attention", fusedattn.dot_product_attention)
    got = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # the engine
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_float16_mask_is_finite(key):
    q, k, v = inputs(key, jnp.float16)
    mask = jax.random.bernoulli(jax.random.fold_in(key, 2), 0.7, (B, 1, T, S))
    mask = mask.at[:, :, 3].set(False)  # a row that keeps nothing
    with jax.debug_infs(True):
        got = jax.jit(lambda q, k, v, m: fusedattn.dot_product_attention(q, k, v, mask=m))(
            q, k, v, mask)
        got.block_until_ready()
    want = JAX_DPA(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                   mask=mask)
    assert np.isfinite(np.asarray(got, np.float32)).all()
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=5e-3, rtol=5e-3)


@pytest.mark.parametrize("h", [384, 512])
def test_head_dims_up_to_512(key, h):
    q, k, v = inputs(key, h=h)
    dout = normal(jax.random.fold_in(key, 3), (B, T, N, h))
    f = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                             attn_mask_type=AttnMaskType.CAUSAL_MASK)
    r = lambda q, k, v: attention_reference(q, k, v, attn_mask_type=AttnMaskType.CAUSAL_MASK)[0]
    out, vjp = jax.vjp(f, q, k, v)
    rout, rvjp = jax.vjp(r, q, k, v)
    np.testing.assert_allclose(out, rout, rtol=2e-5, atol=2e-5)
    for g, rg in zip(vjp(dout), rvjp(dout)):
        np.testing.assert_allclose(g, rg, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="allowed 1..512"):
        f(*inputs(key, h=513))


def test_float64(key):
    with jax.enable_x64(True):
        q, k, v = (x.astype(jnp.float64) for x in inputs(key))
        bias = normal(jax.random.fold_in(key, 4), (1, N, T, S)).astype(jnp.float64)
        f = lambda q, k, v, bias: fusedattn.dot_product_attention(q, k, v, bias,
                                                                  is_causal=True)
        out = jax.jit(f)(q, k, v, bias)
        assert out.dtype == jnp.float64
        # float64 throughout (jax's own function computes its logits in float32)
        qn, kn, vn = (np.repeat(np.asarray(x), N // K, axis=2) if x is not q else np.asarray(x)
                      for x in (q, k, v))
        s = np.einsum("bqhd,bkhd->bhqk", qn, kn) / np.sqrt(H) + np.asarray(bias)
        s = np.where(np.tril(np.ones((T, S), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), vn)
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out, JAX_DPA(q, k, v, bias, is_causal=True), atol=1e-5)
        # every derivative, to second order, in both modes, against finite differences
        small = [x[:1, :5] for x in (q, k, v)] + [bias[..., :5, :5]]
        check_grads(jax.jit(f), small, order=2, modes=("fwd", "rev"), eps=1e-4, atol=1e-6, rtol=1e-6)
