"""fused_attn_small_seq backward on the CPU: dq, dk, dv against jax.grad of the plain-JAX
reference (loss = sum(out * dout) with a random cotangent), for every kv length, head dim,
dtype, layout, mask and head grouping; the backward's outputs poisoned with NaN first."""

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import DTYPES
from fusedattn import AttnMaskType
from small_seq_cases import bshd_case, check_backward_poisoned, check_grads, thd_case

ids = lambda d: jnp.dtype(d).name
HEADS = {64: (4, 1), 128: (2, 2), 256: (4, 2), 512: (2, 2)}


def every_length(key, n_max, **kw):
    lens = np.random.default_rng(n_max + 1).permutation(np.arange(n_max + 1))
    return thd_case(key, lens, width=n_max, pad_kv=2, pad_q=1, tail=2, **kw)


@pytest.mark.parametrize("dim", [64, 128, 256, 512])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_thd_every_kv_length_to_16(key, dtype, dim):
    check_backward_poisoned(every_length(key, 16, heads=HEADS[dim], dim=dim, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_thd_every_kv_length_to_64(key, dtype):
    check_grads(every_length(key, 64, heads=(2, 1), dim=64, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("skv", [1, 3, 16])
def test_bshd(key, dtype, skv):
    check_grads(bshd_case(key, 4, skv, heads=(4, 2), dim=128, dtype=dtype))


def test_bshd_padding(key):
    check_backward_poisoned(bshd_case(key, 5, 6, kv_lens=[6, 0, 1, 3, 5], heads=(2, 2), dim=64,
                                      dtype=jnp.bfloat16, mask=AttnMaskType.PADDING_MASK))


@pytest.mark.parametrize("mask", [AttnMaskType.PADDING_CAUSAL_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK],
                         ids=lambda m: m.name)
def test_thd_causal_masks(key, mask):
    check_backward_poisoned(thd_case(key, [5, 0, 1, 7], heads=(2, 1), dim=64, mask=mask,
                                     pad_kv=1))


@pytest.mark.parametrize("heads", [(8, 1), (6, 3), (1, 1)])
def test_head_groupings(key, heads):
    check_grads(thd_case(key, [3, 0, 6, 2, 16], heads=heads, dim=128, dtype=jnp.bfloat16))


def test_scaling_factor(key):
    check_grads(thd_case(key, [3, 8, 1], heads=(2, 2), dim=64, scale=1.7))


def test_zero_query_segments_give_zero_kv_grads(key):
    case = thd_case(key, [4, 3, 5], q_lens=[0, 1, 0], heads=(2, 2), dim=64, pad_kv=1, tail=2)
    dq, dk, dv = check_grads(case)
    # kv rows of the segments without a query, and the padding rows, get nothing.
    used = np.zeros(case.k.shape[0], bool)
    start = case.kv_offsets[1]
    used[start:start + case.kv_lens[1]] = True
    assert not np.asarray(dk, np.float32)[~used].any()
    assert not np.asarray(dv, np.float32)[~used].any()
    assert np.asarray(dk, np.float32)[used].any()
