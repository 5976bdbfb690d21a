"""Dropout: a Philox4x32-10 keep mask, a pure function of (seed, batch, head, query, key).

With V = identity (Skv == Dv) the output row of a query is its dropped, rescaled
probabilities, so the exact keep mask can be read back from the forward output. That gives
the statistical tests (keep rate; independence across heads, batch entries and seeds), the
check that kept probabilities are scaled by 1 / (1 - p), and a check that the backward
drops the same elements as the forward without asking the reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from features import Spec, check
from fusedattn import AttnMaskType
from fusedattn.reference import dropout_keep, philox4x32_10

B, S, H = 2, 128, 8


def identity_v():
    """v [B, S, H, S]: key j's value is the unit vector e_j, in every head."""
    return jnp.broadcast_to(jnp.eye(S)[None, :, None, :], (B, S, H, S))


def qk(key):
    kq, kk = jax.random.split(key)
    return normal(kq, (B, S, H, 16)), normal(kk, (B, S, H, 16))


def attn(q, k, v, p, seed, training=True, **kw):
    return fusedattn.fused_attn((q, k, v), None, None, seed, dropout_probability=p,
                                is_training=training, **kw)


def keep_mask(out):
    """[B, S, H, S] output with V = I -> bool keep mask [B, H, Sq, Skv]."""
    return np.asarray(out).transpose(0, 2, 1, 3) != 0


def test_philox_known_answers():
    # Random123's known-answer vectors for Philox4x32-10, through the JAX implementation.
    got = philox4x32_10(*(jnp.uint32(x) for x in (0x243f6a88, 0x85a308d3, 0x13198a2e,
                                                   0x03707344, 0xa4093822, 0x299f31d0)))
    assert [int(x) for x in got] == [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    got = philox4x32_10(*(jnp.uint32(0),) * 6)
    assert [int(x) for x in got] == [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_and_scaling(key, p):
    q, k = qk(key)
    v = identity_v()
    dropped, plain = jax.jit(lambda q, k: (attn(q, k, v, p, 1234), attn(q, k, v, 0.0, None)))(q, k)
    keep = keep_mask(dropped)
    n = keep.size
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma, (keep.mean(), 1 - p)
    # Kept probabilities are scaled by 1 / (1 - p); dropped ones are 0.
    d, pl = np.asarray(dropped).transpose(0, 2, 1, 3), np.asarray(plain).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(d[keep], pl[keep] / (1 - p), rtol=2e-6)
    assert (pl > 0).all(), "every probability is positive, so 0 means dropped"


def test_mask_is_the_documented_philox_rule(key):
    q, k = qk(key)
    seed = jnp.array([7, 99], jnp.uint32)
    keep = keep_mask(attn(q, k, identity_v(), 0.3, seed))
    np.testing.assert_array_equal(keep, np.asarray(dropout_keep(seed, 0.3, B, H, S, S)))


def _agreement(a, b):
    return float((a == b).mean())


def test_masks_are_independent_across_heads_batches_and_seeds(key):
    p = 0.5
    q, k = qk(key)
    q = jnp.broadcast_to(q[:1, :, :1], q.shape)  # identical inputs everywhere: only the
    k = jnp.broadcast_to(k[:1, :, :1], k.shape)  # mask can tell heads and batches apart
    a = keep_mask(attn(q, k, identity_v(), p, 5))
    b = keep_mask(attn(q, k, identity_v(), p, 6))
    expect = p * p + (1 - p) * (1 - p)
    sigma = np.sqrt(expect * (1 - expect) / a[0, 0].size)
    for what, x, y in (("heads", a[0, 0], a[0, 1]), ("heads", a[1, 3], a[1, 7]),
                       ("batch", a[0, 2], a[1, 2]), ("seed", a[0, 0], b[0, 0])):
        assert abs(_agreement(x, y) - expect) < 5 * sigma, what
    # Neighbouring keys and queries within one head are independent too.
    assert abs(_agreement(a[0, 0, :, :-1], a[0, 0, :, 1:]) - expect) < 5 * sigma
    assert abs(_agreement(a[0, 0, :-1], a[0, 0, 1:]) - expect) < 5 * sigma


def test_fixed_seed_reproduces_bitwise(key):
    q, k = qk(key)
    v = normal(jax.random.fold_in(key, 1), (B, S, H, 16))
    f = jax.jit(lambda seed: attn(q, k, v, 0.3, seed))
    np.testing.assert_array_equal(np.asarray(f(42)), np.asarray(f(42)))
    np.testing.assert_array_equal(np.asarray(f(42)), np.asarray(attn(q, k, v, 0.3, 42)))
    assert not np.array_equal(np.asarray(f(42)), np.asarray(f(43)))


def test_backward_drops_what_the_forward_dropped(key):
    # With V = I the forward output is P_dropped; dV must be P_dropped^T dO summed over the
    # q heads of each kv head, which holds only if the backward drew the same mask.
    q, k = qk(key)
    k, v = k[:, :, :2], identity_v()[:, :, :2]  # GQA: 4 q heads per kv head
    dout = normal(jax.random.fold_in(key, 2), (B, S, H, S))
    f = lambda v: attn(q, k, v, 0.4, 2024)
    out, vjp = jax.vjp(f, v)
    (dv,) = vjp(dout)
    pd = np.asarray(out).reshape(B, S, 2, 4, S)           # [b, i, hk, g, j]
    expected = np.einsum("bikgj,bikgd->bjkd", pd, np.asarray(dout).reshape(B, S, 2, 4, S))
    np.testing.assert_allclose(np.asarray(dv), expected, rtol=1e-4, atol=1e-5)


def test_inference_disables_dropout(key):
    q, k = qk(key)
    v = identity_v()
    np.testing.assert_array_equal(np.asarray(attn(q, k, v, 0.5, 3, training=False)),
                                  np.asarray(attn(q, k, v, 0.0, None)))


def test_seed_forms(key):
    q, k = qk(key)
    v = identity_v()
    f = lambda seed: np.asarray(attn(q, k, v, 0.5, seed))
    np.testing.assert_array_equal(f(5), f(jnp.array([5, 0], jnp.uint32)))
    np.testing.assert_array_equal(f(jax.random.PRNGKey(5)), f(jax.random.key(5)))
    np.testing.assert_array_equal(f(2 ** 33 + 1), f(jnp.array([1, 2], jnp.uint32)))
    np.testing.assert_array_equal(jax.jit(lambda s: attn(q, k, v, 0.5, s))(jnp.int32(5)), f(5))
    with pytest.raises(ValueError, match="seed"):
        attn(q, k, v, 0.5, None)
    with pytest.raises(ValueError, match="seed must be"):
        attn(q, k, v, 0.5, jnp.zeros((3,), jnp.float32))


def test_vmap_over_seeds(key):
    q, k = qk(key)
    v = normal(jax.random.fold_in(key, 1), (B, S, H, 16))
    seeds = jnp.array([[1, 0], [2, 0], [3, 7]], jnp.uint32)
    got = jax.jit(jax.vmap(lambda s: attn(q, k, v, 0.3, s)))(seeds)
    for n in range(3):
        np.testing.assert_array_equal(np.asarray(got[n]), np.asarray(attn(q, k, v, 0.3, seeds[n])))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_dropout_gradients_against_reference(key, dtype):
    # The reference draws the same mask, so forward and gradients compare directly.
    check(key, Spec(dtype=dtype, mask=AttnMaskType.CAUSAL_MASK, Sq=96, Skv=96, Hq=4, Hkv=2,
                    dropout=0.25, seed=77))


def test_broadcast_shares_batch_0_head_0s_mask(key):
    """dropout_broadcast: one mask for every batch entry and head (Flax's broadcast_dropout),
    the one batch entry 0, head 0 draws without it; inputs differ everywhere."""
    q, k = qk(key)
    seed = jnp.array([11, 5], jnp.uint32)
    shared = keep_mask(attn(q, k, identity_v(), 0.3, seed, dropout_broadcast=True))
    own = keep_mask(attn(q, k, identity_v(), 0.3, seed))
    for b in range(B):
        for h in range(H):
            np.testing.assert_array_equal(shared[b, h], shared[0, 0])
    np.testing.assert_array_equal(shared[0, 0], own[0, 0])
    assert not np.array_equal(own[1, 3], own[0, 0])  # without it the masks differ
    want = dropout_keep(seed, 0.3, B, H, S, S, broadcast=True)
    np.testing.assert_array_equal(shared, np.asarray(want))


def test_broadcast_backward_drops_what_the_forward_dropped(key):
    q, k = qk(key)
    k, v = k[:, :, :2], identity_v()[:, :, :2]  # GQA: 4 q heads per kv head
    dout = normal(jax.random.fold_in(key, 2), (B, S, H, S))
    out, vjp = jax.vjp(lambda v: attn(q, k, v, 0.4, 2025, dropout_broadcast=True), v)
    (dv,) = vjp(dout)
    pd = np.asarray(out).reshape(B, S, 2, 4, S)
    expected = np.einsum("bikgj,bikgd->bjkd", pd, np.asarray(dout).reshape(B, S, 2, 4, S))
    np.testing.assert_allclose(np.asarray(dv), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK])
def test_broadcast_against_reference(key, mask):
    """Forward and gradients of a broadcast-dropout call against reference.py's, GQA."""
    from fusedattn.reference import attention_reference
    ks = jax.random.split(key, 4)
    q, k, v = normal(ks[0], (2, 64, 4, 16)), normal(ks[1], (2, 64, 2, 16)), normal(ks[2], (2, 64, 2, 16))
    dout = normal(ks[3], (2, 64, 4, 16))
    seed = jnp.array([3, 4], jnp.uint32)

    def ours(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, seed, attn_mask_type=mask,
                                    dropout_probability=0.2, is_training=True,
                                    dropout_broadcast=True)

    def ref(q, k, v):
        return attention_reference(q, k, v, attn_mask_type=mask, dropout_probability=0.2,
                                   seed=seed, dropout_broadcast=True)[0]

    o1, vjp1 = jax.vjp(ours, q, k, v)
    o2, vjp2 = jax.vjp(ref, q, k, v)
    np.testing.assert_allclose(np.asarray(o1), np.asarray(o2), rtol=2e-5, atol=2e-6)
    for name, a, b in zip("qkv", vjp1(dout), vjp2(dout)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5, err_msg=name)


def test_broadcast_routes_the_gpu_to_the_cuda_flash_kernels():
    from fusedattn import _lib
    call = dict(dropout_probability=0.1, is_training=True)
    qkv = tuple(jax.ShapeDtypeStruct((2, 128, 4, 64), jnp.bfloat16) for _ in range(3))
    assert fusedattn.get_backend(qkv, platform="cpu", dropout_broadcast=True, **call).name == "cpu_flash"
    if not _lib.built_with_cuda():
        return  # the GPU's answer comes from the library's CUDA side (C++ tests cover the rule)
    info = fusedattn.get_backend(qkv, platform="gpu", dropout_broadcast=True, **call)
    assert info.name == "cuda_flash" and "dropout_broadcast" in info.reason, info
