"""The feature set on the GPU (marked gpu: skipped without one). Today XLA runs reference.py
there (attention.py's platform_dependent default); these check that every feature goes
through that path with the right shapes and gradients, and they keep checking whichever
fused GPU backend replaces it. Dropout is checked statistically, not against the CPU mask:
a GPU backend may draw its masks with its own generator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from features import Spec, check
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType

pytestmark = pytest.mark.gpu


def thd_descriptor():
    return SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.array([[20, 0, 1, 40], [96, 0, 0, 0]]), jnp.array([[25, 3, 1, 0], [60, 10, 0, 0]])),
        (jnp.array([[0, 25, 25, 30, 70], [0, 96, 96, 96, 96]]),
         jnp.array([[5, 35, 38, 39, 39], [0, 60, 70, 70, 70]])))


SPECS = {
    "bs3hd-causal": Spec(layout=QKVLayout.BS3HD, mask=AttnMaskType.CAUSAL_MASK, Sq=96, Skv=96,
                         Hkv=4, D=64),
    "thd-causal-gqa": Spec(layout=QKVLayout.THD_THD_THD, mask=AttnMaskType.PADDING_CAUSAL_MASK,
                           Sq=96, Skv=96, Hq=8, Hkv=2, D=64, sd=thd_descriptor(), M=4),
    "t3hd-bottom-right": Spec(layout=QKVLayout.T3HD, Sq=96, Skv=96, Hkv=4, D=64, M=4,
                              mask=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
                              sd=thd_descriptor()),
    "bias-padding": Spec(mask=AttnMaskType.PADDING_MASK, Sq=80, Skv=100, D=64,
                         sd=SequenceDescriptor.from_seqlens((jnp.array([80, 3]),
                                                             jnp.array([0, 77]))),
                         bias_shape=(1, 4, 80, 100), bias_type=AttnBiasType.PRE_SCALE_BIAS),
    "window-sink": Spec(mask=AttnMaskType.CAUSAL_MASK, Sq=200, Skv=200, Hq=4, Hkv=1, D=64,
                        window=(32, 0), softmax=SoftmaxType.LEARNABLE_SOFTMAX),
    "off-by-one-mla": Spec(mask=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, Sq=64, Skv=40, D=192,
                           Dv=128, softmax=SoftmaxType.OFF_BY_ONE_SOFTMAX),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("name", SPECS)
def test_gpu_feature_against_reference(key, name, dtype):
    import dataclasses
    # float32 runs the CUDA flash kernels (cuDNN takes 16-bit only), at float32 accuracy
    # under "highest" (3xTF32; jax's default precision would be TF32, as XLA's own), whose
    # matmuls sit near float32's accuracy: on the H200 (2026-11-26) dk of thd-causal-gqa came
    # to 1.06e-5 x max |ref| against the 1e-5 bound, so float32 gets 4x it.
    slack = 4.0 if dtype == jnp.float32 else 1.0
    with jax.default_matmul_precision("highest"):
        check(key, dataclasses.replace(SPECS[name], dtype=dtype), slack=slack)


def test_gpu_dropout_keep_rate_and_scaling(key):
    # V = identity: the output rows are the dropped, rescaled probabilities.
    B, S, H, p = 2, 128, 4, 0.3
    kq, kk = jax.random.split(key)
    q, k = normal(kq, (B, S, H, 32)), normal(kk, (B, S, H, 32))
    v = jnp.broadcast_to(jnp.eye(S)[None, :, None, :], (B, S, H, S))
    f = lambda p: fusedattn.fused_attn((q, k, v), None, None, 7, dropout_probability=p,
                                       is_training=True)
    with jax.default_matmul_precision("highest"):  # P V exact: out's rows are P (float32)
        dropped, plain, again = np.asarray(f(p)), np.asarray(f(0.0)), np.asarray(f(p))
    keep = dropped != 0
    sigma = np.sqrt(p * (1 - p) / keep.size)
    assert abs(keep.mean() - (1 - p)) < 5 * sigma
    np.testing.assert_allclose(dropped[keep], plain[keep] / (1 - p), rtol=1e-5)
    np.testing.assert_array_equal(again, dropped)  # a fixed seed reproduces


def test_gpu_dot_product_attention_matches_jax(key):
    ks = jax.random.split(key, 3)
    q, k, v = (normal(kk, (2, 64, 4, 64)) for kk in ks)
    lens = jnp.array([64, 20], jnp.int32)
    with jax.default_matmul_precision("highest"):  # no TF32 on either side
        ours = fusedattn.dot_product_attention(q, k, v, is_causal=True,
                                               key_value_seq_lengths=lens)
        theirs = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                              key_value_seq_lengths=lens, implementation="xla")
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-4, atol=1e-4)
