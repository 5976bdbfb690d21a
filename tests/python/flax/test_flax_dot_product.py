"""fusedattn.flax DotProductAttention (linen and nnx) against plain-jnp attention: forward
and gradients in float32, GQA, the learnable softmax offset, layouts and the transposed
[S, B, H, D] form, enum names, dropout statistics, and the argument errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
import pytest
from flax import nnx

from conftest import normal
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor
from fusedattn.flax import linen as fl
from fusedattn.flax import nnx as fn

import flax_helpers as ref

APIS = ["linen", "nnx"]


def build(api, **kw):
    """-> (apply(params, q, k, v, **call_kw), params): one calling form for both APIs."""
    if api == "linen":
        m = fl.DotProductAttention(**kw)

        def apply(params, *args, rng=None, **call_kw):
            return m.apply(params, *args, rngs=None if rng is None else {"dropout": rng},
                           **call_kw)

        def init(*args):
            return nn.meta.unbox(m.init(jax.random.PRNGKey(0), *args, deterministic=True))
        return apply, init
    head_dim, heads = kw.pop("head_dim"), kw.pop("num_attention_heads")
    m = fn.DotProductAttention(head_dim, heads, **kw)
    graphdef, state = nnx.split(m)

    def apply(params, *args, rng=None, **call_kw):
        return nnx.merge(graphdef, params)(*args, rngs=rng, **call_kw)
    return apply, lambda *args: state


def offset_of(api, params):
    return params["params"]["softmax_offset"] if api == "linen" else params["softmax_offset"][...]


@pytest.mark.parametrize("api,heads,groups,mask", [
    ("linen", 4, 4, "causal"), ("nnx", 4, 2, "no_mask"), ("linen", 6, 1, AttnMaskType.CAUSAL_MASK),
    ("nnx", 6, 3, "CAUSAL_MASK")])
def test_forward_and_grads_match_plain_attention(api, heads, groups, mask, key):
    kq, kk, kv, kd = jax.random.split(key, 4)
    B, S, D = 2, 24, 16
    q = normal(kq, (B, S, heads, D))
    k, v = normal(kk, (B, S, groups, D)), normal(kv, (B, S, groups, D))
    dout = normal(kd, (B, S, heads, D))
    apply, init = build(api, head_dim=D, num_attention_heads=heads, num_gqa_groups=groups,
                        attn_mask_type=mask)
    params = init(q, k, v)
    causal = mask != "no_mask"
    fused = jax.jit(lambda q, k, v: apply(params, q, k, v, deterministic=True))
    ref.assert_close("out", fused(q, k, v), ref.attention(q, k, v, causal=causal))
    loss = lambda f: lambda *a: jnp.sum(f(*a) * dout)
    got = jax.grad(loss(fused), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(lambda *a: ref.attention(*a, causal=causal)), argnums=(0, 1, 2))(q, k, v)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        ref.assert_close(name, g, w)


@pytest.mark.parametrize("api", APIS)
def test_learnable_softmax_offset_is_a_parameter_with_a_gradient(api, key):
    kq, kk, kv, ko, kd = jax.random.split(key, 5)
    B, S, H, D = 2, 16, 4, 8
    q, k, v = (normal(x, (B, S, H, D)) for x in (kq, kk, kv))
    dout = normal(kd, (B, S, H, D))
    apply, init = build(api, head_dim=D, num_attention_heads=H, softmax_type="learnable",
                        attn_mask_type="causal")
    params = init(q, k, v)
    offset = offset_of(api, params)
    assert offset.shape == (H,) and not np.asarray(offset).any()  # zeros init
    # Give the offset random values, then compare value and gradient with the reference.
    sink = normal(ko, (H,))
    if api == "linen":
        params = {"params": {"softmax_offset": sink}}
    else:
        params["softmax_offset"][...] = sink
    out = apply(params, q, k, v, deterministic=True)
    ref.assert_close("out", out, ref.attention(q, k, v, causal=True, sink=sink))

    def loss(params):
        return jnp.sum(apply(params, q, k, v, deterministic=True) * dout)
    grads = jax.grad(loss)(params)
    got = grads["params"]["softmax_offset"] if api == "linen" else grads["softmax_offset"][...]
    want = jax.grad(lambda s: jnp.sum(ref.attention(q, k, v, causal=True, sink=s) * dout))(sink)
    assert np.abs(np.asarray(want)).min() > 1e-4  # a gradient that can be wrong
    ref.assert_close("d softmax_offset", got, want)


@pytest.mark.parametrize("api", APIS)
def test_layouts_transpose_padding_and_bias(api, key):
    kq, kk, kv, kb = jax.random.split(key, 4)
    B, S, H, D = 2, 12, 2, 8
    q, k, v = (normal(x, (B, S, H, D)) for x in (kq, kk, kv))
    want = ref.attention(q, k, v, causal=True)
    common = dict(head_dim=D, num_attention_heads=H)
    apply, init = build(api, qkv_layout="bs3hd", **common)
    qkv = jnp.stack([q, k, v], axis=2)
    ref.assert_close("BS3HD", apply(init(qkv), qkv, None, None, deterministic=True), want)
    apply, init = build(api, qkv_layout=QKVLayout.BSHD_BS2HD, **common)
    kvp = jnp.stack([k, v], axis=2)
    ref.assert_close("BSHD_BS2HD", apply(init(q, kvp), q, kvp, None, deterministic=True), want)
    apply, init = build(api, transpose_batch_sequence=True, **common)
    t = lambda x: jnp.swapaxes(x, 0, 1)
    out = apply(init(t(q), t(k), t(v)), t(q), t(k), t(v), deterministic=True)
    ref.assert_close("transpose_batch_sequence", t(out), want)
    # A padding mask from a descriptor and a post-scale bias.
    bias = normal(kb, (1, H, S, S))
    lens = jnp.array([S, 7], jnp.int32)
    sd = SequenceDescriptor.from_seqlens(lens)
    apply, init = build(api, attn_mask_type="padding_causal", attn_bias_type="post_scale_bias",
                        **common)
    out = apply(init(q, k, v, sd, bias), q, k, v, sd, bias, deterministic=True)
    keep = (jnp.arange(S)[None, :] < lens[:, None])[:, None, None, :]   # [B, 1, 1, S] keys
    want = ref.attention(q, k, v, causal=True, bias=bias, keep=keep)
    rows = np.arange(S)[None, :] < np.asarray(lens)[:, None]             # valid query rows
    ref.assert_close("padding + bias", np.asarray(out)[rows], np.asarray(want)[rows])
    assert not np.asarray(out)[~rows].any()


@pytest.mark.parametrize("api", APIS)
def test_dropout_keeps_one_minus_rate_and_deterministic_is_exact(api, key):
    """Window (0, 0): each query keeps only its own key, so out = v * z / (1 - p) with z
    the engine's keep bit: the kept fraction is 1 - p within 4 sigma over 4096 draws, kept
    rows are v / (1 - p) exactly, another key gives another pattern, and deterministic=True
    drops nothing."""
    kq, kk, kv = jax.random.split(key, 3)
    B, S, H, D, p = 4, 256, 4, 8, 0.3
    q, k = normal(kq, (B, S, H, D)), normal(kk, (B, S, H, D))
    v = 1.0 + jax.random.uniform(kv, (B, S, H, D))                       # nonzero values
    apply, init = build(api, head_dim=D, num_attention_heads=H, attention_dropout=p,
                        window_size=(0, 0), attn_mask_type="causal")
    params = init(q, k, v)
    out = np.asarray(apply(params, q, k, v, deterministic=False, rng=jax.random.PRNGKey(7)))
    kept = out[..., 0] != 0                                              # [B, S, H]
    n = kept.size
    frac = kept.mean()
    assert abs(frac - (1 - p)) < 4 * np.sqrt(p * (1 - p) / n), frac
    np.testing.assert_allclose(out[kept], (np.asarray(v) / (1 - p))[kept], rtol=1e-5)
    other = np.asarray(apply(params, q, k, v, deterministic=False, rng=jax.random.PRNGKey(8)))
    assert ((other[..., 0] != 0) != kept).any()                          # the seed matters
    exact = apply(params, q, k, v, deterministic=True)
    ref.assert_close("deterministic", exact, v)                          # no dropout at all


@pytest.mark.parametrize("api", APIS)
def test_bad_arguments_name_the_argument(api, key):
    q = normal(key, (1, 8, 4, 8))
    with pytest.raises(ValueError, match="num_gqa_groups"):
        apply, init = build(api, head_dim=8, num_attention_heads=4, num_gqa_groups=3)
        apply(init(q, q, q), q, q, q, deterministic=True)
    with pytest.raises(ValueError, match="attn_mask_type='sideways'"):
        apply, init = build(api, head_dim=8, num_attention_heads=4, attn_mask_type="sideways")
        apply(init(q, q, q), q, q, q, deterministic=True)
    with pytest.raises(ValueError, match="head_dim=16"):
        apply, init = build(api, head_dim=16, num_attention_heads=4)
        apply(init(q, q, q), q, q, q, deterministic=True)
    with pytest.raises(ValueError, match="attention_dropout"):
        apply, init = build(api, head_dim=8, num_attention_heads=4, attention_dropout=1.5)
        apply(init(q, q, q), q, q, q, deterministic=False, rng=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="value must be None"):
        apply, init = build(api, head_dim=8, num_attention_heads=4, qkv_layout="BSHD_BS2HD")
        kv = jnp.stack([q, q], 2)
        apply(init(q, kv, q), q, kv, q, deterministic=True)


@pytest.mark.parametrize("api", APIS)
def test_record_max_logit_is_the_per_head_max_of_the_kept_logits(api, key):
    kq, kk, kv = jax.random.split(key, 3)
    B, S, H, D = 2, 16, 4, 8
    q, k, v = (normal(x, (B, S, H, D)) for x in (kq, kk, kv))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5
    want = jnp.max(jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf), axis=(0, 2, 3))
    if api == "linen":
        m = fl.DotProductAttention(head_dim=D, num_attention_heads=H, record_max_logit=True)
        out, state = m.apply({}, q, k, v, deterministic=True, mutable=["intermediates"])
        got = state["intermediates"]["max_logit"][0]
    else:
        m = fn.DotProductAttention(D, H, record_max_logit=True)
        out = m(q, k, v, deterministic=True)
        got = m.max_logit[...]
    ref.assert_close("out", out, ref.attention(q, k, v, causal=True))
    ref.assert_close("max_logit", got, want)
