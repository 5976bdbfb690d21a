"""fusedattn's attention as flax.linen modules.

DotProductAttention: fused_attn as a module (TransformerEngine's attributes).
MultiHeadAttention: projections, rotary embeddings, DotProductAttention, output projection
and dropout, logical sharding axis names, a KV cache ('cache' collection, decode=True).
attention_fn / make_attention_fn: the hook of flax.linen.MultiHeadDotProductAttention.

Logical axis names (for nn.logical_axis_rules): kernels ('embed', 'qkv', 'heads', 'kv'),
the output kernel ('heads', 'kv', 'embed'); activations ('batch', 'length', 'heads', 'kv')
and ('batch', 'length', 'embed').
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from ..context_parallel import CPStrategy
from ..enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from . import _common
from ._adapter import attention_fn, make_attention_fn

__all__ = ["DotProductAttention", "MultiHeadAttention", "attention_fn", "make_attention_fn"]

Enum = Any  # the enum member, its int code or its name ("causal", "CAUSAL_MASK", ...)


class DotProductAttention(nn.Module):
    """fused_attn as a linen module (fusedattn.fused_attn's docstring has every semantic).

    Call: (query, key, value, sequence_descriptor=None, bias=None, *, deterministic=False)
    with query [B, Sq, Hq, D], key / value [B, Skv, Hkv, D] ([S, B, H, D] under
    transpose_batch_sequence; packed layouts: BS3HD takes the qkv [B, S, 3, H, D] as
    query, key and value None; BSHD_BS2HD the kv [B, S, 2, H, D] as key, value None).
    Returns [B, Sq, Hq, D].

    head_dim, num_attention_heads, num_gqa_groups (None: num_attention_heads): checked
      against the inputs.
    attention_dropout: the rate; with deterministic=False it draws the seed from the 'dropout'
      rng stream.
    attn_mask_type, attn_bias_type, qkv_layout, softmax_type: the enums or their names
      ("causal", "padding_causal", "post_scale_bias", "learnable", ...).
      LEARNABLE_SOFTMAX creates the parameter 'softmax_offset' [Hq] (zeros, axis 'heads').
    scale_factor: None = 1/sqrt(head_dim). window_size: (left, right) or None.
    max_segments_per_seq, score_mod, context_parallel_*: passed to fused_attn.
    dtype: the inputs are cast to it (None: kept).
    record_max_logit: sow fused_attn's per-head max logit f32 [Hq] into 'intermediates'
      ('max_logit'; apply with mutable=['intermediates']).
    """

    head_dim: int
    num_attention_heads: int
    num_gqa_groups: int | None = None
    attention_dropout: float = 0.0
    attn_mask_type: Enum = AttnMaskType.CAUSAL_MASK
    attn_bias_type: Enum = AttnBiasType.NO_BIAS
    qkv_layout: Enum = QKVLayout.BSHD_BSHD_BSHD
    scale_factor: float | None = None
    window_size: tuple[int, int] | None = None
    max_segments_per_seq: int = 1
    softmax_type: Enum = SoftmaxType.VANILLA_SOFTMAX
    score_mod: Callable | None = None
    context_parallel_strategy: Enum = CPStrategy.DEFAULT
    context_parallel_axis: str | None = None
    context_parallel_causal_load_balanced: bool = False
    transpose_batch_sequence: bool = False
    dtype: Any = None
    record_max_logit: bool = False

    @nn.compact
    def __call__(self, query, key=None, value=None, sequence_descriptor=None, bias=None, *,
                 deterministic: bool = False, attn_mask_type: Enum = None):
        """attn_mask_type: overrides the module's for this call (the KV cache uses it)."""
        where = type(self).__name__
        hq = _common.heads(self, where)[0]
        offset = None
        if _common.needs_offset(self, where):
            offset = self.param("softmax_offset",
                                nn.with_logical_partitioning(nn.initializers.zeros, ("heads",)),
                                (hq,), jnp.float32)
        seed = (self.make_rng("dropout") if _common.dropout_on(self, deterministic, where)
                else None)
        result = _common.attend(self, query, key, value, sequence_descriptor, bias,
                                deterministic=deterministic, softmax_offset=offset, seed=seed,
                                attn_mask_type=attn_mask_type,
                                return_max_logit=self.record_max_logit)
        if not self.record_max_logit:
            return result
        self.sow("intermediates", "max_logit", result[1])
        return result[0]


def _kernel_init():
    return nn.initializers.lecun_normal()


class MultiHeadAttention(nn.Module):
    """Multi-head self- or cross-attention on DotProductAttention.

    Call: (inputs [B, S, E], inputs_kv=None, *, positions=None, kv_positions=None,
    sequence_descriptor=None, bias=None, deterministic=False) -> [B, S, out_features or E].
    inputs_kv [B, Skv, E_kv]: cross-attention (queries from inputs, keys and values from
    inputs_kv; pick the mask with attn_mask_type, e.g. NO_MASK or PADDING_MASK with a
    descriptor); None: self-attention.

    num_attention_heads, head_dim (None: E // heads), num_gqa_groups (None: no GQA).
    fused_qkv: one kernel 'qkv' [E, 3, Hq, D] (with GQA or cross-attention: 'query'
      [E, Hq, D] and a fused 'kv' [E_kv, 2, Hkv, D]); False: 'query', 'key', 'value'.
      Output kernel 'out' [Hq, D, E].
    enable_rotary_pos_emb: RoPE (rotate-half) on q at positions (None: 0 .. S-1, or the
      cache index onwards when decoding) and on k at positions (self-attention) or
      kv_positions (cross-attention; None: 0 .. Skv-1), int [S] or [B, S]; rotary_base its
      base.
    attention_dropout: on the attention probabilities; dropout_rate: on the output.
    decode: a KV cache in the 'cache' collection (as flax's own decode=True): init with
      the full-length input creates it; then each call appends its tokens (one or more)
      and attends to everything cached, causally (the bottom-right padding-causal mask: no
      dense mask is built). Apply with mutable=['cache']. The index is traced, so a call
      past the last slot is not caught (as in Flax's own cache); one longer than the cache
      is an error. Cross-attention keeps no cache: its keys and values are inputs_kv's,
      passed with every call (an encoder's output).
    The other attributes go to DotProductAttention.
    """

    num_attention_heads: int
    head_dim: int | None = None
    num_gqa_groups: int | None = None
    out_features: int | None = None
    fused_qkv: bool = True
    use_bias: bool = False
    attention_dropout: float = 0.0
    dropout_rate: float = 0.0
    attn_mask_type: Enum = AttnMaskType.CAUSAL_MASK
    attn_bias_type: Enum = AttnBiasType.NO_BIAS
    scale_factor: float | None = None
    window_size: tuple[int, int] | None = None
    softmax_type: Enum = SoftmaxType.VANILLA_SOFTMAX
    score_mod: Callable | None = None
    context_parallel_strategy: Enum = CPStrategy.DEFAULT
    context_parallel_axis: str | None = None
    context_parallel_causal_load_balanced: bool = False
    enable_rotary_pos_emb: bool = False
    rotary_base: float = 10000.0
    decode: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = _kernel_init()
    record_max_logit: bool = False

    def _proj(self, name, x, shape, axes):
        """x [B, S, E] -> [B, S, *shape] by the kernel name [E, *shape]."""
        init = nn.with_logical_partitioning(_flat_init(self.kernel_init), ("embed",) + axes)
        kernel = self.param(name, init, (x.shape[-1],) + shape, self.param_dtype)
        dt = self.dtype or x.dtype
        y = jnp.tensordot(x.astype(dt), kernel.astype(dt), axes=1)
        if self.use_bias:
            b = self.param(f"{name}_bias", nn.with_logical_partitioning(
                nn.initializers.zeros, axes), shape, self.param_dtype)
            y = y + b.astype(dt)
        return y

    @nn.compact
    def __call__(self, inputs, inputs_kv=None, *, positions=None, kv_positions=None,
                 sequence_descriptor=None, bias=None, deterministic: bool = False):
        where = type(self).__name__
        B, S, E = inputs.shape
        hq = _common.positive_int(self.num_attention_heads, "num_attention_heads", where)
        d = _common.head_dim_of(E, hq, self.head_dim, where)
        hkv = hq if self.num_gqa_groups is None else self.num_gqa_groups
        _common.heads(_Heads(hq, hkv, d), where)
        act = ("batch", "length", "heads", "kv")
        cross = inputs_kv is not None
        if cross:
            _common.check_inputs_kv(inputs_kv, B, where)
            q = self._proj("query", inputs, (hq, d), ("heads", "kv"))
            if self.fused_qkv:
                kv = self._proj("kv", inputs_kv, (2, hkv, d), ("qkv", "heads", "kv"))
                k, v = kv[:, :, 0], kv[:, :, 1]
            else:
                k = self._proj("key", inputs_kv, (hkv, d), ("heads", "kv"))
                v = self._proj("value", inputs_kv, (hkv, d), ("heads", "kv"))
        elif self.fused_qkv and hq == hkv:
            qkv = self._proj("qkv", inputs, (3, hq, d), ("qkv", "heads", "kv"))
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        elif self.fused_qkv:
            q = self._proj("query", inputs, (hq, d), ("heads", "kv"))
            kv = self._proj("kv", inputs, (2, hkv, d), ("qkv", "heads", "kv"))
            k, v = kv[:, :, 0], kv[:, :, 1]
        else:
            q = self._proj("query", inputs, (hq, d), ("heads", "kv"))
            k = self._proj("key", inputs, (hkv, d), ("heads", "kv"))
            v = self._proj("value", inputs, (hkv, d), ("heads", "kv"))

        caching = self.decode and not cross
        decoding = caching and self.has_variable("cache", "cached_key")
        if caching:
            cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
            cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
            index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        if positions is None:
            positions = jnp.arange(S) + (index.value if decoding else 0)
        if cross and kv_positions is None:
            kv_positions = jnp.arange(k.shape[1])
        if self.enable_rotary_pos_emb:
            q = _common.rotary(q, positions, self.rotary_base)
            k = _common.rotary(k, kv_positions if cross else positions, self.rotary_base)
        q, k, v = (nn.with_logical_constraint(x, act) for x in (q, k, v))

        mask_override = None
        if decoding:
            _common.check_cache_room(cached_k.value.shape[1], S, where)
            i = index.value
            cached_k.value = _common.cache_update(cached_k.value, k, i)
            cached_v.value = _common.cache_update(cached_v.value, v, i)
            index.value = i + S
            k, v = cached_k.value, cached_v.value
            sequence_descriptor = _common.decode_descriptor(i, B, S)
            mask_override = _common.DECODE_MASK

        out = DotProductAttention(
            head_dim=d, num_attention_heads=hq, num_gqa_groups=hkv,
            attention_dropout=self.attention_dropout, attn_mask_type=self.attn_mask_type,
            attn_bias_type=self.attn_bias_type, scale_factor=self.scale_factor,
            window_size=self.window_size, softmax_type=self.softmax_type,
            score_mod=self.score_mod, context_parallel_strategy=self.context_parallel_strategy,
            context_parallel_axis=self.context_parallel_axis,
            context_parallel_causal_load_balanced=self.context_parallel_causal_load_balanced,
            dtype=self.dtype, record_max_logit=self.record_max_logit, name="attention")(
                q, k, v, sequence_descriptor, bias, deterministic=deterministic,
                attn_mask_type=mask_override)
        out = nn.with_logical_constraint(out, act)
        e_out = self.out_features or E
        init = nn.with_logical_partitioning(_flat_init(self.kernel_init, fan_in_dims=2),
                                            ("heads", "kv", "embed"))
        w = self.param("out", init, (hq, d, e_out), self.param_dtype)
        dt = out.dtype
        y = jnp.einsum("bshd,hde->bse", out, w.astype(dt))
        if self.use_bias:
            y = y + self.param("out_bias", nn.with_logical_partitioning(
                nn.initializers.zeros, ("embed",)), (e_out,), self.param_dtype).astype(dt)
        y = nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic)
        return nn.with_logical_constraint(y, ("batch", "length", "embed"))


class _Heads:
    """The three attributes _common.heads reads, for MultiHeadAttention's own check."""

    def __init__(self, hq, hkv, d):
        self.num_attention_heads, self.num_gqa_groups, self.head_dim = hq, hkv, d


def _flat_init(init, fan_in_dims: int = 1):
    """init on the kernel seen as a matrix [prod(first fan_in_dims dims), prod(rest)], so
    fan-in / fan-out scaled initializers see the true fans; reshaped back."""

    def wrapped(key, shape, dtype=jnp.float32):
        flat = (math.prod(shape[:fan_in_dims]), math.prod(shape[fan_in_dims:]))
        return jnp.reshape(init(key, flat, dtype), shape)

    return wrapped
