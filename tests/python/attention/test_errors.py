"""Bad calls fail at trace time (jax.eval_shape: nothing is allocated or run) with a
message that names the argument and what is allowed; the C++ handlers check again and
answer a call that bypasses Python with an FFI error, never a crash."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import descriptor
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType

B, S, H, D = 2, 16, 2, 16
MAX_S = 2 ** 20


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def shapes(q=(B, S, H, D), k=(B, S, H, D), v=None, dtype=jnp.float32, k_dtype=None):
    v = k if v is None else v
    return (sds(q, dtype), sds(k, k_dtype or dtype), sds(v, k_dtype or dtype))


def trace(qkv, bias=None, sd=None, **kwargs):
    """fused_attn traced with abstract inputs only."""
    return jax.eval_shape(
        lambda qkv, bias, sd: fusedattn.fused_attn(qkv, bias, sd, None, **kwargs), qkv, bias, sd)


def raises(exc, *patterns):
    """pytest.raises whose message must contain every pattern (case-sensitive, literal)."""
    return pytest.raises(exc, match="".join(f"(?=.*{re.escape(p)})" for p in patterns))


# ---------------------------------------------------------------------------
# Shapes and dtypes


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("rank", [3, 5])
def test_wrong_rank(name, rank):
    good = (B, S, H, D)
    bad = good[:3] if rank == 3 else (1,) + good
    qkv = shapes(**{n: bad if n == name else good for n in "qkv"})
    with raises(ValueError, f"{name} must have rank 4", str(bad)):
        trace(qkv)


def test_qkv_must_be_a_triple():
    q, k, _ = shapes()
    with raises(ValueError, "qkv must be a tuple (q, k, v)"):
        trace((q, k))


@pytest.mark.parametrize("hq, hkv", [(3, 2), (2, 4), (4, 3)])
def test_q_heads_must_be_a_multiple_of_kv_heads(hq, hkv):
    with raises(ValueError, "multiple", f"q has {hq} heads", f"k/v have {hkv}"):
        trace(shapes(q=(B, S, hq, D), k=(B, S, hkv, D)))


def test_k_and_v_heads_must_agree():
    with raises(ValueError, "k and v", "heads"):
        trace(shapes(k=(B, S, 2, D), v=(B, S, 1, D)))


def test_k_and_v_lengths_must_agree():
    with raises(ValueError, "k and v", "sequence length"):
        trace(shapes(k=(B, S, H, D), v=(B, S + 1, H, D)))


def test_q_and_k_head_dims_must_agree():
    with raises(ValueError, "head dim", "q", "k"):
        trace(shapes(k=(B, S, H, D * 2), v=(B, S, H, D)))


def test_batch_sizes_must_agree():
    with raises(ValueError, "batch"):
        trace(shapes(k=(B + 1, S, H, D)))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int8, jnp.float8_e4m3fn, jnp.complex64],
                         ids=lambda d: jnp.dtype(d).name)
def test_unsupported_dtype(dtype):
    with raises(ValueError, "dtype", jnp.dtype(dtype).name):
        trace(shapes(dtype=dtype))


def test_float64_is_accepted():
    # Under x64: float64 in, float64 out (float64 math on the CPU). Without it, NumPy float64
    # arrays become float32, as everywhere in jax.
    with jax.enable_x64(True):
        assert trace(shapes(dtype=jnp.float64)).dtype == jnp.float64
    x = np.ones((B, S, H, D), np.float64)
    assert fusedattn.fused_attn((x, x, x), None, None, None).dtype == jnp.float32
    with raises(ValueError, "dtype", "complex64"):
        trace(shapes(dtype=jnp.complex64))


def test_mixed_dtypes():
    with raises(ValueError, "dtype", "bfloat16", "float32"):
        trace(shapes(dtype=jnp.bfloat16, k_dtype=jnp.float32))


@pytest.mark.parametrize("which", ["q", "kv"])
def test_sequence_longer_than_the_maximum(which):
    long = (1, MAX_S + 1, 1, 16)
    short = (1, 8, 1, 16)
    qkv = shapes(q=long, k=short) if which == "q" else shapes(q=short, k=long)
    name = "query" if which == "q" else "key/value"
    with raises(ValueError, f"{name} sequence length", str(MAX_S + 1), str(MAX_S)):
        trace(qkv)


def test_sequence_of_the_maximum_length_traces():
    qkv = shapes(q=(1, MAX_S, 1, 16), k=(1, MAX_S, 1, 16))
    assert trace(qkv, attn_mask_type=AttnMaskType.CAUSAL_MASK).shape == (1, MAX_S, 1, 16)


@pytest.mark.parametrize("dqk, dv, what, got", [(513, 513, "head dim of q and k", 513),
                                                (64, 513, "head dim of v", 513),
                                                (1024, 64, "head dim of q and k", 1024)])
def test_head_dim_above_512(dqk, dv, what, got):
    qkv = (sds((B, S, H, dqk)), sds((B, S, H, dqk)), sds((B, S, H, dv)))
    with raises(ValueError, what, f"got {got}", "512"):
        trace(qkv)


def test_head_dim_256_and_different_v_dim_trace():
    qkv = (sds((B, S, H, 256)), sds((B, S, H, 256)), sds((B, S, H, 8)))
    assert trace(qkv).shape == (B, S, H, 8)


# ---------------------------------------------------------------------------
# Masks, descriptors, bias


@pytest.mark.parametrize("mask", [m for m in AttnMaskType if m.is_padding()],
                         ids=lambda m: m.name)
def test_padding_mask_needs_a_descriptor(mask):
    with raises(ValueError, mask.name, "sequence_descriptor"):
        trace(shapes(), attn_mask_type=mask)


def test_descriptor_must_be_a_sequence_descriptor():
    lens = jnp.array([S, S], jnp.int32)
    with pytest.raises(ValueError, match="sequence_descriptor must be a SequenceDescriptor"):
        fusedattn.fused_attn(shapes(), None, (lens, lens), None,
                             attn_mask_type=AttnMaskType.PADDING_MASK)


def test_descriptor_batch_must_match():
    with raises(ValueError, "sequence_descriptor.q_seqlens", f"[{B}]"):
        trace(shapes(), sd=descriptor([S, S, S], [S, S, S]),
              attn_mask_type=AttnMaskType.PADDING_MASK)


@pytest.mark.parametrize("seqlens, what", [
    (jnp.zeros((2, 2, 2), jnp.int32), "q_seqlens must be an integer array [B] or [B, M]"),
    (jnp.zeros((2,), jnp.float32), "q_seqlens must be an integer array [B] or [B, M]"),
    ((jnp.zeros((2,), jnp.int32), jnp.zeros((3,), jnp.int32)), "same batch size"),
    ((jnp.zeros((2,), jnp.int32),) * 3, "pair"),
])
def test_from_seqlens_rejects_bad_lengths(seqlens, what):
    with raises(ValueError, what):
        fusedattn.SequenceDescriptor.from_seqlens(seqlens)


def test_mask_code_out_of_range():
    with raises(ValueError, "attn_mask_type=6", "AttnMaskType", "NO_MASK"):
        trace(shapes(), attn_mask_type=6)


def test_bias_with_no_bias():
    with raises(ValueError, "bias was given", "NO_BIAS"):
        trace(shapes(), bias=sds((1, H, S, S)))


def test_softmax_offset_needs_learnable_softmax():
    with raises(ValueError, "softmax_offset", "LEARNABLE_SOFTMAX"):
        fusedattn.fused_attn(shapes(), None, None, None, softmax_offset=sds((1, H, 1, 1)))


# ---------------------------------------------------------------------------
# Invalid scalar arguments


@pytest.mark.parametrize("kwargs, what", [
    (dict(scaling_factor=float("inf")), "scaling_factor"),
    (dict(scaling_factor=float("nan")), "scaling_factor"),
    (dict(dropout_probability=1.0), "dropout_probability"),
    (dict(dropout_probability=-0.1), "dropout_probability"),
    (dict(window_size=(-2, 0)), "window_size"),
    (dict(window_size="wide"), "window_size"),
    (dict(window_size=(1, 2, 3)), "window_size"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_invalid_scalars(kwargs, what):
    with raises(ValueError, what):
        trace(shapes(), **kwargs)


# ---------------------------------------------------------------------------
# Combinations the engine does not take, each with what it does take


@pytest.mark.parametrize("bias_shape", [(1, H, S, S + 1), (3, H, S, S), (1, 3, S, S), (H, S, S)])
def test_bias_shape(bias_shape):
    with raises(ValueError, "bias: got shape", f"allowed [1 or {B}, 1 or {H}, {S}, {S}]"):
        trace(shapes(), bias=sds(bias_shape), attn_bias_type=AttnBiasType.POST_SCALE_BIAS)


def test_bias_type_needs_a_bias():
    with raises(ValueError, "attn_bias_type=PRE_SCALE_BIAS needs a bias"):
        trace(shapes(), attn_bias_type=AttnBiasType.PRE_SCALE_BIAS)


def test_learnable_softmax_needs_an_offset():
    with raises(ValueError, "LEARNABLE_SOFTMAX needs softmax_offset", f"[{H}]"):
        trace(shapes(), softmax_type=SoftmaxType.LEARNABLE_SOFTMAX)


@pytest.mark.parametrize("shape", [(H + 1,), (H, 1), (1, H, 1, 2)])
def test_softmax_offset_shape(shape):
    with raises(ValueError, "softmax_offset: got shape", f"allowed [{H}] or [1, {H}, 1, 1]"):
        fusedattn.fused_attn(shapes(), None, None, None, softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
                             softmax_offset=sds(shape))


def test_training_dropout_needs_a_seed():
    with raises(ValueError, "dropout_probability=0.1", "needs a seed"):
        trace(shapes(), dropout_probability=0.1, is_training=True)


@pytest.mark.parametrize("layout, qkv, what", [
    (QKVLayout.BS3HD, shapes(), "packed tensor [B, S, 3, H, D]"),
    (QKVLayout.BS3HD, sds((B, S, 2, H, D)), "qkv must have shape [B, S, 3, H, D]"),
    (QKVLayout.T3HD, sds((B, S, H, D)), "qkv must have rank 5"),
    (QKVLayout.BSHD_BS2HD, shapes(), "qkv must be a pair (q, kv)"),
    (QKVLayout.THD_T2HD, (sds((B, S, H, D)), sds((B, S, 3, H, D))), "kv must have shape"),
    (QKVLayout.BSHD_BS2HD, (sds((B, S, H, D)), sds((B, S, 2, H, D * 2))), "same head dim"),
    (QKVLayout.THD_THD_THD, (sds((B, S, H, D)),) * 2, "qkv must be a tuple (q, k, v)"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_layout_shapes(layout, qkv, what):
    lens = jnp.full((B, 1), S, jnp.int32)
    sd = fusedattn.SequenceDescriptor.from_seqlens(lens)
    with raises(ValueError, what):
        trace(qkv, sd=sd, qkv_layout=layout, attn_mask_type=AttnMaskType.PADDING_MASK)


@pytest.mark.parametrize("layout", [QKVLayout.THD_THD_THD, QKVLayout.T3HD, QKVLayout.THD_T2HD],
                         ids=lambda l: l.name)
def test_thd_layouts_need_a_padding_mask(layout):
    qkv = {QKVLayout.THD_THD_THD: shapes(), QKVLayout.T3HD: sds((B, S, 3, H, D)),
           QKVLayout.THD_T2HD: (sds((B, S, H, D)), sds((B, S, 2, H, D)))}[layout]
    with raises(ValueError, f"qkv_layout={layout.name}", "attn_mask_type=CAUSAL_MASK",
                "allowed: PADDING_MASK, PADDING_CAUSAL_MASK, PADDING_CAUSAL_BOTTOM_RIGHT_MASK"):
        trace(qkv, qkv_layout=layout, attn_mask_type=AttnMaskType.CAUSAL_MASK)


def test_segments_with_a_bshd_layout_warn():
    # As TransformerEngine: a BSHD layout takes max_segments_per_seq > 1 as 1, with a warning.
    with pytest.warns(UserWarning, match="max_segments_per_seq=2 with qkv_layout=BSHD_BSHD_BSHD"):
        trace(shapes(), max_segments_per_seq=2)


def test_descriptor_segments_past_max_segments_warn():
    # Concrete lengths of more segments than the call's max_segments_per_seq are compacted
    # to it (tests/python/attention/test_te_forms.py); the dropped ones are named.
    sd = fusedattn.SequenceDescriptor.from_seqlens(jnp.full((B, 4), 3, jnp.int32))
    q = jax.random.normal(jax.random.PRNGKey(1), (B, S, H, D))
    with pytest.warns(UserWarning, match="hold up to 4 segments in a row, more than "
                      "max_segments_per_seq=1"):
        fusedattn.fused_attn((q, q, q), None, sd, None, qkv_layout=QKVLayout.THD_THD_THD,
                             attn_mask_type=AttnMaskType.PADDING_MASK)


def test_descriptor_offsets_shape():
    lens = jnp.full((B, 2), 3, jnp.int32)
    sd = fusedattn.SequenceDescriptor(lens, lens, jnp.zeros((B, 2), jnp.int32), None)
    with raises(ValueError, "q_offsets must have shape [B, M + 1]", f"[{B}, 3]"):
        trace(shapes(), sd=sd, qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=2,
              attn_mask_type=AttnMaskType.PADDING_MASK)


def test_descriptor_constructors_check_their_arguments():
    SD = fusedattn.SequenceDescriptor
    with raises(ValueError, "kv_offsets must have shape [B, M + 1] = [2, 3]"):
        SD.from_seqlens_and_offsets(jnp.ones((2, 2), jnp.int32),
                                    (jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 2), jnp.int32)))
    with raises(ValueError, "segment_ids must be an array [B, S]"):
        SD.from_segment_ids_and_pos(jnp.ones((2, 3, 4), jnp.int32))
    with raises(ValueError, "segment_pos must be an integer array of the shape of segment_ids"):
        SD.from_segment_ids_and_pos(jnp.ones((2, 8), jnp.int32), jnp.ones((2, 7), jnp.int32))
    with raises(ValueError, "max_segments_per_seq must be >= 1"):
        SD.from_segment_ids_and_pos(jnp.ones((2, 8), jnp.int32), max_segments_per_seq=-1)


# ---------------------------------------------------------------------------
# The C++ side checks again: a call that bypasses fused_attn's checks gets an FFI error


def _ffi_fwd(q, k, v, bias=None, offset=None, seed=None, lens=None, offs=None, index_base=None,
             **attrs):
    empty = lambda dt: jnp.zeros((0,), dt)
    Bq, Sq, Hq, _ = q.shape
    lens = jnp.full((Bq, 1), Sq, jnp.int32) if lens is None else lens
    offs = jnp.tile(jnp.array([[0, Sq]], jnp.int32), (Bq, 1)) if offs is None else offs
    a = dict(layout=np.int32(QKVLayout.BSHD_BSHD_BSHD), mask_type=np.int32(0),
             bias_type=np.int32(0), softmax_type=np.int32(0), is_training=np.int32(0),
             scale=np.float64(0.25), dropout=np.float64(0.0), window_left=np.int64(-1),
             window_right=np.int64(-1), want_lse=np.int32(1), want_max_logit=np.int32(1),
             backend_flags=np.int32(0))
    a.update(attrs)
    call = jax.ffi.ffi_call("fusedattn_attn_fwd", (
        jax.ShapeDtypeStruct((Bq, Sq, Hq, v.shape[-1]), q.dtype),
        jax.ShapeDtypeStruct((Bq, Hq, Sq), jnp.float32), jax.ShapeDtypeStruct((Bq, Hq), jnp.float32)))
    return call(q, k, v, empty(q.dtype) if bias is None else bias,
                empty(jnp.float32) if offset is None else offset,
                empty(jnp.uint32) if seed is None else seed, lens, lens, offs, offs,
                empty(jnp.int32) if index_base is None else index_base, **a)


@pytest.mark.parametrize("case, what", [
    (dict(bias=jnp.ones((1, H, S, S), jnp.bfloat16), bias_type=np.int32(2)), "bias must have q's dtype"),
    (dict(bias=jnp.ones((1, H, S, S)), bias_type=np.int32(0)), "NO_BIAS"),
    (dict(bias=jnp.ones((1, 3, S, S)), bias_type=np.int32(1)), "head extent 3"),
    (dict(softmax_type=np.int32(2)), "softmax_offset"),
    (dict(offset=jnp.ones((H,))), "only softmax_type=LEARNABLE_SOFTMAX reads softmax_offset"),
    (dict(is_training=np.int32(1), dropout=np.float64(0.5)), "seed"),
    (dict(lens=jnp.ones((B, 2), jnp.int32)), "q_offsets"),
    (dict(layout=np.int32(QKVLayout.THD_THD_THD)), "need a padding mask"),
    (dict(layout=np.int32(QKVLayout.BS3HD)), "expected qkv [B, S, 3, H, D]"),
    (dict(window_left=np.int64(-4)), "window_size"),
    (dict(index_base=jnp.array([0, -1], jnp.int32)), "index_base: got (batch_base 0, head_base -1)"),
    (dict(index_base=jnp.array([1, 2, 3], jnp.int32)), "index_base: got shape [3]"),
    (dict(index_base=jnp.array([1.0, 2.0])), "index_base"),
    # kRequestMaskKeepOnly (512) with kRequestMaskBias (8): the bias is a boolean keep mask
    (dict(bias=jnp.ones((1, H, S, S)), bias_type=np.int32(2), backend_flags=np.int32(8 | 512)),
     "with kRequestMaskKeepOnly the bias is a boolean mask (bool)"),
    (dict(bias=jnp.ones((1, H, S, S), bool), bias_type=np.int32(2), backend_flags=np.int32(512)),
     "kRequestMaskKeepOnly (a boolean keep mask as the bias) needs kRequestMaskBias"),
    (dict(bias=jnp.ones((1, H, S, S), bool), bias_type=np.int32(2)), "bias must have q's dtype"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_the_handler_rejects_bad_operands(case, what):
    q = jnp.ones((B, S, H, D))
    with pytest.raises(Exception, match=re.escape(what)) as e:
        jax.block_until_ready(_ffi_fwd(q, q, q, **case))
    assert "fusedattn:" in str(e.value)


def test_errors_do_not_depend_on_jit():
    # The same check runs eagerly and under jit, before anything is computed.
    q = jnp.ones((B, S, 3, D))
    k = jnp.ones((B, S, 2, D))
    call = lambda q, k: fusedattn.fused_attn((q, k, k), None, None, None)
    for f in (call, jax.jit(call), jax.grad(lambda q, k: call(q, k).sum())):
        with raises(ValueError, "multiple"):
            f(q, k)


# ---------------------------------------------------------------------------
# One table of bad arguments, by kind and by value: each raises at trace time a
# ValueError or a TypeError (ArgumentTypeError is both) naming the argument, and
# get_backend answers "none" with the same message.

_Q = sds((B, S, H, D))
_LENS = jnp.full((B,), S, jnp.int32)
_SD = fusedattn.SequenceDescriptor
_PAD = dict(attn_mask_type=AttnMaskType.PADDING_MASK)
_DROP = dict(dropout_probability=0.1, is_training=True)
_POST = dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS)
_LEARN = dict(softmax_type=SoftmaxType.LEARNABLE_SOFTMAX)
TypeOrValue = (TypeError, ValueError)

BAD_CALLS = [
    # (id, qkv, bias, sequence_descriptor, seed, kwargs, exception, substrings)
    ("head dim 0", (sds((B, S, H, 0)),) * 3, None, None, None, {}, ValueError,
     ["head dim of q and k", "got 0", "1..512"]),
    ("q list", ([[1.0]], _Q, _Q), None, None, None, {}, TypeError, ["q must be an array", "list"]),
    ("q None", (None, _Q, _Q), None, None, None, {}, TypeError, ["q must be an array"]),
    ("qkv None", None, None, None, None, {}, TypeError, ["qkv must be a tuple (q, k, v)"]),
    ("qkv dict", {"q": _Q}, None, None, None, {}, TypeError, ["qkv must be a tuple"]),
    ("q int32", shapes(dtype=jnp.int32), None, None, None, {}, ValueError, ["dtype", "int32"]),
    ("q complex", shapes(dtype=jnp.complex64), None, None, None, {}, ValueError,
     ["dtype", "complex64"]),
    ("q bool", shapes(dtype=jnp.bool_), None, None, None, {}, ValueError, ["dtype", "bool"]),
    ("bias list", shapes(), [[0.0]], None, None, _POST, TypeError,
     ["bias must be an array", "list"]),
    ("bias scalar", shapes(), 0.5, None, None, _POST, TypeError, ["bias must be an array", "float"]),
    ("bias int", shapes(), sds((1, H, S, S), jnp.int32), None, None, _POST, ValueError,
     ["bias must be a float array", "int32"]),
    ("bias complex", shapes(), sds((1, H, S, S), jnp.complex64), None, None, _POST, ValueError,
     ["bias must be a float array", "complex64"]),
    ("softmax_offset list", shapes(), None, None, None, dict(_LEARN, softmax_offset=[0.0] * H),
     TypeError, ["softmax_offset must be an array", "list"]),
    ("softmax_offset complex", shapes(), None, None, None,
     dict(_LEARN, softmax_offset=sds((H,), jnp.complex64)), TypeError,
     ["softmax_offset must be a float array", "complex64"]),
    ("window 2**64", shapes(), None, None, None, dict(window_size=(2 ** 64, 0)), ValueError,
     ["window_size", str(2 ** 64), "64-bit"]),
    ("window 2**63", shapes(), None, None, None, dict(window_size=(0, 2 ** 63)), ValueError,
     ["window_size", str(2 ** 63), "64-bit"]),
    ("window -2", shapes(), None, None, None, dict(window_size=(-2, 0)), ValueError,
     ["window_size", "(-2, 0)", "-1 (unbounded) or >= 0"]),
    ("window -2**64", shapes(), None, None, None, dict(window_size=(-2 ** 64, 0)), ValueError,
     ["window_size", "64-bit"]),
    ("window float", shapes(), None, None, None, dict(window_size=(1.5, 0)), TypeError,
     ["window_size", "pair (left, right) of Python ints", "(1.5, 0)"]),
    ("window bool", shapes(), None, None, None, dict(window_size=(True, 0)), TypeError,
     ["window_size", "(True, 0)"]),
    ("window str", shapes(), None, None, None, dict(window_size="wide"), TypeError,
     ["window_size", "'wide'"]),
    ("window int", shapes(), None, None, None, dict(window_size=3), TypeError, ["window_size", "3"]),
    ("window triple", shapes(), None, None, None, dict(window_size=(1, 2, 3)), TypeError,
     ["window_size", "(1, 2, 3)"]),
    ("seed str", shapes(), None, None, "abc", _DROP, TypeError, ["seed must be", "'abc'"]),
    ("seed str, no dropout", shapes(), None, None, "abc", {}, TypeError, ["seed must be"]),
    ("seed float", shapes(), None, None, 1.5, _DROP, TypeError, ["seed must be", "1.5"]),
    ("seed bool", shapes(), None, None, True, _DROP, TypeError, ["seed must be", "True"]),
    ("seed float array", shapes(), None, None, sds((2,), jnp.float32), _DROP, TypeError,
     ["seed must be", "float32"]),
    ("seed keys", shapes(), None, None, jax.random.split(jax.random.key(0)), _DROP, ValueError,
     ["seed must be one PRNG key"]),
    ("scale str", shapes(), None, None, None, dict(scaling_factor="0.5"), TypeError,
     ["scaling_factor must be a real scalar", "'0.5'"]),
    ("scale bool", shapes(), None, None, None, dict(scaling_factor=True), TypeError,
     ["scaling_factor must be a real scalar", "True"]),
    ("scale complex", shapes(), None, None, None, dict(scaling_factor=1j), TypeError,
     ["scaling_factor", "1j"]),
    ("scale vector", shapes(), None, None, None, dict(scaling_factor=np.ones(2)), TypeError,
     ["scaling_factor", "shape (2,)"]),
    ("scale nan", shapes(), None, None, None, dict(scaling_factor=float("nan")), ValueError,
     ["scaling_factor", "nan", "finite"]),
    ("scale -inf", shapes(), None, None, None, dict(scaling_factor=-np.inf), ValueError,
     ["scaling_factor", "inf", "finite"]),
    ("scale 1e39", shapes(), None, None, None, dict(scaling_factor=1e39), ValueError,
     ["scaling_factor", "float32", "finite"]),
    ("scale 10**400", shapes(), None, None, None, dict(scaling_factor=10 ** 400), ValueError,
     ["scaling_factor", "float32", "finite"]),
    ("dropout 1", shapes(), None, None, 0, dict(dropout_probability=1.0), ValueError,
     ["dropout_probability", "0 <= p < 1"]),
    ("dropout negative", shapes(), None, None, 0, dict(dropout_probability=-0.1), ValueError,
     ["dropout_probability", "0 <= p < 1"]),
    ("dropout nan", shapes(), None, None, 0, dict(dropout_probability=float("nan")), ValueError,
     ["dropout_probability", "nan"]),
    ("dropout str", shapes(), None, None, 0, dict(dropout_probability="0.1"), TypeError,
     ["dropout_probability", "'0.1'"]),
    ("dropout None", shapes(), None, None, 0, dict(dropout_probability=None), TypeError,
     ["dropout_probability", "None"]),
    ("is_training str", shapes(), None, None, 0, dict(is_training="no"), TypeError,
     ["is_training must be a Python bool", "'no'"]),
    ("is_training None", shapes(), None, None, 0, dict(is_training=None), TypeError,
     ["is_training", "None"]),
    ("max_segments float", shapes(), None, None, None, dict(max_segments_per_seq=1.5), TypeError,
     ["max_segments_per_seq", "1.5"]),
    ("max_segments str", shapes(), None, None, None, dict(max_segments_per_seq="1"), TypeError,
     ["max_segments_per_seq", "'1'"]),
    ("max_segments 2**64+1", shapes(), None, None, None, dict(max_segments_per_seq=2 ** 64 + 1),
     ValueError, ["max_segments_per_seq", "64-bit"]),
    ("max_segments 0", shapes(), None, None, None, dict(max_segments_per_seq=0), ValueError,
     ["max_segments_per_seq", "got 0"]),
    ("mask bool", shapes(), None, None, None, dict(attn_mask_type=True), TypeError,
     ["attn_mask_type", "AttnMaskType", "True"]),
    ("mask str", shapes(), None, None, None, dict(attn_mask_type="causal"), ValueError,
     ["attn_mask_type='causal'", "CAUSAL_MASK"]),
    ("layout float", shapes(), None, None, None, dict(qkv_layout=2.0), TypeError,
     ["qkv_layout", "QKVLayout", "2.0"]),
    ("bias type None", shapes(), None, None, None, dict(attn_bias_type=None), ValueError,
     ["attn_bias_type=None", "NO_BIAS"]),
    ("softmax type 9", shapes(), None, None, None, dict(softmax_type=9), ValueError,
     ["softmax_type=9", "VANILLA_SOFTMAX"]),
    ("descriptor tuple", shapes(), None, (_LENS, _LENS), None, _PAD, TypeError,
     ["sequence_descriptor must be a SequenceDescriptor"]),
    ("descriptor float lengths", shapes(), None, _SD(_LENS.astype(jnp.float32), _LENS), None, _PAD,
     TypeError, ["sequence_descriptor.q_seqlens must be an integer array", "float32"]),
    ("descriptor bool lengths", shapes(), None, _SD(_LENS, _LENS > 0), None, _PAD, TypeError,
     ["sequence_descriptor.kv_seqlens must be an integer array", "bool"]),
    ("descriptor list lengths", shapes(), None, _SD([S, S], [S, S]), None, _PAD, TypeError,
     ["sequence_descriptor.q_seqlens must be an integer array", "list"]),
    ("descriptor float offsets", shapes(), None,
     _SD(_LENS[:, None], _LENS[:, None], jnp.zeros((B, 2)), None), None, _PAD, TypeError,
     ["sequence_descriptor.q_offsets must be an integer array", "float32"]),
    ("descriptor rank-3 lengths", shapes(), None,
     _SD(jnp.ones((B, 1, 1), jnp.int32), _LENS), None, _PAD, ValueError,
     ["sequence_descriptor.q_seqlens", "(2, 1, 1)"]),
]


@pytest.mark.parametrize("qkv, bias, sd, seed, kwargs, exc, what",
                         [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments(qkv, bias, sd, seed, kwargs, exc, what):
    call = lambda: fusedattn.fused_attn(qkv, bias, sd, seed, **kwargs)
    with raises(exc, "fused_attn: ", *what):
        call()
    with raises(exc, "fused_attn: ", *what):  # the same at trace time under jit
        jax.jit(lambda: call())()
    info = fusedattn.get_backend(qkv, bias, sd, seed, **kwargs)
    assert info.name == "none" and all(w in info.reason for w in what), info.reason


@pytest.mark.parametrize("static", ["dropout_probability", "is_training", "window_size",
                                    "max_segments_per_seq", "attn_mask_type"])
def test_static_arguments_may_not_be_traced(static):
    value = {"dropout_probability": 0.1, "is_training": True, "window_size": 2,
             "max_segments_per_seq": 1, "attn_mask_type": 1}[static]
    arg = (lambda w: dict(window_size=(w, 0))) if static == "window_size" else (
        lambda w: {static: w})
    q = jnp.ones((B, S, H, D))
    f = jax.jit(lambda w: fusedattn.fused_attn((q, q, q), None, None, 0, **arg(w)))
    with raises(TypeError, static, "traced"):
        f(value)


AVAILABLE = dict(is_training=False, q_dtype=jnp.float32, kv_dtype=jnp.float32,
                 qkv_layout=QKVLayout.BSHD_BSHD_BSHD, attn_bias_type=AttnBiasType.NO_BIAS,
                 attn_mask_type=AttnMaskType.NO_MASK, softmax_type=SoftmaxType.VANILLA_SOFTMAX,
                 dropout_probability=0.0, q_num_heads=H, kv_num_heads=H, q_max_seqlen=S,
                 kv_max_seqlen=S, head_dim_qk=D, head_dim_v=D)


@pytest.mark.parametrize("change, result", [
    (dict(q_num_heads=2.0), (TypeError, "q_num_heads", "2.0")),
    (dict(head_dim_v="16"), (TypeError, "head_dim_v", "'16'")),
    (dict(q_dtype="foo", kv_dtype="foo"), (TypeError, "q_dtype", "'foo'")),
    (dict(qkv_layout=9), (ValueError, "qkv_layout=9", "QKVLayout")),
    (dict(attn_mask_type=True), (TypeError, "attn_mask_type", "True")),
    (dict(dropout_probability="a"), (TypeError, "dropout_probability", "'a'")),
    (dict(window_size=(0.5, 0)), (TypeError, "window_size", "0.5")),
    (dict(is_training="yes"), (TypeError, "is_training", "'yes'")),
    (dict(q_num_heads=2 ** 64 + 2, kv_num_heads=2 ** 64 + 2), False),  # never wraps to 2
    (dict(window_size=(2 ** 64, 0)), False),
    (dict(head_dim_qk=0, head_dim_v=0), False),
    ({}, True),
], ids=lambda x: None)
def test_is_fused_attn_kernel_available_arguments(change, result):
    args = dict(AVAILABLE, **change)
    if isinstance(result, bool):
        assert fusedattn.is_fused_attn_kernel_available(**args, platform="cpu") is result
        return
    exc, *what = result
    with raises(exc, "is_fused_attn_kernel_available: ", *what):
        fusedattn.is_fused_attn_kernel_available(**args, platform="cpu")


def test_type_errors_are_value_errors_too():
    # ArgumentTypeError is both, so code that caught ValueError before still catches it.
    with pytest.raises(ValueError):
        fusedattn.fused_attn(shapes(), [[0.0]], None, None, **_POST)
    with pytest.raises(TypeError):
        fusedattn.fused_attn(shapes(), [[0.0]], None, None, **_POST)


SD_BAD = [
    ("from_seqlens float", lambda: _SD.from_seqlens(jnp.ones((B,))), TypeError,
     ["from_seqlens", "q_seqlens must be an integer array", "float32"]),
    ("from_seqlens list of floats", lambda: _SD.from_seqlens([[1.5], [2.0]]), TypeError,
     ["q_seqlens must be an integer array", "float32"]),
    ("from_seqlens str", lambda: _SD.from_seqlens("ab"), TypeError, ["q_seqlens", "'ab'"]),
    ("from_seqlens None", lambda: _SD.from_seqlens(None), TypeError, ["q_seqlens", "None"]),
    ("from_seqlens bool", lambda: _SD.from_seqlens(_LENS > 0), TypeError, ["q_seqlens", "bool"]),
    ("from_seqlens pair of ints", lambda: _SD.from_seqlens([S, S]), ValueError,
     ["q_seqlens", "shape ()", "pair"]),
    ("max_segment_seqlen_kv bool", lambda: _SD.from_seqlens(_LENS, max_segment_seqlen_kv=True),
     TypeError, ["max_segment_seqlen_kv", "True"]),
    ("max_segment_seqlen_q float", lambda: _SD.from_seqlens(_LENS, max_segment_seqlen_q=2.5),
     TypeError, ["max_segment_seqlen_q", "2.5"]),
    ("max_segment_seqlen_kv 0", lambda: _SD.from_seqlens(_LENS, max_segment_seqlen_kv=0),
     ValueError, ["max_segment_seqlen_kv", ">= 1"]),
    ("offsets float", lambda: _SD.from_seqlens_and_offsets(_LENS[:, None], jnp.zeros((B, 2))),
     TypeError, ["q_offsets must be an integer array [B, M + 1]", "float32"]),
    ("segment_ids complex", lambda: _SD.from_segment_ids_and_pos(jnp.ones((B, S), jnp.complex64)),
     TypeError, ["segment_ids must be an integer, bool or float array [B, S]", "complex64"]),
    ("segment_ids reordered", lambda: _SD.from_segment_ids_and_pos(
        jnp.ones((B, S), jnp.int32), is_segment_ids_reordered=True), ValueError,
     ["is_segment_ids_reordered=True", "natural order"]),
    ("segment_pos float", lambda: _SD.from_segment_ids_and_pos(
        jnp.ones((B, S), jnp.int32), jnp.ones((B, S))), ValueError, ["segment_pos", "float32"]),
    ("max_segments float", lambda: _SD.from_segment_ids_and_pos(
        jnp.ones((B, S), jnp.int32), max_segments_per_seq=1.5), TypeError,
     ["max_segments_per_seq", "1.5"]),
    ("max_segments 0", lambda: _SD.from_segment_ids_and_pos(
        jnp.ones((B, S), jnp.int32), max_segments_per_seq=0), ValueError,
     ["max_segments_per_seq must be >= 1", "got 0"]),
    ("max_segments 2**64", lambda: _SD.from_segment_ids_and_pos(
        jnp.ones((B, S), jnp.int32), max_segments_per_seq=2 ** 64), ValueError,
     ["max_segments_per_seq", "64-bit"]),
]


@pytest.mark.parametrize("build, exc, what", [c[1:] for c in SD_BAD],
                         ids=[c[0] for c in SD_BAD])
def test_descriptor_constructors_reject_bad_arguments(build, exc, what):
    with raises(exc, "SequenceDescriptor", *what):
        build()
