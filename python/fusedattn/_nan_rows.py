"""NaN rows in cuDNN's backward: the reference's answer.

cuDNN's backward recomputes P = exp(S - lse) over the masked keys too, so a query row
whose log-sum-exp is NaN (a NaN reached one of its kept logits, or its sink) makes
every key of its head NaN in dk / dv. The reference and the CPU engine keep a masked
probability exactly 0: only the keys such a row keeps get NaN. `nan_exact(bwd)` runs
cuDNN's backward with those rows neutralized (lse +inf, out 0: they then add nothing),
then writes NaN where the reference has it: dq of the row (when it keeps a key), dk / dv
of the keys it keeps, dbias of its kept logits, d softmax_offset of its head. Rows
without a NaN pay one reduction of the lse and a branch (lax.cond) that is not taken.
BSHD layouts (THD goes through cuDNN's ragged path, which needs no fix).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._prepare import KV_PACKED, N_OPS, QKV_PACKED
from .reference import segment_mask


def _poison(x, where):
    return jnp.where(where, jnp.asarray(jnp.nan, x.dtype), x)


def _fix(grads, ops, nan_rows, cfg, dims):
    """grads of the neutralized backward -> with NaN where the reference has it."""
    B, Sq, Skv, Hq, Hkv = dims.B, dims.Sq, dims.Skv, dims.Hq, dims.Hkv
    keep, _ = segment_mask(cfg.mask_type, B, Sq, Skv, ops[6], ops[7], None, None, False,
                           cfg.window)                                    # [B, Sq, Skv]
    hit = keep[:, None] & nan_rows[..., None]                             # [B, Hq, Sq, Skv]
    q_nan = jnp.swapaxes(nan_rows & keep[:, None].any(-1), 1, 2)[..., None]   # [B, Sq, Hq, 1]
    kv_nan = hit.reshape(B, Hkv, Hq // Hkv, Sq, Skv).any((2, 3))          # [B, Hkv, Skv]
    kv_nan = jnp.swapaxes(kv_nan, 1, 2)[..., None]                        # [B, Skv, Hkv, 1]
    g = list(grads)
    if cfg.layout in QKV_PACKED:   # [B, S, 3, H, D]
        g[0] = jnp.stack([_poison(g[0][:, :, 0], q_nan), _poison(g[0][:, :, 1], kv_nan),
                          _poison(g[0][:, :, 2], kv_nan)], axis=2)
    elif cfg.layout in KV_PACKED:  # q, kv [B, S, 2, H, D]
        g[0] = _poison(g[0], q_nan)
        g[1] = _poison(g[1], kv_nan[:, :, None])
    else:
        g[0], g[1], g[2] = _poison(g[0], q_nan), _poison(g[1], kv_nan), _poison(g[2], kv_nan)
    if g[3].size:                  # dbias [1|B, 1|Hq, Sq, Skv]: sums over broadcast dims
        axes = tuple(i for i in (0, 1) if ops[3].shape[i] == 1)
        g[3] = _poison(g[3], hit.any(axes, keepdims=True) if axes else hit)
    if g[4].size:                  # d softmax_offset [B, Hq] or [Hq] (summed over the batch)
        heads = nan_rows.any(-1)
        g[4] = _poison(g[4], heads if g[4].ndim == 2 else heads.any(0))
    return tuple(g)


def nan_exact(bwd):
    """bwd(*ops, out, dout, lse, cfg=, dims=, sm=) (cuDNN's) -> the same with NaN rows
    given the reference's gradients."""
    def run(*args, cfg, dims, sm):
        n = N_OPS + (sm is not None)
        ops, (out, dout, lse) = args[:n], args[n:n + 3]
        nan_rows = jnp.isnan(lse)                                         # [B, Hq, Sq]

        def plain():
            return tuple(bwd(*args, cfg=cfg, dims=dims, sm=sm))

        def neutralized():
            lse_ok = jnp.where(nan_rows, jnp.inf, lse)
            out_ok = jnp.where(jnp.swapaxes(nan_rows, 1, 2)[..., None], 0, out).astype(out.dtype)
            grads = bwd(*ops, out_ok, dout, lse_ok, cfg=cfg, dims=dims, sm=sm)
            return _fix(grads, ops, nan_rows, cfg, dims)

        return jax.lax.cond(nan_rows.any(), neutralized, plain)
    return run
