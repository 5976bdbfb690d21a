"""Which kernels serve a fused_attn call on the GPU, asked of the C++ engine at trace time
(select_backend, then cuDNN's own graph check), and the batch chunks cuDNN's 32-bit
indexing needs. attention.py's per-device bodies lower the CUDA handler (with the
decision's flags) or XLA's reference by these answers; get_backend reports them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib
from . import score_mod as _sm
from ._prepare import N_OPS, Config, Dims


def _sm_key(sm: _sm.ScoreMod | None) -> tuple | None:
    """The CUDA handler's packed program as a hashable key (the graph cache, the workspace
    query and _gpu_choice take it)."""
    return None if sm is None else tuple(int(w) for w in _sm.packed_attribute(sm, cuda=True))


def _is_block(index_base) -> bool:
    """index_base with positions (6 or 8 columns): a block of a bigger call."""
    return index_base.shape[-1:] in ((6,), (8,))


# ---------------------------------------------------------------------------
# The GPU decision: cuDNN, the CUDA flash kernels or XLA's reference. Asked once per configuration (cached), on
# GPU 0; the C++ side builds the graph then, so the first run finds it in the cache.


@functools.lru_cache(maxsize=None)
def _has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


# ---------------------------------------------------------------------------
# Head dims on the GPU. cuDNN's graphs and the CUDA flash kernels' register-resident path
# read each head's row in whole 16-byte chunks (8 bf16 / fp16 elements, 4 float32 ones).
# A call whose head dims are not whole chunks runs on the GPU with q, k, v (and, in the
# backward, out and dout) zero-padded to them, and the results cut back: exact, since the
# zeros add nothing to q . k, the output's extra columns are dropped, and the scale is the
# call's own (fixed from the true head dim before). Every GPU question (the decision, the
# workspace, get_backend) is asked with the padded dims.
_ROW_CHUNK_BYTES = 16


def gpu_head_dim(d: int, itemsize: int) -> int:
    """d rounded up to whole 16-byte chunks of itemsize-byte elements."""
    n = _ROW_CHUNK_BYTES // itemsize
    return -(-d // n) * n


def gpu_dims(dims: Dims, dtype) -> Dims:
    item = jnp.dtype(dtype).itemsize
    return dataclasses.replace(dims, D=gpu_head_dim(dims.D, item),
                               Dv=gpu_head_dim(dims.Dv, item))


def gpu_params(params: _lib.AttnParams) -> _lib.AttnParams:
    """params (a call's, as prepare builds them) as the GPU runs them: the head dims
    padded, a float64 call as float32 (attention._f64 casts; select_backend refuses
    float64 on CUDA)."""
    padded = _lib.AttnParams.from_buffer_copy(params)
    if params.dtype == _lib.ATTN_DTYPE_CODES["float64"]:
        padded.dtype = _lib.DTYPE_CODES["float32"]
    item = 4 if padded.dtype == _lib.DTYPE_CODES["float32"] else 2
    padded.head_dim_qk = gpu_head_dim(params.head_dim_qk, item)
    padded.head_dim_v = gpu_head_dim(params.head_dim_v, item)
    return padded


def _pad_last(x, n: int):
    if not x.size or x.shape[-1] == n:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - x.shape[-1])])


def heads_padded(fn, backward: bool = False):
    """fn (a GPU per-device body: forward ops -> out, lse, max_logit; backward ops, out,
    dout, lse -> dq, dk, dv, ...) run on operands padded to gpu_dims and cut back."""
    def run(*args, cfg: Config, dims: Dims, sm=None):
        pdims = gpu_dims(dims, args[0].dtype)
        if pdims == dims:
            return fn(*args, cfg=cfg, dims=dims, sm=sm)
        # q and k (or the packed buffers, whose head dims are one) take D, v takes Dv
        want = {0: pdims.D, 1: pdims.D, 2: pdims.Dv}
        if backward:
            n = N_OPS + (sm is not None)
            want.update({n: pdims.Dv, n + 1: pdims.Dv})  # out, dout
        padded = [_pad_last(x, want[i]) if i in want else x for i, x in enumerate(args)]
        res = fn(*padded, cfg=cfg, dims=pdims, sm=sm)
        if backward:  # dq, dk, dv back to the operands' widths
            cut = tuple(r[..., :x.shape[-1]] for r, x in zip(res[:3], args[:3]))
            return cut + tuple(res[3:])
        return (res[0][..., :dims.Dv],) + tuple(res[1:])
    return run


def _params_of(ops, cfg: Config, dims: Dims) -> _lib.AttnParams:
    """The AttnParams the CUDA handler will decode from these operands: padded (gpu_dims),
    float64 ones as float32 (the GPU runs float64 calls as float32, attention._f64)."""
    bias = ops[3]
    extent = tuple(bias.shape[:2]) if bias.size else (0, 0)
    return gpu_params(cfg.params(ops[0].dtype, dims.B, dims.Sq, dims.Skv, dims.Hq, dims.Hkv,
                                 dims.D, dims.Dv, ops[6].shape[-1], *extent))


def _fields(params: _lib.AttnParams) -> tuple:
    return tuple(getattr(params, f) for f, _ in params._fields_)


@functools.lru_cache(maxsize=None)
def _gpu_choice(fields: tuple, want_lse: bool, want_max_logit: bool,
                training: bool, score_mod: tuple | None = None,
                flags: int = 0) -> tuple[str, str, int]:
    """("cudnn" | "cuda_flash" | "xla_reference" | "none", reason, flags) for a call on the
    GPU. training: the forward saves the lse for a backward, and both graphs must be
    served, so that the backward sees the dropout mask its forward drew. score_mod: the
    packed program of a flex-attention call (its graphs are asked for). flags: the
    request's REQUEST_* bits (_index_flag); the answer's flags add REQUEST_CUDNN_REJECTED
    when cuDNN's graph check rejected the call, and the CUDA handler, given them, makes
    the same decision."""
    params = _lib.AttnParams(*fields)
    name, _, reason = _lib.select_backend(params, _lib.PLATFORM_CUDA, 0, score_mod,
                                          want_max_logit, flags)
    if name != "cudnn":
        return name, reason, flags
    checks = [("forward", False)] + ([("backward", True)] if training else [])
    for what, backward in checks:
        code, msg = _lib.cudnn_check(params, 0, want_lse or training, want_max_logit, backward,
                                     score_mod, flags)
        if code != _lib.STATUS_OK:
            flags |= _lib.REQUEST_CUDNN_REJECTED
            name, _, reason = _lib.select_backend(params, _lib.PLATFORM_CUDA, 0, score_mod,
                                                  want_max_logit, flags)
            return name, f"{reason} [cuDNN rejected the {what} graph: {msg}]", flags
    return name, reason, flags


def _gpu_fused(ops, cfg: Config, dims: Dims, training: bool, sm=None) -> tuple[str, int]:
    """(the GPU's backend name, the flags its CUDA handler takes) for these operands; ("",
    0) without a GPU (the cuda branch is never lowered)."""
    if not _has_gpu():
        return "", 0
    name, _, flags = _choice(ops, cfg, dims, training, sm)
    return name, flags


def _choice(ops, cfg: Config, dims: Dims, training: bool, sm) -> tuple[str, str, int]:
    """_gpu_choice for these operands (the N_OPS; a score_mod's program joins the key)."""
    return _gpu_choice(_fields(_params_of(ops, cfg, dims)), cfg.want_lse, cfg.want_max_logit,
                       training, None if sm is None else _sm_key(sm),
                       _index_flag(ops, cfg, sm) | _precision_flag(ops[0].dtype) | cfg.request_flags
                       | (_lib.REQUEST_SCORE_MOD_GRADS if cfg.sm_grads and sm is not None else 0))


# jax's matmul precisions (jax.default_matmul_precision) that ask float32 products at
# float32 accuracy; every other one (None and "default", "high", "tensorfloat32",
# "bfloat16", "BF16_BF16_F32_X3", ...) lets XLA multiply float32 in TF32 on the GPU, and so
# do the CUDA flash kernels.
_F32_EXACT_PRECISIONS = frozenset({"highest", "float32", "f32_f32_f32", "tf32_tf32_f32_x3",
                                   "bf16_bf16_f32_x6", "bf16_bf16_f32_x9", "f64_f64_f64"})


def _precision_flag(dtype) -> int:
    """REQUEST_F32_EXACT for a float32 call traced under a float32-accurate matmul
    precision (the CUDA flash kernels then multiply in 3xTF32; else in TF32, as XLA's own
    float32 matmuls on the GPU). FUSEDATTN_F32_MATMUL=tf32|float32 overrides it (options.h)."""
    if jnp.dtype(dtype) != jnp.float32:
        return 0
    precision = jax.config.jax_default_matmul_precision
    name = getattr(precision, "name", precision)
    if name is not None and str(name).lower() in _F32_EXACT_PRECISIONS:
        return _lib.REQUEST_F32_EXACT
    return 0


def _index_flag(ops, cfg: Config, sm) -> int:
    """REQUEST_INDEX_BASE when a kernel must honour the call's index_base: a block of a
    bigger call (6 or 8 columns: positions, whatever the call), or a shard's batch / head
    base that dropout or a score_mod reads. cuDNN and the Hopper forward cannot (they
    count from 0): such calls run the CUDA flash kernels."""
    index_base = ops[10]
    if _is_block(index_base) or (index_base.size and (cfg.dropout_on or sm is not None)):
        return _lib.REQUEST_INDEX_BASE
    return 0


# cuDNN's backward indexes its tensors in 32 bits: on the H100 (cuDNN 9.19, 2026-11-25) a
# bf16 call of 33 x 4096 x 128 x 128 elements gave wrong dq past element 2^31 (the forward
# was right). A cuDNN call past that runs in batch chunks under it, forward and backward
# alike (so a dropout mask drawn by the forward is the one the backward sees).
_CUDNN_MAX_ELEMENTS = 2 ** 31 - 1


def _cudnn_chunk(ops, dims: Dims, sm=None) -> int | None:
    """Batch entries per cuDNN call, or None when one call is within the limit."""
    bias = ops[3]
    per_entry = [int(np.prod(x.shape[1:])) for x in ops[:3] if x.size]
    per_entry.append(dims.Sq * dims.Hq * dims.Dv)  # out, dout
    bias_batched = bias.size and bias.shape[0] == dims.B and dims.B > 1
    if bias_batched:
        per_entry.append(int(np.prod(bias.shape[1:])))
    widest = max(per_entry)
    if dims.B * widest <= _CUDNN_MAX_ELEMENTS and bias.size <= _CUDNN_MAX_ELEMENTS:
        return None
    if widest > _CUDNN_MAX_ELEMENTS or (bias.size > _CUDNN_MAX_ELEMENTS and not bias_batched):
        raise NotImplementedError(
            f"fused_attn: one batch entry of this call has {widest} elements in a tensor (or "
            f"the bias {bias.size}), past the 2^31 - 1 that cuDNN indexes; nothing on the GPU "
            "serves it: split the heads or the sequence")
    if sm is not None and any(shape[0] > 1 for shape in sm.operand_shapes):
        raise NotImplementedError(
            f"fused_attn: this call has {dims.B * widest} elements in a tensor, past the "
            "2^31 - 1 that cuDNN indexes, so it runs in batch chunks; a score_mod operand "
            "with a batch dim cannot be split with them: broadcast it over the batch")
    return _CUDNN_MAX_ELEMENTS // widest


def _batch_args(ops, dims: Dims, n_args: int) -> frozenset:
    """Indices of the arguments that carry the batch: q, k, v, a bias of B entries, the
    descriptor arrays, and in the backward out, dout and lse (the args past ops)."""
    idx = {0, 1, 2, 6, 7, 8, 9} | ({3} if ops[3].size and ops[3].shape[0] == dims.B else set())
    return frozenset(idx | set(range(len(ops), n_args)))


def _chunked(fn, chunk: int | None, batched: frozenset, sums: tuple = ()):
    """fn(*args, dims=...) over batch chunks of chunk entries: the batched args sliced,
    results concatenated along the batch, or summed (result indices in sums)."""
    if chunk is None:
        return fn

    def run(*args, cfg, dims: Dims, sm=None):
        parts = []
        for b0 in range(0, dims.B, chunk):
            n = min(chunk, dims.B - b0)
            cut = [x[b0:b0 + n] if i in batched and x.size else x for i, x in enumerate(args)]
            parts.append(fn(*cut, cfg=cfg, dims=dataclasses.replace(dims, B=n), sm=sm))
        return tuple(functools.reduce(jnp.add, rs) if i in sums else jnp.concatenate(rs, axis=0)
                     for i, rs in enumerate(zip(*parts)))

    return run
