"""Sliding windows window_size=(left, right), -1 unbounded: key j is kept for query i when
i + diag - left <= j <= i + diag + right (diag: 0, or kv_len - q_len for the bottom-right
masks; a causal mask makes right 0)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import ALL_MASKS, DTYPES, LENS_PATTERNS, qkv
from conftest import descriptor as desc
from features import Spec, check
from fusedattn import AttnMaskType

WINDOWS = [(0, 0), (7, 0), (16, 3), (-1, 5), (40, -1)]
SHAPES = {"sq<skv": (50, 130), "sq>skv": (130, 50), "sq=skv": (96, 96)}


def _grid():
    n = 0
    for mask in ALL_MASKS:
        for w in WINDOWS:
            shape = list(SHAPES)[n % 3]
            dtype = DTYPES[n % 3] if n % 4 == 0 else jnp.float32
            n += 1
            yield pytest.param(mask, w, shape, dtype,
                               id=f"{mask.name}-{w[0]}_{w[1]}-{shape}-{jnp.dtype(dtype).name}")


@pytest.mark.parametrize("mask, window, shape, dtype", list(_grid()))
def test_window_against_reference(key, mask, window, shape, dtype):
    Sq, Skv = SHAPES[shape]
    sd = desc(*LENS_PATTERNS["ragged"](Sq, Skv)) if mask.is_padding() else None
    check(key, Spec(dtype=dtype, mask=mask, Sq=Sq, Skv=Skv, Hq=2, Hkv=1, D=16, sd=sd,
                    window=window))


def test_window_equivalences(key):
    q, k, v = qkv(key, 2, 90, 90, 2, 2, 16)
    f = lambda mask, w: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                             window_size=w)
    same = lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    same(f(AttnMaskType.NO_MASK, (-1, 0)), f(AttnMaskType.CAUSAL_MASK, None))
    same(f(AttnMaskType.NO_MASK, (-1, -1)), f(AttnMaskType.NO_MASK, None))
    same(f(AttnMaskType.CAUSAL_MASK, (-1, 9)), f(AttnMaskType.CAUSAL_MASK, None))
    same(f(AttnMaskType.NO_MASK, (200, 200)), f(AttnMaskType.NO_MASK, None))
    # (0, 0): each query sees only its own key, so the output is v.
    np.testing.assert_allclose(np.asarray(f(AttnMaskType.NO_MASK, (0, 0))), np.asarray(v),
                               rtol=1e-6)
