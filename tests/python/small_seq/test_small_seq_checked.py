"""fused_attn_small_seq(check_descriptors=True): an invalid runtime descriptor is a clear
error (eagerly, or through checkify under jit) instead of being clamped by segments.h's
rule; valid descriptors, broken promises included, give the unchecked answer bitwise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor, SmallSeqDescriptor

TQ, TKV, H, D = 4, 12, 2, 64
THD, BSHD = QKVLayout.THD_THD_THD, QKVLayout.BSHD_BSHD_BSHD

# name: (q offsets, kv offsets, q lens, kv lens) of 3 segments over TQ q rows and TKV kv
# rows, and the fragment of the error.
INVALID = {
    "offset_outside": (([0, 1, 2, 3], [0, 4, 8, 30]), None, "outside the buffer"),
    "out_of_order": (([0, 2, 1, 3], [0, 4, 8, 12]), None, "out of order"),
    "negative_length": (([0, 1, 2, 3], [0, 4, 8, 12]), ([1, 1, 1], [2, -1, 3]), "is negative"),
    "length_past_slot": (([0, 1, 2, 3], [0, 4, 8, 12]), ([1, 1, 1], [2, 6, 3]),
                         "overlaps the next one"),
    "length_past_buffer": (([0, 1, 2, 3], [0, 4, 8, 12]), ([1, 1, 1], [2, 3, 9]),
                           "past the end of the buffer"),
}


def _inputs(key, tq=TQ, tkv=TKV):
    ks = jax.random.split(key, 3)
    return normal(ks[0], (tq, H, D)), normal(ks[1], (tkv, H, D)), normal(ks[2], (tkv, H, D))


def _sd(offs, lens):
    lens = (None, None) if lens is None else lens
    return SmallSeqDescriptor.from_cu_seqlens(
        np.array(offs[0]), np.array(offs[1]), max_segment_seqlen_kv=4,
        q_seqlens=None if lens[0] is None else np.array(lens[0]),
        kv_seqlens=None if lens[1] is None else np.array(lens[1]))


def _call(qkv, sd, layout=THD, mask=AttnMaskType.PADDING_MASK, **kw):
    return fusedattn.fused_attn_small_seq(qkv, None, sd, None, attn_mask_type=mask,
                                          qkv_layout=layout, **kw)


@pytest.mark.parametrize("name", list(INVALID))
def test_checked_mode_raises_eagerly(key, name):
    offs, lens, fragment = INVALID[name]
    with pytest.raises(Exception, match=fragment) as e:
        _call(_inputs(key), _sd(offs, lens), check_descriptors=True)
    assert "fused_attn_small_seq(check_descriptors=True)" in str(e.value)


@pytest.mark.parametrize("name", list(INVALID))
def test_checked_mode_under_jit_through_checkify(key, name):
    offs, lens, fragment = INVALID[name]
    qkv = _inputs(key)
    f = jax.jit(lambda sd: _call(qkv, sd, mask=AttnMaskType.PADDING_CAUSAL_MASK,
                                 check_descriptors=True))
    err, _ = checkify.checkify(f)(_sd(offs, lens))
    assert err.get() is not None and fragment in err.get()
    with pytest.raises(Exception, match=fragment):
        err.throw()


def test_checked_mode_off_clamps_silently(key):
    offs, lens, _ = INVALID["length_past_slot"]
    out = _call(_inputs(key), _sd(offs, lens))  # the rule's answer, no error
    assert np.all(np.isfinite(np.asarray(out, np.float32)))


def test_checked_mode_passes_valid_descriptors(key):
    qkv = _inputs(key)
    valid = [_sd(([0, 1, 2, 3], [0, 4, 8, 12]), None),                   # whole slots
             _sd(([0, 1, 1, 3], [0, 4, 4, 12]), ([1, 0, 2], [3, 0, 8])),  # empty, promise broken
             SmallSeqDescriptor.from_seqlens(np.array([1, 1, 2]), np.array([4, 0, 8]),
                                             max_segment_seqlen_kv=4)]
    for sd in valid:
        plain = _call(qkv, sd)
        np.testing.assert_array_equal(np.asarray(_call(qkv, sd, check_descriptors=True)),
                                      np.asarray(plain))
        err, out = checkify.checkify(jax.jit(lambda sd: _call(qkv, sd, check_descriptors=True)))(sd)
        assert err.get() is None
        np.testing.assert_array_equal(np.asarray(out), np.asarray(plain))


def test_checked_mode_thd_lengths_only(key):
    # Offsets packed from the lengths: a negative length is named as such (not as the
    # out-of-order offsets it would make), a total past the buffer as outside it.
    qkv = _inputs(key)
    with pytest.raises(Exception, match="is negative"):
        _call(qkv, SmallSeqDescriptor.from_seqlens(np.array([1, 1, 1]), np.array([4, -1, 4]),
                                                   max_segment_seqlen_kv=4),
              check_descriptors=True)
    with pytest.raises(Exception, match="outside the buffer"):
        _call(qkv, SmallSeqDescriptor.from_seqlens(np.array([1, 1, 1]), np.array([4, 4, 8]),
                                                   max_segment_seqlen_kv=8),
              check_descriptors=True)


def test_checked_mode_bshd_lengths(key):
    ks = jax.random.split(key, 3)
    q, k, v = normal(ks[0], (3, 1, H, D)), normal(ks[1], (3, 6, H, D)), normal(ks[2], (3, 6, H, D))
    good = SequenceDescriptor.from_seqlens((jnp.array([1, 1, 0]), jnp.array([6, 2, 0])))
    np.testing.assert_array_equal(
        np.asarray(_call((q, k, v), good, BSHD, check_descriptors=True)),
        np.asarray(_call((q, k, v), good, BSHD)))
    bad = SequenceDescriptor.from_seqlens((jnp.array([1, 1, 1]), jnp.array([6, 7, 0])))
    with pytest.raises(Exception, match="past the end of the buffer"):
        _call((q, k, v), bad, BSHD, check_descriptors=True)
    # Without a padding mask there is no descriptor to check.
    _call((q, k, v), None, BSHD, mask=AttnMaskType.NO_MASK, check_descriptors=True)


def test_check_descriptors_must_be_a_static_bool(key):
    with pytest.raises(TypeError, match="check_descriptors"):
        _call(_inputs(key), _sd(([0, 1, 2, 3], [0, 4, 8, 12]), None), check_descriptors="yes")
