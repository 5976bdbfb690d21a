"""_nan_rows.nan_exact (what wraps cuDNN's backward on the GPU), checked on the CPU
engine: neutralizing the NaN rows and writing NaN where the reference has it gives
exactly the engine's own gradients (which follow the reference), NaN for NaN, in every
BSHD layout, with NaN from q, k, v, the bias or the sink."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn import attention as A
from fusedattn._nan_rows import nan_exact
from fusedattn._prepare import prepare

B, S, H, HKV, D = 2, 40, 4, 2, 16


def call(key, layout, source, mask):
    kq, kk, kv, kb, ko, kd = jax.random.split(key, 6)
    hkv = H if layout == QKVLayout.BS3HD else HKV
    q, k, v = normal(kq, (B, S, H, D)), normal(kk, (B, S, hkv, D)), normal(kv, (B, S, hkv, D))
    bias, offset = normal(kb, (1, H, S, S)), normal(ko, (H,))
    if source == "q":
        q = q.at[1, 17, 2, 3].set(jnp.nan)
    elif source == "k":
        k = k.at[0, 9, 1, 0].set(jnp.nan)
    elif source == "v":
        v = v.at[1, 12, 0, 5].set(jnp.nan)
        v = v.at[1, 35, 1, 2].set(jnp.nan)  # past kv length 31 of row 1: a key nobody keeps
    elif source == "bias":
        bias = bias.at[0, 3, 30, 27].set(jnp.nan)  # a kept logit (window 7 left)
    else:
        offset = offset.at[1].set(jnp.nan)
    qkv = {QKVLayout.BSHD_BSHD_BSHD: lambda: (q, k, v),
           QKVLayout.BS3HD: lambda: (jnp.stack([q, k, v], axis=2),),
           QKVLayout.BSHD_BS2HD: lambda: (q, jnp.stack([k, v], axis=2))}[layout]()
    sd = SequenceDescriptor.from_seqlens((jnp.array([S, 23], jnp.int32),
                                          jnp.array([31, S], jnp.int32)))
    c = prepare(qkv, bias, sd if mask.is_padding() else None, None,
                attn_bias_type=AttnBiasType.POST_SCALE_BIAS, attn_mask_type=mask,
                qkv_layout=layout, softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
                scaling_factor=None, dropout_probability=0.0, is_training=True,
                max_segments_per_seq=1, window_size=(7, 3), softmax_offset=offset)
    cfg = dataclasses.replace(c.cfg, want_lse=True)
    return c.operands, cfg, c.dims, normal(kd, (B, S, H, D))


@pytest.mark.parametrize("layout", [QKVLayout.BSHD_BSHD_BSHD, QKVLayout.BS3HD,
                                    QKVLayout.BSHD_BS2HD])
@pytest.mark.parametrize("source", ["q", "k", "v", "bias", "offset"])
@pytest.mark.parametrize("mask", [AttnMaskType.CAUSAL_MASK, AttnMaskType.PADDING_CAUSAL_MASK])
def test_nan_exact_equals_the_engine(key, layout, source, mask):
    ops, cfg, dims, dout = call(key, layout, source, mask)
    out, lse, _ = A._ffi_fwd(*ops, cfg=cfg, dims=dims)
    assert np.isnan(np.asarray(out)).any()
    want = A._ffi_bwd(*ops, out, dout, lse, cfg=cfg, dims=dims)
    got = jax.jit(lambda *a: nan_exact(A._ffi_bwd)(*a, cfg=cfg, dims=dims, sm=None))(
        *ops, out, dout, lse)
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, i
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"grad {i}: NaN")
        assert i > 2 or not w.size or not np.isnan(w).all(), f"grad {i}: all NaN (tests nothing)"
        np.testing.assert_allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=1e-5, atol=1e-5,
                                   err_msg=f"grad {i}")


@pytest.mark.parametrize("mask", list(AttnMaskType))
@pytest.mark.parametrize("window", [None, (5, 2), (0, 0), (3, -1), (-1, 4)])
@pytest.mark.parametrize("sq, skv", [(9, 14), (14, 9)])
def test_row_keys_is_the_mask(mask, window, sq, skv):
    # The key interval of each row (mask.h's rule) against the reference's dense mask.
    from fusedattn._nan_rows import row_keys
    from fusedattn._prepare import Config, window as window_of
    from fusedattn.reference import segment_mask
    cfg = Config(QKVLayout.BSHD_BSHD_BSHD, mask, AttnBiasType.NO_BIAS,
                 SoftmaxType.VANILLA_SOFTMAX, 1.0, 0.0, False, window_of(window))
    ql, kl = jnp.array([[sq], [4], [0]], jnp.int32), jnp.array([[skv], [0], [6]], jnp.int32)
    lo, hi = row_keys(cfg, 3, sq, skv, ql, kl)
    keep, _ = segment_mask(mask, 3, sq, skv, ql, kl, None, None, False, cfg.window)
    j = np.arange(skv)
    got = (np.asarray(lo)[..., None] <= j) & (j < np.asarray(hi)[..., None])
    np.testing.assert_array_equal(got, np.asarray(keep))
