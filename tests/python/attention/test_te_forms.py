"""TransformerEngine's call forms, written as TE's own attention tests write them: a
descriptor of segment ids and positions resolved with the call's max_segments_per_seq,
lengths [B, S] and offsets [B, S + 1] padded with -1 (q and kv of different widths in
cross attention), max_segments_per_seq > 1 with a BSHD layout (a warning), and
context_checkpoint_name. Forward and gradients against two oracles on random inputs:
reference.py on the segments found here by plain numpy, and TE's own dense mask (same id,
not 0, causal by position)."""

import inspect
import warnings

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor
from fusedattn.reference import attention_reference

THD = QKVLayout.THD_THD_THD
MASKS = [AttnMaskType.PADDING_MASK, AttnMaskType.PADDING_CAUSAL_MASK]
N_SEG = 3  # segments a row; the calls pass N_SEG + 1 as TE's tests do
H, D = 2, 16


def te_segments(B, S, n, seed, min_len=None):
    """TE's test generator, in numpy: n segments a row of random sizes, each with padding
    (id 0) at its end, positions counting on through that padding; padding at the row end."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((B, S), np.int32)
    pos = np.zeros((B, S), np.int32)
    pad = np.zeros((B, S), bool)
    for b in range(B):
        cur = 0
        for s in range(n):
            lo = 1 if min_len is None else min_len[b][s]
            size = int(rng.integers(lo, S // n + 1))
            if cur + size > S:
                break
            ids[b, cur:cur + size] = s + 1
            pos[b, cur:cur + size] = np.arange(size)
            valid = int(rng.integers(lo, size + 1))
            pad[b, cur + valid:cur + size] = True
            cur += size
        pad[b, cur:] = True
    return np.where(pad, 0, ids), pos


def te_seqlens_and_offsets(ids):
    """TE's tests' get_seqlens_and_offsets, in numpy: lengths [B, S] by id (-1 where none),
    segment starts [B, S + 1] (-1 padded, no end offset)."""
    B, S = ids.shape
    lens = np.full((B, S), -1, np.int32)
    offs = np.full((B, S + 1), -1, np.int32)
    for b in range(B):
        counts = np.bincount(ids[b], minlength=S + 1)[1:S + 1]
        lens[b, :S] = np.where(counts > 0, counts, -1)
        starts = [t for t in range(S) if ids[b, t] != 0 and (t == 0 or ids[b, t - 1] != ids[b, t])]
        offs[b, :len(starts)] = starts
    return lens, offs


def runs_arrays(ids, M):
    """The oracle's descriptor: runs of equal non-zero ids -> lengths [B, M], offsets
    [B, M + 1] (empty fill segments at the row's end)."""
    B, S = ids.shape
    lens = np.zeros((B, M), np.int32)
    offs = np.full((B, M + 1), S, np.int32)
    for b in range(B):
        t, s = 0, 0
        while t < S and s < M:
            if ids[b, t] == 0:
                t += 1
                continue
            start = t
            while t < S and ids[b, t] == ids[b, start]:
                t += 1
            lens[b, s], offs[b, s] = t - start, start
            s += 1
    return lens, offs


def dense_oracle(q, k, v, ids_q, ids_kv, pos_q, pos_kv, causal):
    """TE's reference mask: q token i keeps key j when both carry the same non-zero id (and
    pos_q[i] >= pos_kv[j] if causal); a row that keeps none gives 0."""
    keep = (ids_q[:, :, None] == ids_kv[:, None, :]) & (ids_q[:, :, None] != 0)
    if causal:
        keep &= pos_q[:, :, None] >= pos_kv[:, None, :]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    logits = jnp.where(keep[:, None], logits, -jnp.inf)
    m = jnp.max(logits, axis=-1, keepdims=True)
    p = jnp.where(keep[:, None], jnp.exp(logits - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    p = p / jnp.maximum(jnp.sum(p, axis=-1, keepdims=True), 1e-30)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def _inputs(key, B, Sq, Skv):
    ks = jax.random.split(key, 4)
    return (normal(ks[0], (B, Sq, H, D)), normal(ks[1], (B, Skv, H, D)),
            normal(ks[2], (B, Skv, H, D)), normal(ks[3], (B, Sq, H, D)))


def _value_and_grads(fn, q, k, v, w):
    return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w),
                                      argnums=(0, 1, 2)))(q, k, v)


def _close(got, want):
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)


def _te_call(sd, mask, M, layout=THD, **kw):
    def fn(q, k, v):
        qkv = (jnp.stack([q, k, v], axis=2),) if layout == QKVLayout.T3HD else (q, k, v)
        return fusedattn.fused_attn(qkv, None, sd, None, attn_bias_type=fusedattn.AttnBiasType.NO_BIAS,
                                    attn_mask_type=mask, qkv_layout=layout,
                                    scaling_factor=1.0 / np.sqrt(D), dropout_probability=0.0,
                                    is_training=True, max_segments_per_seq=M, **kw)
    return fn


def _check_against_oracles(key, sd, mask, ids, pos, Sq, Skv, layout=THD, M=N_SEG + 1):
    (ids_q, ids_kv), (pos_q, pos_kv) = ids, pos
    q, k, v, w = _inputs(key, ids_q.shape[0], Sq, Skv)
    if layout == QKVLayout.T3HD:
        k, v = normal(key, q.shape), normal(jax.random.fold_in(key, 1), q.shape)
    got = _value_and_grads(_te_call(sd, mask, M, layout), q, k, v, w)
    causal = mask.is_causal()
    te = _value_and_grads(lambda q, k, v: dense_oracle(q, k, v, ids_q, ids_kv, pos_q, pos_kv,
                                                       causal), q, k, v, w)
    (ql, qo), (kl, ko) = runs_arrays(ids_q, M), runs_arrays(ids_kv, M)
    ref = _value_and_grads(lambda q, k, v: attention_reference(
        q, k, v, attn_mask_type=mask, q_seqlens=ql, kv_seqlens=kl, q_offsets=qo, kv_offsets=ko,
        thd=True)[0], q, k, v, w)
    _close(got, ref)
    _close(got, te)


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
@pytest.mark.parametrize("layout", [THD, QKVLayout.T3HD], ids=lambda l: l.name)
def test_segment_ids_and_pos_resolved_with_the_calls_max_segments(key, mask, layout):
    # TE: SequenceDescriptor.from_segment_ids_and_pos((ids_q, ids_kv), (pos_q, pos_kv)), then
    # fused_attn(..., max_segments_per_seq=N_SEG + 1); cross attention has other kv widths.
    Sq, Skv = (48, 48) if layout == QKVLayout.T3HD else (40, 64)
    ids_q, pos_q = te_segments(2, Sq, N_SEG, seed=42)
    ids_kv, pos_kv = ((ids_q, pos_q) if layout == QKVLayout.T3HD
                      else te_segments(2, Skv, N_SEG, seed=2024))
    sd = SequenceDescriptor.from_segment_ids_and_pos((jnp.asarray(ids_q), jnp.asarray(ids_kv)),
                                                     (jnp.asarray(pos_q), jnp.asarray(pos_kv)))
    assert sd.q_seqlens is None  # nothing resolved before the call
    _check_against_oracles(key, sd, mask, (ids_q, ids_kv), (pos_q, pos_kv), Sq, Skv, layout)


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_minus_one_padded_seqlens_and_offsets_of_different_widths(key, mask):
    # TE's Seqlens form: lengths [B, S] and starts [B, S + 1], -1 padded, each width its own
    # side's (q 40 tokens, kv 64), compacted to max_segments_per_seq = N_SEG + 1.
    Sq, Skv = 40, 64
    ids_q, pos_q = te_segments(3, Sq, N_SEG, seed=7)
    ids_kv, pos_kv = te_segments(3, Skv, N_SEG, seed=8)
    (ql, qo), (kl, ko) = te_seqlens_and_offsets(ids_q), te_seqlens_and_offsets(ids_kv)
    assert ql.shape == (3, Sq) and ko.shape == (3, Skv + 1)
    sd = SequenceDescriptor.from_seqlens_and_offsets((jnp.asarray(ql), jnp.asarray(kl)),
                                                     (jnp.asarray(qo), jnp.asarray(ko)))
    _check_against_oracles(key, sd, mask, (ids_q, ids_kv), (pos_q, pos_kv), Sq, Skv)
    # Built directly, the same arrays are compacted the same way.
    direct = SequenceDescriptor(jnp.asarray(ql), jnp.asarray(kl), jnp.asarray(qo),
                                jnp.asarray(ko))
    _check_against_oracles(key, direct, mask, (ids_q, ids_kv), (pos_q, pos_kv), Sq, Skv)


def test_offsets_with_the_end_column_and_minus_one_padding(key):
    # TE's docstring form: lengths [[2, 1, 1, -1], ..] with offsets [[0, 2, 3, 4, -1], ..].
    ids = np.array([[1, 1, 2, 3, 0, 0], [1, 1, 2, 0, 0, 0]], np.int32)
    lens = jnp.array([[2, 1, 1, -1], [2, 1, -1, -1]], jnp.int32)
    offs = jnp.array([[0, 2, 3, 4, -1], [0, 2, 3, -1, -1]], jnp.int32)
    sd = SequenceDescriptor.from_seqlens_and_offsets(lens, offs)
    pos = np.broadcast_to(np.arange(6), ids.shape)
    for M in (3, 4, 6):  # narrower, as wide as and wider than the arrays
        _check_against_oracles(key, sd, AttnMaskType.PADDING_CAUSAL_MASK, (ids, ids), (pos, pos),
                               6, 6, M=M)


def test_start_only_offsets_at_the_calls_width(key):
    # TE's Seqlens form at width exactly M: starts only, -1 padded (no end column), so the
    # last real segment's bound is a -1; it must run to its length, not be cut at 0.
    ids = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]], np.int32)
    lens = jnp.array([[2, 3, -1], [4, -1, -1]], jnp.int32)
    offs = jnp.array([[0, 2, -1, -1], [0, -1, -1, -1]], jnp.int32)
    sd = SequenceDescriptor.from_seqlens_and_offsets(lens, offs)
    pos = np.broadcast_to(np.arange(6), ids.shape)
    for M in (2, 3, 4):
        _check_against_oracles(key, sd, AttnMaskType.PADDING_CAUSAL_MASK, (ids, ids), (pos, pos),
                               6, 6, M=M)
    # check_descriptors takes TE's -1 padding at width M (trailing -1 lengths are empty
    # segments, as the compaction's fill at other widths) and still reports a -1 before a
    # real segment.
    from jax.experimental import checkify
    q, k, v, _ = _inputs(key, 2, 6, 6)
    checked = checkify.checkify(jax.jit(lambda sd: _te_call(
        sd, AttnMaskType.PADDING_CAUSAL_MASK, 3, check_descriptors=True)(q, k, v)))
    err, out = checked(sd)
    err.throw()
    _close(out, _te_call(sd, AttnMaskType.PADDING_CAUSAL_MASK, 3)(q, k, v))
    holey = SequenceDescriptor.from_seqlens_and_offsets(jnp.array([[2, -1, 3], [4, -1, -1]]),
                                                        jnp.array([[0, 2, 2, -1], [0, -1, -1, -1]]))
    err, _ = checked(holey)
    with pytest.raises(Exception, match=r"q_seqlens\[0, 1\] = -1 is negative"):
        err.throw()


def test_from_seqlens_with_minus_one_entries_packs_the_compacted_lengths(key):
    padded = SequenceDescriptor.from_seqlens(jnp.array([[5, -1, 7, -1, -1, -1, -1, -1]]))
    plain = SequenceDescriptor.from_seqlens(jnp.array([[5, 7, 0]]))
    q, k, v, w = _inputs(key, 1, 16, 16)
    call = lambda sd: _value_and_grads(_te_call(sd, AttnMaskType.PADDING_MASK, 3), q, k, v, w)
    _close(call(padded), call(plain))


def test_the_calls_max_segments_decides_over_the_constructors(key):
    ids = np.array([[1, 1, 1, 2, 2, 0, 3, 3, 3, 3, 4, 4]], np.int32)
    pos = np.broadcast_to(np.arange(12), ids.shape)
    sd = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), max_segments_per_seq=2)
    np.testing.assert_array_equal(sd.q_seqlens, [[3, 2]])  # the constructor's resolution
    _check_against_oracles(key, sd, AttnMaskType.PADDING_MASK, (ids, ids), (pos, pos), 12, 12,
                           M=4)


def test_segment_ids_resolved_under_jit(key):
    ids_q, pos_q = te_segments(2, 32, N_SEG, seed=3)
    q, k, v, w = _inputs(key, 2, 32, 32)

    @jax.jit
    def f(q, k, v, ids, pos):
        sd = SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
        return _te_call(sd, AttnMaskType.PADDING_CAUSAL_MASK, N_SEG + 1)(q, k, v)

    got = f(q, k, v, jnp.asarray(ids_q), jnp.asarray(pos_q))
    want = dense_oracle(q, k, v, ids_q, ids_q, pos_q, pos_q, True)
    _close(got, want)


def test_segments_past_the_calls_max_are_dropped_with_a_warning(key):
    # 4 segments a row, the call keeps 2: the others' tokens are padding (output 0).
    ids = np.array([[1, 1, 1, 2, 2, 0, 3, 3, 3, 3, 4, 4]], np.int32)
    kept = np.where(ids <= 2, ids, 0)
    pos = np.broadcast_to(np.arange(12), ids.shape)
    lens, offs = te_seqlens_and_offsets(ids)
    q, k, v, _ = _inputs(key, 1, 12, 12)
    want = dense_oracle(q, k, v, kept, kept, pos, pos, False)
    for sd, what in ((SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids)), "segment ids"),
                     (SequenceDescriptor.from_seqlens_and_offsets(jnp.asarray(lens),
                                                                  jnp.asarray(offs)), "_seqlens")):
        with pytest.warns(UserWarning, match=f"q {what}|q{what}"):
            got = _te_call(sd, AttnMaskType.PADDING_MASK, 2)(q, k, v)
        _close(got, want)
    # check_descriptors makes it an error (under jit through checkify).
    from jax.experimental import checkify
    sd = SequenceDescriptor.from_seqlens_and_offsets(jnp.asarray(lens), jnp.asarray(offs))
    f = checkify.checkify(jax.jit(lambda q, k, v, sd: _te_call(
        sd, AttnMaskType.PADDING_MASK, 2, check_descriptors=True)(q, k, v)))
    err, _ = f(q, k, v, sd)
    with pytest.raises(Exception, match="q_seqlens of row 0 hold 4 segments .* more than "
                       "max_segments_per_seq=2"):
        err.throw()


@pytest.mark.parametrize("layout", [QKVLayout.BSHD_BSHD_BSHD, QKVLayout.BS3HD,
                                    QKVLayout.BSHD_BS2HD], ids=lambda l: l.name)
def test_bshd_with_max_segments_above_one_warns_and_runs_one_segment(key, layout):
    # TE's BSHD forms: from_segment_ids_and_pos with TE's float 0/1 ids and no positions, or
    # from_seqlens of their sums; max_segments_per_seq=3 (TE's docstring example) warns.
    S = 24
    valid = np.array([17, 24])
    tokens = (np.arange(S)[None, :] < valid[:, None]).astype(np.float32)
    q, k, v, w = _inputs(key, 2, S, S)

    def call(sd, M):
        def fn(q, k, v):
            qkv = {QKVLayout.BS3HD: (jnp.stack([q, k, v], axis=2),),
                   QKVLayout.BSHD_BS2HD: (q, jnp.stack([k, v], axis=2))}.get(layout, (q, k, v))
            return fusedattn.fused_attn(qkv, None, sd, None,
                                        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                                        qkv_layout=layout, max_segments_per_seq=M)
        return _value_and_grads(fn, q, k, v, w)

    by_ids = SequenceDescriptor.from_segment_ids_and_pos((jnp.asarray(tokens), jnp.asarray(tokens)),
                                                         None)
    by_lens = SequenceDescriptor.from_seqlens((jnp.asarray(tokens.sum(-1), jnp.int32),) * 2)
    with pytest.warns(UserWarning, match=f"max_segments_per_seq=3 with qkv_layout={layout.name}"):
        got = call(by_ids, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want_lens = call(by_lens, 1)
    ids = tokens.astype(np.int32)
    pos = np.broadcast_to(np.arange(S), ids.shape)
    te = _value_and_grads(lambda q, k, v: dense_oracle(q, k, v, ids, ids, pos, pos, True),
                          q, k, v, w)
    ql = jnp.asarray(valid, jnp.int32)
    ref = _value_and_grads(lambda q, k, v: attention_reference(
        q, k, v, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK, q_seqlens=ql,
        kv_seqlens=ql)[0], q, k, v, w)
    _close(got, ref)
    _close(want_lens, ref)
    _close(got, te)


def _fwd_calls(fn, *args):
    """FFI forward calls in fn's jaxpr, counted in every sub-jaxpr (repeats included)."""
    def walk(jaxpr):
        n = 0
        for e in jaxpr.eqns:
            n += e.primitive.name == "ffi_call" and e.params.get("target_name") == \
                "fusedattn_attn_fwd"
            for sub in jax.extend.core.jaxprs_in_params(e.params):
                n += walk(sub)
        return n
    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


@pytest.mark.parametrize("name", ["context", "attn_out"])
def test_context_checkpoint_name_lets_remat_keep_the_forward(key, name):
    q, _, _, w = _inputs(key, 2, 16, 16)
    proj = normal(jax.random.fold_in(key, 5), (D, D))

    def f(q, proj):
        x = jnp.tanh(q @ proj)
        kw = {} if name == "context" else dict(context_checkpoint_name=name)
        out = fusedattn.fused_attn((x, x, x), None, None, None,
                                   attn_mask_type=AttnMaskType.CAUSAL_MASK, **kw)
        return jnp.sum(jnp.sin(out @ proj) * w)

    policies = jax.checkpoint_policies
    grad = lambda policy: jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1))
    saved, recomputed = grad(policies.save_only_these_names(name)), grad(policies.nothing_saveable)
    other = grad(policies.save_only_these_names("not_" + name))
    # Saved by name: the backward reads the saved out / lse, the forward runs once.
    assert _fwd_calls(saved, q, proj) == 1
    assert _fwd_calls(recomputed, q, proj) == 2
    assert _fwd_calls(other, q, proj) == 2
    plain = jax.jit(jax.grad(f, argnums=(0, 1)))(q, proj)
    _close(jax.jit(saved)(q, proj), plain)
    _close(jax.jit(recomputed)(q, proj), plain)


def test_te_keyword_names_and_defaults():
    # TE's fused_attn keywords, with TE's defaults where fusedattn has the feature.
    params = inspect.signature(fusedattn.fused_attn).parameters
    te_defaults = dict(max_segments_per_seq=1, window_size=None, context_parallel_axis="",
                       context_parallel_causal_load_balanced=False, context_checkpoint_name="context",
                       softmax_offset=None, stripe_size=None,
                       context_parallel_strategy=fusedattn.CPStrategy.DEFAULT,
                       softmax_type=fusedattn.SoftmaxType.VANILLA_SOFTMAX)
    for name, default in te_defaults.items():
        assert params[name].default == default, name
    for name in ("qkv", "bias", "sequence_descriptor", "seed", "attn_bias_type",
                 "attn_mask_type", "qkv_layout", "scaling_factor", "dropout_probability",
                 "is_training"):
        assert name in params, name
    assert fusedattn.AttnSoftmaxType is fusedattn.SoftmaxType
    sd_params = inspect.signature(SequenceDescriptor.from_seqlens_and_offsets).parameters
    assert "seq_offsets" in sd_params and "offsets" in sd_params
    ids_params = inspect.signature(SequenceDescriptor.from_segment_ids_and_pos).parameters
    assert list(ids_params)[:2] == ["segment_ids", "segment_pos"]


def test_empty_context_parallel_axis_is_no_context_parallelism(key):
    q, k, v, _ = _inputs(key, 2, 16, 16)
    plain = fusedattn.fused_attn((q, k, v), None, None, None)
    _close(fusedattn.fused_attn((q, k, v), None, None, None, context_parallel_axis=""), plain)
    _close(fusedattn.fused_attn((q, k, v), None, None, None, context_parallel_axis=None), plain)


@pytest.mark.parametrize("strategy", [fusedattn.CPStrategy.ALL_GATHER, fusedattn.CPStrategy.RING],
                         ids=lambda s: s.name)
def test_segment_ids_under_context_parallelism(key, strategy):
    # The descriptor of segment ids stays global (natural order) and is resolved once with
    # the call's max_segments_per_seq; q, k, v are striped over a cp mesh of 2 devices.
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    S, cp, stripe = 32, 2, 4
    ids, pos = te_segments(2, S, N_SEG, seed=11)
    q, k, v, w = _inputs(key, 2, S, S)
    mesh = Mesh(np.array(jax.devices("cpu")[:cp]), ("cp",))
    order = lambda x: fusedattn.reorder_causal_load_balancing(
        x, fusedattn.ReorderStrategy.Striped, cp, 1, stripe_size=stripe)
    undo = lambda x: fusedattn.inverse_reorder_causal_load_balancing(
        x, fusedattn.ReorderStrategy.Striped, cp, 1, stripe_size=stripe)
    sd = SequenceDescriptor.from_segment_ids_and_pos(jnp.asarray(ids), jnp.asarray(pos))
    cp_fn = _te_call(sd, AttnMaskType.PADDING_CAUSAL_MASK, N_SEG + 1,
                     context_parallel_axis="cp", context_parallel_strategy=strategy,
                     context_parallel_causal_load_balanced=True, stripe_size=stripe)
    put = lambda x: jax.device_put(order(x), NamedSharding(mesh, P(None, "cp")))
    got = _value_and_grads(lambda q, k, v: undo(cp_fn(q, k, v)), put(q), put(k), put(v), w)
    got = (got[0], tuple(undo(g) for g in got[1]))
    want = _value_and_grads(lambda q, k, v: dense_oracle(q, k, v, ids, ids, pos, pos, True),
                            q, k, v, w)
    _close(got, want)


def test_layout_queries_and_swa_mask_as_te_names_them():
    # TE's tests ask the layout (is_thd, is_qkvpacked, ...) and build windows by make_swa_mask.
    L = QKVLayout
    assert [l for l in L if l.is_thd()] == [L.T3HD, L.THD_T2HD, L.THD_THD_THD]
    assert [l for l in L if l.is_qkvpacked()] == [L.BS3HD, L.T3HD]
    assert [l for l in L if l.is_kvpacked()] == [L.BSHD_BS2HD, L.THD_T2HD]
    assert [l for l in L if l.is_separate()] == [L.BSHD_BSHD_BSHD, L.THD_THD_THD]
    assert L.THD_T2HD.get_qkv_format() == fusedattn.QKVFormat.THD
    assert L.BS3HD.get_qkv_format() == fusedattn.QKVFormat.BSHD
    pos_q = jnp.array([[0, 1, 2, 3, 0, 1]])
    pos_kv = jnp.array([[0, 1, 2, 0, 1, 2, 3]])
    got = fusedattn.make_swa_mask(pos_q, pos_kv, (1, 0), jnp.bool_)
    want = (pos_kv[:, None, :] <= pos_q[:, :, None]) & (pos_kv[:, None, :] >= pos_q[:, :, None] - 1)
    assert got.shape == (1, 1, 6, 7) and got.dtype == jnp.bool_
    np.testing.assert_array_equal(got[:, 0], want)
    np.testing.assert_array_equal(fusedattn.make_swa_mask(pos_q, pos_kv, None), 1.0)
    np.testing.assert_array_equal(fusedattn.make_swa_mask(pos_q, pos_kv, (-1, 2), jnp.int32)[:, 0],
                                  pos_kv[:, None, :] <= pos_q[:, :, None] + 2)
    with pytest.raises(TypeError, match="window_size must be None or a pair"):
        fusedattn.make_swa_mask(pos_q, pos_kv, 3)


@pytest.mark.parametrize("mask", [AttnMaskType.PADDING_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
                                  AttnMaskType.CAUSAL_MASK], ids=lambda m: m.name)
def test_dense_mask_as_sequence_descriptor_gives_the_lengths(key, mask):
    # TE's deprecated form: a dense mask [B, 1, Sq, Skv] (True = masked out) as the
    # descriptor of a BSHD call; only the lengths are read (TE's rule), with a warning.
    B, Sq, Skv = 2, 12, 16
    q_valid, kv_valid = np.array([12, 7]), np.array([9, 16])
    tq = np.arange(Sq)[None, :] < q_valid[:, None]
    tk = np.arange(Skv)[None, :] < kv_valid[:, None]
    keep = tq[:, :, None] & tk[:, None, :]
    if mask.is_causal():
        keep &= np.arange(Sq)[:, None] >= np.arange(Skv)[None, :]
    dense = jnp.asarray(~keep[:, None])
    q, k, v, w = _inputs(key, B, Sq, Skv)
    call = lambda sd: lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, sd, None, attn_mask_type=mask, is_training=True)
    with pytest.warns(DeprecationWarning, match="dense mask as sequence_descriptor"):
        got = _value_and_grads(call(dense), q, k, v, w)
    sd = (SequenceDescriptor.from_seqlens((jnp.asarray(q_valid), jnp.asarray(kv_valid)))
          if mask.is_padding() else None)
    _close(got, _value_and_grads(call(sd), q, k, v, w))
    with pytest.raises(ValueError, match="must have shape \\[2, 1 or H, 12, 16\\]"):
        call(dense[:, :, :5])(q, k, v)
    with pytest.raises(ValueError, match="only taken with a BSHD layout"):
        fusedattn.fused_attn((q, k, v), None, dense, None, attn_mask_type=mask,
                             max_segments_per_seq=2)
