"""The flash backward's stored-output term (conftest.stored_out_grads) on the two fuzz cases
that found it (test_fuzz.py::test_fuzz_valid_inputs_match_reference, derandomized).

The CPU engine's delta = rowsum(dO * O) reads the output the forward stored, rounded to the
dtype (as FlashAttention and cuDNN); the exact delta is that of the unrounded O. On rows
where dS = P * (dP - delta) cancels (a dominant or a single kept key) that rounding is the
gradient's whole error, and reference_lowp (whose autodiff forms sum_j P dP) has no
counterpart of it. These tests pin both halves of the rule: the engine's gradients are the
reference's plus that computed term (to the usual low-precision tolerance), and without the
term they would not pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tolerance
from features import Spec, check, run
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType


def _bf16_d1():
    """bf16, D = Dv = 1: query 4 of row 1 keeps 4 keys, one of them with P = 0.95."""
    sd = SequenceDescriptor.from_seqlens((jnp.array([[4], [5]]), jnp.array([[0], [4]])))
    return Spec(dtype=jnp.bfloat16, layout=QKVLayout.BSHD_BS2HD, mask=AttnMaskType.PADDING_MASK,
                B=2, Sq=9, Skv=5, Hq=2, Hkv=1, D=1, Dv=1, sd=sd, scale=1.481)


def _fp16_single_key():
    """fp16 THD, one query keeping one key (P = 1): the exact dq is 0, with dropout."""
    sd = SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.array([[0, 1]]), jnp.array([[4, 1]])), (jnp.array([[0, 0, 1]]), jnp.array([[0, 4, 5]])))
    return Spec(dtype=jnp.float16, layout=QKVLayout.THD_T2HD,
                mask=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, B=1, Sq=1, Skv=5, Hq=4, Hkv=2,
                D=8, Dv=8, sd=sd, M=2, bias_shape=(1, 1, 1, 5),
                bias_type=AttnBiasType.PRE_SCALE_BIAS, softmax=SoftmaxType.VANILLA_SOFTMAX,
                offset_4d=True, window=(2, 2), dropout=0.25, scale=0.567)


CASES = [pytest.param(_bf16_d1, 7, id="bf16_D1_dominant_key"),
         pytest.param(_fp16_single_key, 40, id="fp16_thd_single_key_dropout")]


@pytest.mark.parametrize("make, seed", CASES)
def test_fuzz_case_passes(make, seed):
    check(jax.random.PRNGKey(seed), make())


@pytest.mark.parametrize("make, seed", CASES)
def test_dq_is_reference_plus_stored_out_term(make, seed):
    spec = make()
    r, _ = run(jax.random.PRNGKey(seed), spec)
    f = lambda x: np.asarray(jnp.asarray(x, jnp.float32))
    got, ref, lowp, stored = (f(r[k][0]) for k in ("fused_g", "ref_g", "lowp_g", "stored_g"))
    tol = tolerance(spec.dtype)
    bound = tol.floor * max(1.0, np.abs(ref).max()) + tol.multiple * np.abs(lowp - ref).max()
    # The engine is the float32 reference plus the computed term, to the plain rule ...
    assert np.abs(got - (ref + stored)).max() <= bound
    # ... and the term is what the plain rule misses (if this fails, the engine's delta no
    # longer reads the rounded output: conftest.stored_out_grads no longer describes it).
    assert np.abs(got - ref).max() > bound
