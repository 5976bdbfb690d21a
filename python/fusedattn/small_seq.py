"""fused_attn_small_seq: cross attention of one query over a handful of keys, per segment.

Target-attention style workloads pack tens of thousands of segments, each with 1 query
token and 1..16 (up to 64) key/value tokens. General flash kernels waste most of their
work on such shapes; this backend runs scores, masked softmax and output in one pass per
(segment, head) on the CPU and on CUDA GPUs, and a backward that computes dq, dk, dv in one
pass from the saved attention weights P.

Segments (csrc/fusedattn/small_seq/segments.h has the one definition):
* THD_THD_THD: q [T_q, H_q, D], k/v [T_kv, H_kv, D]. Segment s owns the q rows
  q_offsets[s] .. q_offsets[s+1] and uses the first q_seqlens[s] of them (the whole slot
  when no lengths are given); likewise for kv. Rows of a slot past its length (padded
  tails), and rows outside every slot, get output 0 and gradient 0.
* BSHD_BSHD_BSHD: q [B, 1, H_q, D], k/v [B, S_kv, H_kv, D]; a segment is a batch entry
  (the padding masks take its lengths from the sequence descriptor).

The caller promises at most max_segment_seqlen_q (= 1) query and max_segment_seqlen_kv
keys per segment; P is saved as [T_q, H_q, 1, max_segment_seqlen_kv] float32. A segment
that breaks the promise is still computed exactly (a slower per-segment path recomputes
its weights from the saved log-sum-exp), never truncated.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib, _partition
from ._args import (ArgumentTypeError, array, fold_scale, got, is_traced, scale_arg, static_bool,
                    static_float, static_int)
from ._lib import SmallSeqParams
from .enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from .small_seq_reference import rule_slots

__all__ = ["SmallSeqDescriptor", "fused_attn_eligibility", "fused_attn_small_seq",
           "small_seq_eligibility", "small_seq_params"]

MAX_SEGMENT_SEQLEN_KV = 64  # kMaxWidth in csrc/fusedattn/small_seq/params.h


# ---------------------------------------------------------------------------
# The C queries (csrc/fusedattn/small_seq/c_api.cc, through _lib)


def small_seq_eligibility(params: SmallSeqParams, platform: str | None = None) -> tuple[bool, str]:
    """Whether the small-seq backend serves a call described by `params` on `platform`
    ("cpu" or "gpu"; None: jax.default_backend()), and why (not). The rule is the C++
    engine's (small_seq::eligibility), the one the FFI handlers enforce."""
    platform = platform or jax.default_backend()
    if platform == "cpu":
        code = _lib.PLATFORM_CPU
    elif platform in ("gpu", "cuda"):
        code = _lib.PLATFORM_CUDA
    else:
        raise ValueError(f"small_seq_eligibility: platform={platform!r}; allowed 'cpu', 'gpu' "
                         "or 'cuda'")
    return _lib.small_seq_eligible(params, code)


def small_seq_params(attn_params: _lib.AttnParams, *, num_segments: int | None = None,
                     tokens_q: int | None = None, tokens_kv: int | None = None,
                     max_segment_seqlen_q: int | None = None,
                     max_segment_seqlen_kv: int | None = None) -> SmallSeqParams:
    """SmallSeqParams of a fused_attn call (its AttnParams), for small_seq_eligibility.

    BSHD: the batch entries are the segments and the sequence lengths the promises.
    THD: pass num_segments, tokens_q, tokens_kv and the descriptor's per-segment maxima.
    """
    p = attn_params
    thd = p.layout == int(QKVLayout.THD_THD_THD)
    if thd:
        segments, tq, tkv = num_segments, tokens_q, tokens_kv
        max_q = 1 if max_segment_seqlen_q is None else max_segment_seqlen_q
        max_kv = -1 if max_segment_seqlen_kv is None else max_segment_seqlen_kv
    else:
        segments, tq, tkv = p.batch, p.batch * p.seqlen_q, p.batch * p.seqlen_kv
        max_q, max_kv = p.seqlen_q, p.seqlen_kv
    return SmallSeqParams(
        packs=1, num_segments=-1 if segments is None else segments,
        tokens_q=-1 if tq is None else tq, tokens_kv=-1 if tkv is None else tkv,
        heads_q=p.heads_q, heads_kv=p.heads_kv, head_dim_qk=p.head_dim_qk,
        head_dim_v=p.head_dim_v, max_seqlen_q=max_q, max_seqlen_kv=max_kv,
        window_left=p.window_left, window_right=p.window_right, dtype=p.dtype,
        layout=p.layout, mask_type=p.mask_type, bias_type=p.bias_type,
        softmax_type=p.softmax_type, is_training=p.is_training, has_q_seqlens=1,
        has_kv_seqlens=1, has_offsets=1 if thd else 0, scale=p.scale, dropout=p.dropout)


def fused_attn_eligibility(attn_params: _lib.AttnParams, sequence_descriptor=None, *,
                           tokens_q: int | None = None, tokens_kv: int | None = None,
                           platform: str | None = None) -> tuple[bool, str]:
    """For fused_attn's dispatch: whether this backend serves a fused_attn call (its
    AttnParams), and why (not). BSHD: the shapes are the promise (one query, at most 64
    keys). THD: the descriptor must state max_segment_seqlen_kv (and may state
    max_segment_seqlen_q); the segment count comes from its offsets or lengths, the token
    counts from q and k (tokens_q, tokens_kv)."""
    sd = sequence_descriptor
    get = lambda name: getattr(sd, name, None) if sd is not None else None
    num_segments = None
    for name, extra in (("q_offsets", 1), ("q_seqlens", 0)):
        x = get(name)
        if x is not None and num_segments is None:
            num_segments = int(np.shape(x)[-1]) - extra
    params = small_seq_params(attn_params, num_segments=num_segments, tokens_q=tokens_q,
                              tokens_kv=tokens_kv,
                              max_segment_seqlen_q=get("max_segment_seqlen_q"),
                              max_segment_seqlen_kv=get("max_segment_seqlen_kv"))
    return small_seq_eligibility(params, platform)


# ---------------------------------------------------------------------------
# The sequence information


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SmallSeqDescriptor:
    """Where the segments of a small-seq call are, and the caller's per-segment maxima.

    q_seqlens, kv_seqlens: int [N] rows each segment uses, or None (the whole slot).
    q_offsets, kv_offsets: int [N + 1] cumulative row offsets (cu_seqlens, padded or not)
      of the segments' slots; THD needs them, BSHD has none (a segment is a batch entry).
    max_segment_seqlen_q, max_segment_seqlen_kv (static): the promised maxima. THD needs
      max_segment_seqlen_kv (1..64): it is the width of the saved attention weights.
    Leading (vmap) dimensions are allowed on every array.
    """

    q_seqlens: jax.Array | None = None
    kv_seqlens: jax.Array | None = None
    q_offsets: jax.Array | None = None
    kv_offsets: jax.Array | None = None
    max_segment_seqlen_q: int = dataclasses.field(default=1, metadata=dict(static=True))
    max_segment_seqlen_kv: int | None = dataclasses.field(default=None,
                                                          metadata=dict(static=True))

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens_q, cu_seqlens_kv, *, max_segment_seqlen_kv: int,
                        max_segment_seqlen_q: int = 1, q_seqlens=None,
                        kv_seqlens=None) -> "SmallSeqDescriptor":
        """THD segments from cumulative offsets [N + 1]; lengths (optional) leave padded
        tails at the end of each slot."""
        ctor = "SmallSeqDescriptor.from_cu_seqlens"
        return cls(_ints(q_seqlens, "q_seqlens", ctor, True),
                   _ints(kv_seqlens, "kv_seqlens", ctor, True),
                   _ints(cu_seqlens_q, "cu_seqlens_q", ctor), _ints(cu_seqlens_kv, "cu_seqlens_kv", ctor),
                   _maximum(max_segment_seqlen_q, "max_segment_seqlen_q", ctor),
                   _maximum(max_segment_seqlen_kv, "max_segment_seqlen_kv", ctor))

    @classmethod
    def from_seqlens(cls, q_seqlens, kv_seqlens, *, max_segment_seqlen_kv: int | None = None,
                     max_segment_seqlen_q: int = 1) -> "SmallSeqDescriptor":
        """Lengths [N]: BSHD padding lengths, or (with max_segment_seqlen_kv) THD segments
        packed back to back (offsets are their running sums)."""
        ctor = "SmallSeqDescriptor.from_seqlens"
        return cls(_ints(q_seqlens, "q_seqlens", ctor), _ints(kv_seqlens, "kv_seqlens", ctor),
                   None, None, _maximum(max_segment_seqlen_q, "max_segment_seqlen_q", ctor),
                   _maximum(max_segment_seqlen_kv, "max_segment_seqlen_kv", ctor, True))


def _ints(x, name, where, optional=False):
    """An integer array as int32 (lists of ints are taken; floats are never truncated)."""
    if x is None and optional:
        return None
    if x is None or isinstance(x, (str, bytes)):
        raise ArgumentTypeError(f"{where}: {name} must be an integer array; got {got(x)}")
    try:
        arr = jnp.asarray(x)
    except (TypeError, ValueError, OverflowError):
        raise ArgumentTypeError(f"{where}: {name} must be an integer array; got {got(x)}") from None
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ArgumentTypeError(f"{where}: {name} must be an integer array; got shape "
                                f"{arr.shape} dtype {arr.dtype}")
    return arr.astype(jnp.int32)


def _maximum(x, name, where, optional=False):
    """A promised per-segment maximum: a Python int (the engine checks its range)."""
    if x is None and optional:
        return None
    return static_int(x, name, where, "a Python int" + (" or None" if optional else ""))


def _check_descriptor(sd, layout, mask, q, k):
    """check_descriptors=True: checkify checks that the descriptor as given is valid, so that
    no clamping or rule changes it (sequence.check_descriptor's checks, per pack): THD
    offsets inside [0, T] and non-decreasing, lengths >= 0 and within their slot [offsets[s],
    offsets[s + 1]); BSHD lengths (padding masks) within [0, S]. A broken promise
    (max_segment_seqlen_q/kv) is no error: such segments are computed exactly."""
    from .sequence import check_descriptor

    where = "fused_attn_small_seq"
    get = lambda name: _index_array(getattr(sd, name, None), name) if sd is not None else None
    rows = lambda x, n: jnp.asarray(x, jnp.int32).reshape(-1, n)
    if layout == QKVLayout.THD_THD_THD:
        q_offs, kv_offs = get("q_offsets"), get("kv_offsets")
        q_lens, kv_lens = get("q_seqlens"), get("kv_seqlens")
        if q_offs is None:  # packed back to back from the lengths: only those can be wrong
            n = q_lens.shape[-1]
            check_descriptor(rows(q_lens, n), rows(kv_lens, n), None, None, seqlen_q=q.shape[-3],
                             seqlen_kv=k.shape[-3], thd=False, padding=True, caller=where)
            q_offs, kv_offs = _cumulative(q_lens), _cumulative(kv_lens)
        n = q_offs.shape[-1] - 1
        q_offs, kv_offs = rows(q_offs, n + 1), rows(kv_offs, n + 1)
        zeros = jnp.zeros((q_offs.shape[0], n), jnp.int32)  # absent lengths: whole slots
        check_descriptor(zeros if q_lens is None else rows(q_lens, n),
                         zeros if kv_lens is None else rows(kv_lens, n), q_offs, kv_offs,
                         seqlen_q=q.shape[-3], seqlen_kv=k.shape[-3], thd=True, padding=True,
                         caller=where)
    elif mask.is_padding():
        check_descriptor(rows(get("q_seqlens"), 1), rows(get("kv_seqlens"), 1), None, None,
                         seqlen_q=q.shape[-3], seqlen_kv=k.shape[-3], thd=False, padding=True,
                         caller=where)


def _cumulative(lens):
    lens = jnp.asarray(lens, jnp.int32)
    zero = jnp.zeros(lens.shape[:-1] + (1,), jnp.int32)
    return jnp.concatenate([zero, jnp.cumsum(lens, axis=-1, dtype=jnp.int32)], axis=-1)


_EMPTY = np.zeros((0,), np.int32)


@dataclasses.dataclass(frozen=True)
class _Segments:
    """The arrays the kernels take (an absent one is [0]) and the promises."""

    q_lens: Any
    kv_lens: Any
    q_offsets: Any
    kv_offsets: Any
    max_q: int
    width: int


def _index_array(x, name):
    if x is None:
        return None
    x = _ints(x, f"sequence_descriptor.{name}", "fused_attn_small_seq") if not (
        hasattr(x, "shape") and hasattr(x, "dtype")) else x
    if not jnp.issubdtype(x.dtype, jnp.integer) or x.ndim < 1:
        raise ValueError(f"fused_attn_small_seq: sequence_descriptor.{name} must be an integer "
                         f"array; got shape {x.shape} dtype {x.dtype}")
    return x.astype(jnp.int32)


def _segments(sequence_descriptor, layout, mask, q, k) -> _Segments:
    """Reads the descriptor: a SmallSeqDescriptor, or any object with q_seqlens and
    kv_seqlens (fusedattn.SequenceDescriptor) and optionally q_offsets, kv_offsets,
    max_segment_seqlen_q and max_segment_seqlen_kv."""
    sd = sequence_descriptor
    get = lambda name: getattr(sd, name, None) if sd is not None else None
    q_lens, kv_lens = _index_array(get("q_seqlens"), "q_seqlens"), _index_array(
        get("kv_seqlens"), "kv_seqlens")
    q_offs, kv_offs = _index_array(get("q_offsets"), "q_offsets"), _index_array(
        get("kv_offsets"), "kv_offsets")
    max_q, max_kv = get("max_segment_seqlen_q"), get("max_segment_seqlen_kv")
    if layout == QKVLayout.THD_THD_THD:
        if sd is None:
            raise ValueError("fused_attn_small_seq: qkv_layout=THD_THD_THD needs a "
                             "sequence_descriptor (SmallSeqDescriptor.from_cu_seqlens(...))")
        if max_kv is None:
            raise ValueError("fused_attn_small_seq: qkv_layout=THD_THD_THD needs the promised "
                             "keys per segment: sequence_descriptor.max_segment_seqlen_kv "
                             f"(1..{MAX_SEGMENT_SEQLEN_KV})")
        if (q_offs is None) != (kv_offs is None):
            raise ValueError("fused_attn_small_seq: give both q_offsets and kv_offsets, or "
                             "neither (then both come from the lengths)")
        if q_offs is None:
            if q_lens is None or kv_lens is None:
                raise ValueError("fused_attn_small_seq: THD segments need offsets "
                                 "(q_offsets/kv_offsets) or lengths (q_seqlens/kv_seqlens)")
            q_offs, kv_offs = _cumulative(q_lens), _cumulative(kv_lens)
        n = q_offs.shape[-1] - 1
        for name, x, size in (("q_offsets", q_offs, n + 1), ("kv_offsets", kv_offs, n + 1),
                              ("q_seqlens", q_lens, n), ("kv_seqlens", kv_lens, n)):
            if x is not None and x.shape[-1] != size:
                raise ValueError(f"fused_attn_small_seq: sequence_descriptor.{name} must have "
                                 f"{size} entries per pack ({n} segments); got shape {x.shape}")
        # Out-of-order offsets under the rule of every backend, before the kernels'
        # slots see them (they assume non-decreasing offsets).
        q_offs, q_lens = rule_slots(q_offs, q_lens, q.shape[-3])
        kv_offs, kv_lens = rule_slots(kv_offs, kv_lens, k.shape[-3])
        where = "fused_attn_small_seq: sequence_descriptor"
        max_q = 1 if max_q is None else _maximum(max_q, "max_segment_seqlen_q", where)
        width = _maximum(max_kv, "max_segment_seqlen_kv", where)
    else:
        if isinstance(sd, SmallSeqDescriptor) and (q_offs is not None or kv_offs is not None):
            raise ValueError("fused_attn_small_seq: offsets are for qkv_layout=THD_THD_THD; a "
                             "BSHD segment is its batch entry")
        # fusedattn.SequenceDescriptor: a BSHD row is one segment from token 0, so only the
        # lengths count; they come as [B, 1].
        one_segment = lambda x: x[..., 0] if x is not None and x.ndim == q.ndim - 2 and \
            x.shape[-1] == 1 else x
        q_lens, kv_lens = one_segment(q_lens), one_segment(kv_lens)
        q_offs = kv_offs = None
        if mask.is_padding():
            if q_lens is None or kv_lens is None:
                raise ValueError(f"fused_attn_small_seq: attn_mask_type={mask.name} needs a "
                                 "sequence_descriptor with q_seqlens and kv_seqlens")
            for name, x in (("q_seqlens", q_lens), ("kv_seqlens", kv_lens)):
                if x.shape != q.shape[:-3]:
                    raise ValueError(f"fused_attn_small_seq: sequence_descriptor.{name} must "
                                     f"have shape {tuple(q.shape[:-3])} (the batch); got "
                                     f"{tuple(x.shape)}")
        else:
            q_lens = kv_lens = None  # without a padding mask every row is used
        max_q, width = q.shape[-3], k.shape[-3]
    absent = lambda x: _EMPTY if x is None else x
    return _Segments(absent(q_lens), absent(kv_lens), absent(q_offs), absent(kv_offs), max_q,
                     width)


# ---------------------------------------------------------------------------
# Argument checks


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static (hashable) part of a call."""

    layout: QKVLayout
    mask_type: AttnMaskType
    scale: float
    width: int

    def attrs(self, save_aux: bool, poison: bool = False) -> dict[str, Any]:
        # Names and types match SmallSeqAttrs in csrc/fusedattn/small_seq/ffi_decode.h.
        return dict(layout=np.int32(self.layout), mask_type=np.int32(self.mask_type),
                    scale=np.float32(self.scale), max_seqlen_kv=np.int64(self.width),
                    save_aux=np.int32(save_aux), poison=np.int32(poison))


def _enum(enum_cls, value, name):
    if isinstance(value, (bool, float, np.bool_, np.floating)) or is_traced(value):
        raise ArgumentTypeError(f"fused_attn_small_seq: {name} must be a member of "
                                f"{enum_cls.__name__} (or its int code); got {got(value)}")
    try:
        return enum_cls(value)
    except (ValueError, TypeError):
        allowed = ", ".join(m.name for m in enum_cls)
        raise ValueError(f"fused_attn_small_seq: {name}={value!r} is not a valid "
                         f"{enum_cls.__name__}; allowed: {allowed}") from None


def _raise_for_status(code: int, message: str) -> None:
    if code == _lib.STATUS_UNIMPLEMENTED:
        raise NotImplementedError(f"fused_attn_small_seq: {message}")
    if code != _lib.STATUS_OK:
        raise ValueError(f"fused_attn_small_seq: {message}")


def _split_qkv(qkv, layout):
    if not isinstance(qkv, (tuple, list)) or len(qkv) != 3:
        raise ValueError("fused_attn_small_seq: qkv must be a tuple (q, k, v) of separate "
                         "tensors (qkv_layout BSHD_BSHD_BSHD or THD_THD_THD)")
    q, k, v = qkv
    rank = 3 if layout == QKVLayout.THD_THD_THD else 4
    shape = "[tokens, heads, head_dim]" if rank == 3 else "[batch, seq, heads, head_dim]"
    for name, x in zip("qkv", (q, k, v)):
        array(x, name, "fused_attn_small_seq", f"an array {shape}")
        if len(x.shape) < rank:
            raise ValueError(f"fused_attn_small_seq: {name} must be {shape} for qkv_layout="
                             f"{layout.name}; got shape {tuple(x.shape)}")
    if not (len(q.shape) == len(k.shape) == len(v.shape)):
        raise ValueError(f"fused_attn_small_seq: q, k, v must have the same rank; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    dtypes = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _lib.DTYPE_CODES:
        raise ValueError(f"fused_attn_small_seq: dtype: got q {q.dtype}, k {k.dtype}, v "
                         f"{v.dtype}; q, k and v must share one dtype among float32, bfloat16 "
                         "and float16")
    lead = len(q.shape) - rank + (0 if rank == 3 else 1)
    if q.shape[:lead] != k.shape[:lead] or k.shape[:lead] != v.shape[:lead]:
        raise ValueError(f"fused_attn_small_seq: q, k, v leading dimensions differ: "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"fused_attn_small_seq: k and v must have the same shape; got "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"fused_attn_small_seq: q and k must have the same head dim; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    return q, k, v


def _prepare(qkv, bias, sequence_descriptor, *, attn_mask_type, qkv_layout, scaling_factor,
             dropout_probability, is_training):
    layout = _enum(QKVLayout, qkv_layout, "qkv_layout")
    mask = _enum(AttnMaskType, attn_mask_type, "attn_mask_type")
    if layout not in (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD):
        raise NotImplementedError(
            f"fused_attn_small_seq: qkv_layout={layout.name} is not served; the small-seq "
            "backend takes separate q, k, v: BSHD_BSHD_BSHD or THD_THD_THD")
    if bias is not None:
        raise NotImplementedError("fused_attn_small_seq: bias is not implemented; pass None")
    q, k, v = _split_qkv(qkv, layout)
    seg = _segments(sequence_descriptor, layout, mask, q, k)
    where = "fused_attn_small_seq"
    scale, traced_scale = scale_arg(scaling_factor, "scaling_factor", where, q.shape[-1])
    dropout = static_float(dropout_probability, "dropout_probability", where,
                           "a static Python float (0: dropout is not implemented)")
    is_training = static_bool(is_training, "is_training", where)
    thd = layout == QKVLayout.THD_THD_THD
    lead = int(np.prod(q.shape[:-3])) if thd else 1
    n = seg.q_offsets.shape[-1] - 1 if thd else int(np.prod(q.shape[:-3]))
    params = SmallSeqParams(
        packs=lead, num_segments=n,
        tokens_q=q.shape[-3] if thd else n * q.shape[-3],
        tokens_kv=k.shape[-3] if thd else n * k.shape[-3], heads_q=q.shape[-2],
        heads_kv=k.shape[-2], head_dim_qk=q.shape[-1], head_dim_v=v.shape[-1],
        max_seqlen_q=seg.max_q, max_seqlen_kv=seg.width, window_left=-1, window_right=-1,
        dtype=_lib.DTYPE_CODES[jnp.dtype(q.dtype).name], layout=int(layout),
        mask_type=int(mask), bias_type=int(AttnBiasType.NO_BIAS),
        softmax_type=int(SoftmaxType.VANILLA_SOFTMAX), is_training=int(bool(is_training)),
        has_q_seqlens=int(seg.q_lens.shape[-1] > 0), has_kv_seqlens=int(seg.kv_lens.shape[-1] > 0),
        has_offsets=int(thd), scale=scale, dropout=dropout)
    _raise_for_status(*_lib.small_seq_validate(params))
    if traced_scale is not None:  # runs as scale 1.0 with s * q (as fused_attn's)
        q = fold_scale(q, traced_scale)
    return q, k, v, seg, _Config(layout, mask, scale, seg.width)


# ---------------------------------------------------------------------------
# The differentiable core


def _aux_shapes(q, cfg: _Config):
    """probs [..., T_q, H_q, 1, W] and stats [..., T_q, H_q, 2], both float32."""
    if cfg.layout == QKVLayout.THD_THD_THD:
        rows = q.shape[:-1]                      # [..., T_q, H_q]
    else:
        rows = q.shape[:-3] + (q.shape[-2],)     # [..., B, H_q] (one query per batch entry)
    return (jax.ShapeDtypeStruct(rows + (1, cfg.width), jnp.float32),
            jax.ShapeDtypeStruct(rows + (2,), jnp.float32))


def _check_platform():
    if jax.default_backend() not in ("cpu",) and not _lib.built_with_cuda():
        raise NotImplementedError(
            "fused_attn_small_seq: this build of fusedattn has no CUDA kernels; it runs on the "
            "CPU, or on a CUDA GPU with a build that found nvcc")


def forward(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, cfg: _Config, *, save_aux=True,
            poison=False):
    """The forward FFI call: (out, probs, stats). Without save_aux, probs and stats are
    left unwritten. poison (tests only) fills the outputs with NaN first."""
    call = jax.ffi.ffi_call(
        "fusedattn_small_seq_fwd",
        (jax.ShapeDtypeStruct(q.shape, q.dtype), *_aux_shapes(q, cfg)),
        vmap_method="broadcast_all")  # the handler takes leading dims (packs / batch)
    args = (q, k, v, q_lens, kv_lens, q_offsets, kv_offsets)
    return _partition.vary_like(tuple(call(*args, **cfg.attrs(save_aux, poison))), *args)


def backward(q, k, v, out, dout, probs, stats, q_lens, kv_lens, q_offsets, kv_offsets,
             cfg: _Config, *, poison=False):
    """The backward FFI call: (dq, dk, dv)."""
    call = jax.ffi.ffi_call(
        "fusedattn_small_seq_bwd",
        (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
         jax.ShapeDtypeStruct(v.shape, v.dtype)),
        vmap_method="broadcast_all")
    args = (q, k, v, out, dout, probs, stats, q_lens, kv_lens, q_offsets, kv_offsets)
    return _partition.vary_like(tuple(call(*args, **cfg.attrs(False, poison))), *args)


# Partitioning (_partition.py): every segment is independent, so the packs / batch and
# the heads shard with no collective (THD tokens stay whole: the offsets index them). k
# and v whose heads do not divide by the head axes are replicated, each device taking the
# kv heads its q heads use (and summing their gradients over the head axes).


def _roles(static, arg_shapes, res_shapes):
    cfg = static[0]
    thd = cfg.layout == QKVLayout.THD_THD_THD
    base = 3 if thd else 4
    q_shape = arg_shapes[0]
    lead = _partition.lead(len(q_shape) - base)
    tok = () if thd else ("b",)  # the batch dim of BSHD (THD: the tokens, before the heads)
    seq = (None,)
    qr = lead + tok + seq + ("h", None)
    kr = lead + tok + seq + ("k", None)
    rows = lead + (tok if not thd else (None,)) + ("h",)  # probs / stats rows [.., T|B, H]

    def index_roles(shape):  # lengths [.., B] (BSHD) or [.., n] / offsets [.., n + 1]
        if len(shape) != len(lead) + 1:
            return (None,) * len(shape)
        return lead + (("b",) if not thd and shape[-1] == q_shape[len(lead)] else (None,))

    names = {"q": qr, "k": kr, "v": kr, "out": qr, "dout": qr, "probs": rows + (None, None),
             "stats": rows + (None,)}
    args = [names[n] if n in names else index_roles(shape)
            for n, shape in zip(static[1], arg_shapes)]
    results = [names[n] for n in static[2]]
    return args, results


def _local_kv(plan, q, k, v):
    h_local, hkv = q.shape[-2], k.shape[-2]
    hq = h_local * (plan.size("h") if plan is not None else 1)
    return _partition.take_kv_heads(plan, k.ndim - 2, h_local, hq, hkv, k, v)


def _fwd_impl(static, plan, q, k, v, *idx):
    cfg, _, _, save_aux = static
    _, (k, v) = _local_kv(plan, q, k, v)
    return forward(q, k, v, *idx, cfg, save_aux=save_aux)


def _bwd_impl(static, plan, q, k, v, out, dout, probs, stats, *idx):
    cfg = static[0]
    hkv = k.shape[-2]
    taken, (k_loc, v_loc) = _local_kv(plan, q, k, v)
    dq, dk, dv = backward(q, k_loc, v_loc, out, dout, probs, stats, *idx, cfg)
    if taken is not None:
        dk, dv = _partition.put_kv_heads(plan, taken, k.ndim - 2, hkv, dk, dv)
    return dq, dk, dv


_INDEX = ("q_seqlens", "kv_seqlens", "q_offsets", "kv_offsets")
_FWD = _partition.Partitioned("fused_attn_small_seq", _fwd_impl, _roles,
                              ("q", "k", "v") + _INDEX)
_BWD = _partition.Partitioned("fused_attn_small_seq_bwd", _bwd_impl, _roles,
                              ("q", "k", "v", "out", "dout", "probs", "stats") + _INDEX)


def _fwd_call(q, k, v, idx, cfg: _Config, save_aux: bool):
    results = ("out", "probs", "stats")
    return _FWD((cfg, ("q", "k", "v") + _INDEX, results, save_aux), q, k, v, *idx)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _small_seq(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, cfg: _Config):
    # Not differentiated: P and the statistics are not needed, so not written.
    return _fwd_call(q, k, v, (q_lens, kv_lens, q_offsets, kv_offsets), cfg, False)[0]


def _small_seq_fwd(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, cfg: _Config):
    out, probs, stats = _fwd_call(q, k, v, (q_lens, kv_lens, q_offsets, kv_offsets), cfg, True)
    return out, (q, k, v, out, probs, stats, q_lens, kv_lens, q_offsets, kv_offsets)


def _small_seq_bwd(cfg: _Config, residuals, dout):
    q, k, v, out, probs, stats, q_lens, kv_lens, q_offsets, kv_offsets = residuals
    names = ("q", "k", "v", "out", "dout", "probs", "stats") + _INDEX
    dq, dk, dv = _BWD((cfg, names, ("q", "k", "v"), False), q, k, v, out,
                      dout.astype(out.dtype), probs, stats, q_lens, kv_lens, q_offsets,
                      kv_offsets)
    return dq, dk, dv, None, None, None, None


_small_seq.defvjp(_small_seq_fwd, _small_seq_bwd)


def fused_attn_small_seq(qkv, bias, sequence_descriptor, seed, *,
                         attn_mask_type=AttnMaskType.PADDING_MASK,
                         qkv_layout=QKVLayout.THD_THD_THD,
                         scaling_factor=None,
                         dropout_probability=0.0,
                         is_training=False,
                         check_descriptors=False):
    """Small-sequence cross attention: one query per segment over at most 64 keys.

    qkv: (q, k, v). THD_THD_THD: q [T_q, H_q, D], k/v [T_kv, H_kv, D]; BSHD_BSHD_BSHD:
      q [B, 1, H_q, D], k/v [B, S_kv, H_kv, D] (S_kv <= 64). D in {64, 128, 256, 512};
      float32, bfloat16 or float16 (all the same); H_q a multiple of H_kv (GQA/MQA).
      Leading (vmap) dimensions are allowed.
    bias: None (bias is not implemented).
    sequence_descriptor: a SmallSeqDescriptor (THD: offsets and/or lengths, and
      max_segment_seqlen_kv), or a fusedattn.SequenceDescriptor (BSHD lengths); None for
      BSHD without a padding mask.
    seed: unused (dropout is not implemented).
    attn_mask_type: THD needs a padding mask (segments bound attention); the causal
      variants apply within a segment (with one query, top-left causal keeps only the
      first key and bottom-right causal keeps all).
    scaling_factor: multiplies q.k before the softmax; None means 1/sqrt(D). A number, or
      a 0-d array traced under jit/grad: that one is folded into q (s * q in q's dtype,
      the kernel then runs with scale 1.0), so gradients reach it.
    dropout_probability: a static float; must be 0 when is_training (not implemented).
    check_descriptors: off (default), an invalid runtime sequence_descriptor is clamped by
      the rule of every backend (segments.h; the same answer on each). On, it is an error
      instead, naming the pack, the segment and the value: THD offsets outside [0, T] or out
      of order, negative lengths, a length past its slot or the buffer; BSHD lengths
      outside [0, S]. The checks are jax.experimental.checkify checks, as fused_attn's:
      eagerly they raise at once; under jit, use err, out = checkify.checkify(jax.jit(f))
      (...); err.throw().
    Bad arguments raise ValueError, or ArgumentTypeError (a TypeError that is also a
    ValueError) for the wrong kind of argument, naming it.

    Returns out, shaped like q, in q's dtype. Differentiable in q, k and v.
    """
    del seed  # dropout is not implemented; _prepare rejects dropout_probability > 0
    q, k, v, seg, cfg = _prepare(
        qkv, bias, sequence_descriptor, attn_mask_type=attn_mask_type, qkv_layout=qkv_layout,
        scaling_factor=scaling_factor, dropout_probability=dropout_probability,
        is_training=is_training)
    if static_bool(check_descriptors, "check_descriptors", "fused_attn_small_seq"):
        _check_descriptor(sequence_descriptor, cfg.layout, cfg.mask_type, q, k)
    _check_platform()
    return _small_seq(q, k, v, seg.q_lens, seg.kv_lens, seg.q_offsets, seg.kv_offsets, cfg)
