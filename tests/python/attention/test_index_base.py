"""index_base, the attention FFI's 11th operand: a shard of a call (batch entries
[b0, b0 + nb), q heads [h0, h0 + nh) with their kv heads) run with index_base (b0, h0)
computes what the whole call computes there. Dropout's keep mask and score_mod's
batch_idx / head_idx follow the global index; score_mod's array operands are the shard's
own slices. Forward and gradients through the custom_vjp (attention._attention), the
reference (reference.attention_reference, attention._reference) with index_base, and vmap
(index_base [V, 2]).

Shapes: q [B, S, Hq, D], k, v [B, S, Hkv, D], table [B, Hq, 1, 1] f32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from fusedattn import attention as attn_mod
from fusedattn import score_mod as sm_mod
from fusedattn._prepare import N_OPS, prepare
from fusedattn.reference import attention_reference

B, S, HQ, HKV, D = 4, 48, 4, 2, 16
G = HQ // HKV
SEED = 1234


def by_index(s, b, h, q, k, table):
    """Reads batch_idx and head_idx (a per-row factor: the softmax sees it) and an operand."""
    return s * (1.0 + 0.1 * b + 0.05 * h).astype(jnp.float32) + table


def build(q, k, v, p, fn, operands):
    """The call's Config / Dims, ScoreMod (or None) and FFI operands (index_base empty)."""
    call = prepare((q, k, v), None, None, SEED if p else None,
                   attn_bias_type=AttnBiasType.NO_BIAS, attn_mask_type=AttnMaskType.CAUSAL_MASK,
                   qkv_layout=QKVLayout.BSHD_BSHD_BSHD, softmax_type=SoftmaxType.VANILLA_SOFTMAX,
                   scaling_factor=None, dropout_probability=p, is_training=True,
                   max_segments_per_seq=1, window_size=None, softmax_offset=None)
    sm, ops = None, call.operands
    if fn is not None:
        d = call.dims
        sm, arrays4 = sm_mod.make_score_mod(fn, operands, None, (d.B, d.Hq, d.Sq, d.Skv))
        ops = (*ops, sm_mod.concat_operands(arrays4))
    return call, sm, ops


def with_base(ops, index_base):
    return ops if index_base is None else (*ops[:N_OPS - 1], index_base, *ops[N_OPS:])


def run(q, k, v, dout, p, fn=None, operands=(), index_base=None):
    """out and the gradients of sum(out * dout) by q, k, v and the operands (CPU engine)."""
    def loss(q, k, v, *operands):
        call, sm, ops = build(q, k, v, p, fn, operands)
        out = attn_mod._attention(call.cfg, call.dims, sm, *with_base(ops, index_base))[0]
        return jnp.sum(out * dout), out
    args = (q, k, v, *operands)
    (_, out), grads = jax.jit(jax.value_and_grad(loss, tuple(range(len(args))), has_aux=True))(
        *args)
    return out, grads


def inputs(key):
    kq, kk, kv, kd, kt = jax.random.split(key, 5)
    return (normal(kq, (B, S, HQ, D)), normal(kk, (B, S, HKV, D)), normal(kv, (B, S, HKV, D)),
            normal(kd, (B, S, HQ, D)), normal(kt, (B, HQ, 1, 1)))


def shard(x, b0, nb, h0, nh):
    """Batch entries [b0, b0 + nb) and heads [h0, h0 + nh) of x [B, S, H, ...]."""
    return x[b0:b0 + nb, :, h0:h0 + nh]


FEATURES = {"dropout": (0.3, None), "score_mod": (0.0, by_index),
            "score_mod_dropout": (0.2, by_index)}
SHARDS = [(2, 2, 0, HQ), (0, B, 2, 2), (1, 2, 2, 2), (3, 1, 2, 2)]  # (b0, nb, h0, nh)


@pytest.mark.parametrize("b0, nb, h0, nh", SHARDS, ids=lambda x: str(x))
@pytest.mark.parametrize("feature", FEATURES)
def test_shard_matches_the_whole_call(key, feature, b0, nb, h0, nh):
    p, fn = FEATURES[feature]
    q, k, v, dout, table = inputs(key)
    ops = (table,) if fn else ()
    out, grads = run(q, k, v, dout, p, fn, ops)
    kv = lambda x: shard(x, b0, nb, h0 // G, nh // G)
    sq = lambda x: shard(x, b0, nb, h0, nh)
    s_ops = (table[b0:b0 + nb, h0:h0 + nh],) if fn else ()
    base = jnp.array([b0, h0], jnp.int32)
    s_out, s_grads = run(sq(q), kv(k), kv(v), sq(dout), p, fn, s_ops, base)

    np.testing.assert_allclose(s_out, sq(out), rtol=1e-6, atol=1e-6, err_msg="out")
    want = (sq(grads[0]), kv(grads[1]), kv(grads[2]))
    if fn:
        want += (grads[3][b0:b0 + nb, h0:h0 + nh],)
    for name, got, ref in zip(("dq", "dk", "dv", "dtable"), s_grads, want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=name)

    # Without its base the shard computes something else (the test is not vacuous).
    local, _ = run(sq(q), kv(k), kv(v), sq(dout), p, fn, s_ops)
    assert np.max(np.abs(np.asarray(local - s_out))) > 1e-3


@pytest.mark.parametrize("feature", FEATURES)
def test_reference_with_index_base_matches_the_engine(key, feature):
    p, fn = FEATURES[feature]
    q, k, v, dout, table = inputs(key)
    b0, nb, h0, nh = 1, 2, 2, 2
    sq = lambda x: shard(x, b0, nb, h0, nh)
    kv = lambda x: shard(x, b0, nb, h0 // G, nh // G)
    q, k, v, dout = sq(q), kv(k), kv(v), sq(dout)
    ops = (table[b0:b0 + nb, h0:h0 + nh],) if fn else ()
    base = jnp.array([b0, h0], jnp.int32)
    out, _ = run(q, k, v, dout, p, fn, ops, base)

    # attention._reference (the GPU fallback) on the same FFI operands.
    call, sm, ffi_ops = build(q, k, v, p, fn, ops)
    ref = attn_mod._reference(*with_base(ffi_ops, base), cfg=call.cfg, dims=call.dims, sm=sm)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg="_reference")

    # attention_reference itself, index_base as Python ints.
    score_mod = None
    if fn:
        arrays4 = sm_mod.split_operands(ffi_ops[N_OPS], sm)
        score_mod = lambda s, qp, kp, index_base=None: sm_mod.apply_reference(
            fn, s, arrays4, index_base=index_base)
    ref, _, _ = attention_reference(q, k, v, attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                    dropout_probability=p, seed=ffi_ops[5], score_mod=score_mod,
                                    index_base=(b0, h0))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5, err_msg="attention_reference")


@pytest.mark.parametrize("feature", FEATURES)
def test_vmap_slices_take_their_own_base(key, feature):
    # Two shards of two batch entries each, stacked: vmap gives the handler index_base [2, 2].
    p, fn = FEATURES[feature]
    q, k, v, dout, table = inputs(key)
    h0, nh = 2, 2
    out, _ = run(q, k, v, dout, p, fn, (table,) if fn else ())
    stack = lambda x, h, n: x[:, :, h:h + n].reshape(2, B // 2, S, n, D)
    qs, ks, vs = stack(q, h0, nh), stack(k, h0 // G, nh // G), stack(v, h0 // G, nh // G)
    bases = jnp.array([[0, h0], [B // 2, h0]], jnp.int32)
    tables = table[:, h0:h0 + nh].reshape(2, B // 2, nh, 1, 1)

    def one(q, k, v, base, table):
        call, sm, ops = build(q, k, v, p, fn, (table,) if fn else ())
        return attn_mod._attention(call.cfg, call.dims, sm, *with_base(ops, base))[0]
    got = jax.jit(jax.vmap(one))(qs, ks, vs, bases, tables)
    np.testing.assert_allclose(got.reshape(B, S, nh, D), out[:, :, h0:h0 + nh], rtol=1e-6,
                               atol=1e-6)


def test_negative_index_base_is_an_ffi_error(key):
    q, k, v, dout, _ = inputs(key)
    with pytest.raises(Exception, match="index_base: got \\(batch_base -1, head_base 0\\)"):
        jax.block_until_ready(run(q, k, v, dout, 0.3, index_base=jnp.array([-1, 0], jnp.int32)))
