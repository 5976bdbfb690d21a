"""NaN rows in cuDNN's backward: the reference's answer.

cuDNN's backward computes dS = P * (dP - D) over the masked keys too, where P is 0 but
dP = dout . v or D = dout . out may be NaN, and recomputes P = exp(S - lse) there with a
NaN lse: so a NaN row, or a NaN value row, spreads NaN to keys the mask hides. The
reference and the CPU engine keep a masked key's dS exactly 0. `nan_exact(bwd)` runs
cuDNN's backward with the NaN neutralized (rows whose lse is NaN get lse +inf, rows whose
output is NaN get out 0, NaN values become 0), then writes NaN where the reference has
it: for a row whose output is NaN, its dq, dk of the keys it keeps, dbias of its kept
logits and d softmax_offset of its head; for a row whose lse is NaN (P NaN), also dv of
the keys it keeps.

Off by default: FUSEDATTN_NAN_EXACT_BWD=1 (read when a call is traced) turns it on. Its
price on the H100 (dev/autodiff/README.md): +10% on a bf16 causal forward+backward at
B 4, S 4096, H 16, D 128, +37% at B 64, S 256, H 6, D 64, for elementwise passes over lse,
out, v and the gradients, and the keys a set of rows keeps, found from each row's key
interval (mask.h's segment_keys, below) by a difference array: O(B * H * (Sq + Skv)),
never the [Sq, Skv] mask. No branch: a lax.cond per backward made the host wait for the
device. Without it a NaN still comes out (NaN in, NaN out): cuDNN's gradients are NaN on
more keys than the reference's. BSHD layouts (THD goes through cuDNN's ragged path, which
needs no fix).
"""

from __future__ import annotations

import os

import jax.numpy as jnp

from ._prepare import KV_PACKED, N_OPS, QKV_PACKED
from .enums import AttnMaskType


def enabled() -> bool:
    return os.environ.get("FUSEDATTN_NAN_EXACT_BWD", "0") not in ("", "0")


def _poison(x, where):
    return jnp.where(where, jnp.asarray(jnp.nan, x.dtype), x)


def _v_slot(ops, layout):
    """(operand index, value view, put back): where the layout keeps v."""
    if layout in QKV_PACKED:   # qkv [B, S, 3, H, D]
        return 0, ops[0][:, :, 2], lambda x: ops[0].at[:, :, 2].set(x)
    if layout in KV_PACKED:    # kv [B, S, 2, H, D]
        return 1, ops[1][:, :, 1], lambda x: ops[1].at[:, :, 1].set(x)
    return 2, ops[2], lambda x: x


def row_keys(cfg, B: int, Sq: int, Skv: int, q_lens, kv_lens):
    """(lo, hi) int32 [B, Sq]: query i keeps keys [lo, hi) (mask.h's segment_keys for the
    one segment of a BSHD row; lo = hi = 0 for padding rows and rows that keep none)."""
    mask = AttnMaskType(cfg.mask_type)
    top_left = mask in (AttnMaskType.CAUSAL_MASK, AttnMaskType.PADDING_CAUSAL_MASK)
    bottom_right = mask in (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
                            AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)
    left = -1 if cfg.window[0] < 0 else min(cfg.window[0], Sq + Skv)
    right = 0 if top_left or bottom_right else (-1 if cfg.window[1] < 0
                                                else min(cfg.window[1], Sq + Skv))
    if mask.is_padding():
        ql = jnp.clip(jnp.asarray(q_lens, jnp.int32).reshape(B, -1)[:, :1], 0, Sq)
        kl = jnp.clip(jnp.asarray(kv_lens, jnp.int32).reshape(B, -1)[:, :1], 0, Skv)
    else:
        ql, kl = jnp.full((B, 1), Sq, jnp.int32), jnp.full((B, 1), Skv, jnp.int32)
    i = jnp.arange(Sq, dtype=jnp.int32)[None]
    pos = i + (kl - ql if bottom_right else jnp.zeros_like(ql))  # [B, Sq]
    reach = ql + kl
    lo = jnp.zeros_like(pos)
    hi = jnp.broadcast_to(kl, pos.shape)
    if left >= 0:
        lo = jnp.maximum(lo, pos - jnp.minimum(left, reach))
    if right >= 0:
        hi = jnp.minimum(hi, pos + jnp.minimum(right, reach) + 1)
    empty = (hi <= lo) | (i >= ql)
    return jnp.where(empty, 0, lo), jnp.where(empty, 0, hi)


def _keys_of(rows, lo, hi, Skv: int, Hkv: int):
    """rows bool [B, Hq, Sq] -> the keys some such row keeps, bool [B, Skv, Hkv, 1]."""
    B, Hq, Sq = rows.shape
    w = rows.astype(jnp.int32)
    b = jnp.arange(B)[:, None, None]
    h = jnp.arange(Hq)[None, :, None]
    d = jnp.zeros((B, Hq, Skv + 1), jnp.int32)
    d = d.at[b, h, jnp.broadcast_to(lo[:, None], rows.shape)].add(w)
    d = d.at[b, h, jnp.broadcast_to(hi[:, None], rows.shape)].add(-w)
    kept = jnp.cumsum(d[..., :Skv], axis=-1) > 0                         # [B, Hq, Skv]
    kept = kept.reshape(B, Hkv, Hq // Hkv, Skv).any(2)
    return jnp.swapaxes(kept, 1, 2)[..., None]


def _fix(grads, ops, rows_lse, rows_out, cfg, dims):
    """grads of the neutralized backward -> with NaN where the reference has it."""
    B, Sq, Skv, Hkv = dims.B, dims.Sq, dims.Skv, dims.Hkv
    lo, hi = row_keys(cfg, B, Sq, Skv, ops[6], ops[7])
    q_nan = jnp.swapaxes(rows_out & (hi > lo)[:, None], 1, 2)[..., None]   # [B, Sq, Hq, 1]
    k_nan = _keys_of(rows_out, lo, hi, Skv, Hkv)
    v_nan = _keys_of(rows_lse, lo, hi, Skv, Hkv)
    g = list(grads)
    if cfg.layout in QKV_PACKED:   # [B, S, 3, H, D]
        g[0] = jnp.stack([_poison(g[0][:, :, 0], q_nan), _poison(g[0][:, :, 1], k_nan),
                          _poison(g[0][:, :, 2], v_nan)], axis=2)
    elif cfg.layout in KV_PACKED:  # q, kv [B, S, 2, H, D]
        g[0] = _poison(g[0], q_nan)
        g[1] = jnp.stack([_poison(g[1][:, :, 0], k_nan), _poison(g[1][:, :, 1], v_nan)], axis=2)
    else:
        g[0], g[1], g[2] = _poison(g[0], q_nan), _poison(g[1], k_nan), _poison(g[2], v_nan)
    if g[3].size and not cfg.keep_mask:  # dbias [1|B, 1|Hq, Sq, Skv] (a keep mask: none)
        j = jnp.arange(Skv, dtype=jnp.int32)
        hit = (rows_out[..., None] & (lo[:, None, :, None] <= j)
               & (j < hi[:, None, :, None]))                              # [B, Hq, Sq, Skv]
        axes = tuple(i for i in (0, 1) if ops[3].shape[i] == 1)
        g[3] = _poison(g[3], hit.any(axes, keepdims=True) if axes else hit)
    if g[4].size:                  # d softmax_offset [B, Hq] or [Hq] (summed over the batch)
        heads = rows_out.any(-1)
        g[4] = _poison(g[4], heads if g[4].ndim == 2 else heads.any(0))
    return tuple(g)


def nan_exact(bwd):
    """bwd(*ops, out, dout, lse, cfg=, dims=, sm=) (cuDNN's) -> the same with NaN rows and
    NaN values given the reference's gradients."""
    def run(*args, cfg, dims, sm):
        n = N_OPS + (sm is not None)
        ops, (out, dout, lse) = args[:n], args[n:n + 3]
        rows_lse = jnp.isnan(lse)                                         # [B, Hq, Sq]
        rows_out = rows_lse | jnp.swapaxes(jnp.isnan(out).any(-1), 1, 2)
        slot, v, put = _v_slot(ops, cfg.layout)
        clean = list(ops)
        clean[slot] = put(jnp.where(jnp.isnan(v), jnp.zeros((), v.dtype), v))
        lse_ok = jnp.where(rows_lse, jnp.inf, lse)
        out_ok = jnp.where(jnp.swapaxes(rows_out, 1, 2)[..., None], 0, out).astype(out.dtype)
        grads = bwd(*clean, out_ok, dout, lse_ok, cfg=cfg, dims=dims, sm=sm)
        return _fix(grads, ops, rows_lse, rows_out, cfg, dims)
    return run
