"""index_base, the attention FFI's 11th operand: a shard of a call (batch entries
[b0, b0 + nb), q heads [h0, h0 + nh) with their kv heads) run with index_base (b0, h0)
computes what the whole call computes there. Dropout's keep mask and score_mod's
batch_idx / head_idx follow the global index; score_mod's array operands are the shard's
own slices. Forward and gradients through the differentiable core (attention._attention), the
reference (reference.attention_reference, attention._reference) with index_base, and vmap
(index_base [V, 2]).

With 6 columns (batch_base, head_base, q_pos, kv_pos, q_extent, kv_extent) a call is a
block of a bigger one along the sequence (context parallelism): the blocks of a call, cut
along q and k/v, merged over k/v by their lse, give the whole call's out, and the blocks'
backward given the whole call's out and lse sum to its dq, dk, dv (and score_mod operand
gradients) - under causal, bottom-right, padding and window masks, dropout and a score_mod
of q_idx / kv_idx with operands sliced per block. With 8 (.., stripe, stride) the blocks
are striped (each device's tokens dealt in stripes), in THD layouts too (the descriptor the
whole call's): the same over every (q device, kv device) pair.

Shapes: q [B, S, Hq, D], k, v [B, S, Hkv, D], table [B, Hq, 1, 1] f32; blocks: q [B, Sq, H,
D], k, v [B, Skv, H, D], score_mod operands slope [1, H, 1, 1], q_row [1, 1, Sq, 1], kv_col
[1, 1, 1, Skv] (sliced to the block's rows and keys). Striped: q, k, v [B, T, H, D] of
packed rows, a device's [B, T / cp, H, D], lse [B, H, T] (the engine's THD lse [B, T, H]),
the ALiBi slope [1, H, 1, 1]."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import normal
import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn import _gpu_route, _lib, attention as attn_mod
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
        out = attn_mod._attention((call.cfg, call.dims, sm), False,
                                  *with_base(ops, index_base))[0]
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
        return attn_mod._attention((call.cfg, call.dims, sm), False, *with_base(ops, base))[0]
    got = jax.jit(jax.vmap(one))(qs, ks, vs, bases, tables)
    np.testing.assert_allclose(got.reshape(B, S, nh, D), out[:, :, h0:h0 + nh], rtol=1e-6,
                               atol=1e-6)


def test_negative_index_base_is_an_ffi_error(key):
    q, k, v, dout, _ = inputs(key)
    with pytest.raises(Exception, match="index_base: got \\(batch_base -1, head_base 0\\)"):
        jax.block_until_ready(run(q, k, v, dout, 0.3, index_base=jnp.array([-1, 0], jnp.int32)))


# ---------------------------------------------------------------------------
# Blocks: index_base [V, 6] (batch_base, head_base, q_pos, kv_pos, q_extent, kv_extent)

BB, BSQ, BSKV, BH, BD = 2, 96, 128, 2, 16
Q_CUTS, KV_CUTS = (0, 40, 96), (0, 36, 100, 128)  # uneven blocks; kv_pos % 4 == 0
Q_LENS, KV_LENS = [70, 96], [90, 128]  # the whole call's, under the padding masks


def alibi(s, b, h, qi, ki, slope, q_row, kv_col):
    """ALiBi-like: reads q_idx and kv_idx (global in a block) and operands indexed by the
    head, the query and the key (local in a block)."""
    return s + slope * (ki - qi).astype(jnp.float32) + q_row + kv_col


# name: (mask, window, padding lengths, dropout, score_mod)
BLOCK_CASES = {
    "no_mask": (AttnMaskType.NO_MASK, None, False, 0.0, None),
    "causal": (AttnMaskType.CAUSAL_MASK, None, False, 0.0, None),
    "causal_bottom_right": (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, None, False, 0.0, None),
    "padding_causal": (AttnMaskType.PADDING_CAUSAL_MASK, None, True, 0.0, None),
    "padding_bottom_right_window": (AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, (30, 0),
                                    True, 0.0, None),
    "window": (AttnMaskType.NO_MASK, (24, 8), False, 0.0, None),
    "dropout": (AttnMaskType.CAUSAL_MASK, None, False, 0.2, None),
    "score_mod": (AttnMaskType.CAUSAL_MASK, None, False, 0.0, alibi),
    "score_mod_dropout_window": (AttnMaskType.NO_MASK, (40, 40), False, 0.2, alibi),
}


def block_inputs(key):
    kq, kk, kv, kd, ks, kr, kc = jax.random.split(key, 7)
    operands = (jax.random.uniform(ks, (1, BH, 1, 1), minval=0.02, maxval=0.06),
                normal(kr, (1, 1, BSQ, 1)), normal(kc, (1, 1, 1, BSKV)))
    return (normal(kq, (BB, BSQ, BH, BD)), normal(kk, (BB, BSKV, BH, BD)),
            normal(kv, (BB, BSKV, BH, BD)), normal(kd, (BB, BSQ, BH, BD)), operands)


def descriptor_of(padding):
    if not padding:
        return None
    return SequenceDescriptor.from_seqlens((jnp.array(Q_LENS, jnp.int32),
                                            jnp.array(KV_LENS, jnp.int32)))


def whole_call(case, q, k, v, dout, operands):
    """The whole call by fused_attn: out, lse [B, H, Sq] and the gradients of sum(out *
    dout) by q, k, v and the score_mod operands."""
    mask, window, padding, p, fn = BLOCK_CASES[case]

    def f(q, k, v, *ops):
        return fusedattn.fused_attn(
            (q, k, v), None, descriptor_of(padding), SEED if p else None, attn_mask_type=mask,
            window_size=window, dropout_probability=p, is_training=True, return_aux=True,
            score_mod=fn, score_mod_operands=ops)

    args = (q, k, v, *(operands if fn else ()))
    (out, aux), vjp = jax.vjp(f, *args)
    grads = vjp((dout, jax.tree_util.tree_map(jnp.zeros_like, aux)))
    return out, aux["softmax_aux"][..., 0], grads


def block_ops(case, q, k, v, operands, q0, kv0, positions=True):
    """cfg, dims, ScoreMod and the FFI operands of the block q [:, q0:], k / v [:, kv0:]
    (as cut) of the whole call: index_base [6], the whole call's lengths, the score_mod
    operands sliced to the block."""
    mask, window, padding, p, fn = BLOCK_CASES[case]
    call = prepare((q, k, v), None, descriptor_of(padding), SEED if p else None,
                   attn_bias_type=AttnBiasType.NO_BIAS, attn_mask_type=mask,
                   qkv_layout=QKVLayout.BSHD_BSHD_BSHD, softmax_type=SoftmaxType.VANILLA_SOFTMAX,
                   scaling_factor=None, dropout_probability=p, is_training=True,
                   max_segments_per_seq=1, window_size=window, softmax_offset=None)
    base = [0, 0, q0, kv0, BSQ, BSKV] if positions else [0, 0]
    ops = with_base(call.operands, jnp.array(base, jnp.int32))
    sm = None
    if fn is not None:
        sq, skv = q.shape[1], k.shape[1]
        slope, q_row, kv_col = operands
        local = (slope, q_row[:, :, q0:q0 + sq], kv_col[..., kv0:kv0 + skv])
        d = call.dims
        sm, arrays4 = sm_mod.make_score_mod(fn, local, None, (d.B, d.Hq, d.Sq, d.Skv))
        ops = (*ops, sm_mod.concat_operands(arrays4))
    return call.cfg, call.dims, sm, ops


def block_fwd(cfg, dims, sm, ops):
    return jax.jit(lambda *o: attn_mod._attention((cfg, dims, sm), False, *o)[:2])(*ops)


def block_bwd(cfg, dims, sm, ops, out, dout, lse):
    """The block's backward given out and lse (the whole call's rows): its share of dq,
    dk, dv and of the score_mod operands' gradient (flat)."""
    cfg = dataclasses.replace(cfg, want_lse=True)
    grads = jax.jit(lambda *a: attn_mod._BWD((cfg, dims, sm, "bwd"), *a))(*ops, out, dout, lse)
    return grads[:3] + ((sm_mod.split_operands(grads[5], sm),) if sm is not None else ())


def merge(parts):
    """(out [B, Sq, H, D], lse [B, H, Sq]) of blocks over the keys -> those of all keys."""
    lses = jnp.stack([lse for _, lse in parts])
    lse = jax.nn.logsumexp(lses, axis=0)
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    w = jnp.where(jnp.isfinite(lses), jnp.exp(lses - safe), 0.0)
    out = sum(jnp.swapaxes(wi, 1, 2)[..., None] * o for wi, (o, _) in zip(w, parts))
    return out, lse


def blocks(cuts):
    return list(zip(cuts[:-1], cuts[1:]))


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_blocks_merge_to_the_whole_call(key, case):
    fn = BLOCK_CASES[case][4]
    q, k, v, dout, operands = block_inputs(key)
    out, lse, grads = whole_call(case, q, k, v, dout, operands)

    outs, lses = [], []
    dq = jnp.zeros_like(q)
    dk, dv = jnp.zeros_like(k), jnp.zeros_like(v)
    dops = [jnp.zeros_like(o) for o in operands]
    for q0, q1 in blocks(Q_CUTS):
        parts = []
        for kv0, kv1 in blocks(KV_CUTS):
            cfg, dims, sm, ops = block_ops(case, q[:, q0:q1], k[:, kv0:kv1], v[:, kv0:kv1],
                                           operands, q0, kv0)
            parts.append(block_fwd(cfg, dims, sm, ops))
            g = block_bwd(cfg, dims, sm, ops, out[:, q0:q1], dout[:, q0:q1], lse[:, :, q0:q1])
            dq = dq.at[:, q0:q1].add(g[0])
            dk, dv = dk.at[:, kv0:kv1].add(g[1]), dv.at[:, kv0:kv1].add(g[2])
            if fn:
                dslope, dq_row, dkv_col = g[3]
                dops = [dops[0] + dslope, dops[1].at[:, :, q0:q1].add(dq_row),
                        dops[2].at[..., kv0:kv1].add(dkv_col)]
        o, l = merge(parts)
        outs.append(o)
        lses.append(l)

    np.testing.assert_allclose(jnp.concatenate(outs, 1), out, rtol=1e-5, atol=1e-5,
                               err_msg="out")
    np.testing.assert_allclose(jnp.concatenate(lses, 2), lse, rtol=1e-5, atol=1e-5,
                               err_msg="lse")
    names = ("dq", "dk", "dv", "dslope", "dq_row", "dkv_col")
    for name, got, want in zip(names, (dq, dk, dv, *(dops if fn else ())), grads):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("case", ["causal", "window", "dropout", "score_mod"])
def test_a_block_without_its_positions_differs(key, case):
    # The merge test is not vacuous: a block read as a call of its own gives other results.
    q, k, v, _, operands = block_inputs(key)
    q0, q1, kv0, kv1 = 40, 96, 36, 100
    cut = (q[:, q0:q1], k[:, kv0:kv1], v[:, kv0:kv1], operands, q0, kv0)
    got = block_fwd(*block_ops(case, *cut))[0]
    local = block_fwd(*block_ops(case, *cut, positions=False))[0]
    assert np.max(np.abs(np.asarray(got - local))) > 1e-3


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_block_backward_reference_takes_the_whole_calls_stats(key, case):
    """The GPU fallback's block backward (attention._block_bwd_reference, what a ring
    block the CUDA kernels do not serve runs) gives the engine's share of the gradients
    given the whole call's out and lse (not the gradient of the block's own softmax)."""
    q, k, v, dout, operands = block_inputs(key)
    out, lse, _ = whole_call(case, q, k, v, dout, operands)
    q0, q1, kv0, kv1 = 40, 96, 36, 100
    cfg, dims, sm, ops = block_ops(case, q[:, q0:q1], k[:, kv0:kv1], v[:, kv0:kv1], operands,
                                   q0, kv0)
    args = (out[:, q0:q1], dout[:, q0:q1], lse[:, :, q0:q1])
    cfg = dataclasses.replace(cfg, want_lse=True)
    want = block_bwd(cfg, dims, sm, ops, *args)
    got = jax.jit(lambda *a: attn_mod._block_bwd_reference(ops, *a, cfg=cfg, dims=dims,
                                                           sm=sm))(*args)
    got = tuple(got[:3]) + ((sm_mod.split_operands(got[5], sm),) if sm is not None else ())
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=name)
    if sm is not None:
        for g, w in zip(got[3], want[3]):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg="d operands")


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_block_reference_matches_the_engine(key, case):
    q, k, v, dout, operands = block_inputs(key)
    q0, q1, kv0, kv1 = 40, 96, 36, 100
    cfg, dims, sm, ops = block_ops(case, q[:, q0:q1], k[:, kv0:kv1], v[:, kv0:kv1], operands,
                                   q0, kv0)
    dout = dout[:, q0:q1]

    def engine(q, k, v):
        return attn_mod._attention((cfg, dims, sm), False, q, k, v, *ops[3:])[:2]

    def reference(q, k, v):
        return attn_mod._reference(q, k, v, *ops[3:], cfg=cfg, dims=dims, sm=sm)[:2]

    results = []
    for f in (engine, reference):
        (out, lse), vjp = jax.jit(lambda *a: jax.vjp(f, *a))(*ops[:3])
        results.append((out, lse, *vjp((dout, jnp.zeros_like(lse)))))
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), *results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


def test_vmap_blocks_take_their_own_positions(key):
    # Two q blocks of one causal call stacked by vmap: the handler gets index_base [2, 6].
    q, k, v, _, _ = block_inputs(key)
    out, lse, _ = whole_call("causal", q, k, v, jnp.zeros_like(q), ())
    n = BSQ // 2
    qs = q.reshape(BB, 2, n, BH, BD).swapaxes(0, 1)
    bases = jnp.array([[0, 0, 0, 0, BSQ, BSKV], [0, 0, n, 0, BSQ, BSKV]], jnp.int32)

    def one(q, base):
        cfg, dims, sm, ops = block_ops("causal", q, k, v, (), 0, 0)
        return attn_mod._attention((cfg, dims, sm), False, *with_base(ops, base))[:2]
    got_out, got_lse = jax.jit(jax.vmap(one))(qs, bases)
    np.testing.assert_allclose(got_out.swapaxes(0, 1).reshape(out.shape), out, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(jnp.concatenate(list(got_lse), 2), lse, rtol=1e-5, atol=1e-5)


def ffi_fwd(cfg, dims, sm, ops):
    """The CPU handler alone (the custom_vjp traces the reference too, whose checks would
    speak first)."""
    return jax.jit(lambda *o: attn_mod._ffi_fwd(*o, cfg=cfg, dims=dims, sm=sm))(*ops)


@pytest.mark.parametrize("case, base, message", [
    ("dropout", [0, 0, 40, 34, BSQ, BSKV], "got kv_pos 34 with dropout.*multiple of 4"),
    ("causal", [0, 0, 41, 36, BSQ, BSKV], "got \\(q_pos 41, kv_pos 36, q_extent 96, kv_extent "
     "128\\) for a block of 56 queries and 64 keys; allowed: .*q_pos \\+ 56 <= q_extent"),
    ("causal", [0, 0, 40, 36, BSQ, 99], "kv_pos \\+ 64 <= kv_extent"),
    ("causal", [0, 0, -1, 36, BSQ, BSKV], "q_pos, kv_pos >= 0"),
    ("causal", [0, -2, 40, 36, BSQ, BSKV], "got \\(batch_base 0, head_base -2\\)"),
    ("causal", [0, 0, 40], "got shape \\[3\\]; expected int32 \\[2\\] .* or \\[6\\]"),
])
def test_bad_block_positions_are_ffi_errors(key, case, base, message):
    q, k, v, _, operands = block_inputs(key)
    cfg, dims, sm, ops = block_ops(case, q[:, 40:], k[:, 36:100], v[:, 36:100], operands, 40, 36)
    ops = with_base(ops, jnp.array(base, jnp.int32))
    with pytest.raises(Exception, match="index_base: .*" + message):
        jax.block_until_ready(ffi_fwd(cfg, dims, sm, ops))


def test_gpu_sends_blocks_to_the_cuda_flash_kernels(key):
    # cuDNN takes no positions: _index_flag asks select_backend for a kernel that honours
    # them (the CUDA flash kernels) for every block, while a plain shard's (batch_base,
    # head_base) alone needs none.
    q, k, v, _, operands = block_inputs(key)
    cfg, _, _, ops = block_ops("causal", q, k, v, operands, 0, 0)
    assert _gpu_route._index_flag(ops, cfg, None) == _lib.REQUEST_INDEX_BASE
    cfg, _, _, ops = block_ops("causal", q, k, v, operands, 0, 0, positions=False)
    assert _gpu_route._index_flag(ops, cfg, None) == 0
    cfg, _, _, ops = block_ops("causal", q, k, v, operands, 0, 0)
    ops = with_base(ops, jnp.array([0, 0, 0, 0, BSQ, BSKV, 8, 16], jnp.int32))
    assert _gpu_route._index_flag(ops, cfg, None) == _lib.REQUEST_INDEX_BASE


# ---------------------------------------------------------------------------
# Striped blocks (index_base [8]: .., stripe, stride) of THD (and BSHD) calls: context
# parallelism deals each packed row's T tokens to CP devices in stripes of ST tokens
# (device r: the stripes of index r mod CP, in order; local token t is global token
# r ST + (t // ST) CP ST + t % ST). Every (q device, kv device) pair is a block call with
# the whole call's descriptor; merged over the kv devices they give fused_attn on the
# whole row, forward and dq / dk / dv.

TB, TT, TH, TD = 2, 96, 2, 16
T_Q_LENS = [[25, 40, 20], [41, 0, 55]]  # 3 segments a row, padding between and after
T_KV_LENS = [[28, 36, 26], [38, 0, 55]]
T_OFFS = [[0, 30, 70, TT], [0, 41, 41, TT]]


def alibi_thd(s, b, h, qi, ki, slope):
    """ALiBi: q_idx / kv_idx (positions in the segment) and an operand without a sequence
    dim (a THD block takes no other)."""
    return s - slope * jnp.abs(ki - qi).astype(jnp.float32)


# name: (layout, mask, window, dropout, score_mod, cp, stripe)
THD = QKVLayout.THD_THD_THD
STRIPE_CASES = {
    "thd_causal": (THD, AttnMaskType.PADDING_CAUSAL_MASK, None, 0.0, None, 2, 4),
    "thd_causal_cp4": (THD, AttnMaskType.PADDING_CAUSAL_MASK, None, 0.0, None, 4, 8),
    "thd_window": (THD, AttnMaskType.PADDING_MASK, (10, 3), 0.0, None, 2, 8),
    "thd_bottom_right_window": (THD, AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, (12, 0),
                                0.0, None, 4, 4),
    "thd_dropout": (THD, AttnMaskType.PADDING_CAUSAL_MASK, None, 0.2, None, 2, 4),
    "thd_score_mod": (THD, AttnMaskType.PADDING_CAUSAL_MASK, None, 0.0, alibi_thd, 4, 4),
    "thd_score_mod_dropout_window": (THD, AttnMaskType.PADDING_MASK, (16, 16), 0.2, alibi_thd,
                                     2, 8),
    "bshd_causal": (QKVLayout.BSHD_BSHD_BSHD, AttnMaskType.CAUSAL_MASK, None, 0.0, None, 4, 4),
}


def stripe_inputs(key):
    kq, kk, kv, kd, ks = jax.random.split(key, 5)
    slope = jax.random.uniform(ks, (1, TH, 1, 1), minval=0.05, maxval=0.2)
    return (normal(kq, (TB, TT, TH, TD)), normal(kk, (TB, TT, TH, TD)),
            normal(kv, (TB, TT, TH, TD)), normal(kd, (TB, TT, TH, TD)), (slope,))


def stripe_descriptor(layout):
    if layout != THD:
        return None
    lens = (jnp.array(T_Q_LENS, jnp.int32), jnp.array(T_KV_LENS, jnp.int32))
    return SequenceDescriptor.from_seqlens_and_offsets(lens, jnp.array(T_OFFS, jnp.int32))


def tokens_of(case, r):
    """The global tokens device r holds, in order (numpy int [n])."""
    cp, st = STRIPE_CASES[case][5:]
    return np.array([g for g in range(TT) if (g // st) % cp == r])


def heads_first(layout, lse):
    """lse [B, H, S] from the layout's ([B, S, H] under THD)."""
    return jnp.swapaxes(lse, 1, 2) if layout == THD else lse


def stripe_whole_call(case, q, k, v, dout, operands):
    """fused_attn on the whole rows: out, lse [B, H, T] and the gradients of sum(out *
    dout) by q, k, v and the score_mod operand."""
    layout, mask, window, p, fn, _, _ = STRIPE_CASES[case]

    def f(q, k, v, *ops):
        return fusedattn.fused_attn(
            (q, k, v), None, stripe_descriptor(layout), SEED if p else None, attn_mask_type=mask,
            qkv_layout=layout, max_segments_per_seq=3 if layout == THD else 1,
            window_size=window, dropout_probability=p, is_training=True, return_aux=True,
            score_mod=fn, score_mod_operands=ops)

    args = (q, k, v, *(operands if fn else ()))
    (out, aux), vjp = jax.vjp(f, *args)
    grads = vjp((dout, jax.tree_util.tree_map(jnp.zeros_like, aux)))
    return out, heads_first(layout, aux["softmax_aux"][..., 0]), grads


def stripe_ops(case, q, k, v, operands, rq, rk, cols=8, fn=None):
    """cfg, dims, ScoreMod and the FFI operands of the block of q device rq (q, its
    tokens) and kv device rk (k, v): index_base [8] (cols 6: the same blocks read as
    contiguous ones), the whole call's descriptor; fn: another score_mod than the case's."""
    layout, mask, window, p, case_fn, cp, st = STRIPE_CASES[case]
    fn = fn or case_fn
    call = prepare((q, k, v), None, stripe_descriptor(layout), SEED if p else None,
                   attn_bias_type=AttnBiasType.NO_BIAS, attn_mask_type=mask, qkv_layout=layout,
                   softmax_type=SoftmaxType.VANILLA_SOFTMAX, scaling_factor=None,
                   dropout_probability=p, is_training=True,
                   max_segments_per_seq=3 if layout == THD else 1, window_size=window,
                   softmax_offset=None)
    base = [0, 0, rq * st, rk * st, TT, TT, st, cp * st][:cols]
    ops = with_base(call.operands, jnp.array(base, jnp.int32))
    sm = None
    if fn is not None:
        d = call.dims
        sm, arrays4 = sm_mod.make_score_mod(fn, operands, None, (d.B, d.Hq, d.Sq, d.Skv))
        ops = (*ops, sm_mod.concat_operands(arrays4))
    return call.cfg, call.dims, sm, ops


def striped_blocks(case, q, k, v, dout, operands, out, lse, cols=8):
    """Every block's forward merged over the kv devices -> (out, lse [B, H, T]), and the
    blocks' backward given the whole call's out / lse summed -> dq, dk, dv (, dslope)."""
    layout, cp = STRIPE_CASES[case][0], STRIPE_CASES[case][5]
    m_out, m_lse = jnp.zeros_like(out), jnp.zeros_like(lse)
    dq, dk, dv = jnp.zeros_like(q), jnp.zeros_like(k), jnp.zeros_like(v)
    dops = [jnp.zeros_like(o) for o in operands]
    for rq in range(cp):
        qt = tokens_of(case, rq)
        parts = []
        for rk in range(cp):
            kt = tokens_of(case, rk)
            cfg, dims, sm, ops = stripe_ops(case, q[:, qt], k[:, kt], v[:, kt], operands, rq,
                                            rk, cols)
            o, l = block_fwd(cfg, dims, sm, ops)
            parts.append((o, heads_first(layout, l)))
            g = block_bwd(cfg, dims, sm, ops, out[:, qt], dout[:, qt],
                          heads_first(layout, lse[:, :, qt]))
            dq, dk, dv = dq.at[:, qt].add(g[0]), dk.at[:, kt].add(g[1]), dv.at[:, kt].add(g[2])
            if sm is not None:
                dops = [a + b for a, b in zip(dops, g[3])]
        o, l = merge(parts)
        m_out, m_lse = m_out.at[:, qt].set(o), m_lse.at[:, :, qt].set(l)
    return m_out, m_lse, (dq, dk, dv, *(dops if operands else ()))


@pytest.mark.parametrize("case", STRIPE_CASES)
def test_striped_blocks_merge_to_the_whole_call(key, case):
    fn = STRIPE_CASES[case][4]
    q, k, v, dout, operands = stripe_inputs(key)
    operands = operands if fn else ()
    out, lse, grads = stripe_whole_call(case, q, k, v, dout, operands)
    m_out, m_lse, m_grads = striped_blocks(case, q, k, v, dout, operands, out, lse)
    np.testing.assert_allclose(m_out, out, rtol=1e-5, atol=1e-5, err_msg="out")
    np.testing.assert_allclose(m_lse, lse, rtol=1e-5, atol=1e-5, err_msg="lse")
    for name, got, want in zip(("dq", "dk", "dv", "dslope"), m_grads, grads):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("case", ["thd_causal", "thd_window", "thd_score_mod", "bshd_causal"])
def test_striped_blocks_read_as_contiguous_differ(key, case):
    # The merge test is not vacuous: the same blocks with 6 columns (no stripes) give
    # another out.
    fn = STRIPE_CASES[case][4]
    q, k, v, dout, operands = stripe_inputs(key)
    operands = operands if fn else ()
    out, lse, _ = stripe_whole_call(case, q, k, v, dout, operands)
    m_out = striped_blocks(case, q, k, v, dout, operands, out, lse, cols=6)[0]
    assert np.max(np.abs(np.asarray(m_out - out))) > 1e-3


def one_striped_block(case, key, rq=1, rk=0):
    q, k, v, dout, operands = stripe_inputs(key)
    operands = operands if STRIPE_CASES[case][4] else ()
    qt, kt = tokens_of(case, rq), tokens_of(case, rk)
    return (q, k, v, dout, operands, qt, kt,
            stripe_ops(case, q[:, qt], k[:, kt], v[:, kt], operands, rq, rk))


@pytest.mark.parametrize("case", STRIPE_CASES)
def test_striped_block_reference_matches_the_engine(key, case):
    q, k, v, dout, operands, qt, kt, (cfg, dims, sm, ops) = one_striped_block(case, key)
    dout = dout[:, qt]

    def engine(q, k, v):
        return attn_mod._attention((cfg, dims, sm), False, q, k, v, *ops[3:])[:2]

    def reference(q, k, v):
        return attn_mod._reference(q, k, v, *ops[3:], cfg=cfg, dims=dims, sm=sm)[:2]

    results = []
    for f in (engine, reference):
        (out, lse), vjp = jax.jit(lambda *a: jax.vjp(f, *a))(*ops[:3])
        results.append((out, lse, *vjp((dout, jnp.zeros_like(lse)))))
    assert np.isfinite(np.asarray(results[0][1])).any()  # the block keeps something
    for name, got, want in zip(("out", "lse", "dq", "dk", "dv"), *results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("case", STRIPE_CASES)
def test_striped_block_backward_reference_takes_the_whole_calls_stats(key, case):
    """attention._block_bwd_reference (the GPU's backward of a block) on a striped block,
    THD's lse [B, T, H] included, gives the engine's share given the whole call's out and
    lse."""
    q, k, v, dout, operands, qt, kt, (cfg, dims, sm, ops) = one_striped_block(case, key)
    layout = STRIPE_CASES[case][0]
    out, lse, _ = stripe_whole_call(case, q, k, v, dout, operands)
    args = (out[:, qt], dout[:, qt], heads_first(layout, lse[:, :, qt]))
    cfg = dataclasses.replace(cfg, want_lse=True)
    want = block_bwd(cfg, dims, sm, ops, *args)
    got = jax.jit(lambda *a: attn_mod._block_bwd_reference(ops, *a, cfg=cfg, dims=dims,
                                                           sm=sm))(*args)
    got = tuple(got[:3]) + ((sm_mod.split_operands(got[5], sm),) if sm is not None else ())
    assert np.max(np.abs(np.asarray(want[0]))) > 1e-3  # the block has a share
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=name)
    if sm is not None:
        for g, w in zip(got[3], want[3]):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg="d operands")


def test_thd_block_score_mod_operands_take_no_sequence_dim(key):
    # THD operands are read at the position in the segment, which a block's local slice
    # does not hold: the FFI and the reference refuse a query / key dim there.
    q, k, v, _, _, qt, kt, _ = one_striped_block("thd_causal", key)
    row = jnp.zeros((1, 1, len(qt), 1), jnp.float32)
    cfg, dims, sm, ops = stripe_ops("thd_causal", q[:, qt], k[:, kt], v[:, kt], (row,), 1, 0,
                                    fn=lambda s, b, h, qi, ki, r: s + r)
    with pytest.raises(Exception, match="score_mod_operands: operand 0 has shape \\[1, 1, "
                       f"{len(qt)}, 1\\]; a THD block"):
        jax.block_until_ready(ffi_fwd(cfg, dims, sm, ops))
    with pytest.raises(ValueError, match="score_mod_operands: a THD block"):
        attn_mod._reference(*ops, cfg=cfg, dims=dims, sm=sm)


@pytest.mark.parametrize("base, message", [
    ([0, 0, 4, 0, TT, TT, 4, 6], "got \\(stripe 4, stride 6\\); allowed: stripe >= 1"),
    ([0, 0, 4, 0, TT, TT, 0, 8], "got \\(stripe 0, stride 8\\)"),
    ([0, 0, 52, 0, TT, TT, 4, 8], "whose last query is global token 143 .*143 < q_extent"),
    ([0, 0, 2, 0, TT, TT, 2, 4], "got stripe 2 \\(stride 4\\) with dropout"),
])
def test_bad_stripes_are_ffi_errors(key, base, message):
    q, k, v, _, _, qt, kt, (cfg, dims, sm, ops) = one_striped_block("thd_dropout", key)
    ops = with_base(ops, jnp.array(base, jnp.int32))
    with pytest.raises(Exception, match="index_base: .*" + message):
        jax.block_until_ready(ffi_fwd(cfg, dims, sm, ops))
