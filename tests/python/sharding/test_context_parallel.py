"""Context parallelism (issue 22) on 8 virtual CPU devices: the sequence of q and k / v
sharded over a "cp" mesh axis, ALL_GATHER and RING, load-balanced (dual chunks) or not,
with cp x dp and cp x tp meshes. Every result equals the single-device call on the same
(natural-order) inputs in float32: out, softmax_aux, max_logit and the gradients of q, k,
v, bias, softmax_offset and the score_mod operands. HLO: the ring passes k / v with
cp - 1 collective-permutes each per direction and never all-gathers them; a ring shard's
buffers never hold the whole k / v.

The root conftest gives the process 8 CPU devices (XLA_FLAGS).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn.context_parallel import (CPStrategy, ReorderStrategy,
                                        inverse_reorder_causal_load_balancing,
                                        reorder_causal_load_balancing)

pytestmark = pytest.mark.skipif(len(jax.devices("cpu")) < 8,
                                reason="needs 8 CPU devices (XLA_FLAGS, tests/python/conftest.py)")

# name -> (mesh shape, axis names, batch axis, head axis); the cp axis is "cp"
MESHES = {
    "cp2_dp4": ((4, 2), ("dp", "cp"), "dp", None),
    "cp4_dp2": ((2, 4), ("dp", "cp"), "dp", None),
    "cp8": ((8,), ("cp",), None, None),
    "cp2_tp2_dp2": ((2, 2, 2), ("dp", "cp", "tp"), "dp", "tp"),
}
B, S, HQ, D = 4, 64, 4, 16
STRATEGIES = [CPStrategy.ALL_GATHER, CPStrategy.RING]
_COLLECTIVE = re.compile(r"= ([^=]*?)\b(all-gather|all-reduce|collective-permute|"
                         r"reduce-scatter)(-start)?\(")


def mesh_of(name):
    shape, axes, batch, heads = MESHES[name]
    return Mesh(np.array(jax.devices("cpu")[:8]).reshape(shape), axes), batch, heads


def normal(key, shape):
    return jax.random.normal(key, shape, jnp.float32)


def close(name, got, want, tol=3e-6):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert not np.isnan(got).any() or np.isnan(want).any(), f"{name}: NaN"
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), f"{name}: non-finite elements differ"
    np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=tol, err_msg=name)


def inputs(key, hkv=HQ, sq=S, skv=S, bias=None, offset=False, sm=False):
    ks = jax.random.split(key, 7)
    a = {"q": normal(ks[0], (B, sq, HQ, D)), "k": normal(ks[1], (B, skv, hkv, D)),
         "v": normal(ks[2], (B, skv, hkv, D))}
    if bias is not None:
        a["bias"] = normal(ks[3], bias + (sq, skv))
    if offset:
        a["softmax_offset"] = normal(ks[4], (HQ,))
    if sm:
        a["slope"] = jax.random.uniform(ks[5], (1, HQ, 1, 1), minval=0.1, maxval=0.9)
        a["table"] = 0.3 * normal(ks[6], (1, 1, sq, skv))
    return a


def _alibi(s, b, h, qi, ki, slope, table):
    return s - slope * jnp.abs(qi - ki).astype(jnp.float32) + table


def _alibi_slope(s, b, h, qi, ki, slope):
    return s - slope * jnp.abs(qi - ki).astype(jnp.float32)


def call(a, kw, lens=None):
    extra = {}
    if "softmax_offset" in a:
        extra["softmax_offset"] = a["softmax_offset"]
    if "table" in a:
        extra.update(score_mod=_alibi, score_mod_operands=(a["slope"], a["table"]))
    elif "slope" in a:
        extra.update(score_mod=_alibi_slope, score_mod_operands=(a["slope"],))
    layout = kw.get("qkv_layout", QKVLayout.BSHD_BSHD_BSHD)
    if layout in (QKVLayout.BS3HD, QKVLayout.T3HD):
        qkv = (jnp.stack([a["q"], a["k"], a["v"]], axis=2),)
    elif layout in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD):
        qkv = (a["q"], jnp.stack([a["k"], a["v"]], axis=2))
    else:
        qkv = (a["q"], a["k"], a["v"])
    sd = None if lens is None else SequenceDescriptor.from_seqlens(lens)
    return fusedattn.fused_attn(qkv, a.get("bias"), sd, 11, return_max_logit=True,
                                return_aux=True, **kw, **extra)


SEQ = ("q", "k", "v")  # the arrays whose dim 1 is the sequence


def run(mesh_name, a, kw, strategy, balanced=False, lens=None, tol=3e-6, stripe=None):
    """The cp call on the mesh vs the single-device call: forward, statistics, gradients
    of a random projection of out. Returns the compiled texts (forward, gradient). THD
    layouts balance by stripes of `stripe` tokens."""
    mesh, batch, heads = mesh_of(mesh_name)
    n = mesh.shape["cp"]
    thd = kw.get("qkv_layout", QKVLayout.BSHD_BSHD_BSHD) in (
        QKVLayout.THD_THD_THD, QKVLayout.THD_T2HD, QKVLayout.T3HD)
    cp_kw = dict(kw, context_parallel_axis="cp", context_parallel_strategy=strategy,
                 context_parallel_causal_load_balanced=balanced,
                 stripe_size=stripe if balanced else None)
    how = (ReorderStrategy.Striped, stripe) if thd else (ReorderStrategy.DualChunkSwap, None)
    order = (lambda x: reorder_causal_load_balancing(x, how[0], n, 1, stripe_size=how[1])
             ) if balanced else (lambda x: x)
    undo = (lambda x, d=1: inverse_reorder_causal_load_balancing(
        x, how[0], n, d, stripe_size=how[1])) if balanced else (lambda x, d=1: x)
    proj = normal(jax.random.key(9), call(a, kw, lens)[0].shape)

    def loss(diff, rest, kw_, reorder):
        out, _ = call({**rest, **diff}, kw_, lens)
        return jnp.sum(out * (order(proj) if reorder else proj))

    split = lambda x: (x, {})  # every array is differentiated
    want_out, want_aux = jax.jit(lambda x: call(x, kw, lens))(a)
    want_g = jax.jit(jax.grad(lambda d, r: loss(d, r, kw, False)))(*split(a))

    def spec(name, x):
        if name in SEQ:
            return P(batch, "cp", heads if x.shape[2] % 2 == 0 else None)
        if name == "bias":
            return P(batch if x.shape[0] > 1 else None, heads if x.shape[1] > 1 else None)
        if name == "softmax_offset":
            return P(heads)
        return P()

    sharded = {k: jax.device_put(order(x) if k in SEQ else x, NamedSharding(mesh, spec(k, x)))
               for k, x in a.items()}
    f = jax.jit(lambda x: call(x, cp_kw, lens))
    g = jax.jit(jax.grad(lambda d, r: loss(d, r, cp_kw, True)))
    fwd_text = f.lower(sharded).compile().as_text()
    bwd_text = g.lower(*split(sharded)).compile().as_text()
    out, aux = f(sharded)
    grads = g(*split(sharded))
    close("out", undo(out), want_out, tol)
    close("softmax_aux", undo(aux["softmax_aux"], 1 if thd else 2), want_aux["softmax_aux"], tol)
    close("max_logit", aux["max_logit"], want_aux["max_logit"], tol)
    assert out.sharding.spec[1] == "cp", out.sharding
    for k in grads:
        got = undo(grads[k]) if k in SEQ else grads[k]
        close(f"d{k}", got, want_g[k], 2 * tol)
    return fwd_text, bwd_text


def collectives(text):
    found = {}
    for m in _COLLECTIVE.finditer(text):
        found[m.group(2)] = found.get(m.group(2), 0) + 1
    return found


# ---------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("balanced", [False, True], ids=["plain", "balanced"])
@pytest.mark.parametrize("mesh_name", ["cp2_dp4", "cp4_dp2", "cp8"])
def test_causal(mesh_name, balanced, strategy):
    run(mesh_name, inputs(jax.random.key(1)), dict(attn_mask_type=AttnMaskType.CAUSAL_MASK),
        strategy, balanced)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
                                  AttnMaskType.PADDING_MASK, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK],
                         ids=lambda m: m.name)
def test_masks(mask, strategy):
    lens = None
    if mask.is_padding():
        lens = (jnp.array([S, 3, 0, 37], jnp.int32), jnp.array([S, 50, 9, 0], jnp.int32))
    run("cp4_dp2", inputs(jax.random.key(2)), dict(attn_mask_type=mask), strategy, True,
        lens=lens)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_bottom_right_cross_attention(strategy):
    """Sq != Skv: the bottom-right diagonal of the whole sequences, on every shard."""
    a = inputs(jax.random.key(3), sq=32, skv=64)
    run("cp4_dp2", a, dict(attn_mask_type=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK), strategy)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("balanced", [False, True], ids=["plain", "balanced"])
def test_sliding_window(strategy, balanced):
    run("cp4_dp2", inputs(jax.random.key(4)),
        dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, window_size=(11, 0)), strategy, balanced)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_window_both_sides(strategy):
    run("cp8", inputs(jax.random.key(5)),
        dict(attn_mask_type=AttnMaskType.NO_MASK, window_size=(5, 9)), strategy, True)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("mesh_name", ["cp4_dp2", "cp2_tp2_dp2"])
def test_gqa(mesh_name, strategy):
    run(mesh_name, inputs(jax.random.key(6), hkv=2),
        dict(attn_mask_type=AttnMaskType.CAUSAL_MASK), strategy, True)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("layout", [QKVLayout.BS3HD, QKVLayout.BSHD_BS2HD],
                         ids=lambda l: l.name)
def test_packed_layouts(layout, strategy):
    run("cp2_dp4", inputs(jax.random.key(7)),
        dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, qkv_layout=layout), strategy, True)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("bias", [(1, HQ), (B, 1)], ids=["1H", "B1"])
def test_bias(bias, strategy):
    run("cp4_dp2", inputs(jax.random.key(8), bias=bias),
        dict(attn_mask_type=AttnMaskType.CAUSAL_MASK,
             attn_bias_type=AttnBiasType.POST_SCALE_BIAS), strategy, True)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("softmax", [SoftmaxType.OFF_BY_ONE_SOFTMAX,
                                     SoftmaxType.LEARNABLE_SOFTMAX], ids=lambda t: t.name)
def test_sinks(softmax, strategy):
    a = inputs(jax.random.key(10), offset=softmax == SoftmaxType.LEARNABLE_SOFTMAX)
    run("cp2_tp2_dp2", a, dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, softmax_type=softmax),
        strategy, True)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_sink_with_padding(strategy):
    """Padding queries keep lse -inf (no sink), real ones with no kept key get the sink."""
    lens = (jnp.array([S, 3, 0, 37], jnp.int32), jnp.array([S, 50, 9, 0], jnp.int32))
    run("cp4_dp2", inputs(jax.random.key(11), offset=True),
        dict(attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
             softmax_type=SoftmaxType.LEARNABLE_SOFTMAX), strategy, True, lens=lens)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("balanced", [False, True], ids=["plain", "balanced"])
@pytest.mark.parametrize("broadcast", [False, True], ids=["own", "broadcast"])
def test_dropout(strategy, balanced, broadcast):
    """The dropout mask of the unsharded call: Philox counters at global positions (one
    mask for the batch and heads with dropout_broadcast)."""
    run("cp4_dp2", inputs(jax.random.key(12)),
        dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, dropout_probability=0.2,
             is_training=True, dropout_broadcast=broadcast), strategy, balanced)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_score_mod(strategy):
    """q_idx / kv_idx are global positions; a per-head operand and a [Sq, Skv] table,
    sliced per block; their gradients summed over the ring."""
    run("cp2_tp2_dp2", inputs(jax.random.key(13), sm=True),
        dict(attn_mask_type=AttnMaskType.CAUSAL_MASK), strategy, True)


# THD: packed sequences (3 segments per row, global descriptor), load-balanced by stripes

THD_LENS = (jnp.array([[20, 30, 14], [5, 40, 0], [64, 0, 0], [7, 9, 33]], jnp.int32),) * 2


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
@pytest.mark.parametrize("balanced", [False, True], ids=["plain", "striped"])
@pytest.mark.parametrize("mesh_name", ["cp4_dp2", "cp2_tp2_dp2"])
def test_thd(mesh_name, balanced, strategy):
    run(mesh_name, inputs(jax.random.key(20), hkv=2),
        dict(qkv_layout=QKVLayout.THD_THD_THD, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
             max_segments_per_seq=3), strategy, balanced, lens=THD_LENS, stripe=4)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_thd_features(strategy):
    """window, dropout, a learnable sink and a score_mod (ALiBi: q_idx / kv_idx are the
    positions in the segment, a per-head slope operand), striped."""
    a = inputs(jax.random.key(21), offset=True, sm=True)
    del a["table"]  # THD score_mod operands are read by position in segment: no [T, T] table
    run("cp4_dp2", a, dict(qkv_layout=QKVLayout.THD_THD_THD,
                           attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK, max_segments_per_seq=3,
                           window_size=(9, 0), dropout_probability=0.2, is_training=True,
                           softmax_type=SoftmaxType.LEARNABLE_SOFTMAX),
        strategy, True, lens=THD_LENS, stripe=4)


@pytest.mark.parametrize("layout", [QKVLayout.T3HD, QKVLayout.THD_T2HD], ids=lambda l: l.name)
def test_thd_packed_layouts(layout):
    run("cp8", inputs(jax.random.key(22)),
        dict(qkv_layout=layout, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
             max_segments_per_seq=3), CPStrategy.RING, True, lens=THD_LENS, stripe=2)


def test_everything_at_once():
    a = inputs(jax.random.key(14), hkv=2, bias=(1, HQ), offset=True, sm=True)
    run("cp2_tp2_dp2", a, dict(attn_mask_type=AttnMaskType.CAUSAL_MASK,
                               attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                               softmax_type=SoftmaxType.LEARNABLE_SOFTMAX, window_size=(20, 0),
                               dropout_probability=0.1, is_training=True),
        CPStrategy.RING, True)


# ---------------------------------------------------------------------------
# HLO and memory


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_hlo(n):
    """The ring: a loop of cp - 1 steps, each passing k and v with one collective-permute
    (so cp - 1 transfers of each per direction), and no all-gather; the backward's loop
    passes k, v, dk and dv, and one more permute returns dk / dv to their owners."""
    mesh_name = {2: "cp2_dp4", 4: "cp4_dp2", 8: "cp8"}[n]
    fwd, bwd = run(mesh_name, inputs(jax.random.key(15)),
                   dict(attn_mask_type=AttnMaskType.CAUSAL_MASK), CPStrategy.RING, True)
    cf, cb = collectives(fwd), collectives(bwd)
    assert "all-gather" not in cf and "all-gather" not in cb, (cf, cb)
    assert cf.get("collective-permute", 0) == 2, cf
    # the gradient jit runs the forward too: 2 + 4 in the backward's loop + 2 home
    # (cp 2: XLA merges the backward's k / v transfer with the forward's, the same one)
    assert cb.get("collective-permute", 0) == 2 + 4 + 2 - (2 if n == 2 else 0), cb
    if n > 2:  # (XLA inlines a loop of one step)
        trips = re.findall(r'"known_trip_count":\{"n":"(\d+)"\}', fwd)
        assert trips == [str(n - 1)], trips
        trips = re.findall(r'"known_trip_count":\{"n":"(\d+)"\}', bwd)
        assert trips == [str(n - 1)] * 2, trips


def test_all_gather_hlo():
    fwd, bwd = run("cp4_dp2", inputs(jax.random.key(16)),
                   dict(attn_mask_type=AttnMaskType.CAUSAL_MASK), CPStrategy.ALL_GATHER, True)
    cf, cb = collectives(fwd), collectives(bwd)
    assert cf.get("all-gather") == 2 and "collective-permute" not in cf, cf
    assert cb.get("reduce-scatter") == 2, cb


def test_ring_never_holds_whole_kv():
    """Compiled memory of one ring shard at a long sequence: arguments, outputs and
    temporaries together stay far below one whole k (let alone k and v)."""
    mesh, _, _ = mesh_of("cp8")
    Sl, H = 8192, 2
    sh = NamedSharding(mesh, P(None, "cp"))
    x = jax.ShapeDtypeStruct((1, Sl, H, 64), jnp.float32, sharding=sh)
    f = jax.jit(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, None, 0, attn_mask_type=AttnMaskType.CAUSAL_MASK,
        context_parallel_axis="cp", context_parallel_strategy="ring",
        context_parallel_causal_load_balanced=True))
    m = f.lower(x, x, x).compile().memory_analysis()
    whole_kv = 2 * Sl * H * 64 * 4
    used = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    assert used < whole_kv, (used, whole_kv)
    g = jax.jit(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, None, 0, attn_mask_type=AttnMaskType.CAUSAL_MASK,
        context_parallel_axis="cp", context_parallel_strategy="all_gather"))
    ma = g.lower(x, x, x).compile().memory_analysis()
    assert ma.temp_size_in_bytes >= whole_kv, "the all-gather holds the whole k / v"


def test_shard_map():
    """Inside shard_map the cp axis is manual: the same algorithm runs on the local shards."""
    mesh, _, _ = mesh_of("cp4_dp2")
    a = inputs(jax.random.key(17))
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_MASK)
    want = call(a, kw)[0]
    spec = P("dp", "cp")

    def body(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, 0, context_parallel_axis="cp",
                                    context_parallel_strategy="ring", **kw)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec))
    close("out", f(a["q"], a["k"], a["v"]), want)


def test_reorder_round_trip_and_layout():
    x = jnp.arange(2 * 16).reshape(2, 16)
    y = reorder_causal_load_balancing(x, ReorderStrategy.DualChunkSwap, 4, 1)
    # 8 chunks of 2: device r holds chunks r and 7 - r
    assert y[0].tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert np.array_equal(inverse_reorder_causal_load_balancing(y, ReorderStrategy.DualChunkSwap, 4, 1),
                          x)
    z = reorder_causal_load_balancing(x, ReorderStrategy.Striped, 4, 1, stripe_size=2)
    assert z[0].tolist() == [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    assert np.array_equal(inverse_reorder_causal_load_balancing(
        z, ReorderStrategy.Striped, 4, 1, stripe_size=2), x)


def test_errors():
    mesh, _, _ = mesh_of("cp8")
    q = jnp.ones((1, 24, 2, 16))
    with pytest.raises(ValueError, match="context_parallel_strategy"):
        fusedattn.fused_attn((q, q, q), None, None, 0, context_parallel_axis="cp",
                             context_parallel_strategy="zigzag")
    with pytest.raises(TypeError, match="context_parallel_axis"):
        fusedattn.fused_attn((q, q, q), None, None, 0, context_parallel_axis=3)
    qs = jax.device_put(q, NamedSharding(mesh, P(None, "cp")))
    # known at partitioning time (the mesh): XLA reports it, the message intact
    with pytest.raises(Exception, match="q sequence length \\(24\\) to be a multiple of 16"):
        jax.jit(lambda x: fusedattn.fused_attn(
            (x, x, x), None, None, 0, context_parallel_axis="cp",
            context_parallel_causal_load_balanced=True))(qs)
    with pytest.raises(ValueError, match="must divide into 2 \\* cp_size"):
        reorder_causal_load_balancing(q, ReorderStrategy.DualChunkSwap, 5, 1)

