"""The batch chunks a cuDNN call past 2^31 elements runs in (attention._chunked): cuDNN's
backward indexes in 32 bits, so such calls run as several calls of fewer batch entries.
Checked here through the CPU handlers, which take the same operands: the chunked forward
and backward equal the whole call (bias batched and broadcast, sinks, THD descriptors),
and the chunk size follows the limit."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn import _gpu_route as R
from fusedattn import attention as A
from fusedattn._prepare import N_OPS, prepare


def _call(key, bias_batch, layout=QKVLayout.BSHD_BSHD_BSHD):
    B, S, H, D = 5, 16, 2, 8
    ks = jax.random.split(key, 5)
    q, k, v = (jax.random.normal(kk, (B, S, H, D)) for kk in ks[:3])
    bias = jax.random.normal(ks[3], (bias_batch, H, S, S))
    sd = None
    mask = AttnMaskType.CAUSAL_MASK
    if layout == QKVLayout.THD_THD_THD:
        lens = jnp.array([[5, 7], [16, 0], [3, 3], [0, 0], [8, 8]], jnp.int32)
        sd = SequenceDescriptor.from_seqlens((lens, lens))
        mask = AttnMaskType.PADDING_CAUSAL_MASK
        bias = None
    call = prepare((q, k, v), bias, sd, 0, attn_bias_type=AttnBiasType.POST_SCALE_BIAS
                   if bias is not None else AttnBiasType.NO_BIAS, attn_mask_type=mask,
                   qkv_layout=layout, softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
                   scaling_factor=None, dropout_probability=0.0, is_training=True,
                   max_segments_per_seq=2 if sd is not None else 1, window_size=None,
                   softmax_offset=jax.random.normal(ks[4], (H,)))
    cfg = dataclasses.replace(call.cfg, want_lse=True)
    return call.operands, cfg, call.dims


@pytest.mark.parametrize("case", ["bias_batched", "bias_broadcast", "thd"])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_chunked_equals_whole(case, chunk):
    layout = QKVLayout.THD_THD_THD if case == "thd" else QKVLayout.BSHD_BSHD_BSHD
    ops, cfg, dims = _call(jax.random.key(0), 5 if case == "bias_batched" else 1, layout)
    batched = R._batch_args(ops, dims, len(ops))
    whole = A._ffi_fwd(*ops, cfg=cfg, dims=dims)
    parts = R._chunked(A._ffi_fwd, chunk, batched)(*ops, cfg=cfg, dims=dims)
    for w, p in zip(whole, parts):
        np.testing.assert_array_equal(np.asarray(p), np.asarray(w))
    out, lse = whole[0], whole[1]
    dout = jax.random.normal(jax.random.key(1), out.shape)
    args = (*ops, out, dout, lse)
    b_batched = R._batch_args(ops, dims, len(args))
    sums = (4, 5) if 3 in b_batched else (3, 4, 5)
    gw = A._ffi_bwd(*args, cfg=cfg, dims=dims)
    gp = R._chunked(A._ffi_bwd, chunk, b_batched, sums)(*args, cfg=cfg, dims=dims)
    for name, w, p in zip(("dq", "dk", "dv", "dbias", "doffset"), gw, gp):
        np.testing.assert_allclose(np.asarray(p), np.asarray(w), rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_chunk_size_follows_the_limit(monkeypatch):
    ops, cfg, dims = _call(jax.random.key(2), 1)
    assert R._cudnn_chunk(ops, dims) is None
    per_entry = dims.Sq * dims.Hq * dims.D  # 256
    monkeypatch.setattr(R, "_CUDNN_MAX_ELEMENTS", 2 * per_entry + 1)
    assert R._cudnn_chunk(ops, dims) == 2
    monkeypatch.setattr(R, "_CUDNN_MAX_ELEMENTS", per_entry - 1)
    with pytest.raises(NotImplementedError, match="2\\^31 - 1 that cuDNN indexes"):
        R._cudnn_chunk(ops, dims)
