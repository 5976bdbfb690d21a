"""fusedattn's attention as flax.nnx modules (the linen face's twin: fusedattn.flax.linen
has the attributes' documentation; here they are constructor arguments).

DotProductAttention(head_dim, num_attention_heads, ..., rngs=None)
MultiHeadAttention(num_attention_heads, in_features, ..., rngs=...) with init_cache(...)
for decoding; attention_fn / make_attention_fn: the hook of flax.nnx.MultiHeadAttention.

Parameters carry logical sharding axis names (the out_sharding metadata of
nnx.with_partitioning): kernels ('embed', 'qkv', 'heads', 'kv'), the output kernel
('heads', 'kv', 'embed'), softmax_offset ('heads',). They are not sharded at creation
(a module builds without a mesh): nnx.get_partition_spec under nn.logical_axis_rules gives
the specs to jit or device_put with.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax.numpy as jnp
from flax import nnx

from ..context_parallel import CPStrategy
from ..enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from . import _common
from ._adapter import attention_fn, make_attention_fn

__all__ = ["DotProductAttention", "MultiHeadAttention", "attention_fn", "make_attention_fn"]


def _stream(rngs):
    """nnx.Rngs -> its 'dropout' stream forked (None stays None)."""
    if rngs is None:
        return nnx.data(None)
    if isinstance(rngs, nnx.Rngs):
        return rngs["dropout"].fork()
    if isinstance(rngs, nnx.RngStream):
        return rngs.fork()
    raise TypeError(f"rngs must be an nnx.Rngs, an nnx.RngStream or None; got {type(rngs)}")


def _draw(rngs):
    """A dropout key from a call's rngs (Rngs, RngStream or a key array)."""
    if isinstance(rngs, nnx.Rngs):
        return rngs.dropout()
    if isinstance(rngs, nnx.RngStream):
        return rngs()
    return rngs


class DotProductAttention(nnx.Module):
    """fused_attn as an nnx module; the attributes as fusedattn.flax.linen's.

    __call__(query, key=None, value=None, sequence_descriptor=None, bias=None, *,
    deterministic=False, rngs=None, attn_mask_type=None): rngs (an nnx.Rngs, RngStream or
    key) overrides the constructor's for the dropout seed. With record_max_logit the
    latest call's per-head max logit f32 [Hq] is kept in self.max_logit (an
    nnx.Intermediate)."""

    def __init__(self, head_dim: int, num_attention_heads: int,
                 num_gqa_groups: int | None = None, *, attention_dropout: float = 0.0,
                 attn_mask_type=AttnMaskType.CAUSAL_MASK, attn_bias_type=AttnBiasType.NO_BIAS,
                 qkv_layout=QKVLayout.BSHD_BSHD_BSHD, scale_factor: float | None = None,
                 window_size=None, max_segments_per_seq: int = 1,
                 softmax_type=SoftmaxType.VANILLA_SOFTMAX, score_mod: Callable | None = None,
                 context_parallel_strategy=CPStrategy.DEFAULT,
                 context_parallel_axis: str | None = None,
                 context_parallel_causal_load_balanced: bool = False,
                 transpose_batch_sequence: bool = False, dtype: Any = None,
                 record_max_logit: bool = False, rngs: nnx.Rngs | None = None):
        self.head_dim, self.num_attention_heads = head_dim, num_attention_heads
        self.num_gqa_groups = num_gqa_groups
        self.attention_dropout = attention_dropout
        self.attn_mask_type, self.attn_bias_type = attn_mask_type, attn_bias_type
        self.qkv_layout, self.softmax_type = qkv_layout, softmax_type
        self.scale_factor = scale_factor
        self.window_size = None if window_size is None else tuple(window_size)
        self.max_segments_per_seq = max_segments_per_seq
        self.score_mod = score_mod
        self.context_parallel_strategy = context_parallel_strategy
        self.context_parallel_axis = context_parallel_axis
        self.context_parallel_causal_load_balanced = context_parallel_causal_load_balanced
        self.transpose_batch_sequence = transpose_batch_sequence
        self.dtype, self.record_max_logit = dtype, record_max_logit
        where = type(self).__name__
        hq = _common.heads(self, where)[0]
        _common.rate(attention_dropout, "attention_dropout", where)
        if _common.needs_offset(self, where):
            self.softmax_offset = nnx.Param(jnp.zeros((hq,), jnp.float32),
                                            out_sharding=("heads",), eager_sharding=False)
        else:
            self.softmax_offset = nnx.data(None)
        self.rngs = _stream(rngs)
        self.max_logit = nnx.Intermediate(jnp.zeros((hq,), jnp.float32)) \
            if record_max_logit else nnx.data(None)

    def __call__(self, query, key=None, value=None, sequence_descriptor=None, bias=None, *,
                 deterministic: bool = False, rngs=None, attn_mask_type=None):
        where = type(self).__name__
        seed = None
        if _common.dropout_on(self, deterministic, where):
            source = rngs if rngs is not None else self.rngs
            if source is None:
                raise ValueError(f"{where}: attention_dropout > 0 with deterministic=False "
                                 "needs rngs (in the constructor or the call)")
            seed = _draw(source)
        offset = None if self.softmax_offset is None else self.softmax_offset[...]
        result = _common.attend(self, query, key, value, sequence_descriptor, bias,
                                deterministic=deterministic, softmax_offset=offset, seed=seed,
                                attn_mask_type=attn_mask_type,
                                return_max_logit=self.record_max_logit)
        if not self.record_max_logit:
            return result
        self.max_logit[...] = result[1]
        return result[0]


def _param(rngs, init, shape, axes, dtype, fan_in_dims=1):
    """An nnx.Param of shape with axis names; init sees it as [fan_in, fan_out]."""
    flat = (math.prod(shape[:fan_in_dims]), math.prod(shape[fan_in_dims:]))
    value = jnp.reshape(init(rngs.params(), flat, dtype), shape)
    return nnx.Param(value, out_sharding=axes, eager_sharding=False)


class MultiHeadAttention(nnx.Module):
    """Multi-head self- or cross-attention on DotProductAttention (fusedattn.flax.linen's
    MultiHeadAttention documents the arguments; the parameters have the same names).

    __call__(inputs [B, S, E], inputs_kv=None, *, positions=None, kv_positions=None,
    sequence_descriptor=None, bias=None, deterministic=False, rngs=None, decode=None)
    -> [B, S, out_features or E]. in_kv_features (constructor) makes it cross-attention:
    keys and values from inputs_kv [B, Skv, in_kv_features], given with every call (no
    cache); kernels 'query' and 'kv' (fused_qkv) or 'key' / 'value' [in_kv_features, ...].
    Decoding: init_cache(input_shape [B, L, E], dtype) makes the cache of L tokens; calls
    with decode=True (or decode=True in the constructor) append their tokens and attend
    to everything cached, causally (past the last slot is not caught: the index is traced)."""

    def __init__(self, num_attention_heads: int, in_features: int, head_dim: int | None = None,
                 num_gqa_groups: int | None = None, *, out_features: int | None = None,
                 fused_qkv: bool = True, use_bias: bool = False,
                 attention_dropout: float = 0.0, dropout_rate: float = 0.0,
                 attn_mask_type=AttnMaskType.CAUSAL_MASK, attn_bias_type=AttnBiasType.NO_BIAS,
                 scale_factor: float | None = None, window_size=None,
                 softmax_type=SoftmaxType.VANILLA_SOFTMAX, score_mod: Callable | None = None,
                 context_parallel_strategy=CPStrategy.DEFAULT,
                 context_parallel_axis: str | None = None,
                 context_parallel_causal_load_balanced: bool = False,
                 enable_rotary_pos_emb: bool = False, rotary_base: float = 10000.0,
                 decode: bool = False, dtype: Any = None, param_dtype: Any = jnp.float32,
                 kernel_init: Callable = nnx.initializers.lecun_normal(),
                 record_max_logit: bool = False, in_kv_features: int | None = None,
                 rngs: nnx.Rngs):
        where = type(self).__name__
        hq = _common.positive_int(num_attention_heads, "num_attention_heads", where)
        e = _common.positive_int(in_features, "in_features", where)
        self.cross = in_kv_features is not None
        e_kv = _common.positive_int(in_kv_features, "in_kv_features", where) if self.cross else e
        d = _common.head_dim_of(e, hq, head_dim, where)
        hkv = hq if num_gqa_groups is None else num_gqa_groups
        self.attention = DotProductAttention(
            d, hq, hkv, attention_dropout=attention_dropout, attn_mask_type=attn_mask_type,
            attn_bias_type=attn_bias_type, scale_factor=scale_factor, window_size=window_size,
            softmax_type=softmax_type, score_mod=score_mod,
            context_parallel_strategy=context_parallel_strategy,
            context_parallel_axis=context_parallel_axis,
            context_parallel_causal_load_balanced=context_parallel_causal_load_balanced,
            dtype=dtype, record_max_logit=record_max_logit, rngs=rngs)
        self.num_attention_heads, self.num_gqa_groups, self.head_dim = hq, hkv, d
        self.fused_qkv, self.use_bias = fused_qkv, use_bias
        self.enable_rotary_pos_emb, self.rotary_base = enable_rotary_pos_emb, rotary_base
        self.decode, self.dtype = decode, dtype
        e_out = out_features or e
        p = lambda shape, axes, fan_in_dims=1: _param(rngs, kernel_init, shape, axes,
                                                      param_dtype, fan_in_dims)
        z = lambda shape, axes: nnx.Param(jnp.zeros(shape, param_dtype), out_sharding=axes,
                                          eager_sharding=False)
        if fused_qkv and hq == hkv and not self.cross:
            shapes = {"qkv": ((3, hq, d), ("qkv", "heads", "kv"))}
        elif fused_qkv:
            shapes = {"query": ((hq, d), ("heads", "kv")),
                      "kv": ((2, hkv, d), ("qkv", "heads", "kv"))}
        else:
            shapes = {name: ((h, d), ("heads", "kv"))
                      for name, h in (("query", hq), ("key", hkv), ("value", hkv))}
        # Each kernel's input features: cross-attention's keys and values read inputs_kv.
        self.kernels = nnx.Dict({n: p((e if n == "query" else e_kv,) + s, ("embed",) + a)
                                 for n, (s, a) in shapes.items()})
        self.biases = nnx.Dict({n: z(s, a) for n, (s, a) in shapes.items()}) \
            if use_bias else nnx.data(None)
        self.out = p((hq, d, e_out), ("heads", "kv", "embed"), 2)
        self.out_bias = z((e_out,), ("embed",)) if use_bias else nnx.data(None)
        self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
        self.cached_key = self.cached_value = self.cache_index = nnx.data(None)

    def init_cache(self, input_shape, dtype: Any = jnp.float32):
        """A cache for input_shape [B, L, E]: L tokens of keys and values, index 0."""
        B, L = input_shape[0], input_shape[1]
        shape = (B, L, self.num_gqa_groups, self.head_dim)
        self.cached_key = nnx.Cache(jnp.zeros(shape, dtype))
        self.cached_value = nnx.Cache(jnp.zeros(shape, dtype))
        self.cache_index = nnx.Cache(jnp.zeros((), jnp.int32))

    def _project(self, name, x):
        dt = self.dtype or x.dtype
        y = jnp.tensordot(x.astype(dt), self.kernels[name][...].astype(dt), axes=1)
        if self.biases is not None:
            y = y + self.biases[name][...].astype(dt)
        return y

    def __call__(self, inputs, inputs_kv=None, *, positions=None, kv_positions=None,
                 sequence_descriptor=None, bias=None, deterministic: bool = False, rngs=None,
                 decode: bool | None = None):
        where = type(self).__name__
        B, S, _ = inputs.shape
        if self.cross != (inputs_kv is not None):
            raise ValueError(
                f"{where}: inputs_kv is cross-attention's, which the constructor's "
                f"in_kv_features selects; this module was built for "
                f"{'cross' if self.cross else 'self'}-attention and got inputs_kv="
                f"{'None' if inputs_kv is None else getattr(inputs_kv, 'shape', inputs_kv)}")
        if self.cross:
            _common.check_inputs_kv(inputs_kv, B, where)
            q = self._project("query", inputs)
            if "kv" in self.kernels:
                kv = self._project("kv", inputs_kv)
                k, v = kv[:, :, 0], kv[:, :, 1]
            else:
                k, v = self._project("key", inputs_kv), self._project("value", inputs_kv)
        elif "qkv" in self.kernels:
            qkv = self._project("qkv", inputs)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        elif "kv" in self.kernels:
            q = self._project("query", inputs)
            kv = self._project("kv", inputs)
            k, v = kv[:, :, 0], kv[:, :, 1]
        else:
            q, k, v = (self._project(n, inputs) for n in ("query", "key", "value"))
        decode = (self.decode if decode is None else decode) and not self.cross
        if decode and self.cached_key is None:
            raise ValueError(f"{where}: decode=True needs init_cache(input_shape) first")
        index = self.cache_index[...] if decode else 0
        if positions is None:
            positions = jnp.arange(S) + index
        if self.cross and kv_positions is None:
            kv_positions = jnp.arange(k.shape[1])
        if self.enable_rotary_pos_emb:
            q = _common.rotary(q, positions, self.rotary_base)
            k = _common.rotary(k, kv_positions if self.cross else positions, self.rotary_base)
        mask_override = None
        if decode:
            _common.check_cache_room(self.cached_key.shape[1], S, where)
            self.cached_key[...] = _common.cache_update(self.cached_key[...], k, index)
            self.cached_value[...] = _common.cache_update(self.cached_value[...], v, index)
            self.cache_index[...] = index + S
            k, v = self.cached_key[...], self.cached_value[...]
            sequence_descriptor = _common.decode_descriptor(index, B, S)
            mask_override = _common.DECODE_MASK
        out = self.attention(q, k, v, sequence_descriptor, bias, deterministic=deterministic,
                             rngs=rngs, attn_mask_type=mask_override)
        y = jnp.einsum("bshd,hde->bse", out, self.out[...].astype(out.dtype))
        if self.out_bias is not None:
            y = y + self.out_bias[...].astype(y.dtype)
        return self.dropout(y, deterministic=deterministic, rngs=rngs)
