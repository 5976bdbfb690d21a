"""Bad calls fail at trace time (jax.eval_shape: nothing is allocated or run) with a
message that names the argument; valid but unimplemented features raise NotImplementedError
naming the feature."""

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


def test_float64_is_unsupported():
    # Without x64, eval_shape would turn float64 into float32: enable it for this call,
    # and pass plain numpy arrays too (no tracing at all).
    with jax.enable_x64(True):
        with raises(ValueError, "dtype", "float64"):
            trace(shapes(dtype=jnp.float64))
    x = np.ones((B, S, H, D), np.float64)
    with raises(ValueError, "dtype", "float64"):
        fusedattn.fused_attn((x, x, x), None, None, None)


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


@pytest.mark.parametrize("dqk, dv, what, got", [(257, 257, "head dim of q and k", 257),
                                                (64, 257, "head dim of v", 257),
                                                (512, 64, "head dim of q and k", 512)])
def test_head_dim_above_256(dqk, dv, what, got):
    qkv = (sds((B, S, H, dqk)), sds((B, S, H, dqk)), sds((B, S, H, dv)))
    with raises(ValueError, what, f"got {got}", "256"):
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
    (jnp.zeros((2, 2), jnp.int32), "q_seqlens must be a 1-D integer array"),
    (jnp.zeros((2,), jnp.float32), "q_seqlens must be a 1-D integer array"),
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
# Valid requests this version does not implement


@pytest.mark.parametrize("bias_type", [AttnBiasType.PRE_SCALE_BIAS, AttnBiasType.POST_SCALE_BIAS],
                         ids=lambda b: b.name)
def test_bias_types_not_implemented(bias_type):
    with raises(NotImplementedError, f"attn_bias_type={bias_type.name}", "not implemented"):
        trace(shapes(), bias=sds((1, H, S, S)), attn_bias_type=bias_type)


@pytest.mark.parametrize("softmax", [SoftmaxType.OFF_BY_ONE_SOFTMAX, SoftmaxType.LEARNABLE_SOFTMAX],
                         ids=lambda s: s.name)
def test_softmax_types_not_implemented(softmax):
    with raises(NotImplementedError, f"softmax_type={softmax.name}", "not implemented"):
        trace(shapes(), softmax_type=softmax)


def test_learnable_softmax_with_offset_not_implemented():
    with raises(NotImplementedError, "softmax_type=LEARNABLE_SOFTMAX", "not implemented"):
        fusedattn.fused_attn(shapes(), None, None, None, softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
                             softmax_offset=sds((1, H, 1, 1)))


def test_training_dropout_not_implemented():
    with raises(NotImplementedError, "dropout_probability=0.1", "not implemented"):
        trace(shapes(), dropout_probability=0.1, is_training=True)


@pytest.mark.parametrize("window", [(8, 0), (-1, 0), (0, -1), (4, 4)])
def test_window_not_implemented(window):
    with raises(NotImplementedError, f"window_size=({window[0]}, {window[1]})", "not implemented"):
        trace(shapes(), window_size=window)


@pytest.mark.parametrize("layout", [l for l in QKVLayout if l != QKVLayout.BSHD_BSHD_BSHD],
                         ids=lambda l: l.name)
def test_other_layouts_not_implemented(layout):
    with raises(NotImplementedError, f"qkv_layout={layout.name}", "not implemented"):
        trace(shapes(), qkv_layout=layout)


def test_packed_segments_not_implemented():
    with raises(NotImplementedError, "max_segments_per_seq=2", "not implemented"):
        trace(shapes(), max_segments_per_seq=2)


def test_errors_do_not_depend_on_jit():
    # The same check runs eagerly and under jit, before anything is computed.
    q = jnp.ones((B, S, 3, D))
    k = jnp.ones((B, S, 2, D))
    call = lambda q, k: fusedattn.fused_attn((q, k, k), None, None, None)
    for f in (call, jax.jit(call), jax.grad(lambda q, k: call(q, k).sum())):
        with raises(ValueError, "multiple"):
            f(q, k)
