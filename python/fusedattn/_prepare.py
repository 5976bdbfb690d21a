"""Checks a fused_attn call and turns it into the engine's eleven FFI operands and a static
config (csrc/fusedattn/attention/ffi_decode.h lists the operands).

Bad input raises at trace time, naming the argument, the value and what is allowed:
ArgumentTypeError (a TypeError that is also a ValueError) for the wrong kind of argument
(a list where an array goes, a string or a float where an int goes, a traced value where
a static one goes), ValueError for a wrong value, NotImplementedError for what the engine
does not serve. Python checks kinds and that numbers fit the engine's int64 / float32
fields; the engine's own validate() checks every range and has the last word: Python asks
it through the C API with the same AttnParams the FFI handler will decode.
The kinds are checked by _args.py's helpers, which every op module shares.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib
from ._args import (ArgumentTypeError, got, is_bool, array, fold_scale, is_traced, scale_arg,
                    static_bool, static_float, static_int)
from .determinism import is_deterministic
from .enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from .sequence import SequenceDescriptor, compact, from_dense_mask, packed_offsets

THD_LAYOUTS = (QKVLayout.T3HD, QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD)
QKV_PACKED = (QKVLayout.BS3HD, QKVLayout.T3HD)
KV_PACKED = (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)
# The FFI operands every attention call starts with (ffi_decode.h): q, k, v, bias,
# softmax_offset, seed, q_seqlens, kv_seqlens, q_offsets, kv_offsets, index_base.
N_OPS = 11


@dataclasses.dataclass(frozen=True)
class Config:
    """Static (hashable) part of a call: everything but the arrays."""

    layout: QKVLayout
    mask_type: AttnMaskType
    bias_type: AttnBiasType
    softmax_type: SoftmaxType
    scale: float
    dropout: float
    is_training: bool
    window: tuple[int, int]
    # Forward results the caller reads (a GPU graph may skip the others); the CPU
    # engine computes all of them regardless.
    want_lse: bool = False
    want_max_logit: bool = False
    # context parallelism (context_parallel.CPConfig) or None
    cp: Any = None
    # the name out, lse and max_logit are tagged with (jax.ad_checkpoint.checkpoint_name),
    # None: none
    checkpoint_name: str | None = "context"
    # the bias is a folded boolean mask (dot_product_attention's): _lib.REQUEST_MASK_BIAS
    mask_bias: bool = False
    # ... and it holds no values (no bias came beside the mask): _lib.REQUEST_MASK_KEEP_ONLY;
    # the bias operand is then the boolean mask itself (keep_mask)
    mask_keep_only: bool = False
    # jax.nn.dot_product_attention's rows that keep nothing get the average of the values
    # (dot_product_attention's): _lib.REQUEST_AVERAGE_EMPTY_ROWS, done by every backend
    average_empty_rows: bool = False
    # the backward's dbias is wanted: False when the bias has no tangent (a constant, a
    # folded mask; _autodiff's specialize): _lib.REQUEST_NO_DBIAS, the kernels skip it
    want_dbias: bool = True
    # the score_mod's array operands' gradient is wanted (_autodiff's specialize):
    # _lib.REQUEST_SCORE_MOD_GRADS, a routing matter on the GPU (backend.h)
    sm_grads: bool = False
    # one dropout mask for every batch entry and head: _lib.REQUEST_DROPOUT_BROADCAST
    dropout_broadcast: bool = False
    # a bitwise repeatable backward (determinism.py, read at trace time):
    # _lib.REQUEST_DETERMINISTIC
    deterministic: bool = False

    @property
    def thd(self) -> bool:
        return self.layout in THD_LAYOUTS

    @property
    def dropout_on(self) -> bool:
        return self.is_training and self.dropout > 0.0

    @property
    def request_flags(self) -> int:
        """The call's own REQUEST_* bits beside the bias's: _lib.REQUEST_DROPOUT_BROADCAST
        when dropout runs with one shared mask, _lib.REQUEST_DETERMINISTIC in deterministic
        mode."""
        return ((_lib.REQUEST_DROPOUT_BROADCAST if self.dropout_on and self.dropout_broadcast else 0)
                | (_lib.REQUEST_DETERMINISTIC if self.deterministic else 0))

    def ffi_attrs(self) -> dict[str, Any]:
        # Names and types match AttnAttrs in csrc/fusedattn/attention/ffi_decode.h.
        return dict(layout=np.int32(self.layout), mask_type=np.int32(self.mask_type),
                    bias_type=np.int32(self.bias_type), softmax_type=np.int32(self.softmax_type),
                    is_training=np.int32(self.is_training), scale=np.float64(self.scale),
                    dropout=np.float64(self.dropout), window_left=np.int64(self.window[0]),
                    window_right=np.int64(self.window[1]), want_lse=np.int32(self.want_lse),
                    want_max_logit=np.int32(self.want_max_logit), backend_flags=np.int32(0))

    @property
    def keep_mask(self) -> bool:
        """The bias operand is a boolean keep mask (dot_product_attention's mask alone): it
        takes no gradient (its slot in the backward's results is a boolean array nothing
        writes, dropped by attention._fused_bwd)."""
        return self.mask_bias and self.mask_keep_only

    def params(self, dtype, batch, seqlen_q, seqlen_kv, heads_q, heads_kv, head_dim_qk,
               head_dim_v, max_segments=1, bias_batch=0, bias_heads=0) -> _lib.AttnParams:
        return _lib.AttnParams(
            batch=batch, seqlen_q=seqlen_q, seqlen_kv=seqlen_kv, heads_q=heads_q,
            heads_kv=heads_kv, head_dim_qk=head_dim_qk, head_dim_v=head_dim_v,
            window_left=self.window[0], window_right=self.window[1], max_segments=max_segments,
            bias_batch=bias_batch, bias_heads=bias_heads, num_slices=1,
            dtype=_lib.ATTN_DTYPE_CODES.get(jnp.dtype(dtype).name, -1), layout=int(self.layout),
            mask_type=int(self.mask_type), bias_type=int(self.bias_type),
            softmax_type=int(self.softmax_type), is_training=int(self.is_training),
            scale=self.scale, dropout=self.dropout)


@dataclasses.dataclass(frozen=True)
class Dims:
    B: int
    Sq: int
    Skv: int
    Hq: int
    Hkv: int
    D: int
    Dv: int


def raise_for_status(code: int, message: str) -> None:
    if code == _lib.STATUS_UNIMPLEMENTED:
        raise NotImplementedError(f"fused_attn: {message}")
    if code != _lib.STATUS_OK:
        raise ValueError(f"fused_attn: {message}")


def enum(enum_cls, value, name: str, where: str = "fused_attn"):
    """An enum member from itself or its int code (a bool, a float or a traced value is
    not a code)."""
    allowed = ", ".join(m.name for m in enum_cls)
    if is_bool(value) or is_traced(value) or isinstance(value, (float, np.floating)):
        raise ArgumentTypeError(f"{where}: {name} must be a member of {enum_cls.__name__} (or "
                                f"its int code); got {got(value)}; allowed: {allowed}")
    try:
        return enum_cls(value)
    except (ValueError, TypeError):
        raise ValueError(f"{where}: {name}={value!r} is not a valid {enum_cls.__name__}; "
                         f"allowed: {allowed}") from None


_WINDOW_ALLOWED = "None or a pair (left, right) of Python ints, each -1 (unbounded) or >= 0"


def window(window_size, name: str = "window_size", where: str = "fused_attn") -> tuple[int, int]:
    """None or (left, right) -> (left, right) ints of int64 (the engine checks each >= -1)."""
    if window_size is None:
        return (-1, -1)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ArgumentTypeError(f"{where}: {name} must be {_WINDOW_ALLOWED}; got "
                                f"{got(window_size)}")
    try:
        left, right = (static_int(w, name, where, _WINDOW_ALLOWED) for w in window_size)
    except ArgumentTypeError:
        raise ArgumentTypeError(f"{where}: {name} must be {_WINDOW_ALLOWED}; got "
                                f"{got(window_size)}") from None
    except ValueError:
        raise ValueError(f"{where}: {name}={tuple(window_size)} does not fit 64-bit ints; "
                         f"{name} must be {_WINDOW_ALLOWED}") from None
    return (left, right)


def _check_rank(name, x, rank, form):
    array(x, name, "fused_attn", f"an array {form}")
    if len(x.shape) != rank:
        raise ValueError(f"fused_attn: {name} must have rank {rank} {form}; got shape "
                         f"{tuple(x.shape)}")


def split_qkv(qkv, layout: QKVLayout):
    """The layout's tensors -> (q_op, k_op, v_op, Dims); absent operands are None."""
    if layout in QKV_PACKED:
        if isinstance(qkv, (tuple, list)):
            if len(qkv) != 1:
                raise ValueError(f"fused_attn: qkv must be the packed tensor [B, S, 3, H, D] (or "
                                 f"a 1-tuple of it) for qkv_layout={layout.name}")
            qkv = qkv[0]
        _check_rank("qkv", qkv, 5, "[batch, seq, 3, heads, head_dim]")
        B, S, three, H, D = qkv.shape
        if three != 3:
            raise ValueError(f"fused_attn: qkv must have shape [B, S, 3, H, D] for "
                             f"qkv_layout={layout.name}; got {tuple(qkv.shape)}")
        _check_dtypes(qkv)
        return qkv, None, None, Dims(B, S, S, H, H, D, D)
    if layout in KV_PACKED:
        if not isinstance(qkv, (tuple, list)) or len(qkv) != 2:
            raise ArgumentTypeError(f"fused_attn: qkv must be a pair (q, kv) for qkv_layout="
                                    f"{layout.name}; got {got(qkv)}")
        q, kv = qkv
        _check_rank("q", q, 4, "[batch, seq, heads, head_dim]")
        _check_rank("kv", kv, 5, "[batch, seq, 2, heads, head_dim]")
        if kv.shape[2] != 2:
            raise ValueError(f"fused_attn: kv must have shape [B, S, 2, H, D]; got {tuple(kv.shape)}")
        _check_dtypes(q, kv)
        if q.shape[0] != kv.shape[0]:
            raise ValueError(f"fused_attn: batch sizes differ: q {q.shape}, kv {kv.shape}")
        if q.shape[3] != kv.shape[4]:
            raise ValueError(f"fused_attn: q and kv must have the same head dim; got q {q.shape}, "
                             f"kv {kv.shape}")
        B, Sq, Hq, D = q.shape
        return q, kv, None, Dims(B, Sq, kv.shape[1], Hq, kv.shape[3], D, D)
    if not isinstance(qkv, (tuple, list)) or len(qkv) != 3:
        raise ArgumentTypeError(f"fused_attn: qkv must be a tuple (q, k, v) for qkv_layout="
                                f"{layout.name}; got {got(qkv)}")
    q, k, v = qkv
    for name, x in zip("qkv", (q, k, v)):
        _check_rank(name, x, 4, "[batch, seq, heads, head_dim]")
    _check_dtypes(q, k, v)
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError(f"fused_attn: batch sizes differ: q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(f"fused_attn: k and v must have the same sequence length and heads; got "
                         f"k {k.shape}, v {v.shape}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"fused_attn: q and k must have the same head dim; got q {q.shape}, "
                         f"k {k.shape}")
    B, Sq, Hq, D = q.shape
    return q, k, v, Dims(B, Sq, k.shape[1], Hq, k.shape[2], D, v.shape[3])


def stat_dtype(dtype):
    """The dtype of the statistics (softmax_offset, lse, max_logit and their gradients)
    of a call in dtype: float64 for float64 (the CPU engine's double form), else float32."""
    return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def _check_dtypes(*xs):
    dtypes = {jnp.dtype(x.dtype).name for x in xs}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _lib.ATTN_DTYPE_CODES:
        got = ", ".join(str(x.dtype) for x in xs)
        raise ValueError(f"fused_attn: dtype: got {got}; q, k and v must share one dtype among "
                         "float32, bfloat16, float16 and float64")


def unpack(q_op, k_op, v_op, layout: QKVLayout):
    """The FFI operands -> (q, k, v) [B, S, H, D] views (for the reference)."""
    if layout in QKV_PACKED:
        return q_op[:, :, 0], q_op[:, :, 1], q_op[:, :, 2]
    if layout in KV_PACKED:
        return q_op, k_op[:, :, 0], k_op[:, :, 1]
    return q_op, k_op, v_op


_SEED_ALLOWED = ("None, a Python int, an integer scalar array, a raw PRNG key (uint32 [2]) or "
                 "a typed PRNG key (jax.random.key)")


def check_seed(seed) -> None:
    """The kinds of seed fused_attn takes (checked even when dropout is off)."""
    if seed is None or (isinstance(seed, (int, np.integer)) and not is_bool(seed)):
        return
    if not (hasattr(seed, "shape") and hasattr(seed, "dtype")):
        raise ArgumentTypeError(f"fused_attn: seed must be {_SEED_ALLOWED}; got {got(seed)}")
    dtype, shape = seed.dtype, tuple(seed.shape)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape != ():
            raise ValueError(f"fused_attn: seed must be one PRNG key; got keys of shape {shape}")
        return
    if (shape == (2,) and dtype == jnp.uint32) or (
            shape == () and jnp.issubdtype(dtype, jnp.integer) and not is_bool(seed)):
        return
    raise ArgumentTypeError(f"fused_attn: seed must be {_SEED_ALLOWED}; got {got(seed)}")


def seed_words(seed) -> jax.Array:
    """An int, a raw key (uint32 [2]) or a typed PRNG key (check_seed passed) -> the
    engine's seed, uint32 [2]."""
    if isinstance(seed, (int, np.integer)):
        s = int(seed) & (2 ** 64 - 1)
        return jnp.array([s & 0xFFFFFFFF, s >> 32], jnp.uint32)
    seed = jnp.asarray(seed) if not isinstance(seed, jax.Array) else seed
    if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(seed)
        if data.shape == (2,) and data.dtype == jnp.uint32:
            return data
        return jax.random.bits(seed, (2,), jnp.uint32)
    if seed.shape == (2,) and seed.dtype == jnp.uint32:
        return seed
    hi = (seed >> 32).astype(jnp.uint32) if seed.dtype.itemsize == 8 else jnp.uint32(0)
    return jnp.stack([seed.astype(jnp.uint32), jnp.broadcast_to(hi, ())])


def _check_descriptor_kinds(sd: SequenceDescriptor) -> None:
    """A descriptor built directly: its lengths and offsets are integer arrays."""
    for name in ("q_seqlens", "kv_seqlens", "q_offsets", "kv_offsets"):
        x = getattr(sd, name)
        if x is None and name.endswith("offsets"):
            continue
        form = "[B] or [B, M]" if name.endswith("seqlens") else "[B, M + 1]"
        array(x, f"sequence_descriptor.{name}", "fused_attn", f"an integer array {form} "
              "(SequenceDescriptor.from_seqlens(...) builds one)")
        if not jnp.issubdtype(x.dtype, jnp.integer):  # never truncate lengths or offsets
            raise ArgumentTypeError(f"fused_attn: sequence_descriptor.{name} must be an integer "
                                    f"array {form}; got dtype {x.dtype}")
        if len(x.shape) not in ((1, 2) if name.endswith("seqlens") else (2,)):
            raise ValueError(f"fused_attn: sequence_descriptor.{name} must be an integer array "
                             f"{form}; got shape {tuple(x.shape)}")


def _warn_dropped(sd: SequenceDescriptor, M: int) -> None:
    """Warns when concrete lengths or ids hold more segments a row than the call's M."""
    for side in ("q", "kv"):
        runs = getattr(sd, f"{side}_runs")
        if runs is None or is_traced(runs) or not runs.size:
            continue
        most = int(np.max(np.asarray(runs)))
        if most > M:
            what = "segment ids" if sd.runs_of == "segment ids" else "_seqlens"
            warnings.warn(f"fused_attn: sequence_descriptor {side}{' ' * (what[0] != '_')}"
                          f"{what} hold up to {most} segments in a row, more than "
                          f"max_segments_per_seq={M}: the segments past it are dropped (their "
                          f"tokens are padding); pass max_segments_per_seq={most} to keep "
                          "them", UserWarning, stacklevel=5)


def resolve_descriptor(sd: SequenceDescriptor, dims: Dims, M: int) -> SequenceDescriptor:
    """The descriptor at the call's M (sequence.py's docstring): int32 lengths [B, M],
    offsets [B, M + 1] (None: packed from the lengths) and, where segments were counted
    (segment ids, compacted lengths), runs [B]. Checked against the call's shapes."""
    if sd.has_segment_ids:
        for side, ids, S in (("q", sd.q_segment_ids, dims.Sq), ("kv", sd.kv_segment_ids,
                                                                  dims.Skv)):
            if tuple(ids.shape) != (dims.B, S):
                raise ValueError(f"fused_attn: sequence_descriptor {side} segment_ids must have "
                                 f"shape [B, S{side}] = [{dims.B}, {S}] (one id per {side} "
                                 f"token); got {tuple(ids.shape)}")
        out = sd.resolve_segment_ids(M)
        _warn_dropped(out, M)
        return out
    _check_descriptor_kinds(sd)
    fields, compacted = {}, False
    for side, S in (("q", dims.Sq), ("kv", dims.Skv)):
        lens, offs = getattr(sd, f"{side}_seqlens"), getattr(sd, f"{side}_offsets")
        shape = tuple(lens.shape) + ((1,) if len(lens.shape) == 1 else ())
        if shape[0] != dims.B:
            raise ValueError(f"fused_attn: sequence_descriptor.{side}_seqlens must have shape "
                             f"[{dims.B}] or [{dims.B}, W] (the batch); got {tuple(lens.shape)}")
        W = shape[1]
        lens = jnp.asarray(lens, jnp.int32).reshape(dims.B, W)
        runs = None
        if W == M:
            if offs is not None and tuple(offs.shape) != (dims.B, M + 1):
                raise ValueError(f"fused_attn: sequence_descriptor.{side}_offsets must have shape "
                                 f"[B, M + 1] = [{dims.B}, {M + 1}]; got {tuple(offs.shape)}")
            # TE's trailing -1 padding at this width too, as the compaction's fill: such a
            # length is an empty segment (0), a trailing negative offset (TE's start-only
            # form has no end column) bounds nothing (the buffer's extent). Other negative
            # lengths, and a -1 before a valid entry, stay invalid (check_descriptors
            # reports them).
            lens = _trailing_to(lens, lens == -1, 0)
            if offs is not None:
                offs = jnp.asarray(offs, jnp.int32)
                offs = _trailing_to(offs, offs < 0, S)
        else:  # TransformerEngine's -1-padded arrays: compacted to M
            if offs is not None and tuple(offs.shape) != (dims.B, W + 1):
                raise ValueError(f"fused_attn: sequence_descriptor.{side}_offsets must have shape "
                                 f"[B, W + 1] = [{dims.B}, {W + 1}] ({side}_seqlens is [B, W] = "
                                 f"[{dims.B}, {W}]); got {tuple(offs.shape)}")
            lens, runs = compact(lens, M, 0)
            offs = (packed_offsets(lens) if offs is None or sd.offsets_packed
                    else compact(offs, M + 1, S)[0])
            compacted = True
        fields.update({f"{side}_seqlens": lens, f"{side}_offsets": offs, f"{side}_runs": runs})
    out = dataclasses.replace(sd, **fields, runs_of="seqlens" if compacted else sd.runs_of)
    _warn_dropped(out, M)
    return out


def _trailing_to(x, pad, fill):
    """x int32 [B, W] with each row's run of pad entries (bool [B, W]) at its end set to fill."""
    trailing = jnp.flip(jnp.cumprod(jnp.flip(pad, -1).astype(jnp.int32), -1), -1) > 0
    return jnp.where(trailing, jnp.int32(fill), x)


def warn_past_sequence(sd: SequenceDescriptor, dims: Dims, layout: QKVLayout) -> None:
    """Warns (once per message) when a descriptor known at trace time (concrete arrays, not
    traced) holds a length longer than its sequence, or, in THD layouts, a segment that ends
    past its row: every backend clamps it to the buffer (README: sequences), which is rarely
    what the caller meant. Traced descriptors are not looked at (their values are unknown)."""
    for side, extent, what in (("q", dims.Sq, "query"), ("kv", dims.Skv, "key/value")):
        lens, offs = getattr(sd, f"{side}_seqlens"), getattr(sd, f"{side}_offsets")
        if is_traced(lens) or is_traced(offs):
            continue
        lens = np.asarray(lens, np.int64).reshape(dims.B, -1)
        name = f"sequence_descriptor.{side}_seqlens"
        if lens.size and lens.max() > extent:
            b, m = np.unravel_index(np.argmax(lens), lens.shape)
            warnings.warn(f"fused_attn: {name}[{b}, {m}] = {lens[b, m]} is longer than the "
                          f"{what} sequence ({extent} tokens); it is clamped to {extent}",
                          UserWarning, stacklevel=4)
            continue
        if layout not in THD_LAYOUTS:
            continue
        starts = (np.concatenate([np.zeros((dims.B, 1), np.int64),
                                  np.cumsum(np.maximum(lens, 0), axis=1)[:, :-1]], axis=1)
                  if offs is None else np.asarray(offs, np.int64)[:, :lens.shape[1]])
        ends = np.where(lens > 0, starts + lens, 0)
        if ends.size and ends.max() > extent:
            b, m = np.unravel_index(np.argmax(ends), ends.shape)
            where = "the lengths before it" if offs is None else f"{side}_offsets[{b}, {m}]"
            warnings.warn(f"fused_attn: {name}[{b}, {m}] = {lens[b, m]} from token {starts[b, m]} "
                          f"({where}) ends at {ends[b, m]}, past the row's {extent} {what} tokens;"
                          f" the segment is clamped to the row", UserWarning, stacklevel=4)


@dataclasses.dataclass(frozen=True)
class Call:
    cfg: Config
    dims: Dims
    params: _lib.AttnParams
    operands: tuple | None  # the N_OPS FFI operands (None when only checking)
    traced_scale: Any = None  # a traced scaling_factor, folded into the operands (cfg.scale 1.0)
    # the call's descriptor resolved to its max_segments_per_seq (None: none given)
    sequence_descriptor: SequenceDescriptor | None = None


def prepare(qkv, bias, sequence_descriptor, seed, *, attn_bias_type, attn_mask_type, qkv_layout,
            softmax_type, scaling_factor, dropout_probability, is_training, max_segments_per_seq,
            window_size, softmax_offset, context_checkpoint_name="context", build=True,
            dropout_broadcast=False, keep_mask=False) -> Call:
    """Checks a call; with build, also makes the N_OPS FFI operands. Raises on bad input.
    keep_mask (dot_product_attention's mask alone, _lib.REQUEST_MASK_KEEP_ONLY): the bias is
    a boolean mask (True keeps the key) and stays boolean.
    max_segments_per_seq > 1 with a BSHD layout warns and is taken as 1 (one sequence a
    row), as TransformerEngine takes it."""
    layout = enum(QKVLayout, qkv_layout, "qkv_layout")
    mask_type = enum(AttnMaskType, attn_mask_type, "attn_mask_type")
    bias_type = enum(AttnBiasType, attn_bias_type, "attn_bias_type")
    softmax = enum(SoftmaxType, softmax_type, "softmax_type")
    q_op, k_op, v_op, dims = split_qkv(qkv, layout)
    dtype = q_op.dtype
    if bias is not None:
        array(bias, "bias", "fused_attn", "an array [1 or B, 1 or Hq, Sq, Skv] or None")
    if softmax_offset is not None:
        array(softmax_offset, "softmax_offset", "fused_attn", "an array [Hq] or [1, Hq, 1, 1] "
              "or None")
        if not jnp.issubdtype(softmax_offset.dtype, jnp.floating):
            raise ArgumentTypeError(f"fused_attn: softmax_offset must be a float array; got "
                                    f"dtype {softmax_offset.dtype}")
    check_seed(seed)
    if bias is not None and bias_type == AttnBiasType.NO_BIAS:
        raise ValueError("fused_attn: bias was given but attn_bias_type=NO_BIAS; pass bias=None "
                         "or choose PRE_SCALE_BIAS / POST_SCALE_BIAS")
    if bias is None and bias_type != AttnBiasType.NO_BIAS:
        raise ValueError(f"fused_attn: attn_bias_type={bias_type.name} needs a bias "
                         f"[1 or B, 1 or Hq, Sq, Skv]; got bias=None")
    bias_extent = (0, 0)
    if bias is not None:
        bshape = tuple(bias.shape)
        if (len(bshape) != 4 or bshape[0] not in (1, dims.B) or bshape[1] not in (1, dims.Hq)
                or bshape[2:] != (dims.Sq, dims.Skv)):
            raise ValueError(f"fused_attn: bias: got shape {list(bshape)}; allowed [1 or {dims.B},"
                             f" 1 or {dims.Hq}, {dims.Sq}, {dims.Skv}] ([1 or B, 1 or Hq, Sq, Skv])")
        if keep_mask and bias.dtype != jnp.bool_:
            raise ValueError(f"fused_attn: a keep mask (_mask_keep_only) must be a boolean "
                             f"array; got dtype {bias.dtype}")
        if not keep_mask and not jnp.issubdtype(bias.dtype, jnp.floating):
            raise ValueError(f"fused_attn: bias must be a float array; got dtype {bias.dtype}")
        bias_extent = bshape[:2]
    if softmax_offset is not None and softmax != SoftmaxType.LEARNABLE_SOFTMAX:
        raise ValueError("fused_attn: softmax_offset is only used with "
                         "softmax_type=LEARNABLE_SOFTMAX")
    if softmax == SoftmaxType.LEARNABLE_SOFTMAX:
        if softmax_offset is None:
            raise ValueError(f"fused_attn: softmax_type=LEARNABLE_SOFTMAX needs softmax_offset "
                             f"[{dims.Hq}] or [1, {dims.Hq}, 1, 1]")
        if tuple(softmax_offset.shape) not in ((dims.Hq,), (1, dims.Hq, 1, 1)):
            raise ValueError(f"fused_attn: softmax_offset: got shape {tuple(softmax_offset.shape)}"
                             f"; allowed [{dims.Hq}] or [1, {dims.Hq}, 1, 1] (one logit per head)")
    if isinstance(sequence_descriptor, (jax.Array, np.ndarray)):  # TE's deprecated dense mask
        warnings.warn("fused_attn: a dense mask as sequence_descriptor is TransformerEngine's "
                      "deprecated form: only each row's lengths are read from it (padding at "
                      "the end); pass a SequenceDescriptor", DeprecationWarning, stacklevel=3)
        if layout in THD_LAYOUTS or max_segments_per_seq != 1:
            raise ValueError(f"fused_attn: a dense mask as sequence_descriptor is only taken "
                             f"with a BSHD layout and max_segments_per_seq=1 (as in "
                             f"TransformerEngine); got qkv_layout={layout.name}, "
                             f"max_segments_per_seq={max_segments_per_seq!r}")
        sequence_descriptor = from_dense_mask(sequence_descriptor, mask_type, dims.B, dims.Sq,
                                              dims.Skv)
    if mask_type.is_padding() and sequence_descriptor is None:
        raise ValueError(f"fused_attn: attn_mask_type={mask_type.name} needs a "
                         "sequence_descriptor (SequenceDescriptor.from_seqlens(...))")
    if sequence_descriptor is not None and not isinstance(sequence_descriptor, SequenceDescriptor):
        raise ArgumentTypeError("fused_attn: sequence_descriptor must be a SequenceDescriptor or "
                                f"None; got {type(sequence_descriptor).__name__}")
    M = static_int(max_segments_per_seq, "max_segments_per_seq", "fused_attn",
                   "a Python int >= 1 (1 for BSHD layouts)")
    if M > 1 and layout not in THD_LAYOUTS:
        warnings.warn(f"fused_attn: max_segments_per_seq={M} with qkv_layout={layout.name} (a "
                      "BSHD layout: one sequence per row) is taken as 1, as TransformerEngine "
                      "does; pass 1, or a THD layout for packed sequences", UserWarning,
                      stacklevel=3)
        M = 1
    if context_checkpoint_name is not None and (not isinstance(context_checkpoint_name, str)
                                                or not context_checkpoint_name):
        raise ArgumentTypeError(f"fused_attn: context_checkpoint_name must be a non-empty str "
                                f"or None; got {got(context_checkpoint_name)}")
    scale, traced_scale = scale_arg(scaling_factor, "scaling_factor", "fused_attn", dims.D)
    dropout = static_float(dropout_probability, "dropout_probability", "fused_attn",
                           "a static Python float in [0, 1)")
    training = static_bool(is_training, "is_training", "fused_attn")
    broadcast = static_bool(dropout_broadcast, "dropout_broadcast", "fused_attn")
    cfg = Config(layout, mask_type, bias_type, softmax, scale, dropout, training,
                 window(window_size), checkpoint_name=context_checkpoint_name,
                 dropout_broadcast=broadcast, deterministic=is_deterministic())
    params = cfg.params(dtype, dims.B, dims.Sq, dims.Skv, dims.Hq, dims.Hkv, dims.D, dims.Dv,
                        M, *bias_extent)
    raise_for_status(*_lib.validate(params))
    if sequence_descriptor is None:
        sd = None
    elif build:
        sd = resolve_descriptor(sequence_descriptor, dims, M)
    else:  # only checking (get_backend): the descriptor may be ShapeDtypeStructs
        if not sequence_descriptor.has_segment_ids:
            _check_descriptor_kinds(sequence_descriptor)
        sd = jax.eval_shape(lambda s: resolve_descriptor(s, dims, M), sequence_descriptor)
    if cfg.dropout_on and seed is None:
        raise ValueError(f"fused_attn: dropout_probability={cfg.dropout} with is_training=True "
                         "needs a seed (an int or a PRNG key)")
    if not build:
        return Call(cfg, dims, params, None, traced_scale, sd)
    if sd is not None:
        warn_past_sequence(sd, dims, layout)
    if traced_scale is not None:
        q_op, bias = _fold_traced_scale(q_op, bias, traced_scale, layout, bias_type)

    empty = lambda dt: jnp.zeros((0,), dt)
    if sd is None:  # one full sequence per row
        q_lens = jnp.full((dims.B, 1), dims.Sq, jnp.int32)
        kv_lens = jnp.full((dims.B, 1), dims.Skv, jnp.int32)
        q_offs = kv_offs = None
    else:
        q_lens, kv_lens, q_offs, kv_offs = sd.q_seqlens, sd.kv_seqlens, sd.q_offsets, sd.kv_offsets
    q_offs = packed_offsets(q_lens) if q_offs is None else jnp.asarray(q_offs, jnp.int32)
    kv_offs = packed_offsets(kv_lens) if kv_offs is None else jnp.asarray(kv_offs, jnp.int32)
    operands = (
        q_op,
        empty(dtype) if k_op is None else k_op,
        empty(dtype) if v_op is None else v_op,
        empty(dtype) if bias is None else jnp.asarray(bias).astype(jnp.bool_ if keep_mask else dtype),
        (empty(stat_dtype(dtype)) if softmax_offset is None
         else jnp.asarray(softmax_offset).astype(stat_dtype(dtype)).reshape(dims.Hq)),
        seed_words(seed) if cfg.dropout_on else empty(jnp.uint32),
        q_lens, kv_lens, q_offs, kv_offs,
        empty(jnp.int32))  # index_base: (0, 0), an unsharded call
    return Call(cfg, dims, params, operands, traced_scale, sd)


def _fold_traced_scale(q_op, bias, scale, layout: QKVLayout, bias_type: AttnBiasType):
    """A traced scaling_factor s runs as the static scale 1.0 with s folded into the
    operands: s * (q.k) = (s * q).k, and PRE_SCALE_BIAS s * (q.k + bias) = (s * q).k +
    s * bias. Gradients reach s through these products, as in jax.nn.dot_product_attention."""
    q_op = fold_scale(q_op, scale, axis=2) if layout in QKV_PACKED else fold_scale(q_op, scale)
    if bias is not None and bias_type == AttnBiasType.PRE_SCALE_BIAS:
        bias = fold_scale(jnp.asarray(bias).astype(q_op.dtype), scale)
    return q_op, bias
