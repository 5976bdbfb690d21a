"""Bad fused_attn_small_seq calls fail at trace time (jax.eval_shape: nothing runs) with
a message naming the argument; unimplemented options raise NotImplementedError naming
the option. The C++ handlers re-check every shape and answer with an FFI error."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SmallSeqDescriptor
from fusedattn import small_seq as ss

N, H, D, W = 4, 2, 64, 8
CU_Q = np.arange(N + 1, dtype=np.int32)
CU_KV = np.arange(N + 1, dtype=np.int32) * 3
THD_SD = SmallSeqDescriptor.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=W)


def sds(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def thd(q=(N, H, D), k=(3 * N, H, D), v=None, dtype=jnp.bfloat16, k_dtype=None):
    v = k if v is None else v
    return (sds(q, dtype), sds(k, k_dtype or dtype), sds(v, k_dtype or dtype))


def bshd(b=N, sq=1, skv=4, hq=H, hkv=H, d=D, dtype=jnp.bfloat16):
    return (sds((b, sq, hq, d), dtype), sds((b, skv, hkv, d), dtype), sds((b, skv, hkv, d), dtype))


def trace(qkv, sd=THD_SD, bias=None, **kwargs):
    kwargs.setdefault("qkv_layout", QKVLayout.THD_THD_THD if len(qkv[0].shape) == 3
                      else QKVLayout.BSHD_BSHD_BSHD)
    return jax.eval_shape(lambda qkv, bias, sd: fusedattn.fused_attn_small_seq(
        qkv, bias, sd, None, **kwargs), qkv, bias, sd)


def raises(exc, *patterns):
    return pytest.raises(exc, match="".join(f"(?=.*{re.escape(p)})" for p in patterns))


def test_valid_calls_trace():
    assert trace(thd()).shape == (N, H, D)
    assert trace(bshd(), sd=None, attn_mask_type=AttnMaskType.NO_MASK).shape == (N, 1, H, D)


# ---------------------------------------------------------------------------
# Unimplemented options


def test_bias_is_not_implemented():
    with raises(NotImplementedError, "bias"):
        trace(thd(), bias=sds((1, H, 1, 3)))


def test_dropout_in_training_is_not_implemented():
    with raises(NotImplementedError, "dropout_probability=0.1"):
        trace(thd(), dropout_probability=0.1, is_training=True)
    assert trace(thd(), dropout_probability=0.1, is_training=False).shape == (N, H, D)


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_dropout_out_of_range(p):
    with raises(ValueError, "dropout_probability", "0 <= p < 1"):
        trace(thd(), dropout_probability=p)


@pytest.mark.parametrize("layout", [QKVLayout.BS3HD, QKVLayout.T3HD, QKVLayout.THD_T2HD])
def test_packed_layouts_are_not_served(layout):
    with raises(NotImplementedError, layout.name, "BSHD_BSHD_BSHD or THD_THD_THD"):
        trace(thd(), qkv_layout=layout)


@pytest.mark.parametrize("d", [32, 96, 1024])
def test_head_dims_outside_the_four(d):
    with raises(NotImplementedError, "head dim", f"got {d}", "64, 128, 256 or 512"):
        trace(thd(q=(N, H, d), k=(3 * N, H, d)))


# ---------------------------------------------------------------------------
# Bad arguments


def test_bad_enums():
    with raises(ValueError, "qkv_layout=17"):
        trace(thd(), qkv_layout=17)
    with raises(ValueError, "attn_mask_type=9"):
        trace(thd(), attn_mask_type=9)


def test_qkv_must_be_a_triple():
    q, k, _ = thd()
    with raises(ValueError, "qkv must be a tuple (q, k, v)"):
        fusedattn.fused_attn_small_seq((q, k), None, THD_SD, None)


def test_ranks():
    with raises(ValueError, "q must be [tokens, heads, head_dim]"):
        trace(thd(q=(N, D)), qkv_layout=QKVLayout.THD_THD_THD)
    with raises(ValueError, "must be [batch, seq, heads, head_dim]"):
        trace(thd(), qkv_layout=QKVLayout.BSHD_BSHD_BSHD, sd=None)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float8_e4m3fn], ids=lambda d: jnp.dtype(d).name)
def test_dtypes(dtype):
    with raises(ValueError, "dtype", jnp.dtype(dtype).name):
        trace(thd(dtype=dtype))


def test_mixed_dtypes():
    with raises(ValueError, "dtype", "bfloat16", "float32"):
        trace(thd(k_dtype=jnp.float32))


def test_k_and_v_must_agree():
    with raises(ValueError, "k and v must have the same shape"):
        trace(thd(v=(3 * N, H, 2 * D)))
    with raises(ValueError, "same head dim"):
        trace(thd(k=(3 * N, H, 2 * D)))


def test_heads_must_group():
    with raises(ValueError, "multiple", "q has 3 heads", "k/v have 2"):
        trace(thd(q=(N, 3, D)))


def test_thd_needs_a_descriptor_and_the_promise():
    with raises(ValueError, "THD_THD_THD needs a sequence_descriptor"):
        trace(thd(), sd=None)
    with raises(ValueError, "max_segment_seqlen_kv"):
        trace(thd(), sd=SmallSeqDescriptor(None, None, CU_Q, CU_KV, 1, None))
    with raises(ValueError, "max_segment_seqlen_kv"):
        trace(thd(), sd=fusedattn.SequenceDescriptor.from_seqlens(np.ones(N, np.int32)))


@pytest.mark.parametrize("width", [0, 65])
def test_promised_keys_within_1_to_64(width):
    sd = SmallSeqDescriptor.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=width)
    with raises(ValueError, "max_segment_seqlen_kv", f"got {width}", "1..64"):
        trace(thd(), sd=sd)


def test_one_query_per_segment():
    sd = SmallSeqDescriptor.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=W,
                                            max_segment_seqlen_q=2)
    with raises(ValueError, "max_segment_seqlen_q", "got 2", "one query per segment"):
        trace(thd(), sd=sd)
    with raises(ValueError, "query sequence length", "got 2"):
        trace(bshd(sq=2), sd=None, attn_mask_type=AttnMaskType.NO_MASK)


def test_bshd_key_length_within_64():
    with raises(ValueError, "key/value sequence length", "got 65", "1..64"):
        trace(bshd(skv=65), sd=None, attn_mask_type=AttnMaskType.NO_MASK)


@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK])
def test_thd_needs_a_padding_mask(mask):
    with raises(ValueError, mask.name, "padding mask"):
        trace(thd(), attn_mask_type=mask)


def test_bshd_padding_needs_lengths():
    with raises(ValueError, "PADDING_MASK", "q_seqlens and kv_seqlens"):
        trace(bshd(), sd=None, attn_mask_type=AttnMaskType.PADDING_MASK)
    sd = fusedattn.SequenceDescriptor.from_seqlens(np.ones(N + 1, np.int32))
    with raises(ValueError, "q_seqlens must have shape", f"({N},)"):
        trace(bshd(), sd=sd, attn_mask_type=AttnMaskType.PADDING_MASK)


def test_bshd_takes_no_offsets():
    with raises(ValueError, "offsets are for qkv_layout=THD_THD_THD"):
        trace(bshd(), sd=THD_SD, attn_mask_type=AttnMaskType.PADDING_MASK)


def test_descriptor_array_sizes():
    sd = SmallSeqDescriptor.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=W,
                                            kv_seqlens=np.ones(N + 2, np.int32))
    with raises(ValueError, "kv_seqlens must have 4 entries"):
        trace(thd(), sd=sd)
    sd = SmallSeqDescriptor(None, None, CU_Q, CU_KV[:-1], 1, W)
    with raises(ValueError, "kv_offsets must have 5 entries"):
        trace(thd(), sd=sd)
    sd = SmallSeqDescriptor(None, None, CU_Q, None, 1, W)
    with raises(ValueError, "both q_offsets and kv_offsets"):
        trace(thd(), sd=sd)
    sd = SmallSeqDescriptor(np.zeros(N, np.float32), None, CU_Q, CU_KV, 1, W)
    with raises(ValueError, "q_seqlens must be an integer array"):
        trace(thd(), sd=sd)


# ---------------------------------------------------------------------------
# The C++ side re-checks what reaches it directly


def internal(**overrides):
    q, k, v, seg, cfg = ss._prepare(tuple(jnp.zeros(x.shape, x.dtype) for x in thd()), None,
                                    THD_SD, attn_mask_type=AttnMaskType.PADDING_MASK,
                                    qkv_layout=QKVLayout.THD_THD_THD, scaling_factor=None,
                                    dropout_probability=0.0, is_training=True)
    args = dict(q=q, k=k, v=v, q_lens=seg.q_lens, kv_lens=seg.kv_lens, q_offsets=seg.q_offsets,
                kv_offsets=seg.kv_offsets)
    args.update(overrides)
    return args, cfg


@pytest.mark.parametrize("override, what", [
    (dict(kv_offsets=np.arange(N, dtype=np.int32)), "kv_offsets"),
    (dict(q_offsets=np.arange(N + 1, dtype=np.float32)), "q_offsets"),
    (dict(q_lens=np.ones(N - 1, np.int32)), "q_seqlens"),
    (dict(q_offsets=np.zeros(0, np.int32), kv_offsets=np.zeros(0, np.int32)), "q_offsets"),
])
def test_ffi_handler_rechecks(override, what):
    args, cfg = internal(**override)
    with pytest.raises(Exception, match=f"small-seq: .*{what}"):
        jax.block_until_ready(ss.forward(*args.values(), cfg))


def test_ffi_handler_rechecks_the_width():
    args, cfg = internal()
    bad = ss._Config(cfg.layout, cfg.mask_type, cfg.scale, 65)
    with pytest.raises(Exception, match="small-seq: max_segment_seqlen_kv: got 65"):
        jax.block_until_ready(ss.forward(*args.values(), bad))


# ---------------------------------------------------------------------------
# One table of bad arguments, by kind and by value: a ValueError or a TypeError
# (ArgumentTypeError is both) naming the argument.

_SSD = SmallSeqDescriptor
BAD = [
    # (id, build the call, exception, substrings)
    # the engine's small-seq rule: a head dim outside its four is not served
    ("head dim 0", lambda: trace(thd(q=(N, H, 0), k=(3 * N, H, 0))), NotImplementedError,
     ["head dim", "got 0"]),
    ("q list", lambda: fusedattn.fused_attn_small_seq(([[1.0]], sds((3 * N, H, D)),
                                                        sds((3 * N, H, D))), None, THD_SD, None),
     TypeError, ["q must be an array", "list"]),
    ("scale str", lambda: trace(thd(), scaling_factor="0.5"), TypeError,
     ["scaling_factor must be a real scalar", "'0.5'"]),
    ("scale bool", lambda: trace(thd(), scaling_factor=True), TypeError, ["scaling_factor", "True"]),
    ("scale nan", lambda: trace(thd(), scaling_factor=float("nan")), ValueError,
     ["scaling_factor", "nan"]),
    ("scale 10**400", lambda: trace(thd(), scaling_factor=10 ** 400), ValueError,
     ["scaling_factor", "float32"]),
    ("dropout str", lambda: trace(thd(), dropout_probability="0"), TypeError,
     ["dropout_probability", "'0'"]),
    ("is_training str", lambda: trace(thd(), is_training="no"), TypeError,
     ["is_training must be a Python bool", "'no'"]),
    ("mask bool", lambda: trace(thd(), attn_mask_type=True), TypeError,
     ["attn_mask_type", "True"]),
    ("layout float", lambda: trace(thd(), qkv_layout=5.0), TypeError, ["qkv_layout", "5.0"]),
    ("cu_seqlens float", lambda: _SSD.from_cu_seqlens(CU_Q + 0.5, CU_KV,
                                                      max_segment_seqlen_kv=W), TypeError,
     ["cu_seqlens_q must be an integer array", "float"]),
    ("cu_seqlens str", lambda: _SSD.from_cu_seqlens("ab", CU_KV, max_segment_seqlen_kv=W),
     TypeError, ["cu_seqlens_q", "'ab'"]),
    ("q_seqlens float", lambda: _SSD.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=W,
                                                     q_seqlens=np.ones(N)), TypeError,
     ["q_seqlens must be an integer array", "float"]),
    ("from_seqlens float", lambda: _SSD.from_seqlens(np.ones(N) * 1.5, np.ones(N, np.int32)),
     TypeError, ["from_seqlens", "q_seqlens must be an integer array"]),
    ("width float", lambda: _SSD.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=2.5),
     TypeError, ["max_segment_seqlen_kv", "2.5"]),
    ("width str", lambda: _SSD.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv="8"),
     TypeError, ["max_segment_seqlen_kv", "'8'"]),
    ("width None", lambda: _SSD.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=None),
     TypeError, ["max_segment_seqlen_kv", "None"]),
    ("width 2**64", lambda: _SSD.from_cu_seqlens(CU_Q, CU_KV, max_segment_seqlen_kv=2 ** 64),
     ValueError, ["max_segment_seqlen_kv", "64-bit"]),
    ("direct float offsets", lambda: trace(thd(), sd=_SSD(None, None, CU_Q.astype(np.float32),
                                                          CU_KV, 1, W)), ValueError,
     ["sequence_descriptor.q_offsets must be an integer array", "float32"]),
    ("direct float width", lambda: trace(thd(), sd=_SSD(None, None, CU_Q, CU_KV, 1, 8.5)),
     TypeError, ["max_segment_seqlen_kv", "8.5"]),
]


@pytest.mark.parametrize("call, exc, what", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_arguments(call, exc, what):
    with raises(exc, *what):
        call()


def test_lists_of_ints_are_taken_as_offsets():
    sd = SmallSeqDescriptor(None, None, CU_Q.tolist(), CU_KV.tolist(), 1, W)
    assert trace(thd(), sd=sd).shape == (N, H, D)
