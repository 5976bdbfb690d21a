"""What the softmax tests share: inputs, a float64 numpy reference, the low-precision
baseline of the tolerance rule, and a runner that checks forward and backward at once.

Reference (the definition in fusedattn/softmax.py, written again here in numpy float64):
s = scale * x on the elements a row keeps (SCALED: all; SCALED_MASKED: mask False;
SCALED_UPPER_TRIANG_MASKED: j <= i), y = exp(s - max) / sum on them, 0 elsewhere and on
rows that keep nothing; dx = scale * y * (dy - sum(y * dy)).

Tolerance: conftest's rule. float32 within ~1e-5; bf16/fp16 within 2x the error of the
same softmax computed by XLA in that precision (jax.nn.softmax and its vjp, inputs and
arithmetic in the low dtype) plus a small floor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from conftest import assert_close
from fusedattn import SoftmaxFusionType

SCALED = SoftmaxFusionType.SCALED
MASKED = SoftmaxFusionType.SCALED_MASKED
CAUSAL = SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED


def keep_np(shape, mask, kind, q_index=None):
    """bool array broadcast to shape: the elements a row keeps. q_index: the query index
    of each position of the second-to-last axis (default 0..Sq-1; a sample of rows of a
    larger call passes its own)."""
    if kind == MASKED:
        return np.broadcast_to(~np.asarray(mask, bool), shape)
    if kind == CAUSAL:
        i = (np.arange(shape[-2]) if q_index is None else np.asarray(q_index))[:, None]
        j = np.arange(shape[-1])[None, :]
        return np.broadcast_to(j <= i, shape)
    return np.ones(shape, bool)


def reference(x, mask, scale, kind, dy=None, q_index=None):
    """(y, dx) in float64 from the (already rounded) inputs; dx is None without dy."""
    x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    keep = keep_np(x.shape, mask, kind, q_index)
    s = np.where(keep, scale * x, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.where(keep, np.exp(s - m), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    y = e / np.where(total == 0, 1.0, total)
    if dy is None:
        return y, None
    dy = np.asarray(jnp.asarray(dy, jnp.float32), np.float64)
    dx = scale * y * (dy - (y * dy).sum(axis=-1, keepdims=True))
    return y, dx


def lowp_baseline(x, mask, scale, kind, dy, q_index=None):
    """(y, dx) by XLA in x.dtype: jax.nn.softmax of the scaled, masked logits and its vjp.
    Rows that keep nothing give 0 (not NaN) so the comparison stays finite."""
    dt = x.dtype
    keep = jnp.asarray(keep_np(x.shape, mask, kind, q_index))

    row_keeps = keep.any(axis=-1, keepdims=True)

    def f(x):
        s = jnp.where(keep, x * jnp.asarray(scale, dt), jnp.asarray(-jnp.inf, dt))
        s = jnp.where(row_keeps, s, jnp.zeros((), dt))  # finite, so its gradient is too
        return jnp.where(keep, jax.nn.softmax(s, axis=-1), jnp.zeros((), dt))

    y, vjp = jax.vjp(f, x)
    return y, vjp(dy.astype(dt))[0]


def random_inputs(key, shape, dtype, mask_shape=None, p_masked=0.3, stddev=2.0):
    """x ~ N(0, stddev^2) in dtype, dy ~ N(0, 1) in dtype, mask ~ Bernoulli(p) (or None)."""
    kx, kd, km = jax.random.split(key, 3)
    x = (stddev * jax.random.normal(kx, shape, jnp.float32)).astype(dtype)
    dy = jax.random.normal(kd, shape, jnp.float32).astype(dtype)
    mask = None if mask_shape is None else jax.random.bernoulli(km, p_masked, mask_shape)
    return x, dy, mask


def run_softmax(x, mask, scale, kind, dy):
    """(y, dx) of fusedattn.softmax under jit, the backward through jax.vjp."""
    @jax.jit
    def run(x, mask, dy):
        y, vjp = jax.vjp(lambda x: fusedattn.softmax(x, mask, scale, kind), x)
        return y, vjp(dy)[0]
    return run(x, mask, dy)


def check(x, mask, scale, kind, dy, y=None, dx=None, q_index=None):
    """Checks y and dx of fusedattn.softmax (computed here unless given) on these inputs:
    no NaN, exact zeros where a row keeps nothing or an element is dropped, close elsewhere.
    q_index: see keep_np (x, dy, y, dx are then rows sampled from a larger call)."""
    if y is None:
        y, dx = run_softmax(x, mask, scale, kind, dy)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert dx.dtype == x.dtype and dx.shape == x.shape
    y_ref, dx_ref = reference(x, mask, scale, kind, dy, q_index)
    lowp = ((None, None) if x.dtype == jnp.float32
            else lowp_baseline(x, mask, scale, kind, dy, q_index))
    assert_close("y", y, y_ref, lowp[0], dtype=x.dtype)
    assert_close("dx", dx, dx_ref, lowp[1], dtype=x.dtype)
    dropped = ~keep_np(x.shape, mask, kind, q_index)
    y32, dx32 = np.asarray(y, np.float32), np.asarray(dx, np.float32)
    assert not y32[dropped].any(), "y must be exactly 0 where an element is dropped"
    assert not dx32[dropped].any(), "dx must be exactly 0 where an element is dropped"
