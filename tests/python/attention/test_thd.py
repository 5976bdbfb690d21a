"""THD layouts (THD_THD_THD, T3HD, THD_T2HD): several sequences per row, described by
SequenceDescriptor (lengths + offsets, or segment ids). Tokens of different segments never
attend to each other, padding tokens give zeros, softmax_aux is [B, Sq, Hq, 1]."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import DTYPES, normal
from features import Spec, check
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor

PADDING_MASKS = [m for m in AttnMaskType if m.is_padding()]
S = 96

# Two rows of four segments: gaps between segments, lengths 0 and 1, a segment whose
# queries have no keys (kv length 0), padding at the rows' ends; q and kv differ.
RAGGED = dict(
    seqlens=([[20, 0, 1, 40], [96, 0, 0, 0]], [[25, 3, 1, 0], [60, 10, 0, 0]]),
    offsets=([[0, 25, 25, 30, 70], [0, 96, 96, 96, 96]], [[5, 35, 38, 39, 39], [0, 60, 70, 70, 70]]))


def ragged():
    lens = tuple(jnp.array(x, jnp.int32) for x in RAGGED["seqlens"])
    offs = tuple(jnp.array(x, jnp.int32) for x in RAGGED["offsets"])
    return SequenceDescriptor.from_seqlens_and_offsets(lens, offs)


def _grid():
    layouts = (QKVLayout.THD_THD_THD, QKVLayout.T3HD, QKVLayout.THD_T2HD)
    for i, layout in enumerate(layouts):
        for j, mask in enumerate(PADDING_MASKS):
            yield pytest.param(layout, mask, DTYPES[(i + j) % 3],
                               id=f"{layout.name}-{mask.name}-{jnp.dtype(DTYPES[(i + j) % 3]).name}")


@pytest.mark.parametrize("layout, mask, dtype", list(_grid()))
def test_thd_against_reference(key, layout, mask, dtype):
    Hkv = 4 if layout == QKVLayout.T3HD else 2
    check(key, Spec(dtype=dtype, layout=layout, mask=mask, Sq=S, Skv=S, Hq=4, Hkv=Hkv, D=32,
                    sd=ragged(), M=4))


def test_thd_causal_gqa_dropout(key):
    # The combination a packed-sequence training step uses.
    check(key, Spec(layout=QKVLayout.THD_THD_THD, mask=AttnMaskType.PADDING_CAUSAL_MASK, Sq=S,
                    Skv=S, Hq=8, Hkv=2, D=32, sd=ragged(), M=4, dropout=0.2, seed=11))


def test_thd_sq_differs_from_skv(key):
    sd = SequenceDescriptor.from_seqlens((jnp.array([[30, 1, 0], [0, 64, 3]]),
                                          jnp.array([[50, 40, 7], [9, 1, 90]])))
    check(key, Spec(dtype=jnp.bfloat16, layout=QKVLayout.THD_THD_THD,
                    mask=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, Sq=70, Skv=150,
                    sd=sd, M=3))


@pytest.mark.parametrize("mask", PADDING_MASKS, ids=lambda m: m.name)
def test_thd_equals_one_call_per_segment(key, mask):
    # Independent of the reference: each segment of a packed row gives what a BSHD call on
    # that segment alone gives (its tokens, its lengths), and padding tokens give zeros.
    q_lens, kv_lens = [10, 0, 1, 30, 7], [12, 5, 1, 30, 2]
    M, Hq, Hkv, D = len(q_lens), 4, 2, 16
    sd = SequenceDescriptor.from_seqlens((jnp.array([q_lens]), jnp.array([kv_lens])))
    Sq, Skv = sum(q_lens) + 6, sum(kv_lens) + 3  # padding at the end of the row
    ks = jax.random.split(key, 3)
    q = normal(ks[0], (1, Sq, Hq, D))
    k = normal(ks[1], (1, Skv, Hkv, D))
    v = normal(ks[2], (1, Skv, Hkv, D))
    out = fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask,
                               qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=M)
    qo, ko = np.cumsum([0] + q_lens), np.cumsum([0] + kv_lens)
    for s in range(M):
        if q_lens[s] == 0:
            continue
        seg_q = q[:, qo[s]:qo[s + 1]]
        seg_k, seg_v = k[:, ko[s]:ko[s + 1]], v[:, ko[s]:ko[s + 1]]
        if kv_lens[s] == 0:
            expected = jnp.zeros_like(seg_q)
        else:
            one = SequenceDescriptor.from_seqlens((jnp.array([q_lens[s]]), jnp.array([kv_lens[s]])))
            expected = fusedattn.fused_attn((seg_q, seg_k, seg_v), None, one, None,
                                            attn_mask_type=mask)
        np.testing.assert_allclose(np.asarray(out[:, qo[s]:qo[s + 1]]), np.asarray(expected),
                                   rtol=1e-5, atol=1e-6, err_msg=f"segment {s}")
    assert not np.asarray(out[:, qo[-1]:]).any(), "padding tokens must give 0"


def test_padding_tokens_get_zero_gradients(key):
    spec = Spec(layout=QKVLayout.THD_THD_THD, mask=AttnMaskType.PADDING_MASK, Sq=S, Skv=S,
                sd=ragged(), M=4)
    r = check(key, spec)
    dq, dk, dv = (np.asarray(g) for g in r["fused_g"][:3])
    q_pad = np.ones((2, S), bool)
    kv_pad = np.ones((2, S), bool)
    (ql, kl), (qo, ko) = RAGGED["seqlens"], RAGGED["offsets"]
    for b in range(2):
        for s in range(4):
            q_pad[b, qo[b][s]:qo[b][s] + ql[b][s]] = False
            kv_pad[b, ko[b][s]:ko[b][s] + kl[b][s]] = False
    assert q_pad.any() and kv_pad.any()
    assert not dq[q_pad].any() and not dk[kv_pad].any() and not dv[kv_pad].any()


def test_from_segment_ids_and_pos_gives_the_runs():
    ids = jnp.array([[1, 1, 1, 2, 2, 0, 0, 3], [5, 5, 5, 5, 5, 5, 5, 5]])
    pos = jnp.array([[0, 1, 2, 0, 1, 0, 0, 0], [0, 1, 2, 3, 0, 1, 2, 3]])
    sd = SequenceDescriptor.from_segment_ids_and_pos(ids, max_segments_per_seq=4)
    np.testing.assert_array_equal(sd.q_seqlens, [[3, 2, 1, 0], [8, 0, 0, 0]])
    np.testing.assert_array_equal(sd.q_offsets, [[0, 3, 7, 8, 8], [0, 8, 8, 8, 8]])
    # With positions, a position that does not continue the previous one starts a segment.
    sd = SequenceDescriptor.from_segment_ids_and_pos(ids, pos, max_segments_per_seq=4)
    np.testing.assert_array_equal(sd.q_seqlens, [[3, 2, 1, 0], [4, 4, 0, 0]])
    np.testing.assert_array_equal(sd.kv_offsets, [[0, 3, 7, 8, 8], [0, 4, 8, 8, 8]])
    # Runs past max_segments_per_seq are dropped (their tokens become padding).
    sd = SequenceDescriptor.from_segment_ids_and_pos(ids, max_segments_per_seq=2)
    np.testing.assert_array_equal(sd.q_seqlens, [[3, 2], [8, 0]])


def test_segment_ids_match_lengths_and_offsets(key):
    # A packed pipeline's segment ids (with padding between documents) describe the same
    # sequences as the equivalent lengths and offsets; under jit, from traced ids.
    ids = jnp.array([[1] * 10 + [2] * 5 + [0] * 3 + [3] * 14, [4] * 20 + [0] * 12])
    by_ids = SequenceDescriptor.from_segment_ids_and_pos(ids, max_segments_per_seq=3)
    by_offsets = SequenceDescriptor.from_seqlens_and_offsets(
        jnp.array([[10, 5, 14], [20, 0, 0]]), jnp.array([[0, 10, 18, 32], [0, 20, 20, 20]]))
    ks = jax.random.split(key, 3)
    q, k, v = (normal(kk, (2, 32, 2, 16)) for kk in ks)

    def f(sd):
        return fusedattn.fused_attn((q, k, v), None, sd, None,
                                    attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                                    qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=3)

    traced = jax.jit(lambda ids: f(SequenceDescriptor.from_segment_ids_and_pos(
        ids, max_segments_per_seq=3)))(ids)
    np.testing.assert_array_equal(np.asarray(f(by_ids)), np.asarray(f(by_offsets)))
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(f(by_offsets)))


def test_thd_stats(key):
    # max_logit stays [Hq] and softmax_aux is [B, Sq, Hq, 1] (check() compares both).
    r = check(key, Spec(layout=QKVLayout.T3HD, mask=AttnMaskType.PADDING_CAUSAL_MASK, Sq=S,
                        Skv=S, Hq=2, Hkv=2, sd=ragged(), M=4), grads=False)
    assert r["fused"][1]["max_logit"].shape == (2,)
