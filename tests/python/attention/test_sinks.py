"""OFF_BY_ONE_SOFTMAX (an extra logit 0) and LEARNABLE_SOFTMAX (an extra logit
softmax_offset[h], differentiable) against the reference, alone and with padding,
sliding windows (attention sinks) and THD."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import DTYPES, descriptor, qkv
from features import Spec, check
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType

TYPES = [SoftmaxType.OFF_BY_ONE_SOFTMAX, SoftmaxType.LEARNABLE_SOFTMAX]
MASKS = [AttnMaskType.NO_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
         AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK]


def _grid():
    for i, st in enumerate(TYPES):
        for j, mask in enumerate(MASKS):
            dtype = DTYPES[(i + j) % 3]
            yield pytest.param(st, mask, dtype, id=f"{st.name}-{mask.name}-{jnp.dtype(dtype).name}")


@pytest.mark.parametrize("softmax, mask, dtype", list(_grid()))
def test_sinks_against_reference(key, softmax, mask, dtype):
    # Sq > Skv with bottom-right and kv length 0 leave rows that keep no key: their lse is
    # the extra logit and their output 0.
    sd = descriptor([50, 17], [0, 40]) if mask.is_padding() else None
    check(key, Spec(dtype=dtype, mask=mask, Sq=70, Skv=40, Hq=4, Hkv=2, sd=sd, softmax=softmax))


def test_offset_shapes_agree(key):
    # softmax_offset [Hq] and [1, Hq, 1, 1] are the same logits; the gradient keeps the shape.
    q, k, v = qkv(key, 2, 30, 30, 4, 2, 16)
    off = jax.random.normal(jax.random.fold_in(key, 1), (4,))

    def loss(off):
        return jnp.sum(fusedattn.fused_attn((q, k, v), None, None, None,
                                            softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
                                            softmax_offset=off) ** 2)

    g1, g4 = jax.grad(loss)(off), jax.grad(loss)(off.reshape(1, 4, 1, 1))
    assert g4.shape == (1, 4, 1, 1)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g4).reshape(4))


def test_lse_of_rows_without_keys_is_the_extra_logit(key):
    q, k, v = qkv(key, 1, 8, 8, 2, 2, 16)
    sd = descriptor([8], [0])  # queries, but no keys
    off = jnp.array([0.5, -2.0])
    for st, expect in ((SoftmaxType.VANILLA_SOFTMAX, -np.inf), (SoftmaxType.OFF_BY_ONE_SOFTMAX, 0.0),
                       (SoftmaxType.LEARNABLE_SOFTMAX, off[:, None])):
        out, aux = fusedattn.fused_attn(
            (q, k, v), None, sd, None, attn_mask_type=AttnMaskType.PADDING_MASK, softmax_type=st,
            softmax_offset=off if st == SoftmaxType.LEARNABLE_SOFTMAX else None, return_aux=True)
        np.testing.assert_array_equal(np.asarray(aux["softmax_aux"][0, ..., 0]),
                                      np.broadcast_to(expect, (2, 8)), err_msg=st.name)
        assert not np.asarray(out).any()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_sliding_window_with_sink(key, dtype):
    # gpt-oss style: causal sliding window plus a learnable sink per head.
    check(key, Spec(dtype=dtype, mask=AttnMaskType.CAUSAL_MASK, Sq=150, Skv=150, Hq=4, Hkv=1,
                    window=(32, 0), softmax=SoftmaxType.LEARNABLE_SOFTMAX, offset_4d=True))


def test_learnable_softmax_in_thd(key):
    sd = SequenceDescriptor.from_seqlens(jnp.array([[20, 1, 0, 40], [60, 30, 6, 0]]))
    check(key, Spec(layout=QKVLayout.THD_THD_THD, mask=AttnMaskType.PADDING_CAUSAL_MASK, Sq=96,
                    Skv=96, sd=sd, M=4, softmax=SoftmaxType.LEARNABLE_SOFTMAX))
