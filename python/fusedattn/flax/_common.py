"""What fusedattn.flax.linen and fusedattn.flax.nnx share: the modules' argument checks,
the call of fused_attn a DotProductAttention makes, rotary embeddings, the KV cache's
descriptor and the attention_fn adapter's body. No Flax here: the two faces pass their
module (its attributes are read by name) and what Flax gave them (a dropout key, a
parameter).

Shapes: q [B, Sq, Hq, D], k / v [B, Skv, Hkv, D] (transpose_batch_sequence: [S, B, H, D]),
out [B, Sq, Hq, D].
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._args import ArgumentTypeError, got, is_bool
from .._prepare import enum
from ..attention import fused_attn
from ..dot_product import _large_negative, dot_product_attention
from ..enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from ..sequence import SequenceDescriptor

# The suffix a short (TransformerEngine-style) name drops: "causal" for CAUSAL_MASK,
# "learnable" for LEARNABLE_SOFTMAX.
_SUFFIX = {AttnMaskType: "_MASK", SoftmaxType: "_SOFTMAX"}


def as_enum(enum_cls, value, name: str, where: str):
    """An enum member from itself, its int code or its name in any case ("CAUSAL_MASK",
    "causal_mask", "causal"; "learnable" for LEARNABLE_SOFTMAX)."""
    if isinstance(value, str):
        key = value.strip().upper()
        names = {m.name: m for m in enum_cls}
        suffix = _SUFFIX.get(enum_cls)
        if suffix:
            names.update({m.name[:-len(suffix)]: m for m in enum_cls if m.name.endswith(suffix)})
        if key in names:
            return names[key]
        raise ValueError(f"{where}: {name}={value!r} is not a valid {enum_cls.__name__}; "
                         f"allowed: its members or their names ({', '.join(names)})")
    return enum(enum_cls, value, name, where)


def positive_int(value, name: str, where: str) -> int:
    if is_bool(value) or not isinstance(value, (int, np.integer)) or value < 1:
        raise (ValueError if isinstance(value, (int, np.integer)) and not is_bool(value)
               else ArgumentTypeError)(f"{where}: {name} must be a Python int >= 1; got "
                                       f"{got(value)}")
    return int(value)


def rate(value, name: str, where: str) -> float:
    if is_bool(value) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"{where}: {name} must be a float in [0, 1); got {got(value)}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{where}: {name}={value!r}; must be in [0, 1)")
    return float(value)


def heads(m, where: str) -> tuple[int, int, int]:
    """(Hq, Hkv, D) of a module's num_attention_heads, num_gqa_groups (None: Hq) and head_dim."""
    hq = positive_int(m.num_attention_heads, "num_attention_heads", where)
    hkv = hq if m.num_gqa_groups is None else positive_int(m.num_gqa_groups, "num_gqa_groups",
                                                           where)
    if hq % hkv:
        raise ValueError(f"{where}: num_attention_heads={hq} must be a multiple of "
                         f"num_gqa_groups={hkv}")
    return hq, hkv, positive_int(m.head_dim, "head_dim", where)


def head_dim_of(features: int, heads_: int, head_dim, where: str) -> int:
    """head_dim, or features // heads when None (features must divide then)."""
    if head_dim is not None:
        return positive_int(head_dim, "head_dim", where)
    if features % heads_:
        raise ValueError(f"{where}: head_dim=None needs the features ({features}) to be a "
                         f"multiple of num_attention_heads ({heads_}); pass head_dim")
    return features // heads_


def needs_offset(m, where: str) -> bool:
    """Whether the module owns a LEARNABLE_SOFTMAX offset parameter [Hq]."""
    return as_enum(SoftmaxType, m.softmax_type, "softmax_type", where) == \
        SoftmaxType.LEARNABLE_SOFTMAX


def dropout_on(m, deterministic: bool, where: str) -> bool:
    return rate(m.attention_dropout, "attention_dropout", where) > 0.0 and not deterministic


_PACKED = {QKVLayout.BS3HD: 1, QKVLayout.T3HD: 1, QKVLayout.BSHD_BS2HD: 2,
           QKVLayout.THD_T2HD: 2}


def _operands(layout, query, key, value, where: str) -> tuple:
    """The qkv tuple fused_attn takes for this layout: BS3HD / T3HD read query only (the
    packed qkv), BSHD_BS2HD / THD_T2HD query and key (the packed kv)."""
    n = _PACKED.get(layout, 3)
    given = (query, key, value)
    names = ("query", "key", "value")
    for i, arg in enumerate(names):
        if i < n and given[i] is None:
            raise ValueError(f"{where}: {arg} is None; qkv_layout {layout.name} needs "
                             f"{', '.join(names[:n])}")
        if i >= n and given[i] is not None:
            raise ValueError(f"{where}: {arg} must be None under qkv_layout {layout.name} (the "
                             f"{'qkv' if n == 1 else 'kv'} tensor is packed into "
                             f"{'query' if n == 1 else 'key'})")
    return tuple(jnp.asarray(x) for x in given[:n])


def _check_heads(ops, layout, m, where: str):
    hq, hkv, d = heads(m, where)
    q_heads, kv_heads = ops[0].shape[-2], ops[-1].shape[-2]
    dim = ops[0].shape[-1]
    if q_heads != hq or kv_heads != hkv or dim != d:
        raise ValueError(
            f"{where}: the inputs have {q_heads} query heads, {kv_heads} key/value heads of "
            f"dim {dim} ({layout.name}: shapes {[tuple(x.shape) for x in ops]}); the module "
            f"has num_attention_heads={hq}, num_gqa_groups={hkv}, head_dim={d}")


def attend(m, query, key, value, sequence_descriptor, bias, *, deterministic: bool,
           softmax_offset=None, seed=None, attn_mask_type=None, return_max_logit=False):
    """A DotProductAttention's call of fused_attn, its options read from module m.

    attn_mask_type overrides m's (the KV cache's decoding steps). Returns out (query's
    layout: [B, Sq, Hq, D], [Sq, B, Hq, D] under transpose_batch_sequence) and, with
    return_max_logit, max_logit f32 [Hq]."""
    where = type(m).__name__
    layout = as_enum(QKVLayout, m.qkv_layout, "qkv_layout", where)
    mask_type = as_enum(AttnMaskType, m.attn_mask_type if attn_mask_type is None
                        else attn_mask_type, "attn_mask_type", where)
    bias_type = as_enum(AttnBiasType, m.attn_bias_type, "attn_bias_type", where)
    softmax_type = as_enum(SoftmaxType, m.softmax_type, "softmax_type", where)
    ops = _operands(layout, query, key, value, where)
    thd = layout in (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)
    if m.transpose_batch_sequence:
        if thd:
            raise ValueError(f"{where}: transpose_batch_sequence=True needs a BSHD layout "
                             f"(its inputs are [S, B, H, D]); qkv_layout is {layout.name}")
        ops = tuple(jnp.swapaxes(x, 0, 1) for x in ops)
    if m.dtype is not None:
        ops = tuple(x.astype(m.dtype) for x in ops)
    _check_heads(ops, layout, m, where)
    if bias is not None and bias_type == AttnBiasType.NO_BIAS:
        raise ValueError(f"{where}: a bias was passed but attn_bias_type is NO_BIAS; set "
                         "attn_bias_type to PRE_SCALE_BIAS or POST_SCALE_BIAS")
    training = dropout_on(m, deterministic, where)
    result = fused_attn(
        ops, bias, sequence_descriptor, seed if training else None,
        attn_bias_type=bias_type, attn_mask_type=mask_type, qkv_layout=layout,
        softmax_type=softmax_type, scaling_factor=m.scale_factor,
        dropout_probability=float(m.attention_dropout), is_training=training,
        max_segments_per_seq=m.max_segments_per_seq, window_size=m.window_size,
        softmax_offset=softmax_offset, return_max_logit=return_max_logit,
        score_mod=m.score_mod, context_parallel_strategy=m.context_parallel_strategy,
        context_parallel_axis=m.context_parallel_axis,
        context_parallel_causal_load_balanced=m.context_parallel_causal_load_balanced)
    out, aux = result if return_max_logit else (result, None)
    if m.transpose_batch_sequence:
        out = jnp.swapaxes(out, 0, 1)
    return (out, aux["max_logit"]) if return_max_logit else out


# ---------------------------------------------------------------------------
# Rotary position embeddings (RoPE, the rotate-half form: the first and second halves of
# each head's features are the two coordinates of D/2 planes, plane i turning by
# position * base^(-2i/D)).


def rotary(x, positions, base: float = 10000.0):
    """x [B, S, H, D] (D even), positions int [S] or [B, S] -> x rotated, x's dtype."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"rotary position embeddings need an even head_dim; got {d}")
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)          # [D/2]
    pos = jnp.asarray(positions, jnp.float32)
    pos = jnp.broadcast_to(pos, x.shape[:2]) if pos.ndim == 1 else pos          # [B, S]
    angles = pos[..., None, None] * inv_freq                                   # [B, S, 1, D/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :d // 2], x32[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


# ---------------------------------------------------------------------------
# The KV cache: n new tokens at index (the count already cached) of a cache of L slots.
# The n queries see the cached keys and themselves causally: a padding mask with kv length
# index + n, bottom-right aligned, which keeps the empty slots out and costs one call.

DECODE_MASK = AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK


def decode_descriptor(index, batch: int, n: int) -> SequenceDescriptor:
    """q length n, kv length index + n for every row of the batch."""
    q_lens = jnp.full((batch,), n, jnp.int32)
    kv_lens = jnp.full((batch,), 0, jnp.int32) + (index + n).astype(jnp.int32)
    return SequenceDescriptor.from_seqlens((q_lens, kv_lens))


def cache_update(cached, new, index):
    """Write new [B, n, H, D] into cached [B, L, H, D] at token index."""
    zero = jnp.zeros((), jnp.int32)
    return jax.lax.dynamic_update_slice(cached, new.astype(cached.dtype),
                                        (zero, index.astype(jnp.int32), zero, zero))


def check_inputs_kv(x, batch: int, where: str):
    """Cross-attention's inputs_kv: [B, Skv, E_kv] with the queries' batch."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 3 or shape[0] != batch:
        raise ValueError(f"{where}: inputs_kv must be [B, Skv, E_kv] with the inputs' batch "
                         f"B = {batch}; got shape {shape}")


def check_cache_room(length: int, n: int, where: str):
    if n > length:
        raise ValueError(f"{where}: {n} new tokens do not fit a KV cache of {length} slots")


# ---------------------------------------------------------------------------
# The attention_fn adapter: Flax's dot_product_attention hook on fusedattn.


def _flatten_batch(x, lead):
    """[..., S, H, D] -> [prod(...), S, H, D]."""
    return x.reshape((math.prod(lead),) + x.shape[len(lead):])


def _mask_4d(a, lead, name):
    """A mask or bias broadcastable to [..., H, Sq, Skv] -> 4-D with one batch dim."""
    a = jnp.asarray(a)
    nb = len(lead)
    if a.ndim < 3 or a.ndim > nb + 3:
        raise ValueError(f"attention_fn: {name} of shape {a.shape} must broadcast to "
                         f"[batch..., heads, q_length, kv_length] (batch dims {lead})")
    a = a.reshape((1,) * (nb + 3 - a.ndim) + a.shape)
    if nb == 1:
        return a
    if all(s == 1 for s in a.shape[:nb]):
        return a.reshape((1,) + a.shape[nb:])
    return jnp.broadcast_to(a, lead + a.shape[nb:]).reshape((-1,) + a.shape[nb:])


def flax_attention(query, key, value, bias=None, mask=None, *, dropout_rng=None,
                   dropout_rate=0.0, deterministic=False, dtype=None, is_causal=False,
                   local_window_size=None, broadcast_dropout=False):
    """Flax's dot_product_attention semantics on fusedattn's engine.

    query [batch..., Sq, Hq, D], key / value [batch..., Skv, Hkv, D] (Hq a multiple of
    Hkv: GQA runs natively); mask: bool or float broadcastable to [batch..., Hq, Sq, Skv],
    nonzero keeps a key; bias: the same shape, added to the scaled logits. Without dropout
    the call is fusedattn.dot_product_attention (jax.nn's semantics, which are Flax's: a
    row that keeps no key averages the values). With dropout (dropout_rate > 0 and not
    deterministic) it is fused_attn with the mask folded into a POST_SCALE_BIAS and the
    seed taken from dropout_rng; broadcast_dropout (Flax's) shares one dropout mask over
    the batch and heads (fused_attn's dropout_broadcast), else each probability is dropped
    on its own."""
    query, key, value = (jnp.asarray(x) for x in (query, key, value))
    dt = jnp.dtype(dtype) if dtype is not None else jnp.result_type(query, key, value)
    query, key, value = (x.astype(dt) for x in (query, key, value))
    lead = query.shape[:-3]
    if not lead:
        raise ValueError(f"attention_fn: query must be [batch..., q_length, heads, head_dim]; "
                         f"got shape {query.shape}")
    if key.shape[:-3] != lead or value.shape[:-3] != lead:
        raise ValueError(f"attention_fn: query, key and value must share their batch dims; "
                         f"got {query.shape}, {key.shape}, {value.shape}")
    q, k, v = (_flatten_batch(x, lead) for x in (query, key, value))
    if mask is not None:
        mask = _mask_4d(mask, lead, "mask")
        mask = mask if mask.dtype == jnp.bool_ else mask != 0
    if bias is not None:
        bias = _mask_4d(bias, lead, "bias").astype(dt)
    training = float(dropout_rate) > 0.0 and not deterministic
    if not training:
        out = dot_product_attention(q, k, v, bias, mask, is_causal=is_causal,
                                    local_window_size=local_window_size)
        return out.reshape(query.shape[:-1] + (v.shape[-1],))
    if dropout_rng is None:
        raise ValueError("attention_fn: dropout_rate > 0 and deterministic=False need a "
                         "dropout_rng")
    T, S = q.shape[1], k.shape[1]
    if mask is not None:
        mask = jnp.broadcast_to(mask, jnp.broadcast_shapes(mask.shape, (1, 1, T, S)))
        base = jnp.zeros((), dt) if bias is None else bias
        # jax's masked logit, or -0.7 x the dtype's max where it cannot hold that (float16).
        masked = _large_negative(dt)
        bias = jnp.where(mask, base, jnp.asarray(masked, dt))
    if bias is not None:
        bias = jnp.broadcast_to(bias, jnp.broadcast_shapes(bias.shape, (1, 1, T, S)))
    window = None
    if local_window_size is not None:
        window = (tuple(local_window_size) if isinstance(local_window_size, (tuple, list))
                  else (local_window_size, local_window_size))
    out = fused_attn((q, k, v), bias, None, dropout_rng,
                     attn_bias_type=(AttnBiasType.NO_BIAS if bias is None
                                     else AttnBiasType.POST_SCALE_BIAS),
                     attn_mask_type=AttnMaskType.CAUSAL_MASK if is_causal else
                     AttnMaskType.NO_MASK, dropout_probability=float(dropout_rate),
                     is_training=True, window_size=window,
                     dropout_broadcast=bool(broadcast_dropout))
    return out.reshape(query.shape[:-1] + (v.shape[-1],))
