"""fusedattn.softmax on an NVIDIA GPU (pytest -m gpu; skipped without one): the CUDA
kernels against the float64 reference at every launch-configuration boundary of the row
length (launch.cuh), aligned and odd, in each dtype and SoftmaxFusionType; outputs
poisoned with NaN (out_init aliased), so an element no thread writes shows; the compiled
program must contain our custom call (the CUDA kernel ran, not the fallback); rows past
the kernel's limit take the fallback and are still right."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from softmax_helpers import CAUSAL, MASKED, SCALED, check, random_inputs, reference

pytestmark = pytest.mark.gpu
sm = importlib.import_module("fusedattn.softmax")

KINDS = [SCALED, MASKED, CAUSAL]
# Row lengths around every (threads per row, bytes per thread) switch of launch.cuh,
# in elements; the odd ones run the scalar (unaligned) kernels.
LENGTHS = {
    jnp.float32: [1, 3, 4, 5, 8, 17, 32, 64, 127, 128, 129, 255, 256, 257, 511, 512, 1000,
                  1024, 2047, 2048, 4096, 4099, 8192, 8193, 16383, 16384],
    jnp.bfloat16: [1, 2, 7, 8, 16, 33, 64, 128, 255, 256, 512, 513, 1000, 1024, 2048, 2049,
                   4096, 8191, 8192, 16383, 16384, 16392, 24576, 32768],
    jnp.float16: [1, 9, 64, 256, 1024, 2050, 4096, 16384, 16392, 32768],
}
# The kind rotates along the lengths (each length once: the whole grid would compile 180
# programs); test_causal_square and the mask tests add the kinds' own coverage.
GRID = [pytest.param(d, n, KINDS[i % 3], id=f"{jnp.dtype(d).name}-{n}-{KINDS[i % 3].name}")
        for d, lengths in LENGTHS.items() for i, n in enumerate(lengths)]


def gpu_run(x, mask, scale, kind, dy):
    """(y, dx) from the CUDA kernels directly, each output pre-filled with NaN."""
    cfg = sm._check(x, mask, scale, kind)
    assert "cuda" in cfg.kernel_on, "the CUDA kernel should serve this call"
    nan = lambda: jnp.full(x.shape, jnp.nan, x.dtype)
    y = jax.jit(lambda x, m, o: sm._fwd_ffi(x, m, cfg, out_init=o))(x, mask, nan())
    dx = jax.jit(lambda y, d, o: sm._bwd_ffi(y, d, cfg, out_init=o))(y, dy, nan())
    return y, dx


@pytest.mark.parametrize("dtype, skv, kind", GRID)
def test_row_lengths(key, dtype, skv, kind):
    # 2 x 3 x 5 rows: several row groups per block and a partly filled last one; causal
    # rows keep 1..5 elements (the whole row when it is shorter).
    shape = (2, 3, 5, skv)
    x, dy, mask = random_inputs(key, shape, dtype, (2, 1, 5, skv) if kind == MASKED else None)
    y, dx = gpu_run(x, mask, 0.7, kind, dy)
    check(x, mask, 0.7, kind, dy, y, dx)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16],
                         ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("s", [33, 256, 1000, 2048, 4104])
def test_causal_square(key, dtype, s):
    """Every diagonal position of a row: [B*H, S, S], the causal variant's rank-3 form."""
    x, dy, _ = random_inputs(key, (2, s, s), dtype)
    y, dx = gpu_run(x, None, 0.125, CAUSAL, dy)
    check(x, None, 0.125, CAUSAL, dy, y, dx)


@pytest.mark.parametrize("dtype, s", [(jnp.float32, 16384), (jnp.bfloat16, 32768)],
                         ids=["float32-16384", "bfloat16-32768"])
def test_causal_square_longest_rows(key, dtype, s):
    """The longest rows a kernel holds, square causal: every element checked on the device
    (no NaN, zeros past the diagonal), values on a sample of rows against the reference."""
    x, dy, _ = random_inputs(key, (1, s, s), dtype)
    y, dx = gpu_run(x, None, 0.1, CAUSAL, dy)
    upper = jnp.arange(s)[None, :] > jnp.arange(s)[:, None]
    for name, out in (("y", y), ("dx", dx)):
        assert not bool(jnp.isnan(out).any()), f"{name}: NaN (an element left unwritten)"
        assert not bool(jnp.where(upper, out, 0).any()), f"{name}: nonzero past the diagonal"
    rows = np.array([0, 1, 7, 8, 9, 255, 1023, 1024, s // 2 - 1, s // 2, s - 9, s - 2, s - 1])
    take = lambda a: a[:, rows, :]
    check(take(x), None, 0.1, CAUSAL, take(dy), take(y), take(dx), q_index=rows)


@pytest.mark.parametrize("mask_shape", [(3, 4, 6, 520), (3, 1, 6, 520), (1, 4, 1, 520),
                                        (1, 1, 1, 520)], ids=lambda s: "x".join(map(str, s)))
def test_mask_broadcasts(key, mask_shape):
    x, dy, mask = random_inputs(key, (3, 4, 6, 520), jnp.bfloat16, mask_shape)
    y, dx = gpu_run(x, mask, 0.5, MASKED, dy)
    check(x, mask, 0.5, MASKED, dy, y, dx)


@pytest.mark.parametrize("shape, dtype", [
    ((2, 16, 2048, 40), jnp.float32),     # 16 heads a row group, several groups a block
    ((2, 16, 2048, 520), jnp.bfloat16),   # 16 heads, a warp per row
    ((1, 4, 4096, 2048), jnp.bfloat16),   # 4 heads, a 128-thread block per row
    ((1, 2, 4096, 4104), jnp.float32),    # 2 heads, 1024-thread blocks
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else jnp.dtype(v).name)
def test_heads_share_the_mask_row(key, shape, dtype):
    """Calls large enough that a row group loops over the heads sharing a [B, 1, Sq, Skv]
    mask row (kernels.cuh mask_reps; small calls keep one row a group)."""
    b, _, sq, skv = shape
    x, dy, mask = random_inputs(key, shape, dtype, (b, 1, sq, skv))
    y, dx = gpu_run(x, mask, 0.3, MASKED, dy)
    check(x, mask, 0.3, MASKED, dy, y, dx)


@pytest.mark.parametrize("skv", [40, 1030, 2048, 16392, 32768])
def test_fully_masked_rows_give_zeros(key, skv):
    x, dy, mask = random_inputs(key, (2, 3, 4, skv), jnp.bfloat16, (2, 1, 4, skv))
    mask = mask.at[0, 0, 1].set(True).at[1, 0, 3].set(True)
    y, dx = gpu_run(x, mask, 1.0, MASKED, dy)
    assert not np.asarray(y, np.float32)[0, :, 1].any()
    check(x, mask, 1.0, MASKED, dy, y, dx)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_softmax_runs_the_cuda_kernel(key, kind):
    """softmax() and its gradient compile to our custom calls on the GPU."""
    x, dy, mask = random_inputs(key, (2, 4, 64, 2048), jnp.bfloat16,
                                (2, 1, 64, 2048) if kind == MASKED else None)
    f = lambda x: fusedattn.softmax(x, mask, 0.125, kind)
    g = jax.grad(lambda x: jnp.sum(f(x).astype(jnp.float32) * dy.astype(jnp.float32)))
    fwd_hlo = jax.jit(f).lower(x).compile().as_text()
    bwd_hlo = jax.jit(g).lower(x).compile().as_text()
    assert 'custom_call_target="fusedattn_softmax_fwd"' in fwd_hlo
    assert 'custom_call_target="fusedattn_softmax_bwd"' in bwd_hlo
    assert x.devices() == {jax.devices("gpu")[0]}
    check(x, mask, 0.125, kind, dy)  # end to end through softmax() and jax.vjp


@pytest.mark.parametrize("dtype, skv", [(jnp.float32, 16392), (jnp.bfloat16, 32776),
                                        (jnp.bfloat16, 16385)])
def test_rows_past_the_limit_take_the_fallback(key, dtype, skv):
    x, dy, _ = random_inputs(key, (1, 2, 3, skv), dtype)
    assert not fusedattn.is_softmax_kernel_available("scaled", 1, 2, 3, skv, dtype)
    hlo = jax.jit(lambda x: fusedattn.softmax(x, None, 0.5)).lower(x).compile().as_text()
    assert "fusedattn_softmax" not in hlo
    check(x, None, 0.5, SCALED, dy)


def test_vmap_on_the_gpu(key):
    x, dy, mask = random_inputs(key, (3, 2, 4, 6, 1024), jnp.float32, (3, 2, 1, 6, 1024))
    f = jax.jit(jax.vmap(lambda x, m: fusedattn.softmax(x, m, 0.9, MASKED)))
    np.testing.assert_allclose(np.asarray(f(x, mask)), reference(x, mask, 0.9, MASKED)[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16],
                         ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("skv", [5, 128, 1000, 4099, 16384])
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_nan_logits_give_nan_rows(key, dtype, skv, kind):
    # As jax.nn.softmax: a NaN among a row's kept logits makes the whole row NaN (y and dx),
    # an all-NaN row too (its max is -inf once fmaxf drops every NaN); a NaN at a masked
    # (or, causal, an upper-triangle) position changes nothing; other rows stay right.
    x, dy, mask = random_inputs(key, (1, 2, 4, skv), dtype, (1, 1, 4, skv) if kind == MASKED else None)
    x = x.at[0, 0, 1, skv // 2].set(jnp.nan).at[0, 0, 2, :].set(jnp.nan)
    if kind == MASKED:  # the NaN of row 1 and element 0 of row 2 kept
        mask = mask.at[0, 0, 1, skv // 2].set(False).at[0, 0, 2, 0].set(False)
    if skv > 4:  # row 3: NaN in its last element, which the mask (or causality) drops
        x = x.at[0, 1, 3, skv - 1].set(jnp.nan)
        if kind == MASKED:
            mask = mask.at[0, 0, 3, skv - 1].set(True)
    y, dx = gpu_run(x, mask, 0.7, kind, dy)
    y, dx = np.asarray(y, np.float32), np.asarray(dx, np.float32)
    nan_rows = np.zeros((1, 2, 4), bool)
    nan_rows[0, 0, 2] = True
    nan_rows[0, 0, 1] = kind != CAUSAL or skv // 2 <= 1
    if skv > 4:
        nan_rows[0, 1, 3] = kind == SCALED
    np.testing.assert_array_equal(np.isnan(y).any(-1), nan_rows)
    first = np.isnan(y[..., 0])  # the NaN rows keep element 0: all their kept elements NaN
    np.testing.assert_array_equal(first, nan_rows)
    np.testing.assert_array_equal(np.isnan(dx).any(-1), nan_rows)
    y_fb = np.asarray(fusedattn.softmax_fallback(x, mask, 0.7, kind), np.float32)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(y_fb))
    ok = ~nan_rows
    np.testing.assert_allclose(y[ok], y_fb[ok], rtol=2e-2 if dtype != jnp.float32 else 1e-5,
                               atol=1e-2 if dtype != jnp.float32 else 1e-6)
