"""JAX transformations: jit, grad, vmap, checkpoint and their compositions give the results
of the untransformed call on each slice (vmap folds its axes into the kernel's batch)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import descriptor, loss_fn, normal, qkv
from fusedattn import AttnMaskType

N, B, Sq, Skv, Hq, Hkv, D = 3, 2, 40, 56, 4, 2, 32
MASKS = [AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, AttnMaskType.PADDING_CAUSAL_MASK]


def attn(mask, **kwargs):
    """(q, k, v, seq descriptor or None) -> out, for one mask type."""
    def f(q, k, v, sd=None):
        return fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask, **kwargs)
    return f


def stacked_inputs(key, dtype=jnp.float32):
    """q [N, B, Sq, Hq, D], k/v [N, B, Skv, Hkv, D], lens [N, B] (each slice its own)."""
    kq, kk, kv, kd = jax.random.split(key, 4)
    q = normal(kq, (N, B, Sq, Hq, D), dtype)
    k = normal(kk, (N, B, Skv, Hkv, D), dtype)
    v = normal(kv, (N, B, Skv, Hkv, D), dtype)
    # from_seqlens takes one batch [B]; a stacked descriptor is built field by field.
    sd = fusedattn.SequenceDescriptor(jnp.array([[0, Sq], [5, 17], [Sq, 1]], jnp.int32),
                                      jnp.array([[Skv, 3], [Skv, 0], [40, Skv]], jnp.int32))
    dout = normal(kd, (N, B, Sq, Hq, D), dtype)
    return q, k, v, sd, dout


def slice_sd(sd, n):
    return jax.tree.map(lambda x: x[n], sd)


def assert_same(got, expected, what):
    got, expected = jax.tree.leaves(got), jax.tree.leaves(expected)
    assert len(got) == len(expected), what
    for i, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(e, np.float32),
                                      err_msg=f"{what}: result {i}")


def test_jit_matches_eager(key):
    # Under jit the lengths are traced values, not constants.
    q, k, v, sd, _ = stacked_inputs(key, jnp.bfloat16)
    q, k, v, sd = q[0], k[0], v[0], slice_sd(sd, 1)
    f = attn(AttnMaskType.PADDING_CAUSAL_MASK)
    assert_same(jax.jit(f)(q, k, v, sd), f(q, k, v, sd), "jit")


def test_grad_under_jit_matches_eager(key):
    kx, kd = jax.random.split(key)
    q, k, v = qkv(kx, B, Sq, Skv, Hq, Hkv, D)
    loss = loss_fn(attn(AttnMaskType.CAUSAL_MASK), normal(kd, (B, Sq, Hq, D)))
    g = jax.grad(loss, argnums=(0, 1, 2))
    assert_same(jax.jit(g)(q, k, v), g(q, k, v), "grad")


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_vmap_over_a_leading_axis(key, mask):
    q, k, v, sd, _ = stacked_inputs(key)
    f = attn(mask)
    got = jax.jit(jax.vmap(f))(q, k, v, sd)
    one = jax.jit(f)
    assert_same(got, jnp.stack([one(q[n], k[n], v[n], slice_sd(sd, n)) for n in range(N)]),
                "vmap")


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_vmap_over_q_only(key, mask):
    # in_axes=(0, None, None): every slice of q attends to the same k and v.
    q, k, v, sd, _ = stacked_inputs(key)
    k, v, sd = k[0], v[0], slice_sd(sd, 0)
    f = attn(mask)
    got = jax.jit(jax.vmap(f, in_axes=(0, None, None, None)))(q, k, v, sd)
    one = jax.jit(f)
    assert_same(got, jnp.stack([one(q[n], k, v, sd) for n in range(N)]), "vmap q only")


def test_nested_vmap_over_a_middle_axis(key):
    # The outer vmap maps axis 1 (B) of [N, B, S, H, D], the inner one N; the kernel then
    # sees single sequences [S, H, D] (given back a batch of 1 here).
    q, k, v, sd, _ = stacked_inputs(key)
    f = attn(AttnMaskType.PADDING_CAUSAL_MASK)

    def single(q, k, v, q_len, kv_len):
        return f(q[None], k[None], v[None], descriptor(q_len[None], kv_len[None]))[0]

    nested = jax.vmap(jax.vmap(single), in_axes=1, out_axes=1)
    got = jax.jit(nested)(q, k, v, sd.q_seqlens, sd.kv_seqlens)
    assert_same(got, jax.jit(jax.vmap(f))(q, k, v, sd), "nested vmap")


def test_vmap_of_stats(key):
    q, k, v, sd, _ = stacked_inputs(key)
    f = attn(AttnMaskType.PADDING_MASK, return_max_logit=True, return_aux=True)
    out, aux = jax.jit(jax.vmap(f))(q, k, v, sd)
    assert aux["max_logit"].shape == (N, Hq) and aux["softmax_aux"].shape == (N, B, Hq, Sq, 1)
    one = jax.jit(f)
    for n in range(N):
        o, a = one(q[n], k[n], v[n], slice_sd(sd, n))
        assert_same(out[n], o, f"vmap out[{n}]")
        assert_same(aux["max_logit"][n], a["max_logit"], f"vmap max_logit[{n}]")
        assert_same(aux["softmax_aux"][n], a["softmax_aux"], f"vmap softmax_aux[{n}]")


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_grad_of_vmap_and_vmap_of_grad(key, mask):
    q, k, v, sd, dout = stacked_inputs(key)
    f = attn(mask)

    def loss_of_vmap(q, k, v):
        return jnp.sum(jax.vmap(f)(q, k, v, sd) * dout)

    def loss_one(q, k, v, sd, dout):
        return jnp.sum(f(q, k, v, sd) * dout)

    grad_of_vmap = jax.jit(jax.grad(loss_of_vmap, argnums=(0, 1, 2)))(q, k, v)
    vmap_of_grad = jax.jit(jax.vmap(jax.grad(loss_one, argnums=(0, 1, 2))))(q, k, v, sd, dout)
    one = jax.jit(jax.grad(loss_one, argnums=(0, 1, 2)))
    per_slice = [one(q[n], k[n], v[n], slice_sd(sd, n), dout[n]) for n in range(N)]
    expected = tuple(jnp.stack([g[i] for g in per_slice]) for i in range(3))
    assert_same(grad_of_vmap, expected, "grad of vmap")
    assert_same(vmap_of_grad, expected, "vmap of grad")


def test_grad_of_vmap_over_q_only(key):
    # k and v are shared by the slices: their gradients sum over the vmapped axis.
    q, k, v, sd, dout = stacked_inputs(key)
    k, v, sd = k[0], v[0], slice_sd(sd, 0)
    f = attn(AttnMaskType.CAUSAL_MASK)

    def loss(q, k, v):
        return jnp.sum(jax.vmap(f, in_axes=(0, None, None))(q, k, v) * dout)

    dq, dk, dv = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    one = jax.jit(jax.grad(lambda q, k, v, d: jnp.sum(f(q, k, v) * d), argnums=(0, 1, 2)))
    per_slice = [one(q[n], k, v, dout[n]) for n in range(N)]
    np.testing.assert_array_equal(np.asarray(dq), np.stack([g[0] for g in per_slice]))
    np.testing.assert_allclose(np.asarray(dk), sum(g[1] for g in per_slice), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(dv), sum(g[2] for g in per_slice), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_checkpoint(key, dtype):
    kx, kd = jax.random.split(key)
    q, k, v = qkv(kx, B, Sq, Skv, Hq, Hkv, D, dtype=dtype)
    loss = loss_fn(attn(AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK), normal(kd, (B, Sq, Hq, D), dtype))
    g = lambda f: jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)
    remat = jax.checkpoint(loss)
    assert_same(g(remat), g(loss), "checkpoint")


def test_checkpoint_inside_vmap_inside_grad(key):
    q, k, v, sd, dout = stacked_inputs(key)
    f = jax.checkpoint(attn(AttnMaskType.PADDING_MASK))

    def loss(q, k, v, f):
        return jnp.sum(jax.vmap(f)(q, k, v, sd) * dout)

    g = lambda f: jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)(q, k, v, f)
    assert_same(g(f), g(attn(AttnMaskType.PADDING_MASK)), "grad of vmap of checkpoint")


# ---------------------------------------------------------------------------
# vmap with the feature operands: each slice reads its own bias, softmax_offset, seed and
# THD descriptor (the handler folds the slices into the batch and finds them per slice).


def test_vmap_with_bias_offset_dropout_and_thd(key):
    from fusedattn import AttnBiasType, QKVLayout, SequenceDescriptor, SoftmaxType
    S_ = 48
    ks = jax.random.split(key, 6)
    q = normal(ks[0], (N, B, S_, Hq, D))
    k = normal(ks[1], (N, B, S_, Hkv, D))
    v = normal(ks[2], (N, B, S_, Hkv, D))
    bias = normal(ks[3], (N, 1, Hq, S_, S_))
    offset = normal(ks[4], (N, Hq))
    seeds = jnp.arange(2 * N, dtype=jnp.uint32).reshape(N, 2)
    lens = jnp.array([[[20, 4, 0], [30, 18, 0]], [[48, 0, 0], [1, 1, 1]], [[0, 9, 39], [10, 10, 10]]])
    dout = normal(ks[5], (N, B, S_, Hq, D))

    def f(q, k, v, bias, offset, seed, lens):
        sd = SequenceDescriptor.from_seqlens(lens)
        return fusedattn.fused_attn(
            (q, k, v), bias, sd, seed, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
            attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK, qkv_layout=QKVLayout.THD_THD_THD,
            max_segments_per_seq=3, softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
            softmax_offset=offset, dropout_probability=0.2, is_training=True)

    def loss(q, k, v, bias, offset, seed, lens, dout):
        return jnp.sum(f(q, k, v, bias, offset, seed, lens) * dout)

    args = (q, k, v, bias, offset, seeds, lens)
    out = jax.jit(jax.vmap(f))(*args)
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3, 4))))(*args, dout)
    one, one_g = jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))
    for n in range(N):
        sl = [a[n] for a in args]
        assert_same(out[n], one(*sl), f"vmap out[{n}]")
        assert_same([g[n] for g in grads], one_g(*sl, dout[n]), f"vmap grads[{n}]")


def test_grad_of_vmap_with_a_shared_bias(key):
    # The bias is not mapped: its gradient sums over the slices.
    from fusedattn import AttnBiasType
    q, k, v, _, dout = stacked_inputs(key)
    bias = normal(jax.random.fold_in(key, 9), (1, 1, Sq, Skv))
    f = lambda q, k, v, bias: fusedattn.fused_attn(
        (q, k, v), bias, None, None, attn_bias_type=AttnBiasType.PRE_SCALE_BIAS,
        attn_mask_type=AttnMaskType.CAUSAL_MASK)
    g = jax.jit(jax.grad(lambda bias: jnp.sum(
        jax.vmap(f, in_axes=(0, 0, 0, None))(q, k, v, bias) * dout)))(bias)
    one = jax.jit(jax.grad(lambda bias, n: jnp.sum(f(q[n], k[n], v[n], bias) * dout[n])))
    np.testing.assert_allclose(np.asarray(g), sum(np.asarray(one(bias, n)) for n in range(N)),
                               rtol=1e-5, atol=1e-6)


def test_vmap_of_packed_layouts(key):
    # Packed layouts pass empty k / v operands, which vmap broadcasts like the others.
    from fusedattn import QKVLayout
    qkv_ = normal(key, (N, B, Sq, 3, Hq, D))

    def loss(x):
        out = fusedattn.fused_attn(x, None, None, None, qkv_layout=QKVLayout.BS3HD,
                                   attn_mask_type=AttnMaskType.CAUSAL_MASK)
        return jnp.sum(out ** 2)

    got = jax.jit(jax.vmap(jax.grad(loss)))(qkv_)
    one = jax.jit(jax.grad(loss))
    assert_same(got, jnp.stack([one(qkv_[n]) for n in range(N)]), "vmap of BS3HD grads")
