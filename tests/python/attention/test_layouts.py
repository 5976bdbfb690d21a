"""Packed layouts: BS3HD (qkv [B, S, 3, H, D]) and BSHD_BS2HD (q, kv [B, S, 2, H, D]) give
the results of the separate layout, forward and gradients (dqkv comes back as one buffer),
and q/k head dim != v head dim (MLA-style) in the separate layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import DTYPES, descriptor, normal, qkv
from features import Spec, check
from fusedattn import AttnMaskType, QKVLayout

MASKS = [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK,
         AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK]


def _grid():
    for i, layout in enumerate((QKVLayout.BS3HD, QKVLayout.BSHD_BS2HD)):
        for j, mask in enumerate(MASKS):
            dtype = DTYPES[(i + j) % 3]
            yield pytest.param(layout, mask, dtype,
                               id=f"{layout.name}-{mask.name}-{jnp.dtype(dtype).name}")


@pytest.mark.parametrize("layout, mask, dtype", list(_grid()))
def test_packed_layout_against_reference(key, layout, mask, dtype):
    Sq, Skv = 80, 80 if layout == QKVLayout.BS3HD else 100
    Hkv = 4 if layout == QKVLayout.BS3HD else 2
    sd = descriptor([Sq, 33], [Skv, 1 if layout == QKVLayout.BS3HD else 70]) \
        if mask.is_padding() else None
    check(key, Spec(dtype=dtype, layout=layout, mask=mask, Sq=Sq, Skv=Skv, Hq=4, Hkv=Hkv, D=32,
                    sd=sd))


@pytest.mark.parametrize("layout", [QKVLayout.BS3HD, QKVLayout.BSHD_BS2HD], ids=lambda l: l.name)
def test_packed_equals_separate_bitwise(key, layout):
    # Same engine, same math: only the strides differ, so the results are identical.
    B, S, H, D = 2, 70, 2, 16
    q, k, v = qkv(key, B, S, S, H, H, D, dtype=jnp.bfloat16)
    dout = normal(jax.random.fold_in(key, 1), (B, S, H, D), jnp.bfloat16)
    packed = (jnp.stack([q, k, v], 2) if layout == QKVLayout.BS3HD
              else (q, jnp.stack([k, v], 2)))

    def loss(x, layout):
        out = fusedattn.fused_attn(x, None, None, None, qkv_layout=layout,
                                   attn_mask_type=AttnMaskType.CAUSAL_MASK)
        return jnp.sum(out.astype(jnp.float32) * dout), out

    (_, out_p), g_p = jax.jit(jax.value_and_grad(loss, has_aux=True),
                              static_argnums=1)(packed, layout)
    (_, out_s), g_s = jax.jit(jax.value_and_grad(loss, has_aux=True),
                              static_argnums=1)((q, k, v), QKVLayout.BSHD_BSHD_BSHD)
    np.testing.assert_array_equal(np.asarray(out_p, np.float32), np.asarray(out_s, np.float32))
    if layout == QKVLayout.BS3HD:
        assert g_p.shape == (B, S, 3, H, D), "dqkv is one buffer of qkv's shape"
        got = (g_p[:, :, 0], g_p[:, :, 1], g_p[:, :, 2])
    else:
        assert g_p[1].shape == (B, S, 2, H, D), "dkv is one buffer of kv's shape"
        got = (g_p[0], g_p[1][:, :, 0], g_p[1][:, :, 1])
    for name, a, b in zip(("dq", "dk", "dv"), got, g_s):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=0, atol=0, err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_mla_head_dims(key, dtype):
    # q/k head dim 192, v head dim 128 (DeepSeek-style MLA), GQA, causal.
    check(key, Spec(dtype=dtype, mask=AttnMaskType.CAUSAL_MASK, Sq=48, Skv=48, Hq=4, Hkv=2,
                    D=192, Dv=128))
