"""The plain-JAX reference of fused attention: materialized scores, float32 math.

Every backend is tested against it, and XLA runs it where no fused kernel
serves a call. Semantics (shared with csrc/fusedattn/cpu/mask.h):

* scores s = scaling_factor * q . k, per (batch, q head, query, key); q head h
  reads kv head h // (Hq // Hkv) (GQA/MQA).
* Row i keeps the keys j with lo_i <= j < hi_i: padding masks keep i < q_len[b]
  and j < kv_len[b]; CAUSAL keeps j <= i; CAUSAL_BOTTOM_RIGHT keeps
  j <= i + (kv_len - q_len).
* A row that keeps nothing gives output 0 and log-sum-exp -inf.
* max_logit [H] is the max of kept scores over batch, queries and keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .enums import AttnMaskType


def attention_mask(mask_type: AttnMaskType, batch: int, seqlen_q: int, seqlen_kv: int,
                   q_seqlens=None, kv_seqlens=None) -> jax.Array:
    """bool [B, 1, Sq, Skv], True = the key is kept."""
    mask_type = AttnMaskType(mask_type)
    if mask_type.is_padding():
        q_len = jnp.clip(jnp.asarray(q_seqlens, jnp.int32), 0, seqlen_q)
        kv_len = jnp.clip(jnp.asarray(kv_seqlens, jnp.int32), 0, seqlen_kv)
    else:
        q_len = jnp.full((batch,), seqlen_q, jnp.int32)
        kv_len = jnp.full((batch,), seqlen_kv, jnp.int32)
    i = jnp.arange(seqlen_q)[None, :, None]
    j = jnp.arange(seqlen_kv)[None, None, :]
    q_len = q_len[:, None, None]
    kv_len = kv_len[:, None, None]
    keep = (i < q_len) & (j < kv_len)
    if mask_type.is_causal():
        diag = kv_len - q_len if mask_type.is_bottom_right() else 0
        keep &= j <= i + diag
    return keep[:, None]


def attention_reference(q, k, v, *, attn_mask_type=AttnMaskType.NO_MASK, scaling_factor=None,
                        q_seqlens=None, kv_seqlens=None):
    """q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv].

    Returns (out [B, Sq, Hq, Dv] in q's dtype, lse [B, Hq, Sq] f32, max_logit [B, Hq] f32);
    max_logit is per batch entry here, fused_attn reduces it over the batch.
    """
    B, Sq, Hq, D = q.shape
    _, Skv, Hkv, _ = k.shape
    if scaling_factor is None:
        scaling_factor = D ** -0.5
    group = Hq // Hkv
    qf = q.astype(jnp.float32).reshape(B, Sq, Hkv, group, D)
    kf = k.astype(jnp.float32)
    vf = v.astype(jnp.float32)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qf, kf, precision="highest") * scaling_factor
    s = s.reshape(B, Hq, Sq, Skv)
    keep = attention_mask(attn_mask_type, B, Sq, Skv, q_seqlens, kv_seqlens)
    neg_inf = jnp.float32(-jnp.inf)
    m = jnp.max(jnp.where(keep, s, neg_inf), axis=-1, keepdims=True)
    row_kept = jnp.isfinite(m)
    m_safe = jax.lax.stop_gradient(jnp.where(row_kept, m, 0.0))
    # The inner where keeps masked entries out of exp (no inf, no NaN gradients).
    p = jnp.where(keep, jnp.exp(jnp.where(keep, s, 0.0) - m_safe), 0.0)
    l = jnp.sum(p, axis=-1, keepdims=True)
    l_safe = jnp.where(row_kept, l, 1.0)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", (p / l_safe).reshape(B, Hkv, group, Sq, Skv), vf,
                     precision="highest").reshape(B, Sq, Hq, -1)
    lse = jnp.where(row_kept, m_safe + jnp.log(l_safe), neg_inf)[..., 0]
    max_logit = jnp.max(m[..., 0], axis=-1)
    return out.astype(q.dtype), lse, max_logit
