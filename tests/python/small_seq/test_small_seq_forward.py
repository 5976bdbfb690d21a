"""fused_attn_small_seq forward on the CPU: the output, the saved attention weights P and
the row statistics against the plain-JAX reference, every element (outputs poisoned with
NaN first), for every kv length 0..64, head dim, dtype, layout, mask and head grouping."""

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import DTYPES
from fusedattn import AttnMaskType
from small_seq_cases import bshd_case, check_forward, check_nan, thd_case

HEAD_DIMS = [64, 128, 256, 512]
# (q heads, kv heads) by head dim: MHA, GQA and MQA all appear.
HEADS = {64: (4, 1), 128: (4, 2), 256: (2, 2), 512: (3, 3)}
ids = lambda d: jnp.dtype(d).name


def every_length(key, n_max, **kw):
    """Segments of every kv length 0..n_max (shuffled), padded slots and a padded tail."""
    lens = np.random.default_rng(n_max).permutation(np.arange(n_max + 1))
    return thd_case(key, lens, width=n_max, pad_kv=2, pad_q=1, tail=3, **kw)


@pytest.mark.parametrize("dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_thd_every_kv_length_to_16(key, dtype, dim):
    check_forward(every_length(key, 16, heads=HEADS[dim], dim=dim, dtype=dtype),
                  check_public=dim == 128)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_thd_every_kv_length_to_64(key, dtype):
    check_forward(every_length(key, 64, heads=(2, 1), dim=128, dtype=dtype))


@pytest.mark.parametrize("width", [1, 3, 17, 64])
def test_thd_widths(key, width):
    """P's width as promised: segments fill it or fall short (test_small_seq_gpu.py runs
    every chunk size of the CUDA kernels)."""
    lens = [width, max(width - 1, 0), 0, width, 1]
    check_forward(thd_case(key, lens, width=width, heads=(2, 2), dim=64, dtype=jnp.bfloat16))


# Every (dtype, head dim) once, the key lengths cycling through small and large.
BSHD_GRID = [(d, dim, [1, 2, 5, 16, 64][(i * 4 + j) % 5])
             for i, d in enumerate(DTYPES) for j, dim in enumerate(HEAD_DIMS)]


@pytest.mark.parametrize("dtype, dim, skv", BSHD_GRID,
                         ids=[f"{ids(d)}-{dim}-{skv}" for d, dim, skv in BSHD_GRID])
def test_bshd(key, dtype, dim, skv):
    check_forward(bshd_case(key, 5, skv, heads=HEADS[dim], dim=dim, dtype=dtype),
                  check_public=dim == 128)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bshd_padding(key, dtype):
    case = bshd_case(key, 6, 9, kv_lens=[9, 0, 1, 4, 12, -2], heads=(4, 2), dim=128,
                     dtype=dtype, mask=AttnMaskType.PADDING_MASK)
    case.kv_lens = np.clip(case.kv_lens, 0, 9)  # the kernels clamp lengths to the slot
    check_forward(case)


PADDING = [AttnMaskType.PADDING_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
           AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK]


@pytest.mark.parametrize("mask", PADDING, ids=lambda m: m.name)
def test_thd_masks(key, mask):
    # One query: top-left causal keeps the first key, bottom-right all of them.
    check_forward(thd_case(key, [5, 0, 1, 7, 3], heads=(2, 1), dim=64, mask=mask, pad_kv=1))


@pytest.mark.parametrize("mask", list(AttnMaskType), ids=lambda m: m.name)
def test_bshd_masks(key, mask):
    lens = [4, 0, 1] if mask.is_padding() else None
    check_forward(bshd_case(key, 3, 4, kv_lens=lens, heads=(2, 2), dim=64, mask=mask))


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_scaling_factor(key, dtype):
    check_forward(thd_case(key, [3, 8, 1], heads=(2, 2), dim=128, dtype=dtype, scale=0.37))


@pytest.mark.parametrize("heads", [(1, 1), (8, 1), (8, 2), (6, 3), (16, 4)])
def test_head_groupings(key, heads):
    check_forward(thd_case(key, [3, 0, 6, 2], heads=heads, dim=64, dtype=jnp.bfloat16))


def test_lengths_only_packs_segments_back_to_back(key):
    check_forward(thd_case(key, [2, 7, 0, 5], offsets=False, heads=(2, 2), dim=64),
                  check_public=True)


def test_offsets_only_use_whole_slots(key):
    check_forward(thd_case(key, [2, 7, 0, 5], with_lengths=False, pad_kv=3, heads=(2, 2),
                           dim=64))


def test_single_segment_and_zero_query_segments(key):
    check_forward(thd_case(key, [6], heads=(2, 2), dim=64, tail=4))
    check_forward(thd_case(key, [6, 3, 4], q_lens=[0, 1, 0], heads=(2, 2), dim=64, pad_q=1))


def test_large_logits_stay_finite(key):
    case = thd_case(key, [16, 4, 9], heads=(2, 2), dim=64, scale=30.0)
    out = check_forward(case)
    assert np.isfinite(np.asarray(out)).all()


@pytest.mark.parametrize("source, token", [("q", 5), ("k", 9), ("v", 9)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_nan_propagates(key, dtype, source, token):
    # Segments of 1..5 kv rows and 2 queries each: q token 5 is the second query of
    # segment 2; kv token 9 lies in segment 3 (kv rows 6..9 without padding).
    case = thd_case(key, [1, 2, 3, 4, 5], q_lens=[2] * 5, heads=(2, 2), dtype=dtype)
    check_nan(case, source, token, 1)
