"""Plain-jnp references of the fusedattn.flax tests: attention, rotary embeddings and the
multi-head block, written from the definitions (no fusedattn, no Flax attention)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def attention(q, k, v, *, causal=False, scale=None, bias=None, sink=None, keep=None):
    """q [B, Sq, Hq, D], k / v [B, Skv, Hkv, D] -> [B, Sq, Hq, D] by the softmax over
    materialized logits. causal: top-left (j <= i); keep: bool [B|1, H|1, Sq, Skv];
    sink: f32 [Hq], an extra logit in every row's denominator (LEARNABLE softmax)."""
    B, Sq, Hq, D = q.shape
    g = Hq // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (D ** -0.5 if scale is None else scale)
    if bias is not None:
        s = s + bias
    mask = jnp.ones(s.shape, bool)
    if causal:
        mask &= jnp.tril(jnp.ones((Sq, k.shape[1]), bool))
    if keep is not None:
        mask &= keep
    s = jnp.where(mask, s, -jnp.inf)
    if sink is not None:
        col = jnp.broadcast_to(sink[None, :, None, None], s.shape[:3] + (1,))
        p = jax.nn.softmax(jnp.concatenate([s, col], -1), axis=-1)[..., :-1]
    else:
        p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def rotary(x, positions, base=10000.0):
    """RoPE by complex numbers: feature i and i + D/2 are one complex number, turned by
    e^{i * pos * base^(-2i/D)}. x [B, S, H, D], positions [S] or [B, S]."""
    d = x.shape[-1]
    z = x[..., :d // 2] + 1j * x[..., d // 2:]
    theta = np.asarray(positions, np.float64)[..., None] * base ** (-np.arange(0, d, 2) / d)
    theta = theta[None] if theta.ndim == 2 else theta                    # [B|1, S, D/2]
    z = z * np.exp(1j * theta)[:, :, None, :]
    return jnp.concatenate([z.real, z.imag], -1).astype(x.dtype)


def mha(params, x, *, heads, kv_heads, head_dim, causal=True, rope_positions=None,
        sink=None, x_kv=None, kv_rope_positions=None):
    """The multi-head block from its parameters (fusedattn.flax's names):
    'qkv' [E, 3, H, D] or 'query' [E, Hq, D] + 'kv' [E, 2, Hkv, D] or 'query' / 'key' /
    'value'; 'out' [Hq, D, E]. x_kv: cross-attention's keys / values input (their kernels
    [E_kv, ...]; RoPE at kv_rope_positions)."""
    xkv = x if x_kv is None else x_kv
    if "qkv" in params:
        qkv = jnp.einsum("bse,ethd->bsthd", x, params["qkv"])
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q = jnp.einsum("bse,ehd->bshd", x, params["query"])
        if "kv" in params:
            kv = jnp.einsum("bse,ethd->bsthd", xkv, params["kv"])
            k, v = kv[:, :, 0], kv[:, :, 1]
        else:
            k = jnp.einsum("bse,ehd->bshd", xkv, params["key"])
            v = jnp.einsum("bse,ehd->bshd", xkv, params["value"])
    if rope_positions is not None:
        q = rotary(q, rope_positions)
        k = rotary(k, rope_positions if x_kv is None else kv_rope_positions)
    o = attention(q, k, v, causal=causal, sink=sink)
    return jnp.einsum("bshd,hde->bse", o, params["out"])


def assert_close(name, got, want, rel=1e-5):
    """max |got - want| <= rel * max(1, max |want|) (float32 rounding)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert np.isfinite(got).all(), f"{name}: not finite"
    err = np.max(np.abs(got - want))
    bound = rel * max(1.0, np.max(np.abs(want)))
    assert err <= bound, f"{name}: max |err| {err:.3g} > {bound:.3g}"
