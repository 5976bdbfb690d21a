"""PRE_SCALE_BIAS / POST_SCALE_BIAS with bias [1|B, 1|Hq, Sq, Skv]: forward and dbias (summed
over the broadcast dims) against the reference, with padding and with -inf entries."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import DTYPES, descriptor, qkv
from features import Spec, check
from fusedattn import AttnBiasType, AttnMaskType

B, Sq, Skv, Hq = 2, 70, 90, 4
SHAPES = [(1, 1), (B, 1), (1, Hq), (B, Hq)]
TYPES = [AttnBiasType.POST_SCALE_BIAS, AttnBiasType.PRE_SCALE_BIAS]


def _grid():
    for i, bt in enumerate(TYPES):
        for j, (bb, bh) in enumerate(SHAPES):
            dtype = DTYPES[(i + j) % 3]
            yield pytest.param(bt, (bb, bh, Sq, Skv), dtype,
                               id=f"{bt.name}-{bb}x{bh}-{jnp.dtype(dtype).name}")


@pytest.mark.parametrize("bias_type, shape, dtype", list(_grid()))
def test_bias_against_reference(key, bias_type, shape, dtype):
    r = check(key, Spec(dtype=dtype, mask=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, Sq=Sq, Skv=Skv,
                        Hq=Hq, Hkv=2, bias_shape=shape, bias_type=bias_type, scale=0.3))
    assert r["fused_g"][3].shape == shape and r["fused_g"][3].dtype == dtype, "dbias: bias's shape"


@pytest.mark.parametrize("bias_type", TYPES, ids=lambda b: b.name)
def test_bias_with_padding(key, bias_type):
    # Padding rows and keys get no bias gradient.
    r = check(key, Spec(mask=AttnMaskType.PADDING_MASK, Sq=Sq, Skv=Skv, Hq=Hq, Hkv=1,
                        sd=descriptor([40, 0], [Skv, 13]), bias_shape=(B, 1, Sq, Skv),
                        bias_type=bias_type))
    dbias = np.asarray(r["fused_g"][3])
    assert not dbias[0, :, 40:].any() and not dbias[1].any() and not dbias[0, :, :, 90:].any()


def test_pre_and_post_scale_differ(key):
    # PRE_SCALE_BIAS scales the bias with q.k; with scale != 1 the two types differ.
    q, k, v = qkv(key, B, 16, 16, 2, 2, 8)
    bias = jax.random.normal(jax.random.fold_in(key, 1), (1, 2, 16, 16))
    f = lambda t: fusedattn.fused_attn((q, k, v), bias, None, None, attn_bias_type=t,
                                       scaling_factor=0.25)
    assert not np.allclose(f(TYPES[0]), f(TYPES[1]), atol=1e-3)


def test_minus_inf_bias_masks(key):
    # A bias of -inf removes a key like a mask does; a row whose every key is -inf gives 0
    # and finite gradients.
    q, k, v = qkv(key, B, 20, 20, 2, 2, 16)
    bias = jax.random.normal(jax.random.fold_in(key, 1), (B, 1, 20, 20))
    bias = bias.at[:, :, :, 15:].set(-jnp.inf).at[0, :, 3].set(-jnp.inf)
    f = lambda q, k, v, bias: fusedattn.fused_attn(
        (q, k, v), bias, None, None, attn_bias_type=AttnBiasType.POST_SCALE_BIAS)
    cut = fusedattn.fused_attn((q, k[:, :15], v[:, :15]), bias[:, :, :, :15], None, None,
                               attn_bias_type=AttnBiasType.POST_SCALE_BIAS)
    out = f(q, k, v, bias)
    np.testing.assert_allclose(np.asarray(out[:, :3]), np.asarray(cut[:, :3]), rtol=1e-5,
                               atol=1e-6)
    assert not np.asarray(out[0, 3]).any()
    grads = jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2, 3))(q, k, v, bias)
    for g in grads:
        assert np.isfinite(np.asarray(g)).all()
    assert not np.asarray(grads[3])[:, :, :, 15:].any()


def _bwd_flags(hlo: str) -> list:
    """backend_flags of every backward custom call in a lowered (StableHLO) text."""
    calls = list(re.finditer(r"custom_call @fusedattn_attn_bwd[^\n]*", hlo))
    return [int(re.search(r"backend_flags = (\d+)", m.group(0)).group(1)) for m in calls]


def test_dbias_is_skipped_only_when_the_bias_has_no_tangent(key):
    """A bias nobody differentiates (a constant, a folded mask) has no tangent: the
    backward asks the kernels for no dbias (_lib.REQUEST_NO_DBIAS) and the other gradients
    are unchanged; differentiating the bias asks for it, and it matches the reference."""
    from fusedattn import _lib
    q, k, v = qkv(key, 2, 40, 40, 4, 2, 32)
    bias = jax.random.normal(jax.random.fold_in(key, 7), (1, 4, 40, 40), jnp.float32)
    dout = jax.random.normal(jax.random.fold_in(key, 8), q.shape, jnp.float32)
    kw = dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    loss = lambda q, k, v, b: jnp.sum(fusedattn.fused_attn((q, k, v), b, None, None, **kw) * dout)
    ref = lambda q, k, v, b: jnp.sum(fusedattn.attention_reference(
        q, k, v, bias=b, **{"attn_bias_type": kw["attn_bias_type"],
                            "attn_mask_type": kw["attn_mask_type"]})[0] * dout)
    no_bias_grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    with_bias_grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    flags = _bwd_flags(no_bias_grad.lower(q, k, v, bias).as_text())
    assert flags and all(f & _lib.REQUEST_NO_DBIAS for f in flags), flags
    flags = _bwd_flags(with_bias_grad.lower(q, k, v, bias).as_text())
    assert flags and not any(f & _lib.REQUEST_NO_DBIAS for f in flags), flags
    got3, got4 = no_bias_grad(q, k, v, bias), with_bias_grad(q, k, v, bias)
    want = jax.grad(ref, argnums=(0, 1, 2, 3))(q, k, v, bias)
    for a, b, w in zip(got3, got4, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same kernels
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got4[3]), np.asarray(want[3]), rtol=2e-5, atol=2e-5)
    # grad of grad through the same call (the backward's derivative) still works
    hvp = jax.grad(lambda q: jnp.sum(jax.grad(loss)(q, k, v, bias) ** 2))(q)
    hvp_ref = jax.grad(lambda q: jnp.sum(jax.grad(ref)(q, k, v, bias) ** 2))(q)
    np.testing.assert_allclose(np.asarray(hvp), np.asarray(hvp_ref), rtol=1e-4, atol=1e-4)
