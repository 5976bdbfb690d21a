"""fusedattn.flax MultiHeadAttention (linen and nnx) against the block written with plain
jnp from its own parameters: forward and gradients (fused and separate projections, GQA,
RoPE, the learnable offset), cross-attention (its own kv input width and length), RoPE
against a complex-number rotation, and decoding with the KV cache (token by token and in
chunks) equal to the full causal forward."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import normal
from fusedattn import AttnMaskType
from fusedattn.flax import _common
from fusedattn.flax import linen as fl
from fusedattn.flax import nnx as fn

import flax_helpers as ref

E, H = 32, 4
CONFIGS = {  # name -> (num_gqa_groups, fused_qkv, rope, softmax_type)
    "fused": (None, True, False, "vanilla"),
    "fused_gqa_rope": (2, True, True, "vanilla"),
    "separate_mqa_rope_sink": (1, False, True, "learnable"),
}


def make(api, groups, fused, rope, softmax, decode=False):
    """-> (apply(params, x, **kw) -> y, params, kernels(params) -> the reference's dict)."""
    kw = dict(num_gqa_groups=groups, fused_qkv=fused, enable_rotary_pos_emb=rope,
              softmax_type=softmax)
    if api == "linen":
        m = fl.MultiHeadAttention(num_attention_heads=H, decode=decode, **kw)
        params = nn.meta.unbox(m.init(jax.random.PRNGKey(1), jnp.zeros((2, 16, E))))

        def kernels(p):
            p = p["params"]
            sink = p["attention"]["softmax_offset"] if "attention" in p else None
            return {n: w for n, w in p.items() if n != "attention"}, sink
        return (lambda p, x, **c: m.apply(p, x, **c)), params, kernels
    m = fn.MultiHeadAttention(H, E, rngs=nnx.Rngs(1), decode=decode, **kw)
    graphdef, state, rest = nnx.split(m, nnx.Param, ...)  # parameters; the rng state apart

    def kernels(p):
        d = {n: w[...] for n, w in p["kernels"].items()}
        d["out"] = p["out"][...]
        sink = p["attention"]["softmax_offset"][...] if "attention" in p else None
        return d, sink
    return (lambda p, x, **c: nnx.merge(graphdef, p, rest)(x, **c)), state, kernels


@pytest.mark.parametrize("api,config", [
    ("linen", "fused"), ("linen", "separate_mqa_rope_sink"), ("nnx", "fused_gqa_rope"),
    ("nnx", "separate_mqa_rope_sink")])
def test_matches_the_plain_block(api, config, key):
    groups, fused, rope, softmax = CONFIGS[config]
    kx, kd, ks = jax.random.split(key, 3)
    B, S = 2, 16
    x, dy = normal(kx, (B, S, E)), normal(kd, (B, S, E))
    apply, params, kernels = make(api, groups, fused, rope, softmax)
    if softmax == "learnable":  # a nonzero offset, so its use is checked
        if api == "linen":
            params["params"]["attention"]["softmax_offset"] = normal(ks, (H,))
        else:
            params["attention"]["softmax_offset"][...] = normal(ks, (H,))
    hkv = H if groups is None else groups

    def plain(p, x):
        w, sink = kernels(p)
        return ref.mha(w, x, heads=H, kv_heads=hkv, head_dim=E // H,
                       rope_positions=np.arange(S) if rope else None, sink=sink)

    got = jax.jit(lambda p, x: apply(p, x, deterministic=True))(params, x)
    ref.assert_close("out", got, plain(params, x))
    loss = lambda f: lambda p, x: jnp.sum(f(p, x) * dy)
    g_got = jax.grad(loss(lambda p, x: apply(p, x, deterministic=True)), argnums=(0, 1))(params, x)
    g_want = jax.grad(loss(plain), argnums=(0, 1))(params, x)
    ref.assert_close("dx", g_got[1], g_want[1])
    (kg, sg), (kw, sw) = kernels(g_got[0]), kernels(g_want[0])
    assert sorted(kg) == sorted(kw)
    for name in kg:
        ref.assert_close(f"d {name}", kg[name], kw[name])
    if softmax == "learnable":
        ref.assert_close("d softmax_offset", sg, sw)


def test_rotary_matches_complex_rotation(key):
    x = normal(key, (2, 10, 3, 16))
    pos = jnp.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [5, 9, 2, 0, 100, 7, 3, 3, 1, 2]])
    ref.assert_close("rope [B, S]", _common.rotary(x, pos), ref.rotary(x, pos))
    ref.assert_close("rope [S]", _common.rotary(x, jnp.arange(10)), ref.rotary(x, np.arange(10)))
    with pytest.raises(ValueError, match="even head_dim"):
        _common.rotary(x[..., :5], jnp.arange(10))


@pytest.mark.parametrize("api,config", [
    ("linen", "fused_gqa_rope"), ("linen", "separate_mqa_rope_sink"), ("nnx", "fused_gqa_rope"),
    ("nnx", "separate_mqa_rope_sink")])
def test_decoding_with_the_cache_equals_the_full_forward(api, config, key):
    groups, fused, rope, softmax = CONFIGS[config]
    B, L = 2, 16
    x = normal(key, (B, L, E))
    apply, params, _ = make(api, groups, fused, rope, softmax)
    full = np.asarray(apply(params, x, deterministic=True))
    chunks = [1] * 5 + [3, 2] + [1] * 6               # token by token, and a few chunks
    assert sum(chunks) == L
    outs = []
    if api == "linen":
        m = fl.MultiHeadAttention(num_attention_heads=H, num_gqa_groups=groups, fused_qkv=fused,
                                  enable_rotary_pos_emb=rope, softmax_type=softmax, decode=True)
        cache = m.init(jax.random.PRNGKey(0), x)["cache"]          # the full length: L slots
        step = jax.jit(lambda c, t: m.apply({"params": params["params"], "cache": c}, t,
                                            mutable=["cache"]))
        i = 0
        for n in chunks:
            y, upd = step(cache, x[:, i:i + n])
            cache, i = upd["cache"], i + n
            outs.append(np.asarray(y))
        assert int(cache["cache_index"]) == L
    else:
        model = fn.MultiHeadAttention(H, E, num_gqa_groups=groups, fused_qkv=fused,
                                      enable_rotary_pos_emb=rope, softmax_type=softmax,
                                      rngs=nnx.Rngs(1))                # make()'s parameters
        model.init_cache(x.shape)
        i = 0
        for n in chunks:
            outs.append(np.asarray(model(x[:, i:i + n], decode=True)))
            i += n
        assert int(model.cache_index[...]) == L
        with pytest.raises(ValueError, match="do not fit a KV cache"):
            model(jnp.concatenate([x, x[:, :1]], 1), decode=True)
    ref.assert_close("decoded", np.concatenate(outs, axis=1), full)


@pytest.mark.parametrize("api", ["linen", "nnx"])
def test_dropout_follows_the_rng_and_deterministic_turns_it_off(api, key):
    x = normal(key, (2, 16, E))
    if api == "linen":
        m = fl.MultiHeadAttention(num_attention_heads=H, attention_dropout=0.5, dropout_rate=0.1)
        p = m.init(jax.random.PRNGKey(1), x, deterministic=True)
        run = lambda seed: m.apply(p, x, deterministic=False,
                                   rngs={"dropout": jax.random.PRNGKey(seed)})
        exact = m.apply(p, x, deterministic=True)
        plain = fl.MultiHeadAttention(num_attention_heads=H).apply(p, x)
    else:
        m = fn.MultiHeadAttention(H, E, attention_dropout=0.5, dropout_rate=0.1, rngs=nnx.Rngs(1))
        run = lambda seed: m(x, deterministic=False, rngs=nnx.Rngs(dropout=seed))
        exact = m(x, deterministic=True)
        plain = fn.MultiHeadAttention(H, E, rngs=nnx.Rngs(1))(x)
    ref.assert_close("deterministic = no dropout", exact, plain)
    a, b, c = run(2), run(2), run(3)
    np.testing.assert_array_equal(a, b)
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3
    assert np.abs(np.asarray(a) - np.asarray(exact)).max() > 1e-3


@pytest.mark.parametrize("api,fused,groups,rope", [
    ("linen", True, None, False), ("linen", False, 2, True), ("nnx", True, 2, True),
    ("nnx", False, None, False)])
def test_cross_attention_matches_the_plain_block(api, fused, groups, rope, key):
    B, S, Skv, E_kv = 2, 12, 20, 24
    kx, kk, kd = jax.random.split(key, 3)
    x, x_kv, dy = normal(kx, (B, S, E)), normal(kk, (B, Skv, E_kv)), normal(kd, (B, S, E))
    kw = dict(num_gqa_groups=groups, fused_qkv=fused, enable_rotary_pos_emb=rope,
              attn_mask_type=AttnMaskType.NO_MASK)
    if api == "linen":
        m = fl.MultiHeadAttention(num_attention_heads=H, **kw)
        params = nn.meta.unbox(m.init(jax.random.PRNGKey(1), x, x_kv))
        apply = lambda p, x, x_kv: m.apply(p, x, x_kv, deterministic=True)
        kernels = lambda p: {n: w for n, w in p["params"].items() if n != "attention"}
        # decode=True keeps no cache for cross-attention: the same result, no 'cache'
        md = fl.MultiHeadAttention(num_attention_heads=H, decode=True, **kw)
        assert "cache" not in md.init(jax.random.PRNGKey(1), x, x_kv)
        y, upd = md.apply(params, x, x_kv, deterministic=True, mutable=["cache"])
        assert not upd.get("cache")
        ref.assert_close("decode=True", y, apply(params, x, x_kv))
    else:
        m = fn.MultiHeadAttention(H, E, in_kv_features=E_kv, rngs=nnx.Rngs(1), **kw)
        graphdef, params, rest = nnx.split(m, nnx.Param, ...)
        apply = lambda p, x, x_kv: nnx.merge(graphdef, p, rest)(x, x_kv, deterministic=True)

        def kernels(p):
            d = {n: w[...] for n, w in p["kernels"].items()}
            d["out"] = p["out"][...]
            return d
        with pytest.raises(ValueError, match="in_kv_features"):
            m(x)                                          # a cross module wants inputs_kv
        with pytest.raises(ValueError, match="in_kv_features"):
            fn.MultiHeadAttention(H, E, rngs=nnx.Rngs(1))(x, x_kv)
    with pytest.raises(ValueError, match="inputs_kv must be"):
        apply(params, x, x_kv[:1])
    names = {"query", "kv", "out"} if fused else {"query", "key", "value", "out"}
    assert set(kernels(params)) == names
    hkv = H if groups is None else groups

    def plain(p, x, x_kv):
        return ref.mha(kernels(p), x, heads=H, kv_heads=hkv, head_dim=E // H, causal=False,
                       x_kv=x_kv, rope_positions=np.arange(S) if rope else None,
                       kv_rope_positions=np.arange(Skv) if rope else None)

    ref.assert_close("out", jax.jit(apply)(params, x, x_kv), plain(params, x, x_kv))
    loss = lambda f: lambda p, x, x_kv: jnp.sum(f(p, x, x_kv) * dy)
    g_got = jax.grad(loss(apply), argnums=(0, 1, 2))(params, x, x_kv)
    g_want = jax.grad(loss(plain), argnums=(0, 1, 2))(params, x, x_kv)
    ref.assert_close("dx", g_got[1], g_want[1])
    ref.assert_close("dx_kv", g_got[2], g_want[2])
    kg, kw_ = kernels(g_got[0]), kernels(g_want[0])
    for name in names:
        ref.assert_close(f"d {name}", kg[name], kw_[name])


@pytest.mark.parametrize("api", ["linen", "nnx"])
def test_cross_attention_with_padding_matches_flax_own_module(api, key):
    # Cross-attention (Sq != Skv, own kv width) with a padding descriptor against Flax's own
    # unfused nn.MultiHeadDotProductAttention (same kernels, a dense padding mask), forward
    # and gradients on the queries that are not padding.
    from fusedattn import SequenceDescriptor
    B, S, Skv, E_kv = 2, 12, 20, 24
    q_lens, kv_lens = np.array([12, 7]), np.array([13, 20])
    kx, kk, kd = jax.random.split(key, 3)
    x, x_kv, dy = normal(kx, (B, S, E)), normal(kk, (B, Skv, E_kv)), normal(kd, (B, S, E))
    q_ok = np.arange(S)[None] < q_lens[:, None]
    dy = dy * q_ok[:, :, None]                       # padding queries: no output compared
    sd = SequenceDescriptor.from_seqlens((jnp.asarray(q_lens), jnp.asarray(kv_lens)))
    kw = dict(fused_qkv=False, attn_mask_type=AttnMaskType.PADDING_MASK)
    if api == "linen":
        m = fl.MultiHeadAttention(num_attention_heads=H, **kw)
        params = nn.meta.unbox(m.init(jax.random.PRNGKey(1), x, x_kv, sequence_descriptor=sd))
        apply = lambda p, x, x_kv: m.apply(p, x, x_kv, sequence_descriptor=sd, deterministic=True)
        kernels = lambda p: dict(p["params"])
    else:
        m = fn.MultiHeadAttention(H, E, in_kv_features=E_kv, rngs=nnx.Rngs(1), **kw)
        graphdef, params, rest = nnx.split(m, nnx.Param, ...)
        apply = lambda p, x, x_kv: nnx.merge(graphdef, p, rest)(x, x_kv, sequence_descriptor=sd,
                                                                deterministic=True)
        kernels = lambda p: {**{n: w[...] for n, w in p["kernels"].items()}, "out": p["out"][...]}
    flax_mha = nn.MultiHeadDotProductAttention(num_heads=H, use_bias=False)
    mask = nn.make_attention_mask(q_ok, np.arange(Skv)[None] < kv_lens[:, None])

    def flax_own(p, x, x_kv):
        w = kernels(p)
        fp = {"params": {n: {"kernel": w[n]} for n in ("query", "key", "value", "out")}}
        return flax_mha.apply(fp, x, x_kv, mask=mask)

    loss = lambda f: lambda p, x, x_kv: jnp.sum(f(p, x, x_kv) * dy)
    ref.assert_close("out", jax.jit(apply)(params, x, x_kv) * q_ok[:, :, None],
                     flax_own(params, x, x_kv) * q_ok[:, :, None])
    g_got = jax.grad(loss(apply), argnums=(0, 1, 2))(params, x, x_kv)
    g_want = jax.grad(loss(flax_own), argnums=(0, 1, 2))(params, x, x_kv)
    ref.assert_close("dx", g_got[1], g_want[1])
    ref.assert_close("dx_kv", g_got[2], g_want[2])
    kg, kw_ = kernels(g_got[0]), kernels(g_want[0])
    for name in ("query", "key", "value", "out"):
        ref.assert_close(f"d {name}", kg[name], kw_[name])
