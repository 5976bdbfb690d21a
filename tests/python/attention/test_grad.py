"""Backward: dq, dk, dv of fused_attn against jax.grad of attention_reference.

loss = sum(out * dout) with a random cotangent dout [B, Sq, Hq, Dv]; the gradients have
q's, k's and v's shapes and dtypes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (ALL_MASKS, DTYPES, LENS_PATTERNS, assert_close, fused, loss_fn, normal,
                      padded_rows, pairwise, qkv, reference_f32, reference_lowp, unused_keys)
from fusedattn import AttnMaskType

CASES = {
    "sq=skv,mha,d64": (96, 96, 2, 2, 64, 64, "ragged"),
    "sq<skv,mqa4,d256": (45, 133, 4, 1, 256, 256, "q0_full"),
    "sq>skv,gqa2,d16,dv32": (150, 70, 4, 2, 16, 32, "kv0"),
}
GRID = [pytest.param(d, m, c, id=f"{jnp.dtype(d).name}-{m.name}-{c}")
        for d, m, c in pairwise(DTYPES, ALL_MASKS, CASES)]


def grads(key, dtype, mask, Sq, Skv, Hq, Hkv, D, Dv, q_lens=None, kv_lens=None, scale=None):
    """Returns (q, k, v), fused grads, float32 reference grads, low-precision reference grads."""
    kx, kd = jax.random.split(key)
    q, k, v = qkv(kx, 2, Sq, Skv, Hq, Hkv, D, Dv, dtype)
    dout = normal(kd, (2, Sq, Hq, Dv), dtype)
    f32 = lambda x: x.astype(jnp.float32)

    @jax.jit
    def run(q, k, v, dout):
        g = lambda attn, *x: jax.grad(loss_fn(attn, dout), argnums=(0, 1, 2))(*x)
        return (g(lambda q, k, v: fused(q, k, v, mask, q_lens, kv_lens, scale), q, k, v),
                g(lambda q, k, v: reference_f32(q, k, v, mask, q_lens, kv_lens, scale)[0],
                  f32(q), f32(k), f32(v)),
                g(lambda q, k, v: reference_lowp(q, k, v, mask, q_lens, kv_lens, scale),
                  q, k, v))

    return (q, k, v), *run(q, k, v, dout)


def check_grads(inputs, got, ref, lowp):
    for name, x, g, r, l in zip(("dq", "dk", "dv"), inputs, got, ref, lowp):
        assert g.shape == x.shape and g.dtype == x.dtype, f"{name}: {g.shape} {g.dtype}"
        assert_close(name, g, r, l)


@pytest.mark.parametrize("dtype, mask, case", GRID)
def test_grad_grid(key, dtype, mask, case):
    Sq, Skv, Hq, Hkv, D, Dv, pattern = CASES[case]
    lens = LENS_PATTERNS[pattern](Sq, Skv) if mask.is_padding() else (None, None)
    check_grads(*grads(key, dtype, mask, Sq, Skv, Hq, Hkv, D, Dv, *lens))


def test_grad_scaling_factor(key):
    check_grads(*grads(key, jnp.float32, AttnMaskType.CAUSAL_MASK, 70, 70, 2, 1, 32, 32,
                       scale=0.7))


# Each leaves query rows with no key or keys with no query:
# q_len 0, kv_len 0, bottom-right causal with Sq > Skv, top-left causal with Sq < Skv.
FULLY_MASKED = {
    "padding,q0,kv0": (AttnMaskType.PADDING_MASK, 64, 80, [0, 50], [80, 0]),
    "padding_causal_br,q0,kv1": (AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 64, 80,
                                 [0, 64], [30, 1]),
    "padding_causal,kv0": (AttnMaskType.PADDING_CAUSAL_MASK, 70, 40, [70, 33], [0, 40]),
    "causal_br,sq>skv": (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 100, 37, None, None),
    "causal,sq<skv": (AttnMaskType.CAUSAL_MASK, 37, 100, None, None),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("case", FULLY_MASKED.values(), ids=FULLY_MASKED.keys())
def test_fully_masked_rows_have_finite_zero_grads(key, dtype, case):
    mask, Sq, Skv, q_lens, kv_lens = case
    inputs, got, ref, lowp = grads(key, dtype, mask, Sq, Skv, 4, 2, 32, 32, q_lens, kv_lens)
    for name, g in zip(("dq", "dk", "dv"), got):
        assert np.isfinite(np.asarray(g, np.float32)).all(), f"{name} is not finite"
    rows = padded_rows(mask, 2, Sq, Skv, q_lens, kv_lens)
    keys = unused_keys(mask, 2, Sq, Skv, q_lens, kv_lens)
    assert rows.any() or keys.any(), "the case must mask some rows or some keys"
    dq, dk, dv = (np.asarray(g, np.float32) for g in got)
    assert not dq[rows].any(), "dq must be 0 at query rows that keep no key"
    assert not dk[keys].any(), "dk must be 0 at keys that no query keeps"
    assert not dv[keys].any(), "dv must be 0 at keys that no query keeps"
    check_grads(inputs, got, ref, lowp)

