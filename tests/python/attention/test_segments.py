"""Invalid THD descriptors have one meaning on every backend (sequence.py's docstring,
csrc/fusedattn/attention/mask.h): a segment ends at the next segment's offset, one whose
offset is below an earlier one is empty, everything is clamped to the buffers. The CPU
engine, small-seq and reference.py (the GPU's fallback) agree on each; and
fused_attn(check_descriptors=True) turns each into a clear error instead."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor
from fusedattn.reference import attention_reference

PADDING_MASKS = [m for m in AttnMaskType if m.is_padding()]
S = 12
THD = QKVLayout.THD_THD_THD

# name: (q lens, kv lens, q offsets, kv offsets) of one row of S tokens, and the
# fragment of check_descriptors' error it raises.
INVALID = {
    # Issue 20's: segment 0 claims 8 tokens, segment 1 starts at token 4.
    "overlap": (([8, 4], [8, 4]), ([0, 4, 8], [0, 4, 8]), "overlaps the next one"),
    "overlap_kv_only": (([3, 4], [9, 3]), ([0, 3, 7], [0, 5, 8]), "kv segment 0"),
    "out_of_order": (([2, 2, 2], [2, 3, 2]), ([0, 6, 2, 8], [0, 6, 2, 9]), "out of order"),
    "past_buffer": (([4, 20], [4, 9]), ([0, 4, S], [0, 4, S]), "past the end of the buffer"),
    "past_last_offset": (([4, 6], [4, 6]), ([0, 4, 8], [0, 4, 8]), "overlaps the next one"),
    "offset_outside": (([4, 4], [4, 4]), ([-2, 4, 30], [0, 4, 8]), "outside the buffer"),
    "negative_length": (([4, -3], [4, 2]), ([0, 4, 8], [0, 4, 8]), "is negative"),
}


def _sd(lens, offs):
    return SequenceDescriptor.from_seqlens_and_offsets(
        tuple(jnp.array([x], jnp.int32) for x in lens),
        tuple(jnp.array([x], jnp.int32) for x in offs))


def _inputs(key, Hq=2, Hkv=2, D=16):
    ks = jax.random.split(key, 3)
    return (normal(ks[0], (1, S, Hq, D)), normal(ks[1], (1, S, Hkv, D)),
            normal(ks[2], (1, S, Hkv, D)))


def _fused(qkv, sd, mask, **kw):
    return fusedattn.fused_attn(qkv, None, sd, None, attn_mask_type=mask, qkv_layout=THD,
                                max_segments_per_seq=sd.max_segments_per_seq, **kw)


def _reference(qkv, sd, mask):
    return attention_reference(*qkv, attn_mask_type=mask, q_seqlens=sd.q_seqlens,
                               kv_seqlens=sd.kv_seqlens, q_offsets=sd.q_offsets,
                               kv_offsets=sd.kv_offsets, thd=True)


@pytest.mark.parametrize("mask", PADDING_MASKS, ids=lambda m: m.name)
@pytest.mark.parametrize("name", list(INVALID))
def test_cpu_engine_matches_reference_on_invalid_descriptors(key, name, mask):
    lens, offs, _ = INVALID[name]
    sd = _sd(lens, offs)
    qkv = _inputs(key)
    out, aux = _fused(qkv, sd, mask, return_aux=True)
    ref_out, ref_lse, _ = _reference(qkv, sd, mask)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), rtol=1e-5, atol=1e-6)
    lse = np.asarray(aux["softmax_aux"])[..., 0]  # [B, Sq, Hq] in THD layouts
    np.testing.assert_allclose(lse, np.swapaxes(np.asarray(ref_lse), 1, 2), rtol=1e-5,
                               atol=1e-6)
    grads = jax.grad(lambda *x: jnp.sum(_fused(x, sd, mask) ** 2), argnums=(0, 1, 2))(*qkv)
    ref_grads = jax.grad(lambda *x: jnp.sum(_reference(x, sd, mask)[0] ** 2),
                         argnums=(0, 1, 2))(*qkv)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


def test_overlapping_segment_ends_at_the_next_offset(key):
    # Independent of the reference: segment 0 of the descriptor is the BSHD call
    # on tokens [0, 4), segment 1 the one on [4, 8); tokens [8, S) are padding.
    lens, offs, _ = INVALID["overlap"]
    qkv = _inputs(key)
    out = _fused(qkv, _sd(lens, offs), AttnMaskType.PADDING_MASK)
    for lo, hi in ((0, 4), (4, 8)):
        alone = fusedattn.fused_attn(tuple(x[:, lo:hi] for x in qkv), None, None, None)
        np.testing.assert_allclose(np.asarray(out[:, lo:hi]), np.asarray(alone), rtol=1e-5,
                                   atol=1e-6)
    assert not np.asarray(out[:, 8:]).any()


@pytest.mark.parametrize("lens, offs", [
    # keys that overlap the next segment's and run past the buffer
    (([1, 1, 1], [6, 9, 40]), ([0, 1, 2, 3], [0, 4, 8, S])),
    # kv offsets out of order: segments 1 and 2 keep no key
    (([1, 1, 1], [3, 3, 3]), ([0, 1, 2, 3], [0, 6, 2, S])),
    # q offsets out of order: the queries of segments 1 and 2 are padding
    (([1, 1, 1], [3, 3, 3]), ([0, 2, 1, 3], [0, 4, 8, S])),
], ids=["overlap", "kv_out_of_order", "q_out_of_order"])
def test_small_seq_matches_reference_on_invalid_descriptors(key, lens, offs):
    # One query per segment: small-seq's kernels see rule_slots' canonical slots.
    sd = _sd(lens, offs).with_max_segment_seqlens(max_segment_seqlen_kv=8)
    qkv = _inputs(key, D=64)  # a head dim small-seq serves
    mask = AttnMaskType.PADDING_MASK
    assert fusedattn.get_backend(qkv, None, sd, qkv_layout=THD, attn_mask_type=mask,
                                 max_segments_per_seq=3, platform="cpu").name == "small_seq"
    out = _fused(qkv, sd, mask)
    np.testing.assert_allclose(np.asarray(out), np.asarray(_reference(qkv, sd, mask)[0]),
                               rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# check_descriptors=True


@pytest.mark.parametrize("name", list(INVALID))
def test_checked_mode_raises_eagerly(key, name):
    lens, offs, fragment = INVALID[name]
    with pytest.raises(Exception, match=fragment) as e:
        _fused(_inputs(key), _sd(lens, offs), AttnMaskType.PADDING_MASK,
               check_descriptors=True)
    assert "check_descriptors=True" in str(e.value)


@pytest.mark.parametrize("name", list(INVALID))
def test_checked_mode_under_jit_through_checkify(key, name):
    lens, offs, fragment = INVALID[name]
    qkv = _inputs(key)
    f = jax.jit(lambda sd: _fused(qkv, sd, AttnMaskType.PADDING_CAUSAL_MASK,
                                  check_descriptors=True))
    err, _ = checkify.checkify(f)(_sd(lens, offs))
    assert err.get() is not None and fragment in err.get()
    with pytest.raises(Exception, match=fragment):
        err.throw()


def test_checked_mode_passes_valid_descriptors(key):
    qkv = _inputs(key)
    valid = [_sd(([4, 0, 5], [3, 2, 7]), ([0, 4, 4, 9], [0, 3, 5, S])),  # gaps, empty
             SequenceDescriptor.from_seqlens(jnp.array([[5, 7]])),
             SequenceDescriptor.from_segment_ids_and_pos(
                 jnp.array([[1, 1, 2, 2, 2, 0, 3, 3, 3, 3, 0, 0]]), max_segments_per_seq=3)]
    for sd in valid:
        mask = AttnMaskType.PADDING_MASK
        plain = _fused(qkv, sd, mask)
        np.testing.assert_array_equal(np.asarray(_fused(qkv, sd, mask, check_descriptors=True)),
                                      np.asarray(plain))
        err, out = checkify.checkify(jax.jit(
            lambda sd: _fused(qkv, sd, mask, check_descriptors=True)))(sd)
        assert err.get() is None
        np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))


def test_checked_mode_counts_segment_id_runs(key):
    ids = jnp.array([[1, 1, 2, 2, 0, 3, 3, 4, 4, 4, 5, 0]])  # five runs
    sd = SequenceDescriptor.from_segment_ids_and_pos(ids, max_segments_per_seq=3)
    with pytest.raises(Exception, match="hold 5 runs, more than max_segments_per_seq=3"):
        _fused(_inputs(key), sd, AttnMaskType.PADDING_MASK, check_descriptors=True)


def test_checked_mode_bshd_length_past_the_buffer(key):
    q, k, v = _inputs(key)
    sd = SequenceDescriptor.from_seqlens((jnp.array([S + 1]), jnp.array([S])))
    with pytest.raises(Exception, match="past the end of the buffer"):
        fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=AttnMaskType.PADDING_MASK,
                             check_descriptors=True)
