"""Statistics: return_max_logit / return_aux.

aux["max_logit"] f32 [Hq]: max over batch, queries and kept keys of the scaled logits
(the reference gives it per batch entry, [B, Hq]). aux["softmax_aux"] f32 [B, Hq, Sq, 1]:
the log-sum-exp of each row, -inf where a row keeps no key. Neither carries a gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (ALL_MASKS, DTYPES, assert_lse_close, fused, loss_fn, normal,
                      padded_rows, qkv, reference_f32)
from fusedattn import AttnMaskType

FLAGS = {"max_logit": dict(return_max_logit=True), "aux": dict(return_aux=True),
         "both": dict(return_max_logit=True, return_aux=True)}


def _lens(mask, Sq, Skv):
    # Batch 0 has no queries, batch 1 keeps 2 keys: bottom-right masks some of its rows too.
    return ([0, Sq - 5], [Skv, 2]) if mask.is_padding() else (None, None)


def _grid():
    """Every mask meets every flag set and every dtype (the dtype rotates)."""
    for i, mask in enumerate(ALL_MASKS):
        for j, (name, flags) in enumerate(FLAGS.items()):
            dtype = DTYPES[(i + j) % len(DTYPES)]
            yield pytest.param(mask, dtype, flags, id=f"{mask.name}-{jnp.dtype(dtype).name}-{name}")


@pytest.mark.parametrize("mask, dtype, flags", list(_grid()))
def test_stats(key, mask, dtype, flags):
    B, Sq, Skv, Hq = 2, 75, 50, 4
    q_lens, kv_lens = _lens(mask, Sq, Skv)
    q, k, v = qkv(key, B, Sq, Skv, Hq, 2, 32, dtype=dtype)
    (out, aux), (_, ref_lse, ref_max) = jax.jit(lambda q, k, v: (
        fused(q, k, v, mask, q_lens, kv_lens, **flags),
        reference_f32(q, k, v, mask, q_lens, kv_lens)))(q, k, v)

    expected = {n for n, f in (("max_logit", "return_max_logit"), ("softmax_aux", "return_aux"))
                if flags.get(f)}
    assert set(aux) == expected
    # The statistics are float32 math on the (rounded) inputs in every dtype.
    if "max_logit" in aux:
        assert aux["max_logit"].dtype == jnp.float32 and aux["max_logit"].shape == (Hq,)
        assert_lse_close("max_logit", aux["max_logit"], jnp.max(ref_max, axis=0))
    if "softmax_aux" in aux:
        lse = aux["softmax_aux"]
        assert lse.dtype == jnp.float32 and lse.shape == (B, Hq, Sq, 1)
        assert_lse_close("softmax_aux", lse[..., 0], ref_lse)
        empty = padded_rows(mask, B, Sq, Skv, q_lens, kv_lens)  # [B, Sq]
        assert np.isneginf(np.asarray(lse)[..., 0].transpose(0, 2, 1)[empty]).all()
    empty = padded_rows(mask, B, Sq, Skv, q_lens, kv_lens)
    if mask.is_padding() or mask == AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK:
        assert empty.any(), "the case must have fully masked rows"
    assert not np.asarray(out, np.float32)[empty].any(), "fully masked rows must give 0"


def test_nothing_kept_anywhere(key):
    # Every row of every batch entry is padding: max_logit -inf, lse -inf, out 0.
    q, k, v = qkv(key, 2, 20, 30, 2, 1, 16)
    out, aux = jax.jit(lambda q, k, v: fused(q, k, v, AttnMaskType.PADDING_MASK, [0, 20], [30, 0],
                                             return_max_logit=True, return_aux=True))(q, k, v)
    assert np.isneginf(np.asarray(aux["max_logit"])).all()
    assert np.isneginf(np.asarray(aux["softmax_aux"])).all()
    assert not np.asarray(out).any()


def test_asking_for_stats_leaves_out_unchanged(key):
    # Asking for statistics changes nothing about out.
    q, k, v = qkv(key, 2, 40, 40, 2, 2, 32, dtype=jnp.bfloat16)
    plain, (with_stats, _) = jax.jit(lambda q, k, v: (
        fused(q, k, v, AttnMaskType.CAUSAL_MASK),
        fused(q, k, v, AttnMaskType.CAUSAL_MASK, return_max_logit=True, return_aux=True)))(q, k, v)
    np.testing.assert_array_equal(np.asarray(plain, np.float32),
                                  np.asarray(with_stats, np.float32))


@pytest.mark.parametrize("mask", [AttnMaskType.CAUSAL_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK],
                         ids=lambda m: m.name)
def test_stats_carry_no_gradient(key, mask):
    Sq, Skv = 48, 40
    q_lens, kv_lens = _lens(mask, Sq, Skv)
    kx, kd = jax.random.split(key)
    q, k, v = qkv(kx, 2, Sq, Skv, 2, 1, 16)
    dout = normal(kd, (2, Sq, 2, 16))

    def stats_only(q, k, v):
        _, aux = fused(q, k, v, mask, q_lens, kv_lens, return_max_logit=True, return_aux=True)
        finite = lambda x: jnp.where(jnp.isfinite(x), x, 0.0)
        return jnp.sum(finite(aux["max_logit"])) + jnp.sum(finite(aux["softmax_aux"]))

    def out_and_stats(q, k, v):
        out, _ = fused(q, k, v, mask, q_lens, kv_lens, return_max_logit=True, return_aux=True)
        return jnp.sum(out * dout) + stats_only(q, k, v)

    def out_only(q, k, v):
        return loss_fn(lambda *x: fused(*x, mask, q_lens, kv_lens), dout)(q, k, v)

    g = lambda f: jax.grad(f, argnums=(0, 1, 2))(q, k, v)
    zero, mixed, plain = jax.jit(lambda: (g(stats_only), g(out_and_stats), g(out_only)))()
    for name, z, m, p in zip(("dq", "dk", "dv"), zero, mixed, plain):
        assert not np.asarray(z).any(), f"{name} of the statistics must be 0"
        np.testing.assert_array_equal(np.asarray(m), np.asarray(p), err_msg=name)
