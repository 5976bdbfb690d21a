"""Plain-JAX reference of fused_attn_small_seq: gather each segment into a padded batch,
run fusedattn.attention_reference on it, scatter the rows back.

The segment rules are those of csrc/fusedattn/small_seq/segments.h: slot s of a THD
tensor is [offsets[s], offsets[s+1]) clamped to the tensor, a segment uses the first
min(len, slot) rows of its slot (a segment whose offset is below an earlier one uses
none: rule_slots, the rule of every backend), and rows no segment uses get output 0 (probabilities 0,
statistics -inf). max_q / max_kv bound the rows a segment may use here (static shapes):
give at least the largest length present, promise or not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .enums import AttnMaskType, QKVLayout
from .reference import attention_mask, attention_reference


def rule_slots(offsets, lens, tokens):
    """(offsets [..., N + 1], lengths [..., N]) int32 equivalent to the given ones under the
    descriptor rule of every backend (attention/mask.h): offsets clamped to [0, tokens]
    and made non-decreasing (their running max), a segment ending at the next offset and
    empty when its offset is below an earlier one. lens None: each segment its whole slot.
    Valid descriptors come back unchanged; small-seq's kernels then need no more rule."""
    o = jnp.clip(jnp.asarray(offsets, jnp.int32), 0, tokens)
    run = jax.lax.cummax(o, axis=o.ndim - 1)
    begin = o[..., :-1]
    in_order = begin >= jnp.concatenate([begin[..., :1], run[..., :-2]], axis=-1)
    end = jnp.where(in_order, o[..., 1:], begin)
    if lens is not None:
        end = jnp.minimum(end, begin + jnp.clip(jnp.asarray(lens, jnp.int32), 0, tokens))
    return run, jnp.maximum(end - begin, 0)


def _slots(offsets, lens, tokens):
    run, used = rule_slots(offsets, lens, tokens)
    return run[:-1], used


def _gather(x, start, used, rows):
    """x [T, H, D] -> [N, rows, H, D] (zeros past each segment's length), and the token
    index of every gathered row (T, out of range, where unused)."""
    pos = jnp.arange(rows)[None, :]
    idx = start[:, None] + pos
    valid = pos < used[:, None]
    safe = jnp.clip(idx, 0, x.shape[0] - 1)
    g = jnp.where(valid[..., None, None], x[safe], jnp.zeros((), x.dtype))
    return g, jnp.where(valid, idx, x.shape[0])


def _weights(q, k, mask_type, scale, q_lens, kv_lens, lse):
    """Attention weights [B, Hq, Sq, Skv] f32 and row max [B, Hq, Sq] of q [B, Sq, Hq, D]."""
    B, Sq, Hq, D = q.shape
    _, Skv, Hkv, _ = k.shape
    qf = q.astype(jnp.float32).reshape(B, Sq, Hkv, Hq // Hkv, D)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qf, k.astype(jnp.float32), precision="highest")
    s = s.reshape(B, Hq, Sq, Skv) * scale
    keep = attention_mask(mask_type, B, Sq, Skv, q_lens, kv_lens)
    m = jnp.max(jnp.where(keep, s, -jnp.inf), axis=-1)
    lse_safe = jnp.where(lse == -jnp.inf, 0.0, lse)[..., None]  # a NaN row stays NaN
    p = jnp.where(keep, jnp.exp(jnp.where(keep, s, 0.0) - lse_safe), 0.0)
    return p, m


def small_seq_reference(q, k, v, *, qkv_layout=QKVLayout.THD_THD_THD,
                        attn_mask_type=AttnMaskType.PADDING_MASK, scaling_factor=None,
                        q_seqlens=None, kv_seqlens=None, q_offsets=None, kv_offsets=None,
                        max_q=None, max_kv=None, width=None):
    """Returns (out like q, probs [T_q, H_q, 1, width] f32, stats [T_q, H_q, 2] f32).

    THD: q [T_q, H_q, D], k/v [T_kv, H_kv, D], offsets [N + 1], lengths [N] or None.
    BSHD: q [B, 1, H_q, D], k/v [B, S_kv, H_kv, D], lengths [B] or None (full).
    width: columns of probs (default: max_kv for THD, S_kv for BSHD).
    """
    mask = AttnMaskType(attn_mask_type)
    scale = q.shape[-1] ** -0.5 if scaling_factor is None else scaling_factor
    if QKVLayout(qkv_layout) == QKVLayout.BSHD_BSHD_BSHD:
        B, Sq, Hq, _ = q.shape
        Skv = k.shape[1]
        width = Skv if width is None else width
        q_lens = jnp.full((B,), Sq, jnp.int32) if q_seqlens is None else q_seqlens
        kv_lens = jnp.full((B,), Skv, jnp.int32) if kv_seqlens is None else kv_seqlens
        if not mask.is_padding():
            q_lens, kv_lens = jnp.full((B,), Sq, jnp.int32), jnp.full((B,), Skv, jnp.int32)
        out, lse, _ = attention_reference(q, k, v, attn_mask_type=mask, scaling_factor=scale,
                                          q_seqlens=q_lens, kv_seqlens=kv_lens)
        p, m = _weights(q, k, mask, scale, q_lens, kv_lens, lse)
        probs = jnp.moveaxis(p, 2, 1)  # [B, Sq, Hq, Skv]
        probs = jnp.pad(probs, ((0, 0),) * 3 + ((0, max(0, width - Skv)),))[..., :width]
        probs = probs.reshape(B * Sq, Hq, 1, width)
        stats = jnp.stack([jnp.moveaxis(m, 2, 1), jnp.moveaxis(lse, 2, 1)], -1)
        return out, probs, stats.reshape(B * Sq, Hq, 2)

    Tq, Hq, D = q.shape
    Tkv = k.shape[0]
    q_start, q_used = _slots(jnp.asarray(q_offsets), q_seqlens, Tq)
    kv_start, kv_used = _slots(jnp.asarray(kv_offsets), kv_seqlens, Tkv)
    width = max_kv if width is None else width
    qs, q_idx = _gather(q, q_start, q_used, max_q)
    ks, _ = _gather(k, kv_start, kv_used, max_kv)
    vs, _ = _gather(v, kv_start, kv_used, max_kv)
    out, lse, _ = attention_reference(qs, ks, vs, attn_mask_type=mask, scaling_factor=scale,
                                      q_seqlens=q_used, kv_seqlens=kv_used)
    p, m = _weights(qs, ks, mask, scale, q_used, kv_used, lse)

    flat = q_idx.reshape(-1)  # token of every (segment, row); Tq where unused: dropped
    out_t = jnp.zeros_like(q).at[flat].set(out.reshape(-1, Hq, D), mode="drop")
    probs = jnp.moveaxis(p, 2, 1)  # [N, max_q, Hq, max_kv]
    probs = jnp.pad(probs, ((0, 0),) * 3 + ((0, max(0, width - max_kv)),))[..., :width]
    probs_t = jnp.zeros((Tq, Hq, 1, width), jnp.float32).at[flat].set(
        probs.reshape(-1, Hq, 1, width), mode="drop")
    stats = jnp.stack([jnp.moveaxis(m, 2, 1), jnp.moveaxis(lse, 2, 1)], -1)
    stats_t = jnp.full((Tq, Hq, 2), -jnp.inf, jnp.float32).at[flat].set(
        stats.reshape(-1, Hq, 2), mode="drop")
    return out_t, probs_t, stats_t
