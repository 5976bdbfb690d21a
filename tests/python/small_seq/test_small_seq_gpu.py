"""fused_attn_small_seq on an NVIDIA GPU (the CUDA kernels; skipped without a GPU): the
forward output, saved P and statistics, and the backward's dq, dk, dv against the
reference computed on the GPU in float32, every element, with the kernels' outputs
poisoned with NaN before they run. Covers every kv length and chunk size, every head dim
and dtype, THD (ragged, empty, padded slots and tails) and BSHD, masks, GQA/MQA, broken
promises, vmap, and the 30720-segment shapes of docs/BENCH.md."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import DTYPES
from fusedattn import AttnMaskType
from small_seq_cases import (bshd_case, check_backward_poisoned, check_forward, check_grads,
                             check_nan, thd_case)

pytestmark = pytest.mark.gpu
ids = lambda d: jnp.dtype(d).name
HEADS = {64: (4, 1), 128: (4, 2), 256: (2, 2), 512: (3, 3)}


def every_length(key, n_max, **kw):
    lens = np.random.default_rng(n_max).permutation(np.arange(n_max + 1))
    return thd_case(key, lens, width=n_max, pad_kv=2, pad_q=1, tail=3, **kw)


def test_runs_on_the_gpu():
    assert jax.default_backend() == "gpu"


@pytest.mark.parametrize("dim", [64, 128, 256, 512])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_every_kv_length_to_16(key, dtype, dim):
    case = every_length(key, 16, heads=HEADS[dim], dim=dim, dtype=dtype)
    check_forward(case, check_public=True)
    check_backward_poisoned(case)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("dim", [64, 512])
def test_every_kv_length_to_64(key, dtype, dim):
    case = every_length(key, 64, heads=(2, 1), dim=dim, dtype=dtype)
    check_forward(case)
    check_backward_poisoned(case)


# Every chunk size of every head dim is picked by some width here (launch.cuh).
WIDTHS = [(jnp.bfloat16, w) for w in [1, 2, 3, 5, 9, 17, 33, 64]] + [
    (jnp.float32, w) for w in [2, 9, 64]]


@pytest.mark.parametrize("dtype, width", WIDTHS, ids=[f"{ids(d)}-{w}" for d, w in WIDTHS])
@pytest.mark.parametrize("dim", [64, 128, 256, 512])
def test_widths(key, dim, dtype, width):
    lens = [width, max(width - 1, 0), 0, width, 1, width // 2]
    case = thd_case(key, lens, width=width, heads=(2, 2), dim=dim, dtype=dtype, pad_kv=1)
    check_forward(case)
    check_backward_poisoned(case)


@pytest.mark.parametrize("skv", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_bshd(key, dtype, skv):
    case = bshd_case(key, 7, skv, heads=(4, 2), dim=128, dtype=dtype)
    check_forward(case)
    check_grads(case)


@pytest.mark.parametrize("mask", list(AttnMaskType), ids=lambda m: m.name)
def test_bshd_masks(key, mask):
    lens = [4, 0, 1, 3] if mask.is_padding() else None
    case = bshd_case(key, 4, 4, kv_lens=lens, heads=(2, 2), dim=128, dtype=jnp.bfloat16,
                     mask=mask)
    check_forward(case)
    check_backward_poisoned(case)


@pytest.mark.parametrize("mask", [AttnMaskType.PADDING_MASK, AttnMaskType.PADDING_CAUSAL_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK],
                         ids=lambda m: m.name)
def test_thd_masks(key, mask):
    case = thd_case(key, [5, 0, 1, 7, 3], heads=(2, 1), dim=128, mask=mask, pad_kv=1,
                    dtype=jnp.bfloat16)
    check_forward(case)
    check_backward_poisoned(case)


@pytest.mark.parametrize("heads", [(8, 1), (8, 2), (6, 3), (16, 4), (32, 1)])
def test_head_groupings(key, heads):
    case = thd_case(key, [3, 0, 6, 2, 16, 9], width=16, heads=heads, dim=128,
                    dtype=jnp.bfloat16, pad_kv=1)
    check_forward(case)
    check_backward_poisoned(case)


def test_scaling_factor(key):
    case = thd_case(key, [3, 8, 1], heads=(2, 2), dim=256, dtype=jnp.float16, scale=0.37)
    check_forward(case)
    check_backward_poisoned(case)


# heads (4, 4): the backward's team kernel, which leaves broken segments to the warp;
# (4, 2): the GQA kernel.
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)])
@pytest.mark.parametrize("dim", [64, 128, 512])
def test_broken_promises(key, dim, heads):
    case = thd_case(key, [2, 11, 4, 0, 70, 9], q_lens=[1, 3, 1, 2, 1, 0], width=4,
                    heads=heads, dim=dim, dtype=jnp.bfloat16, pad_kv=1, pad_q=1,
                    mask=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)
    check_forward(case)
    check_backward_poisoned(case)


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_broken_promises_among_many(key, dim):
    """A few broken segments among thousands of kept ones: the warps that meet one retrace
    their teams' items, the others do not."""
    rng = np.random.default_rng(dim)
    n = 4000
    kv_lens = rng.integers(0, 9, n)
    q_lens = np.ones(n, np.int32)
    q_lens[rng.choice(n, 12, replace=False)] = 0
    broken = rng.choice(n, 10, replace=False)
    kv_lens[broken[:5]] = 13
    q_lens[broken[5:]] = 2
    case = thd_case(key, kv_lens, q_lens=q_lens, width=8, heads=(2, 2), dim=dim,
                    dtype=jnp.float16, pad_kv=1)
    check_forward(case)
    check_backward_poisoned(case)


def test_gpu_matches_cpu(key):
    case = thd_case(key, [3, 16, 0, 9, 1], width=16, heads=(8, 2), dim=128, dtype=jnp.bfloat16,
                    pad_kv=2)
    gpu = np.asarray(case.call(), np.float32)
    cpu_dev = jax.devices("cpu")[0]
    with jax.default_device(cpu_dev):
        cpu = np.asarray(case.call(*(jax.device_put(x, cpu_dev) for x in (case.q, case.k,
                                                                          case.v))), np.float32)
    # Same math in float32 up to the order of the sums, then one bf16 rounding.
    np.testing.assert_allclose(gpu, cpu, rtol=1e-2, atol=1e-2)


def test_vmap_over_packs(key):
    cases = [thd_case(jax.random.fold_in(key, i), [3, 1, 7, 0], width=8, heads=(2, 2), dim=128)
             for i in range(3)]
    from fusedattn import SmallSeqDescriptor
    import fusedattn
    tq = max(c.q.shape[0] for c in cases)
    tkv = max(c.k.shape[0] for c in cases)
    pad = lambda x, t: jnp.pad(x, ((0, t - x.shape[0]), (0, 0), (0, 0)))
    q = jnp.stack([pad(c.q, tq) for c in cases])
    k = jnp.stack([pad(c.k, tkv) for c in cases])
    v = jnp.stack([pad(c.v, tkv) for c in cases])
    sd = SmallSeqDescriptor.from_cu_seqlens(
        np.stack([c.q_offsets for c in cases]), np.stack([c.kv_offsets for c in cases]),
        max_segment_seqlen_kv=8, q_seqlens=np.stack([c.q_lens for c in cases]),
        kv_seqlens=np.stack([c.kv_lens for c in cases]))
    f = lambda q, k, v, sd: fusedattn.fused_attn_small_seq((q, k, v), None, sd, None)
    got = jax.jit(jax.vmap(f))(q, k, v, sd)
    for i in range(3):
        one = f(q[i], k[i], v[i], jax.tree.map(lambda x: x[i], sd))
        np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(one))


@pytest.mark.parametrize("skv", [2, 4, 8, 16])
def test_30720_segments(key, skv):
    """The BENCH.md shapes: B = 30720 segments, 1 query, H = 8, D = 128, bf16, THD with
    ragged kv lengths up to the promise (and some empty segments)."""
    n = 30720
    lens = np.random.default_rng(skv).integers(0, skv + 1, n)
    lens[:8] = skv
    case = thd_case(key, lens, width=skv, heads=(8, 8), dim=128, dtype=jnp.bfloat16)
    check_forward(case)
    check_backward_poisoned(case)


def test_30720_segments_bshd_full(key):
    case = bshd_case(key, 30720, 16, heads=(8, 8), dim=128, dtype=jnp.bfloat16)
    check_forward(case)
    check_grads(case)


@pytest.mark.parametrize("dim", [64, 512])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
@pytest.mark.parametrize("source, token", [("q", 5), ("k", 9), ("v", 9)])
def test_nan_propagates(key, dtype, dim, source, token):
    # As test_small_seq_forward.test_nan_propagates, on the CUDA kernels (fmaxf drops a
    # NaN from the chunk max; exp2 of it still makes the row's sum NaN).
    case = thd_case(key, [1, 2, 3, 4, 5], q_lens=[2] * 5, heads=(2, 2), dim=dim, dtype=dtype)
    check_nan(case, source, token, 1)
