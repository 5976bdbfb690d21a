"""fused_attn: the JAX face of the fused attention engine.

Argument checks happen at trace time and ask the C++ engine's own validate(),
so a bad call fails with the engine's message before anything runs. The
forward and backward run as XLA FFI custom calls on the CPU; on platforms
without a fused kernel in this build, XLA computes reference.py instead (with
a one-time warning). get_backend() says which of the two a call gets.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi
from .enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from .reference import attention_reference
from .sequence import SequenceDescriptor

__all__ = ["fused_attn", "get_backend", "is_fused_attn_kernel_available", "BackendInfo"]


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static (hashable) part of a call: everything but the arrays."""

    layout: QKVLayout
    mask_type: AttnMaskType
    bias_type: AttnBiasType
    softmax_type: SoftmaxType
    scale: float
    dropout: float
    is_training: bool
    window: tuple[int, int]

    def ffi_attrs(self) -> dict[str, Any]:
        # Names and types match AttnAttrs in csrc/fusedattn/ffi/attn_decode.h.
        return dict(layout=np.int32(self.layout), mask_type=np.int32(self.mask_type),
                    bias_type=np.int32(self.bias_type), softmax_type=np.int32(self.softmax_type),
                    is_training=np.int32(self.is_training), scale=np.float32(self.scale),
                    dropout=np.float32(self.dropout), window_left=np.int64(self.window[0]),
                    window_right=np.int64(self.window[1]))

    def params(self, dtype, batch, seqlen_q, seqlen_kv, heads_q, heads_kv, head_dim_qk,
               head_dim_v) -> _ffi.AttnParams:
        return _ffi.AttnParams(
            batch=batch, seqlen_q=seqlen_q, seqlen_kv=seqlen_kv, heads_q=heads_q,
            heads_kv=heads_kv, head_dim_qk=head_dim_qk, head_dim_v=head_dim_v,
            window_left=self.window[0], window_right=self.window[1],
            dtype=_ffi.DTYPE_CODES.get(jnp.dtype(dtype).name, -1), layout=int(self.layout),
            mask_type=int(self.mask_type), bias_type=int(self.bias_type),
            softmax_type=int(self.softmax_type), is_training=int(self.is_training),
            scale=self.scale, dropout=self.dropout)


def _raise_for_status(code: int, message: str) -> None:
    if code == _ffi.STATUS_UNIMPLEMENTED:
        raise NotImplementedError(f"fused_attn: {message}")
    if code != _ffi.STATUS_OK:
        raise ValueError(f"fused_attn: {message}")


def _enum(enum_cls, value, name: str):
    try:
        return enum_cls(value)
    except ValueError:
        allowed = ", ".join(m.name for m in enum_cls)
        raise ValueError(f"fused_attn: {name}={value!r} is not a valid {enum_cls.__name__}; "
                         f"allowed: {allowed}") from None


def _window(window_size) -> tuple[int, int]:
    if window_size is None:
        return (-1, -1)
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"fused_attn: window_size must be None or a pair (left, right) of ints; "
                         f"got {window_size!r}") from None
    return (left, right)


def _split_qkv(qkv, layout: QKVLayout):
    if layout != QKVLayout.BSHD_BSHD_BSHD:
        raise NotImplementedError(
            f"fused_attn: qkv_layout={layout.name} is not implemented yet; implemented: "
            "BSHD_BSHD_BSHD")
    if not isinstance(qkv, (tuple, list)) or len(qkv) != 3:
        raise ValueError("fused_attn: qkv must be a tuple (q, k, v) for qkv_layout=BSHD_BSHD_BSHD")
    q, k, v = qkv
    for name, x in zip("qkv", (q, k, v)):
        if len(x.shape) != 4:
            raise ValueError(f"fused_attn: {name} must have rank 4 [batch, seq, heads, head_dim]; "
                             f"got shape {tuple(x.shape)}")
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _ffi.DTYPE_CODES:
        raise ValueError(f"fused_attn: dtype: got q {q.dtype}, k {k.dtype}, v {v.dtype}; q, k and "
                         "v must share one dtype among float32, bfloat16 and float16")
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError(f"fused_attn: batch sizes differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(f"fused_attn: k and v must have the same sequence length and heads; got "
                         f"k {k.shape}, v {v.shape}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"fused_attn: q and k must have the same head dim; got q {q.shape}, "
                         f"k {k.shape}")
    return q, k, v


def _prepare(qkv, bias, sequence_descriptor, *, attn_bias_type, attn_mask_type, qkv_layout,
             softmax_type, scaling_factor, dropout_probability, is_training, max_segments_per_seq,
             window_size, softmax_offset):
    """Checks a call and returns (q, k, v, config, params). Raises on bad input."""
    layout = _enum(QKVLayout, qkv_layout, "qkv_layout")
    mask_type = _enum(AttnMaskType, attn_mask_type, "attn_mask_type")
    bias_type = _enum(AttnBiasType, attn_bias_type, "attn_bias_type")
    softmax = _enum(SoftmaxType, softmax_type, "softmax_type")
    q, k, v = _split_qkv(qkv, layout)
    if bias is not None and bias_type == AttnBiasType.NO_BIAS:
        raise ValueError("fused_attn: bias was given but attn_bias_type=NO_BIAS; pass bias=None "
                         "or choose PRE_SCALE_BIAS / POST_SCALE_BIAS")
    if softmax_offset is not None and softmax != SoftmaxType.LEARNABLE_SOFTMAX:
        raise ValueError("fused_attn: softmax_offset is only used with "
                         "softmax_type=LEARNABLE_SOFTMAX")
    if max_segments_per_seq != 1:
        raise NotImplementedError(
            f"fused_attn: max_segments_per_seq={max_segments_per_seq} is not implemented yet "
            "(packed THD sequences); use 1")
    if mask_type.is_padding() and sequence_descriptor is None:
        raise ValueError(f"fused_attn: attn_mask_type={mask_type.name} needs a "
                         "sequence_descriptor (SequenceDescriptor.from_seqlens(...))")
    if sequence_descriptor is not None and not isinstance(sequence_descriptor, SequenceDescriptor):
        raise ValueError("fused_attn: sequence_descriptor must be a SequenceDescriptor or None; "
                         f"got {type(sequence_descriptor).__name__}")
    scale = float(q.shape[-1] ** -0.5 if scaling_factor is None else scaling_factor)
    cfg = _Config(layout, mask_type, bias_type, softmax, scale, float(dropout_probability),
                  bool(is_training), _window(window_size))
    params = cfg.params(q.dtype, q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2],
                        q.shape[3], v.shape[3])
    _raise_for_status(*_ffi.validate(params))
    if sequence_descriptor is not None:
        for name in ("q_seqlens", "kv_seqlens"):
            lens = getattr(sequence_descriptor, name)
            if lens.shape != (q.shape[0],):
                raise ValueError(f"fused_attn: sequence_descriptor.{name} must have shape "
                                 f"[{q.shape[0]}] (the batch); got {tuple(lens.shape)}")
    return q, k, v, cfg, params


# ---------------------------------------------------------------------------
# The differentiable core: (q, k, v, q_lens, kv_lens) -> (out, lse, max_logit per batch)


def _fwd_ffi(q, k, v, q_lens, kv_lens, cfg: _Config):
    B, Sq, Hq, _ = q.shape
    Dv = v.shape[-1]
    call = jax.ffi.ffi_call(
        "fusedattn_attn_fwd",
        (jax.ShapeDtypeStruct((B, Sq, Hq, Dv), q.dtype),
         jax.ShapeDtypeStruct((B, Hq, Sq), jnp.float32),
         jax.ShapeDtypeStruct((B, Hq), jnp.float32)),
        vmap_method="broadcast_all")  # the handler folds vmap's leading dims into the batch
    return call(q, k, v, q_lens, kv_lens, **cfg.ffi_attrs())


def _bwd_ffi(q, k, v, out, dout, lse, q_lens, kv_lens, cfg: _Config):
    call = jax.ffi.ffi_call(
        "fusedattn_attn_bwd",
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
         jax.ShapeDtypeStruct(v.shape, v.dtype)),
        vmap_method="broadcast_all")
    return call(q, k, v, out, dout, lse, q_lens, kv_lens, **cfg.ffi_attrs())


def _reference(q, k, v, q_lens, kv_lens, cfg: _Config):
    return attention_reference(q, k, v, attn_mask_type=cfg.mask_type, scaling_factor=cfg.scale,
                               q_seqlens=q_lens, kv_seqlens=kv_lens)


def _bwd_reference(q, k, v, out, dout, lse, q_lens, kv_lens, cfg: _Config):
    _, vjp = jax.vjp(lambda q, k, v: _reference(q, k, v, q_lens, kv_lens, cfg)[0], q, k, v)
    return vjp(dout)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, q_lens, kv_lens, cfg: _Config):
    return jax.lax.platform_dependent(
        q, k, v, q_lens, kv_lens,
        cpu=functools.partial(_fwd_ffi, cfg=cfg),
        default=functools.partial(_reference, cfg=cfg))


def _attention_fwd(q, k, v, q_lens, kv_lens, cfg: _Config):
    out, lse, max_logit = _attention(q, k, v, q_lens, kv_lens, cfg)
    return (out, lse, max_logit), (q, k, v, out, lse, q_lens, kv_lens)


def _attention_bwd(cfg: _Config, residuals, cotangents):
    q, k, v, out, lse, q_lens, kv_lens = residuals
    dout = cotangents[0].astype(out.dtype)  # lse and max_logit carry no gradient
    dq, dk, dv = jax.lax.platform_dependent(
        q, k, v, out, dout, lse, q_lens, kv_lens,
        cpu=functools.partial(_bwd_ffi, cfg=cfg),
        default=functools.partial(_bwd_reference, cfg=cfg))
    return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


_warned: set[str] = set()


def _warn_if_fallback(params: _ffi.AttnParams) -> None:
    platform = jax.default_backend()
    if platform == "cpu":
        return
    name, _, reason = _ffi.select_backend(params, _ffi.PLATFORM_CUDA)
    if name == "xla_reference" and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"fusedattn on {platform}: {reason}", RuntimeWarning, stacklevel=3)


def fused_attn(qkv, bias, sequence_descriptor, seed, *,
               attn_bias_type=AttnBiasType.NO_BIAS,
               attn_mask_type=AttnMaskType.NO_MASK,
               qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
               softmax_type=SoftmaxType.VANILLA_SOFTMAX,
               scaling_factor=None,
               dropout_probability=0.0,
               is_training=False,
               max_segments_per_seq=1,
               window_size=None,
               softmax_offset=None,
               return_max_logit=False,
               return_aux=False):
    """Fused scaled-dot-product attention.

    qkv: (q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv]) for BSHD_BSHD_BSHD;
      float32, bfloat16 or float16 (all the same); Hq a multiple of Hkv (GQA/MQA).
    bias: None (attn_bias_type=NO_BIAS).
    sequence_descriptor: SequenceDescriptor (required by the padding masks) or None.
    seed: dropout seed; unused while dropout_probability == 0.
    scaling_factor: multiplies q.k before the softmax; None means 1/sqrt(D).

    Returns out [B, Sq, Hq, Dv] in q's dtype, or (out, aux) when return_max_logit or
    return_aux is set: aux["max_logit"] f32 [Hq] (max over batch, queries and kept keys
    of the scaled logits), aux["softmax_aux"] f32 [B, Hq, Sq, 1] (log-sum-exp of the
    scaled masked logits; -inf for a fully masked row). Neither carries a gradient.
    """
    del seed  # dropout is not implemented yet; _prepare rejects dropout_probability > 0
    q, k, v, cfg, params = _prepare(
        qkv, bias, sequence_descriptor, attn_bias_type=attn_bias_type,
        attn_mask_type=attn_mask_type, qkv_layout=qkv_layout, softmax_type=softmax_type,
        scaling_factor=scaling_factor, dropout_probability=dropout_probability,
        is_training=is_training, max_segments_per_seq=max_segments_per_seq,
        window_size=window_size, softmax_offset=softmax_offset)
    _warn_if_fallback(params)
    if sequence_descriptor is not None:
        q_lens, kv_lens = sequence_descriptor.q_seqlens, sequence_descriptor.kv_seqlens
    else:
        q_lens = jnp.full((q.shape[0],), q.shape[1], jnp.int32)
        kv_lens = jnp.full((q.shape[0],), k.shape[1], jnp.int32)
    out, lse, max_logit = _attention(q, k, v, q_lens.astype(jnp.int32), kv_lens.astype(jnp.int32),
                                     cfg)
    if not (return_max_logit or return_aux):
        return out
    aux = {}
    if return_max_logit:
        aux["max_logit"] = jax.lax.stop_gradient(jnp.max(max_logit, axis=0))
    if return_aux:
        aux["softmax_aux"] = jax.lax.stop_gradient(lse[..., None])
    return out, aux


# ---------------------------------------------------------------------------
# Backend queries


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """Which backend runs a call: name is "cpu_flash", "xla_reference" or "none".

    fused is True when one of fusedattn's own kernels serves the call; reason says
    why this backend and why not the others (or, for "none", what is wrong).
    """

    name: str
    fused: bool
    reason: str


_FUSED_BACKENDS = {"cpu_flash"}


def _platform_code(platform: str | None) -> int:
    platform = platform or jax.default_backend()
    if platform == "cpu":
        return _ffi.PLATFORM_CPU
    if platform in ("gpu", "cuda"):
        return _ffi.PLATFORM_CUDA
    raise ValueError(f"get_backend: platform={platform!r}; allowed 'cpu', 'gpu' or 'cuda'")


def _backend_info(params: _ffi.AttnParams, platform: str | None) -> BackendInfo:
    name, _, reason = _ffi.select_backend(params, _platform_code(platform))
    return BackendInfo(name, name in _FUSED_BACKENDS, reason)


def get_backend(qkv, bias=None, sequence_descriptor=None, *,
                attn_bias_type=AttnBiasType.NO_BIAS,
                attn_mask_type=AttnMaskType.NO_MASK,
                qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
                softmax_type=SoftmaxType.VANILLA_SOFTMAX,
                scaling_factor=None,
                dropout_probability=0.0,
                is_training=False,
                max_segments_per_seq=1,
                window_size=None,
                softmax_offset=None,
                platform: str | None = None) -> BackendInfo:
    """The backend fused_attn would use for these arguments (arrays or ShapeDtypeStructs).

    platform: "cpu" or "gpu" (anything else raises ValueError); None means
    jax.default_backend(). A bad attention call does not raise: it returns name
    "none" with the error as the reason.
    """
    try:
        *_, params = _prepare(
            qkv, bias, sequence_descriptor, attn_bias_type=attn_bias_type,
            attn_mask_type=attn_mask_type, qkv_layout=qkv_layout, softmax_type=softmax_type,
            scaling_factor=scaling_factor, dropout_probability=dropout_probability,
            is_training=is_training, max_segments_per_seq=max_segments_per_seq,
            window_size=window_size, softmax_offset=softmax_offset)
    except (ValueError, NotImplementedError) as e:
        return BackendInfo("none", False, str(e))
    return _backend_info(params, platform)


def is_fused_attn_kernel_available(is_training, q_dtype, kv_dtype, qkv_layout, attn_bias_type,
                                   attn_mask_type, softmax_type, dropout_probability,
                                   q_num_heads, kv_num_heads, q_max_seqlen, kv_max_seqlen,
                                   head_dim_qk, head_dim_v, window_size=None, platform=None):
    """True when one of fusedattn's fused kernels serves this configuration."""
    if jnp.dtype(q_dtype) != jnp.dtype(kv_dtype):
        return False
    cfg = _Config(QKVLayout(qkv_layout), AttnMaskType(attn_mask_type),
                  AttnBiasType(attn_bias_type), SoftmaxType(softmax_type), 1.0,
                  float(dropout_probability), bool(is_training), _window(window_size))
    params = cfg.params(q_dtype, 1, q_max_seqlen, kv_max_seqlen, q_num_heads, kv_num_heads,
                        head_dim_qk, head_dim_v)
    return _backend_info(params, platform).fused
