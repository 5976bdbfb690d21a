"""NaN rows in cuDNN's backward: the reference's answer.

cuDNN's backward computes dS = P * (dP - D) over the masked keys too, where P is 0 but
dP = dout . v or D = dout . out may be NaN, and recomputes P = exp(S - lse) there with a
NaN lse: so a NaN row, or a NaN value row, spreads NaN to keys the mask hides. The
reference and the CPU engine keep a masked key's dS exactly 0. `nan_exact(bwd)` runs
cuDNN's backward with the NaN neutralized (rows whose lse is NaN get lse +inf, rows whose
output is NaN get out 0, NaN values become 0), then writes NaN where the reference has
it: for a row whose output is NaN, its dq, dk of the keys it keeps, dbias of its kept
logits and d softmax_offset of its head; for a row whose lse is NaN (P NaN), also dv of
the keys it keeps. Calls without a NaN pay two reductions and a branch (lax.cond) that is
not taken. BSHD layouts (THD goes through cuDNN's ragged path, which needs no fix).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._prepare import KV_PACKED, N_OPS, QKV_PACKED
from .reference import segment_mask


def _poison(x, where):
    return jnp.where(where, jnp.asarray(jnp.nan, x.dtype), x)


def _v_slot(ops, layout):
    """(operand index, value view, put back): where the layout keeps v."""
    if layout in QKV_PACKED:   # qkv [B, S, 3, H, D]
        return 0, ops[0][:, :, 2], lambda x: ops[0].at[:, :, 2].set(x)
    if layout in KV_PACKED:    # kv [B, S, 2, H, D]
        return 1, ops[1][:, :, 1], lambda x: ops[1].at[:, :, 1].set(x)
    return 2, ops[2], lambda x: x


def _fix(grads, ops, rows_lse, rows_out, cfg, dims):
    """grads of the neutralized backward -> with NaN where the reference has it."""
    B, Sq, Skv, Hq, Hkv = dims.B, dims.Sq, dims.Skv, dims.Hq, dims.Hkv
    keep, _ = segment_mask(cfg.mask_type, B, Sq, Skv, ops[6], ops[7], None, None, False,
                           cfg.window)                                    # [B, Sq, Skv]

    def keys_of(rows):  # [B, Hq, Sq] -> keys some such row keeps, [B, Skv, Hkv, 1]
        hit = (keep[:, None] & rows[..., None]).reshape(B, Hkv, Hq // Hkv, Sq, Skv)
        return jnp.swapaxes(hit.any((2, 3)), 1, 2)[..., None]

    q_nan = jnp.swapaxes(rows_out & keep[:, None].any(-1), 1, 2)[..., None]  # [B, Sq, Hq, 1]
    k_nan, v_nan = keys_of(rows_out), keys_of(rows_lse)
    g = list(grads)
    if cfg.layout in QKV_PACKED:   # [B, S, 3, H, D]
        g[0] = jnp.stack([_poison(g[0][:, :, 0], q_nan), _poison(g[0][:, :, 1], k_nan),
                          _poison(g[0][:, :, 2], v_nan)], axis=2)
    elif cfg.layout in KV_PACKED:  # q, kv [B, S, 2, H, D]
        g[0] = _poison(g[0], q_nan)
        g[1] = jnp.stack([_poison(g[1][:, :, 0], k_nan), _poison(g[1][:, :, 1], v_nan)], axis=2)
    else:
        g[0], g[1], g[2] = _poison(g[0], q_nan), _poison(g[1], k_nan), _poison(g[2], v_nan)
    if g[3].size:                  # dbias [1|B, 1|Hq, Sq, Skv]: sums over broadcast dims
        hit = keep[:, None] & rows_out[..., None]                         # [B, Hq, Sq, Skv]
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
        v_bad = jnp.isnan(v)

        def plain():
            return tuple(bwd(*args, cfg=cfg, dims=dims, sm=sm))

        def neutralized():
            clean = list(ops)
            clean[slot] = put(jnp.where(v_bad, jnp.zeros((), v.dtype), v))
            lse_ok = jnp.where(rows_lse, jnp.inf, lse)
            out_ok = jnp.where(jnp.swapaxes(rows_out, 1, 2)[..., None], 0, out).astype(out.dtype)
            grads = bwd(*clean, out_ok, dout, lse_ok, cfg=cfg, dims=dims, sm=sm)
            return _fix(grads, ops, rows_lse, rows_out, cfg, dims)

        return jax.lax.cond(rows_out.any() | v_bad.any(), neutralized, plain)
    return run
