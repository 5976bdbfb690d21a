"""A sequence length past its sequence, known at trace time, warns (naming the argument, the
value and the extent) and is clamped: the result equals the call with the clamped length."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor
from conftest import assert_close, qkv, reference_f32

PAD = AttnMaskType.PADDING_MASK


def _call(q, k, v, sd, **kw):
    return fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=PAD, **kw)


def test_bshd_length_past_the_sequence_warns_and_clamps(key):
    q, k, v = qkv(key, 2, 16, 24, 2, 2, 8)
    sd = SequenceDescriptor.from_seqlens((jnp.array([20, 5]), jnp.array([24, 30])))
    with pytest.warns(UserWarning) as rec:
        out = _call(q, k, v, sd)
    msgs = [str(w.message) for w in rec]
    assert any("sequence_descriptor.q_seqlens[0, 0] = 20" in m and "query sequence (16 tokens)"
               in m for m in msgs), msgs
    assert any("sequence_descriptor.kv_seqlens[1, 0] = 30" in m and "(24 tokens)" in m
               for m in msgs), msgs
    clamped = SequenceDescriptor.from_seqlens((jnp.array([16, 5]), jnp.array([24, 24])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # lengths within the sequence: no warning
        want = _call(q, k, v, clamped)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    ref, _, _ = reference_f32(q, k, v, PAD, jnp.array([16, 5]), jnp.array([24, 24]))
    assert_close("out", out, ref)


def test_thd_segment_past_the_row_warns(key):
    q, k, v = qkv(key, 1, 32, 32, 2, 2, 8)
    sd = SequenceDescriptor.from_seqlens(jnp.array([[20, 16]]))  # 20 + 16 = 36 > 32 tokens
    with pytest.warns(UserWarning) as rec:
        _call(q, k, v, sd, qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=2)
    msgs = " | ".join(str(w.message) for w in rec)
    for side, what in (("q", "query"), ("kv", "key/value")):
        assert (f"{side}_seqlens[0, 1] = 16 from token 20" in msgs
                and f"ends at 36, past the row's 32 {what} tokens" in msgs), msgs


def test_traced_descriptor_does_not_warn(key):
    q, k, v = qkv(key, 2, 16, 16, 2, 2, 8)
    sd = SequenceDescriptor.from_seqlens(jnp.array([20, 5]))
    f = jax.jit(lambda q, k, v, sd: _call(q, k, v, sd))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.block_until_ready(f(q, k, v, sd))
