"""The GPU's head-dim padding (_gpu_route.heads_padded), checked on the CPU engine: a call
whose head dims are not whole 16-byte chunks runs on the GPU with q, k, v (out, dout in the
backward) zero-padded and the results cut back. Here the wrapper runs around the CPU
engine's own FFI call, which takes any head dim, so the padded call must equal the
unpadded one: every layout (packed buffers included), q/k and v dims apart, THD, a bias,
a sink, GQA, dropout. And get_backend on the GPU reports the padded dims' decision."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn._gpu_route import gpu_dims, gpu_head_dim, heads_padded
from fusedattn._prepare import prepare
from fusedattn.attention import _ffi_bwd, _ffi_fwd

BF16 = jnp.bfloat16
B, S, HQ, HKV = 2, 48, 4, 2


def _case(key, layout, D, Dv, dtype, **kw):
    ks = jax.random.split(key, 3)
    thd = layout == QKVLayout.THD_THD_THD
    if layout == QKVLayout.BS3HD:
        qkv = (normal(ks[0], (B, S, 3, HQ, D), dtype),)
    elif layout == QKVLayout.BSHD_BS2HD:
        qkv = (normal(ks[0], (B, S, HQ, D), dtype), normal(ks[1], (B, S, 2, HKV, D), dtype))
    else:
        qkv = (normal(ks[0], (B, S, HQ, D), dtype), normal(ks[1], (B, S, HKV, D), dtype),
               normal(ks[2], (B, S, HKV, Dv), dtype))
    sd = None
    if thd:
        ids = jnp.array([[1] * 30 + [2] * 10 + [0] * 8, [3] * 20 + [4] * 28])
        sd = SequenceDescriptor.from_segment_ids_and_pos(ids, max_segments_per_seq=2)
        kw.setdefault("attn_mask_type", AttnMaskType.PADDING_CAUSAL_MASK)
    return qkv, sd, dict(qkv_layout=layout, max_segments_per_seq=2 if thd else 1, **kw)


CASES = {
    "bshd_d60_bf16_causal": (QKVLayout.BSHD_BSHD_BSHD, 60, 60, BF16,
                             dict(attn_mask_type=AttnMaskType.CAUSAL_MASK)),
    "bshd_d36_dv100_bias_sink": (QKVLayout.BSHD_BSHD_BSHD, 36, 100, BF16,
                                 dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                                      softmax_type=SoftmaxType.OFF_BY_ONE_SOFTMAX)),
    "bs3hd_d20_dropout": (QKVLayout.BS3HD, 20, 20, BF16,
                          dict(dropout_probability=0.2, is_training=True)),
    "bs2hd_d12_window": (QKVLayout.BSHD_BS2HD, 12, 12, jnp.float16,
                         dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, window_size=(8, 0))),
    "thd_f32_d6_dv10": (QKVLayout.THD_THD_THD, 6, 10, jnp.float32, {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_padded_call_equals_the_unpadded_one(key, name):
    layout, D, Dv, dtype, kw = CASES[name]
    qkv, sd, kw = _case(key, layout, D, Dv, dtype, **kw)
    bias = None
    if kw.get("attn_bias_type") == AttnBiasType.POST_SCALE_BIAS:
        bias = normal(jax.random.fold_in(key, 7), (1, HQ, S, S), dtype)
    full = dict(attn_bias_type=AttnBiasType.NO_BIAS, attn_mask_type=AttnMaskType.NO_MASK,
                softmax_type=SoftmaxType.VANILLA_SOFTMAX, scaling_factor=None,
                dropout_probability=0.0, is_training=False, window_size=None,
                softmax_offset=None)
    call = prepare(qkv, bias, sd, 5, **{**full, **kw})
    cfg = dataclasses.replace(call.cfg, want_lse=True, want_max_logit=True)
    ops, dims = call.operands, call.dims
    assert gpu_dims(dims, dtype) != dims, "the case must need padding"

    fwd = jax.jit(lambda *o: _ffi_fwd(*o, cfg=cfg, dims=dims, sm=None))
    fwd_padded = jax.jit(lambda *o: heads_padded(_ffi_fwd)(*o, cfg=cfg, dims=dims, sm=None))
    want, got = fwd(*ops), fwd_padded(*ops)
    for what, g, w in zip(("out", "lse", "max_logit"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, what
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=2e-6, atol=2e-6, err_msg=what)

    out, lse = want[0], want[1]
    dout = normal(jax.random.fold_in(key, 9), out.shape, dtype)
    bwd = jax.jit(lambda *a: _ffi_bwd(*a, cfg=cfg, dims=dims, sm=None))
    bwd_padded = jax.jit(lambda *a: heads_padded(_ffi_bwd, backward=True)(
        *a, cfg=cfg, dims=dims, sm=None))
    for what, g, w in zip(("dq", "dk", "dv", "dbias", "d offset"),
                          bwd_padded(*ops, out, dout, lse), bwd(*ops, out, dout, lse)):
        assert g.shape == w.shape and g.dtype == w.dtype, what
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=2e-5, atol=2e-5, err_msg=what)


def test_gpu_head_dims():
    assert [gpu_head_dim(d, 2) for d in (1, 8, 60, 100, 129)] == [8, 8, 64, 104, 136]
    assert [gpu_head_dim(d, 4) for d in (1, 4, 6, 36)] == [4, 4, 8, 36]


def test_get_backend_reports_the_padded_dims():
    odd = jax.ShapeDtypeStruct((2, 128, 4, 60), BF16)
    info = fusedattn.get_backend((odd, odd, odd), platform="gpu")
    assert "zero-padded to 64 / 64" in info.reason, info
    aligned = jax.ShapeDtypeStruct((2, 128, 4, 64), BF16)
    assert "zero-padded" not in fusedattn.get_backend((aligned,) * 3, platform="gpu").reason
    assert fusedattn.get_backend((odd, odd, odd), platform="cpu").name == "cpu_flash"


@pytest.mark.gpu
def test_gpu_decision_of_padded_dims():
    odd = jax.ShapeDtypeStruct((2, 128, 4, 60), BF16)
    info = fusedattn.get_backend((odd, odd, odd), platform="gpu")
    assert info.name == "cudnn" and "zero-padded to 64 / 64" in info.reason, info
    # a score_mod with a bias (cuDNN would add the bias after it): the flash kernels, which
    # ran no score_mod at such head dims before
    bias = jax.ShapeDtypeStruct((1, 4, 128, 128), BF16)
    info = fusedattn.get_backend((odd, odd, odd), bias,
                                 attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                                 score_mod=lambda s, b, h, q, k: s * 0.5, platform="gpu")
    assert info.name == "cuda_flash" and "zero-padded" in info.reason, info
