"""The attention_fn adapter plugged into Flax's own modules equals Flax's default attention
(flax.linen.MultiHeadDotProductAttention, flax.nnx.MultiHeadAttention; boolean and float
masks, causal by mask and by is_causal, GQA, a fully masked row, under jit, forward and
gradients), and its dropout keeps 1 - rate of the probabilities with the seed from
dropout_rng, one mask for the batch and heads with broadcast_dropout."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import normal
from fusedattn.flax import linen as fl
from fusedattn.flax import nnx as fn

import flax_helpers as ref

B, S, E, H = 2, 16, 32, 4


def masks(kind):
    """[B, 1, S, S] keep-masks of Flax's conventions (None: none)."""
    causal = nn.make_causal_mask(jnp.ones((B, S)))
    if kind is None:
        return None
    if kind == "causal":
        return causal
    lens = jnp.array([S, 9])
    pad = nn.make_attention_mask(jnp.arange(S)[None] < lens[:, None],
                                 jnp.arange(S)[None] < lens[:, None])
    both = nn.combine_masks(causal, pad)
    # Row 3 of batch 1 keeps no key: Flax averages the values there; so must the adapter.
    both = both.at[1, 0, 3].set(False)
    return both if kind == "causal_padding_bool" else both.astype(jnp.float32)


@pytest.mark.parametrize("mask_kind", [None, "causal_padding_bool", "causal_padding_float"])
def test_linen_multi_head_dot_product_attention(mask_kind, key):
    kx, kd = jax.random.split(key)
    x, dy = normal(kx, (B, S, E)), normal(kd, (B, S, E))
    mask = masks(mask_kind)
    plain = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=E, deterministic=True)
    ours = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=E, deterministic=True,
                                           attention_fn=fl.attention_fn)
    params = plain.init(jax.random.PRNGKey(0), x, mask=mask)
    run = lambda m: jax.jit(lambda p, x: m.apply(p, x, mask=mask))
    ref.assert_close("out", run(ours)(params, x), run(plain)(params, x))
    loss = lambda m: lambda p, x: jnp.sum(m.apply(p, x, mask=mask) * dy)
    g_ours = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(params, x)
    g_plain = jax.jit(jax.grad(loss(plain), argnums=(0, 1)))(params, x)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_ours), jax.tree.leaves(g_plain)):
        ref.assert_close(jax.tree_util.keystr(path), a, b)


def test_linen_causal_attention_fn_equals_a_dense_causal_mask(key):
    x = normal(key, (B, S, E))
    plain = nn.MultiHeadDotProductAttention(num_heads=H, deterministic=True)
    ours = nn.MultiHeadDotProductAttention(num_heads=H, deterministic=True,
                                           attention_fn=fl.make_attention_fn(is_causal=True))
    params = plain.init(jax.random.PRNGKey(0), x)
    want = plain.apply(params, x, mask=nn.make_causal_mask(jnp.ones((B, S))))
    ref.assert_close("is_causal", ours.apply(params, x), want)


@pytest.mark.parametrize("kv_heads,causal_by", [(4, "mask"), (2, "is_causal"), (1, "mask")])
def test_nnx_multi_head_attention(kv_heads, causal_by, key):
    kx, kd = jax.random.split(key)
    x, dy = normal(kx, (B, S, E)), normal(kd, (B, S, E))
    kw = dict(num_heads=H, in_features=E, num_kv_heads=kv_heads, decode=False,
              deterministic=True)
    plain = nnx.MultiHeadAttention(**kw, rngs=nnx.Rngs(0))
    ours = nnx.MultiHeadAttention(**kw, attention_fn=fn.attention_fn, rngs=nnx.Rngs(0))
    mask = masks("causal_padding_float") if causal_by == "mask" else None
    call = dict(mask=mask, is_causal=causal_by == "is_causal")

    @nnx.jit
    def run(m, x):
        return m(x, **call)

    ref.assert_close("out", run(ours, x), run(plain, x))

    @nnx.jit
    def grads(m, x):
        return nnx.grad(lambda m, x: jnp.sum(m(x, **call) * dy), argnums=(0, 1))(m, x)

    (gm_ours, gx_ours), (gm_plain, gx_plain) = grads(ours, x), grads(plain, x)
    ref.assert_close("dx", gx_ours, gx_plain)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(nnx.state(gm_ours, nnx.Param)),
                            jax.tree.leaves(nnx.state(gm_plain, nnx.Param))):
        ref.assert_close(jax.tree_util.keystr(path), a, b)


@pytest.mark.parametrize("broadcast", [True, False], ids=["broadcast", "own"])
def test_adapter_dropout_statistics(key, broadcast):
    """local_window_size (0, 0): each query keeps only its own key, so the output is that
    key's value / (1 - rate) or 0: the kept fraction is 1 - rate within 4 sigma.
    broadcast_dropout (Flax's default): one mask for every batch entry and head, as Flax's."""
    kq, kk, kv = jax.random.split(key, 3)
    q, k = normal(kq, (4, 128, 4, 8)), normal(kk, (4, 128, 4, 8))
    v = 1.0 + jax.random.uniform(kv, (4, 128, 4, 8))
    p = 0.25
    attend = jax.jit(fl.make_attention_fn(local_window_size=(0, 0)),
                     static_argnames=("dropout_rate", "deterministic", "broadcast_dropout"))
    out = np.asarray(attend(q, k, v, dropout_rng=jax.random.PRNGKey(3), dropout_rate=p,
                            deterministic=False, broadcast_dropout=broadcast))
    kept = out[..., 0] != 0  # [batch, query, head]
    shared = (kept == kept[:1, :, :1]).all()
    assert shared == broadcast
    n = kept[0, :, 0].size if broadcast else kept.size  # the independent draws
    assert abs(kept.mean() - (1 - p)) < 4 * np.sqrt(p * (1 - p) / n), kept.mean()
    np.testing.assert_allclose(out[kept], (np.asarray(v) / (1 - p))[kept], rtol=1e-5)
    same = attend(q, k, v, dropout_rng=jax.random.PRNGKey(3), dropout_rate=p, deterministic=True)
    ref.assert_close("deterministic", same, v)
    with pytest.raises(ValueError, match="dropout_rng"):
        fl.attention_fn(q, k, v, dropout_rate=p, deterministic=False)


def test_linen_decode_with_flax_cache_through_the_adapter(key):
    """Flax's own decode=True cache (its [B, 1, 1, L] key mask each step) with the adapter
    equals Flax's full causal forward."""
    x = normal(key, (B, 8, E))
    m = nn.MultiHeadDotProductAttention(num_heads=H, attention_fn=fl.attention_fn, decode=True,
                                        deterministic=True)
    variables = m.init(jax.random.PRNGKey(1), x)
    full = nn.MultiHeadDotProductAttention(num_heads=H, deterministic=True).apply(
        {"params": variables["params"]}, x, mask=nn.make_causal_mask(jnp.ones((B, 8))))
    step = jax.jit(lambda c, t: m.apply({"params": variables["params"], "cache": c}, t,
                                        mutable=["cache"]))
    cache, outs = variables["cache"], []
    for i in range(8):
        y, upd = step(cache, x[:, i:i + 1])
        cache = upd["cache"]
        outs.append(y)
    ref.assert_close("decoded", jnp.concatenate(outs, 1), full)
