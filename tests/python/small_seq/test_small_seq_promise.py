"""Segments that break the caller's promise (more keys than max_segment_seqlen_kv, more
than one query) are still computed exactly, forward and backward, on the CPU: the saved
P holds the first max_segment_seqlen_kv weights and the rest come back from the saved
log-sum-exp. Nothing is truncated and nothing is read out of bounds (offsets and lengths
past the tensors are clamped to them)."""

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import DTYPES
from fusedattn import AttnMaskType
from small_seq_cases import check_backward_poisoned, check_forward, thd_case

ids = lambda d: jnp.dtype(d).name
MASKS = [AttnMaskType.PADDING_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
         AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK]


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_more_keys_than_promised(key, dtype):
    case = thd_case(key, [2, 11, 4, 0, 5, 70], width=4, heads=(4, 2), dim=64, dtype=dtype,
                    pad_kv=1)
    check_forward(case)
    check_backward_poisoned(case)


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: m.name)
def test_more_queries_than_promised(key, mask):
    case = thd_case(key, [3, 6, 2, 5], q_lens=[1, 3, 2, 0], width=8, heads=(2, 1), dim=64,
                    mask=mask, pad_q=1, pad_kv=1)
    check_forward(case)
    check_backward_poisoned(case)


def test_both_broken_with_gqa(key):
    case = thd_case(key, [9, 1, 13], q_lens=[2, 1, 4], width=2, heads=(6, 2), dim=128,
                    dtype=jnp.bfloat16, mask=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)
    check_forward(case)
    check_backward_poisoned(case)


def test_lengths_and_offsets_past_the_tensors_are_clamped(key):
    case = thd_case(key, [3, 4, 2], heads=(2, 2), dim=64)
    # Lengths beyond their slots and offsets beyond the tensors: the kernels clamp both
    # (segments.h); the reference sees the clamped values.
    q_off = np.array([0, 1, 2, 40], np.int32)
    kv_off = np.array([0, 3, 7, 1000], np.int32)
    kv_lens = np.array([5, 9, 7], np.int32)
    q_lens = np.array([1, 1, 30], np.int32)
    from fusedattn import SmallSeqDescriptor
    case.sd = SmallSeqDescriptor.from_cu_seqlens(q_off, kv_off, max_segment_seqlen_kv=4,
                                                 q_seqlens=q_lens, kv_seqlens=kv_lens)
    tq, tkv = case.q.shape[0], case.k.shape[0]
    case.q_offsets, case.kv_offsets = np.minimum(q_off, tq), np.minimum(kv_off, tkv)
    case.q_lens = np.minimum(q_lens, np.diff(case.q_offsets))
    case.kv_lens = np.minimum(kv_lens, np.diff(case.kv_offsets))
    case.width, case.max_q, case.max_kv = 4, tq, tkv
    check_forward(case)
    check_backward_poisoned(case)
