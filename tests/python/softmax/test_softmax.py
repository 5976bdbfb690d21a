"""fusedattn.softmax on the CPU: forward and backward against the float64 reference for
every SoftmaxFusionType and dtype, odd and long rows, broadcast masks, rows that keep
nothing; every output element written (outputs poisoned with NaN through out_init);
the kernel (not the fallback) is what runs; jit, vmap, grad."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import DTYPES, pairwise
from softmax_helpers import CAUSAL, MASKED, SCALED, check, random_inputs, reference

sm = importlib.import_module("fusedattn.softmax")  # the module (fusedattn.softmax is the function)

# shape -> mask shape (SCALED_MASKED) : odd rows, long rows, rank 3, broadcast patterns.
SHAPES = {
    "2x3x5x7": ((2, 3, 5, 7), (2, 1, 5, 7)),
    "1x2x17x1": ((1, 2, 17, 1), (1, 2, 17, 1)),
    "2x2x9x33": ((2, 2, 9, 33), (1, 2, 9, 33)),
    "1x2x8x1000": ((1, 2, 8, 1000), (1, 1, 8, 1000)),
    "1x1x4x4099": ((1, 1, 4, 4099), (1, 1, 1, 4099)),
    "1x2x3x20000": ((1, 2, 3, 20000), (1, 2, 1, 20000)),
    "2x4x64x64": ((2, 4, 64, 64), (2, 4, 64, 64)),
}
KINDS = [SCALED, MASKED, CAUSAL]
GRID = [pytest.param(d, k, s, id=f"{jnp.dtype(d).name}-{k.name}-{s}")
        for d, k, s in pairwise(DTYPES, KINDS, SHAPES)]


@pytest.mark.parametrize("dtype, kind, shape", GRID)
def test_forward_backward_grid(key, dtype, kind, shape):
    shape, mask_shape = SHAPES[shape]
    x, dy, mask = random_inputs(key, shape, dtype, mask_shape if kind == MASKED else None)
    check(x, mask, 0.8, kind, dy)


@pytest.mark.parametrize("mask_shape", [(3, 4, 6, 40), (3, 1, 6, 40), (1, 4, 6, 40),
                                        (3, 4, 1, 40), (1, 1, 6, 40), (1, 1, 1, 40)],
                         ids=lambda s: "x".join(map(str, s)))
def test_mask_broadcasts(key, mask_shape):
    x, dy, mask = random_inputs(key, (3, 4, 6, 40), jnp.bfloat16, mask_shape)
    check(x, mask, 0.5, MASKED, dy)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_fully_masked_rows_give_zeros(key, dtype):
    x, dy, mask = random_inputs(key, (2, 3, 6, 50), dtype, (2, 1, 6, 50))
    mask = mask.at[0, 0, 2].set(True).at[1, 0, 5].set(True).at[1, 0, 0].set(False)
    y, _ = reference(x, mask, 1.0, MASKED)
    assert (y[0, :, 2] == 0).all() and (y[1, :, 5] == 0).all()
    check(x, mask, 1.0, MASKED, dy)


@pytest.mark.parametrize("shape", [(2, 3, 33, 33), (6, 40, 40), (1, 2, 9, 30), (1, 2, 30, 9)],
                         ids=lambda s: "x".join(map(str, s)))
def test_causal_shapes(key, shape):
    """Square, rank 3 ([B*H, S, S]) and non-square (top-left: row i keeps j <= i)."""
    x, dy, _ = random_inputs(key, shape, jnp.float16)
    check(x, None, 0.3, CAUSAL, dy)


@pytest.mark.parametrize("scale", [1.0, 0.0, -1.5, 1e-3, 40.0])
def test_scales(key, scale):
    x, dy, _ = random_inputs(key, (2, 2, 5, 300), jnp.float32)
    check(x, None, scale, SCALED, dy)


def test_kernel_and_fallback_agree_on_inf_and_nan():
    """-inf logits are dropped (an all -inf row is 0), a NaN or +inf logit makes its row NaN:
    the same on the kernel and on the pure-JAX fallback."""
    x = np.tile(np.linspace(-1, 1, 16, dtype=np.float32), (1, 1, 4, 1))
    x[0, 0, 0, :] = -np.inf
    x[0, 0, 1, 3] = -np.inf
    x[0, 0, 2, 5] = np.nan
    x[0, 0, 3, 7] = np.inf
    y = np.asarray(fusedattn.softmax(x, None, 1.0, SCALED))
    y_fb = np.asarray(fusedattn.softmax_fallback(jnp.asarray(x), None, 1.0, SCALED))
    assert (y[0, 0, 0] == 0).all()
    assert y[0, 0, 1, 3] == 0 and abs(y[0, 0, 1].sum() - 1) < 1e-6
    assert np.isnan(y[0, 0, 2]).all() and np.isnan(y[0, 0, 3]).all()
    np.testing.assert_allclose(y, y_fb, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_element_is_written(key, kind):
    """The FFI kernels write into an output pre-filled with NaN (out_init aliased to it)."""
    x, dy, mask = random_inputs(key, (2, 3, 7, 45), jnp.bfloat16,
                                (2, 1, 7, 45) if kind == MASKED else None)
    cfg = sm._check(x, mask, 0.7, kind)
    assert "cpu" in cfg.kernel_on
    nan = jnp.full(x.shape, jnp.nan, x.dtype)
    y = jax.jit(lambda x, m, o: sm._fwd_ffi(x, m, cfg, out_init=o))(x, mask, nan)
    dx = jax.jit(lambda y, d, o: sm._bwd_ffi(y, d, cfg, out_init=o))(y, dy, nan)
    assert not np.isnan(np.asarray(y, np.float32)).any()
    assert not np.isnan(np.asarray(dx, np.float32)).any()
    check(x, mask, 0.7, kind, dy, y, dx)


def hlo(f, *args):
    return jax.jit(f).lower(*args).compile().as_text()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_the_cpu_kernel_runs(key, kind):
    x, dy, mask = random_inputs(key, (1, 2, 4, 64), jnp.float32,
                                (1, 1, 4, 64) if kind == MASKED else None)
    fwd = hlo(lambda x: fusedattn.softmax(x, mask, 1.0, kind), x)
    bwd = hlo(jax.grad(lambda x: jnp.sum(fusedattn.softmax(x, mask, 1.0, kind) * dy)), x)
    assert "fusedattn_softmax_fwd" in fwd
    assert "fusedattn_softmax_fwd" in bwd and "fusedattn_softmax_bwd" in bwd


def test_float64_runs_the_fallback(key):
    with jax.enable_x64(True):
        x = jax.random.normal(key, (2, 2, 5, 9), jnp.float64)
        assert not fusedattn.is_softmax_kernel_available("scaled", 2, 2, 5, 9, jnp.float64,
                                                        platform="cpu")
        f = lambda x: fusedattn.softmax(x, None, 0.5, CAUSAL)
        assert "fusedattn_softmax" not in hlo(f, x)
        dy = jax.random.normal(jax.random.fold_in(key, 1), x.shape, jnp.float64)
        y, vjp = jax.vjp(f, x)
        y_ref, dx_ref = reference(np.asarray(x), None, 0.5, CAUSAL, np.asarray(dy))
        np.testing.assert_allclose(np.asarray(y), y_ref, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(vjp(dy)[0]), dx_ref, rtol=1e-6, atol=1e-7)


def test_vmap_over_a_batch_of_masked_calls(key):
    """vmap adds a leading dim to logits and mask (the handler folds it into the rows);
    the mask keeps its head broadcast inside the batch."""
    x, dy, mask = random_inputs(key, (3, 2, 4, 6, 40), jnp.float32, (3, 2, 1, 6, 40))
    f = jax.vmap(lambda x, m: fusedattn.softmax(x, m, 0.9, MASKED))
    y = jax.jit(f)(x, mask)
    y_ref, _ = reference(x, mask, 0.9, MASKED)
    np.testing.assert_allclose(np.asarray(y), y_ref, rtol=1e-5, atol=1e-6)
    # An unbatched mask, shared by the whole vmapped batch.
    g = jax.vmap(lambda x: fusedattn.softmax(x, mask[0], 0.9, MASKED))
    np.testing.assert_allclose(np.asarray(jax.jit(g)(x)),
                               reference(x, mask[:1], 0.9, MASKED)[0], rtol=1e-5, atol=1e-6)
    dx = jax.jit(jax.vmap(jax.grad(lambda x, m, d: jnp.sum(
        fusedattn.softmax(x, m, 0.9, MASKED) * d))))(x, mask, dy)
    np.testing.assert_allclose(np.asarray(dx), reference(x, mask, 0.9, MASKED, dy)[1],
                               rtol=1e-5, atol=1e-6)


def test_grad_of_a_loss_through_softmax(key):
    """jax.grad end to end (the custom_vjp inside a larger function), against the fallback's
    own autodiff: the two backward formulas agree."""
    x, _, mask = random_inputs(key, (2, 2, 8, 24), jnp.float32, (2, 1, 8, 24))
    w = jax.random.normal(jax.random.fold_in(key, 7), (24, 5))

    def loss(f, x):
        return jnp.sum(jnp.tanh(f(x, mask, 0.6, MASKED) @ w))

    g = jax.jit(jax.grad(lambda x: loss(fusedattn.softmax, x)))(x)
    g_fb = jax.jit(jax.grad(lambda x: loss(fusedattn.softmax_fallback, x)))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_fb), rtol=1e-5, atol=1e-6)


def test_same_bits_for_any_thread_count(key, set_threads):
    x, dy, mask = random_inputs(key, (4, 3, 33, 300), jnp.bfloat16, (4, 1, 33, 300))
    run = jax.jit(lambda x, m, d: jax.vjp(lambda x: fusedattn.softmax(x, m, 0.3, MASKED), x)[1](d))
    results = []
    for n in (1, 2):
        set_threads(n)
        results.append(np.asarray(run(x, mask, dy)[0], np.float32))
    np.testing.assert_array_equal(results[0], results[1])
