"""softmax(): scaled, masked and causal softmax, forward and backward, fused.

The unfused attention path's softmax (TransformerEngine's `softmax()` semantics):
y = softmax(scale_factor * logits) over the last axis, restricted to the elements
a row keeps; y is 0 on the others and on a row that keeps nothing (never NaN).

The forward and backward run as XLA FFI custom calls on the C++ (CPU) and CUDA
kernels. Whether our kernel serves a call on a platform is the C++ engine's
answer (choose_kernel, asked at trace time); where it does not (a dtype the
kernels do not take, rows longer than the CUDA kernel holds, a platform without
kernels), the pure-JAX `softmax_fallback` runs, with identical semantics.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib, _partition
from ._args import (ArgumentTypeError, array, fold_scale, got, is_bool, is_traced, static_float,
                    static_int)
from .enums import SoftmaxFusionType

__all__ = ["is_softmax_kernel_available", "softmax", "softmax_fallback"]

# jax.default_backend() / platform_dependent names -> the engine's FaPlatform.
_PLATFORMS = {"cpu": _lib.PLATFORM_CPU, "cuda": _lib.PLATFORM_CUDA, "gpu": _lib.PLATFORM_CUDA}
_KERNEL_PLATFORMS = ("cpu", "cuda")


def _fusion_type(value) -> SoftmaxFusionType:
    if is_bool(value) or is_traced(value) or isinstance(value, (float, np.floating)):
        raise ArgumentTypeError(f"softmax: softmax_type must be a SoftmaxFusionType, its int "
                                f"code or its name; got {got(value)}")
    if isinstance(value, str):
        try:
            return SoftmaxFusionType[value.upper()]
        except KeyError:
            pass
    else:
        try:
            return SoftmaxFusionType(value)
        except (ValueError, TypeError):
            pass
    allowed = ", ".join(m.name for m in SoftmaxFusionType)
    raise ValueError(f"softmax: softmax_type={value!r} is not a SoftmaxFusionType; allowed: "
                     f"{allowed} (or their lower-case names)")


def _params(shape, dtype, mask_shape, softmax_type, scale) -> _lib.SoftmaxParams:
    p = _lib.SoftmaxParams()
    p.rank = len(shape)
    for i, d in enumerate(shape[:_lib.SOFTMAX_MAX_RANK]):
        p.dims[i] = int(d)
    if mask_shape is not None:
        p.has_mask = 1
        for i, d in enumerate(mask_shape[:_lib.SOFTMAX_MAX_RANK]):
            p.mask_dims[i] = int(d)
    p.softmax_type = int(softmax_type)
    p.dtype = _lib.DTYPE_CODES.get(jnp.dtype(dtype).name, -1)  # -1: the fallback's dtype
    p.scale = scale
    return p


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static (hashable) part of a call."""

    softmax_type: SoftmaxFusionType
    scale: float
    kernel_on: tuple[str, ...]  # platforms (of _KERNEL_PLATFORMS) whose kernel serves the call

    def ffi_attrs(self):
        return dict(softmax_type=np.int32(self.softmax_type), scale=np.float32(self.scale))


def _check(logits, mask, scale_factor, softmax_type) -> _Config:
    """Checks a call at trace time and asks the engine which platforms' kernels serve it.
    A traced scale_factor is checked here and runs as scale 1.0 (softmax folds it)."""
    kind = _fusion_type(softmax_type)
    array(logits, "logits", "softmax", "an array [batch, heads, q_seqlen, kv_seqlen]")
    shape = tuple(logits.shape)
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise ValueError(f"softmax: logits dtype {logits.dtype} is not floating; allowed: "
                         "float32, bfloat16, float16 (kernels) or another float (fallback)")
    ranks = (3, 4) if kind != SoftmaxFusionType.SCALED_MASKED else (4,)
    if len(shape) not in ranks:
        allowed = "[batch, heads, q_seqlen, kv_seqlen]" + (
            " or [batch * heads, q_seqlen, kv_seqlen]" if 3 in ranks else "")
        raise ValueError(f"softmax: logits must have shape {allowed} for {kind.name}; got shape "
                         f"{shape}")
    mask_shape = None
    if kind == SoftmaxFusionType.SCALED_MASKED:
        if mask is None:
            raise ValueError("softmax: softmax_type=SCALED_MASKED needs a mask (bool, True = "
                             "masked out, broadcastable to logits as [batch|1, heads|1, "
                             "q_seqlen|1, kv_seqlen])")
        array(mask, "mask", "softmax", "a bool array (True = masked out)")
        if jnp.dtype(mask.dtype) != jnp.bool_:
            raise ValueError(f"softmax: mask must be a bool array (True = masked out); got "
                             f"{mask.dtype}")
        if len(mask.shape) != len(shape):
            raise ValueError(f"softmax: mask must have rank {len(shape)} like logits "
                             f"[batch|1, heads|1, q_seqlen|1, kv_seqlen]; got shape "
                             f"{tuple(mask.shape)}")
        mask_shape = tuple(mask.shape)
    elif mask is not None:
        raise ValueError(f"softmax: softmax_type={kind.name} takes no mask; use SCALED_MASKED "
                         "for a mask")
    allowed = "a real scalar (a Python number, or a traced 0-d float array)"
    if is_traced(scale_factor):
        if scale_factor.shape != () or not (jnp.issubdtype(scale_factor.dtype, jnp.floating)
                                            or jnp.issubdtype(scale_factor.dtype, jnp.integer)):
            raise ArgumentTypeError(f"softmax: scale_factor must be {allowed}; got "
                                    f"{got(scale_factor)}")
        scale = 1.0
    else:
        scale = static_float(scale_factor, "scale_factor", "softmax", allowed)
    params = _params(shape, logits.dtype, mask_shape, kind, scale)
    kernel_on = []
    for platform in _KERNEL_PLATFORMS:
        ok, status, reason = _lib.softmax_kernel_available(params, _PLATFORMS[platform])
        if status != _lib.STATUS_OK:
            raise ValueError(f"softmax: {reason.removeprefix('invalid call: ')}")
        if ok:
            kernel_on.append(platform)
    return _Config(kind, scale, tuple(kernel_on))


# ---------------------------------------------------------------------------
# The pure-JAX fallback: the semantics every kernel has


def _keep(shape, mask, kind: SoftmaxFusionType):
    """bool, broadcastable to shape: the elements a row keeps (None: all)."""
    if kind == SoftmaxFusionType.SCALED_MASKED:
        return jnp.logical_not(mask)
    if kind == SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED:
        sq, skv = shape[-2], shape[-1]
        return jnp.arange(skv)[None, :] <= jnp.arange(sq)[:, None]
    return None


def softmax_fallback(logits, mask=None, scale_factor=1.0,
                     softmax_type=SoftmaxFusionType.SCALED):
    """The plain-JAX computation of softmax() (float32 math, output in logits.dtype).

    Rows that keep nothing, or whose kept logits are all -inf, give 0; a NaN or
    +inf logit makes its row NaN, as in the kernels. Differentiable by JAX, but
    softmax() uses its own backward (from the output) on every path.
    """
    kind = _fusion_type(softmax_type)
    x = logits.astype(jnp.float32) * jnp.float32(scale_factor)
    keep = _keep(x.shape, mask, kind)
    t = x if keep is None else jnp.where(keep, x, -jnp.inf)
    m = jnp.max(t, axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(m == -jnp.inf, 0.0, m))
    e = jnp.exp(t - m)
    s = jnp.sum(e, axis=-1, keepdims=True)
    return (e / jnp.where(s == 0.0, 1.0, s)).astype(logits.dtype)


def _softmax_grad_fallback(y, dy, cfg: _Config):
    """dx = scale * y * (dy - sum(y * dy)) in float32; causal rows stop at the diagonal."""
    keep = None
    if cfg.softmax_type == SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED:
        keep = _keep(y.shape, None, cfg.softmax_type)
    yf, dyf = y.astype(jnp.float32), dy.astype(jnp.float32)
    p = yf * dyf
    if keep is not None:
        p = jnp.where(keep, p, 0.0)
    d = jnp.sum(p, axis=-1, keepdims=True)
    dx = jnp.float32(cfg.scale) * yf * (dyf - d)
    if keep is not None:
        dx = jnp.where(keep, dx, 0.0)
    return dx.astype(y.dtype)


# ---------------------------------------------------------------------------
# The kernels, through XLA FFI


def _fwd_ffi(logits, mask, cfg: _Config, out_init=None):
    args = [logits] + ([] if mask is None else [mask]) + ([] if out_init is None else [out_init])
    call = jax.ffi.ffi_call(
        "fusedattn_softmax_fwd", jax.ShapeDtypeStruct(logits.shape, logits.dtype),
        vmap_method="broadcast_all",  # the handler folds vmap's leading dims into the rows
        input_output_aliases={len(args) - 1: 0} if out_init is not None else None)
    return _partition.vary_like(call(*args, **cfg.ffi_attrs()), *args)


def _bwd_ffi(y, dy, cfg: _Config, out_init=None):
    args = [y, dy] + ([] if out_init is None else [out_init])
    call = jax.ffi.ffi_call(
        "fusedattn_softmax_bwd", jax.ShapeDtypeStruct(y.shape, y.dtype),
        vmap_method="broadcast_all",
        input_output_aliases={2: 0} if out_init is not None else None)
    return _partition.vary_like(call(*args, **cfg.ffi_attrs()), *args)


def _fwd_fallback(logits, mask, cfg: _Config, out_init=None):
    return softmax_fallback(logits, mask, cfg.scale, cfg.softmax_type)


def _bwd_fallback(y, dy, cfg: _Config, out_init=None):
    return _softmax_grad_fallback(y, dy, cfg)


def _per_platform(kernel, fallback, cfg: _Config, *args, out_init=None):
    """Our kernel on the platforms whose kernel serves cfg, the fallback elsewhere."""
    branches = {
        p: functools.partial(kernel if p in cfg.kernel_on else fallback, cfg=cfg,
                             out_init=out_init)
        for p in _KERNEL_PLATFORMS}
    default = functools.partial(fallback, cfg=cfg, out_init=out_init)
    return jax.lax.platform_dependent(*args, default=default, **branches)


def _forward(logits, mask, cfg: _Config, out_init=None):
    if out_init is not None:  # the aliasing tests' path: one device
        return _per_platform(_fwd_ffi, _fwd_fallback, cfg, logits, mask, out_init=out_init)
    args = (logits,) if mask is None else (logits, mask)
    return _FWD((cfg, logits.ndim), *args)[0]


def _backward(y, dy, cfg: _Config, out_init=None):
    if out_init is not None:
        return _per_platform(_bwd_ffi, _bwd_fallback, cfg, y, dy, out_init=out_init)
    return _BWD((cfg, y.ndim), y, dy)[0]


# Partitioning (_partition.py): rows are independent, so the batch and head dims (and the
# query dim, except under the causal mask, which reads the row's position) shard with no
# collective; the kv dim (the softmax's own axis) is gathered. A mask's broadcast dims
# stay whole.


def _roles(static, arg_shapes, res_shapes):
    cfg, rank = static
    n = len(arg_shapes[0]) - rank
    # The causal mask keeps j <= i for the row's own position i: its rows stay whole.
    s_role = None if cfg.softmax_type == SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED else "s"
    base = ("b", "h", s_role, None) if rank == 4 else ("b", s_role, None)
    roles = _partition.lead(n) + base
    shape = arg_shapes[0]
    per = [tuple(r if d == shape[i] else None for i, (r, d) in enumerate(zip(roles, s)))
           for s in arg_shapes]
    return per, [roles for _ in res_shapes]


def _fwd_impl(static, plan, logits, mask=None):
    cfg, _ = static
    return (_per_platform(_fwd_ffi, _fwd_fallback, cfg, logits, mask),)


def _bwd_impl(static, plan, y, dy):
    cfg, _ = static
    return (_per_platform(_bwd_ffi, _bwd_fallback, cfg, y, dy),)


_FWD = _partition.Partitioned("softmax", _fwd_impl, _roles, ("logits", "mask"),
                              shardable=("b", "h", "s"))
_BWD = _partition.Partitioned("softmax_bwd", _bwd_impl, _roles, ("y", "dy"),
                              shardable=("b", "h", "s"))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _softmax(logits, mask, cfg: _Config):
    return _forward(logits, mask, cfg)


def _softmax_fwd(logits, mask, cfg: _Config):
    y = _forward(logits, mask, cfg)
    return y, y  # the backward needs only the output


def _softmax_bwd(cfg: _Config, y, dy):
    return _backward(y, dy.astype(y.dtype), cfg), None  # the mask has no gradient


_softmax.defvjp(_softmax_fwd, _softmax_bwd)


def softmax(logits, mask=None, scale_factor=1.0, softmax_type=SoftmaxFusionType.SCALED):
    """Fused softmax over the last axis of attention logits.

    logits: [batch, heads, q_seqlen, kv_seqlen] (or [batch * heads, q_seqlen, kv_seqlen]
      for SCALED and SCALED_UPPER_TRIANG_MASKED); float32, bfloat16 or float16 run
      our kernels (another float dtype runs the pure-JAX fallback). Math is float32.
    mask: SCALED_MASKED only: bool, **True = masked out** (TransformerEngine's
      convention), broadcastable to logits as [batch|1, heads|1, q_seqlen|1, kv_seqlen].
    scale_factor: a real number; the softmax is of scale_factor * logits. A scale traced
      under jit or grad (a 0-d array) is folded into the logits first (scale_factor *
      logits rounded to logits' dtype, then scale 1.0), so gradients reach it.
    softmax_type: SoftmaxFusionType (or its lower-case name):
      SCALED keeps every element; SCALED_MASKED keeps the elements where mask is
      False; SCALED_UPPER_TRIANG_MASKED keeps j <= i (causal, top-left: i the query
      index, the second-to-last axis).

    Returns y, logits' shape and dtype: 0 where an element is not kept, and 0 on a
    whole row that keeps nothing (never NaN). Differentiable (jax.grad): the
    backward is our kernel too, dx = scale_factor * y * (dy - sum(y * dy)), from
    the output y alone; the mask gets no gradient. Works under jit, grad, vmap.
    Which path serves a call: is_softmax_kernel_available().
    """
    cfg = _check(logits, mask, scale_factor, softmax_type)
    logits = jnp.asarray(logits)
    if is_traced(scale_factor):
        logits = fold_scale(logits, scale_factor)
    return _softmax(logits, None if mask is None else jnp.asarray(mask), cfg)


def is_softmax_kernel_available(softmax_type, batch, heads, q_seqlen, kv_seqlen, dtype, *,
                                platform=None) -> bool:
    """Whether our fused kernel (not the pure-JAX fallback) serves softmax() for logits
    [batch, heads, q_seqlen, kv_seqlen] of `dtype` on `platform` ("cpu", "gpu"/"cuda";
    default: jax.default_backend()). The C++ engine answers, by the rule the FFI
    handlers apply: the CPU kernel serves every valid call in float32/bfloat16/float16;
    the CUDA kernel rows of up to 16384 float32 or 32768 bfloat16/float16 elements
    (past 16384 with kv_seqlen % 8 == 0). Invalid sizes (0, past int64) give False; a
    size that is not an int (a float, a str) raises TypeError naming it.
    """
    kind = _fusion_type(softmax_type)
    sizes = dict(batch=batch, heads=heads, q_seqlen=q_seqlen, kv_seqlen=kv_seqlen)
    for name, value in sizes.items():
        try:
            static_int(value, name, "is_softmax_kernel_available")
        except ArgumentTypeError:
            raise
        except ValueError:  # past int64
            return False
    platform = jax.default_backend() if platform is None else str(platform).lower()
    if platform not in _PLATFORMS:
        return False
    shape = (batch, heads, q_seqlen, kv_seqlen)
    mask_shape = (batch, 1, q_seqlen, kv_seqlen) if kind == SoftmaxFusionType.SCALED_MASKED else None
    try:
        params = _params(shape, dtype, mask_shape, kind, 1.0)
    except (TypeError, ValueError, OverflowError):
        return False
    ok, status, _ = _lib.softmax_kernel_available(params, _PLATFORMS[platform])
    return ok and status == _lib.STATUS_OK
