"""fused_attn: the JAX face of the fused attention engine.

Argument checks happen at trace time and ask the C++ engine's own validate(),
so a bad call fails with the engine's message before anything runs. The
forward and backward run as XLA FFI custom calls: the CPU engine on the CPU,
cuDNN graphs or fusedattn's CUDA flash kernels on NVIDIA GPUs. Which backend
serves a GPU call is decided in C++ (select_backend, then the cuDNN graph's own
support check, run once at trace time: _gpu_route.py); only a score_mod cuDNN
cannot run falls back to XLA computing reference.py, with a one-time warning.
backends.get_backend() says which a call gets, and why.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from . import _autodiff, _lib, _nan_rows, _partition, context_parallel, small_seq
from . import score_mod as _sm
from ._prepare import KV_PACKED, N_OPS, QKV_PACKED, Config, Dims, prepare, stat_dtype, unpack
from .enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from .reference import attention_reference, nan_max
from .sequence import check_descriptor
from ._gpu_route import (_batch_args, _choice, _chunked, _cudnn_chunk, _gpu_fused, _has_gpu,
                         _is_block, _params_of, _sm_key, heads_padded)

__all__ = ["fused_attn"]


# ---------------------------------------------------------------------------
# The differentiable core: the N_OPS FFI operands (ffi_decode.h), and with a score_mod one
# more, its array operands concatenated (f32 [N], score_mod.py) -> (out, lse, max_logit
# per batch entry). Differentiable in q, k, v (as the layout packs them), bias,
# softmax_offset and the score_mod operands. The CPU engine runs every call (a score_mod
# as its lowered programs); on the GPU cuDNN runs what it serves, the CUDA flash kernels
# the rest (a score_mod by their interpreter), XLA's reference what neither can.


def _fwd_results(ops, cfg: Config, dims: Dims):
    """out [B, Sq, Hq, Dv], lse ([B, Hq, Sq]; THD: [B, Sq, Hq]) and max_logit [B, Hq]
    (float32; float64 for float64 operands)."""
    d = dims
    lse_shape = (d.B, d.Sq, d.Hq) if cfg.thd else (d.B, d.Hq, d.Sq)
    stat = stat_dtype(ops[0].dtype)
    return (jax.ShapeDtypeStruct((d.B, d.Sq, d.Hq, d.Dv), ops[0].dtype),
            jax.ShapeDtypeStruct(lse_shape, stat), jax.ShapeDtypeStruct((d.B, d.Hq), stat))


def _bwd_results(ops, dims: Dims):
    """dq, dk, dv, dbias (the operands' shapes) and d softmax_offset per batch entry."""
    has_offset = ops[4].size > 0
    return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ops[:4]) + (
        jax.ShapeDtypeStruct((dims.B, dims.Hq) if has_offset else (0,), ops[4].dtype),)


def _offset_grad(doffset):
    # d softmax_offset comes per batch entry [B, Hq]: the offset [Hq] is shared by the batch.
    return jnp.sum(doffset, axis=0) if doffset.size else doffset


def _target(direction: str, sm: _sm.ScoreMod | None, cuda: bool) -> str:
    """The FFI target (_lib.TARGETS) of one handler: fa_{cpu|cuda}_attn_{fwd|bwd}[_sm]."""
    return f"fusedattn_attn_{direction}{'' if sm is None else '_sm'}{'_cuda' if cuda else ''}"


def _call_flags(cfg: Config) -> int:
    """The REQUEST_* bits of the call's bias, dropout and mode: a folded mask (the Hopper
    kernels' tiles), no dbias wanted (the Hopper backward takes a folded mask only then), one
    dropout mask for every batch entry and head, a deterministic backward, jax's rows that
    keep nothing."""
    return ((_lib.REQUEST_MASK_BIAS if cfg.mask_bias else 0)
            | (_lib.REQUEST_MASK_KEEP_ONLY if cfg.keep_mask else 0)
            | (_lib.REQUEST_AVERAGE_EMPTY_ROWS if cfg.average_empty_rows else 0)
            | (0 if cfg.want_dbias else _lib.REQUEST_NO_DBIAS) | cfg.request_flags)


def _attrs(cfg: Config, sm: _sm.ScoreMod | None, cuda: bool, flags: int = 0):
    attrs = cfg.ffi_attrs()
    attrs["backend_flags"] = np.int32(
        flags | _call_flags(cfg)
        | (_lib.REQUEST_SCORE_MOD_GRADS if cfg.sm_grads and sm is not None else 0))
    if sm is not None:
        attrs["score_mod"] = _sm.packed_attribute(sm, cuda)
    return attrs


def _workspace(ops, cfg: Config, dims: Dims, backward: bool, score_mod=None, flags: int = 0):
    """The CUDA handler's workspace result, sized by the C++ side for this call
    (score_mod: the packed program attribute of a flex-attention call; flags: the
    decision's REQUEST_* bits; the call's own (_call_flags) are added here, as _attrs gives
    them to the handler: the Hopper kernels then want room for a mask's bits)."""
    n = _lib.cuda_attn_workspace_bytes(_params_of(ops, cfg, dims), 0, cfg.want_lse,
                                       cfg.want_max_logit, backward, score_mod,
                                       flags | _call_flags(cfg))
    return jax.ShapeDtypeStruct((n,), jnp.uint8)


def _ffi_fwd(*ops, cfg: Config, dims: Dims, sm=None, cuda: bool = False, flags: int = 0):
    """The forward handler: ops -> out, lse, max_logit. The CUDA handler returns one more
    result, its workspace, and takes the decision's flags (_gpu_choice). vmap: the handler
    folds the leading dims into the batch."""
    results = _fwd_results(ops, cfg, dims)
    if cuda:
        results += (_workspace(ops[:N_OPS], cfg, dims, False, _sm_key(sm), flags),)
    call = jax.ffi.ffi_call(_target("fwd", sm, cuda), results, vmap_method="broadcast_all")
    return _partition.vary_like(tuple(call(*ops, **_attrs(cfg, sm, cuda, flags))[:3]), *ops)


def _ffi_bwd(*args, cfg: Config, dims: Dims, sm=None, cuda: bool = False, flags: int = 0,
             sm_grads: bool = True):
    """The backward handler: ops, out, dout, lse -> dq, dk, dv, dbias, d softmax_offset and,
    with a score_mod, d of its operands (computed in the kernels: the CPU engine's and the
    CUDA flash ones; behind cuDNN, sm_grads=False, the handler returns zeros and XLA's
    reference vjp gives it, which XLA drops when nothing uses it). The CUDA handler
    returns one more result, its workspace."""
    n = N_OPS if sm is None else N_OPS + 1
    ops, dout = args[:n], args[n + 1]
    results = _bwd_results(ops, dims)
    if sm is not None:
        results += (jax.ShapeDtypeStruct(ops[N_OPS].shape, jnp.float32),)
    if cuda:
        results += (_workspace(ops[:N_OPS], cfg, dims, True, _sm_key(sm), flags),)
    call = jax.ffi.ffi_call(_target("bwd", sm, cuda), results, vmap_method="broadcast_all")
    grads = _partition.vary_like(tuple(call(*args, **_attrs(cfg, sm, cuda, flags))), *args)
    dq, dk, dv, dbias, doffset = grads[:5]
    grads_out = (dq, dk, dv, dbias, _offset_grad(doffset))
    if sm is None:
        return grads_out
    return grads_out + ((grads[5],) if sm_grads else (_sm_operand_grad(ops, dout, cfg, dims, sm),))


def _sm_operand_grad(ops, dout, cfg: Config, dims: Dims, sm: _sm.ScoreMod):
    smo = ops[N_OPS]
    if not smo.size:
        return jnp.zeros_like(smo)
    _, vjp = jax.vjp(lambda o: _reference(*ops[:N_OPS], o, cfg=cfg, dims=dims, sm=sm)[0], smo)
    return vjp(dout)[0]


def _reference(*ops, cfg: Config, dims: Dims, sm=None):
    """The same call by reference.py (XLA's fallback where no fused kernel runs); a
    score_mod applies fn over the materialized scores."""
    score_mod = None
    if sm is not None:
        arrays4 = _sm.split_operands(ops[N_OPS], sm)
        score_mod = lambda s, qp, kp, index_base=None: _sm.apply_reference(
            sm.fn, s, arrays4, *((qp, kp) if cfg.thd else (None, None)), index_base=index_base)
    (q_op, k_op, v_op, bias, offset, seed, q_lens, kv_lens, q_offs, kv_offs,
     index_base) = ops[:N_OPS]
    q, k, v = unpack(q_op, k_op, v_op, cfg.layout)
    bias = _folded(bias, q_op.dtype)
    out, lse, max_logit = attention_reference(
        q, k, v, attn_mask_type=cfg.mask_type, scaling_factor=cfg.scale, q_seqlens=q_lens,
        kv_seqlens=kv_lens, q_offsets=q_offs, kv_offsets=kv_offs, thd=cfg.thd,
        window_size=cfg.window, bias=bias if bias.size else None, attn_bias_type=cfg.bias_type,
        softmax_type=cfg.softmax_type, softmax_offset=offset if offset.size else None,
        dropout_probability=cfg.dropout if cfg.dropout_on else 0.0, seed=seed,
        dropout_broadcast=cfg.dropout_broadcast,
        score_mod=score_mod, index_base=index_base if index_base.size else None)
    if cfg.average_empty_rows:
        out = _average_empty_rows(out, lse, v, q_lens, cfg)
    return out, (jnp.swapaxes(lse, 1, 2) if cfg.thd else lse), max_logit


def _folded(bias, dtype):
    """A boolean keep mask (_mask_keep_only) as the engine folds it for the kernels that add
    a bias: 0 where it keeps the key, _lib.masked_bias_value(dtype) where it drops it."""
    if bias.dtype != jnp.bool_:
        return bias
    dropped = jnp.asarray(_lib.masked_bias_value(jnp.dtype(dtype).name), dtype)
    return jnp.where(bias, jnp.zeros((), dtype), dropped)


def _vjp_of(f, ops, n: int, cfg: Config):
    """jax.vjp of f over ops[:5] and ops[n:] (q, k, v, bias, softmax_offset and a score_mod's
    operands), a keep mask (cfg.keep_mask) held constant: its slot gets a boolean array of
    its shape."""
    diff = (*ops[:5], *ops[n:])
    if not cfg.keep_mask:
        return jax.vjp(f, *diff)[1]
    mask = ops[3]
    _, vjp = jax.vjp(lambda *d: f(*d[:3], mask, *d[3:]), *diff[:3], *diff[4:])

    def with_mask(ct):
        g = vjp(ct)
        return (*g[:3], jnp.zeros(mask.shape, jnp.bool_), *g[3:])
    return with_mask


def _average_empty_rows(out, lse, v, q_lens, cfg: Config):
    """_lib.REQUEST_AVERAGE_EMPTY_ROWS as the engine does it (backend.h's
    kRequestAverageEmptyRows): rows below their q_seqlen whose lse is at most half the
    folded mask's value get the average of all of their kv head's values. out [B, Sq, Hq,
    Dv], lse [B, Hq, Sq], v [B, Skv, Hkv, Dv] (a BSHD call)."""
    Sq, Hq = out.shape[1], out.shape[2]
    empty = lse <= 0.5 * _lib.masked_bias_value(jnp.dtype(out.dtype).name)
    if cfg.mask_type.is_padding() and q_lens.size:
        empty &= jnp.arange(Sq)[None, None, :] < q_lens[:, :1, None]
    mean = jnp.mean(v.astype(jnp.float32), axis=1)                     # [B, Hkv, Dv]
    mean = jnp.repeat(mean, Hq // v.shape[2], axis=1)[:, None]          # [B, 1, Hq, Dv]
    return jnp.where(jnp.swapaxes(empty, 1, 2)[..., None], mean.astype(out.dtype), out)


def _bwd_reference(*args, cfg: Config, dims: Dims, sm=None):
    n = N_OPS if sm is None else N_OPS + 1
    ops, dout = args[:n], args[n + 1]
    if _is_block(ops[10]):
        return _block_bwd_reference(ops, *args[n:n + 3], cfg=cfg, dims=dims, sm=sm)

    def out_of(q, k, v, bias, offset, *smo):
        return _reference(q, k, v, bias, offset, *ops[5:N_OPS], *smo, cfg=cfg, dims=dims,
                          sm=sm)[0]

    return _vjp_of(out_of, ops, N_OPS, cfg)(dout)


def _block_bwd_reference(ops, out, dout, lse, *, cfg: Config, dims: Dims, sm=None):
    """A block of a context-parallel call (index_base with positions): its share of the
    whole call's gradients, given the call's out and lse ([B, Hq, Sq]; THD: [B, Sq, Hq]),
    as the engine's backward gives it. With the block's own (out_b, lse_b) from the
    reference, the share is the gradient of sum_i w_i (out_b,i . dout_i) - w_i D_i, w_i =
    exp(lse_b,i - lse_i), D_i = dout_i . out_i (lse, D constants): exactly P o (Z dP - D)
    on the block's logits."""
    f32 = jnp.float32
    heads_last = (lambda x: x) if cfg.thd else (lambda x: jnp.swapaxes(x, 1, 2))  # [B, Sq, Hq]
    lse = heads_last(lse)
    D = jnp.einsum("bshd,bshd->bsh", dout.astype(f32), out.astype(f32))
    safe = jnp.where(jnp.isneginf(lse), 0.0, lse)

    def share(q, k, v, bias, offset, *smo):
        ob, lb, _ = _reference(q, k, v, bias, offset, *ops[5:N_OPS], *smo, cfg=cfg, dims=dims,
                               sm=sm)
        w = jnp.where(jnp.isneginf(lse), 0.0, jnp.exp(heads_last(lb) - safe))
        return jnp.sum(ob.astype(f32) * w[..., None] * dout.astype(f32)) - jnp.sum(w * D)

    return _vjp_of(share, ops, N_OPS, cfg)(jnp.ones((), f32))


def _per_platform(args, cfg: Config, dims: Dims, sm, kernel, cuda, reference):
    """kernel (the FFI call) on the CPU, cuda on NVIDIA GPUs, reference elsewhere."""
    bind = lambda f: functools.partial(f, cfg=cfg, dims=dims, sm=sm)
    return jax.lax.platform_dependent(*args, cpu=bind(kernel), cuda=bind(cuda),
                                      default=bind(reference))


def _is_f64(ops) -> bool:
    return ops[0].dtype == jnp.float64


def _cast_floats(xs, dtype):
    return tuple(x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in xs)


def _f64(ops, cfg: Config, dims: Dims, sm, kernel, reference, float32_call):
    """A float64 call: on the CPU the engine in double (kernel), or with a score_mod the
    reference in float64 (the score_mod interpreter computes in float32; select_backend
    says xla_reference); the float32 path on the GPU (rounded in, widened back out) at
    float32 accuracy (its matmuls as under jax.default_matmul_precision("highest"):
    3xTF32)."""
    def gpu(*o, cfg, dims, sm):
        want = jax.eval_shape(functools.partial(reference, cfg=cfg, dims=dims, sm=sm), *o)
        with jax.default_matmul_precision("highest"):
            got = float32_call(_cast_floats(o, jnp.float32))
        return tuple(g.astype(w.dtype) for g, w in zip(got, want))
    return _per_platform(ops, cfg, dims, sm, reference if sm is not None else kernel, gpu,
                         reference)


def _forward(ops, cfg: Config, dims: Dims, sm, training: bool):
    """One device's forward (the partitioned primitive's per-device body)."""
    if _is_f64(ops):
        return _f64(ops, cfg, dims, sm, _ffi_fwd, _reference,
                    lambda o: _forward(o, cfg, dims, sm, training))
    gpu = heads_padded(functools.partial(_gpu_forward, training=training))
    return _per_platform(ops, cfg, dims, sm, _ffi_fwd, gpu, _reference)


def _gpu_forward(*ops, cfg: Config, dims: Dims, sm, training: bool):
    """The forward on the GPU (head dims whole 16-byte chunks: heads_padded)."""
    name, flags = _gpu_fused(ops[:N_OPS], cfg, dims, training, sm)
    if name == "cudnn":
        return _chunked(functools.partial(_ffi_fwd, cuda=True, flags=flags),
                        _cudnn_chunk(ops, dims, sm), _batch_args(ops, dims, len(ops)))(
                            *ops, cfg=cfg, dims=dims, sm=sm)
    if name == "cuda_flash":
        return _ffi_fwd(*ops, cfg=cfg, dims=dims, sm=sm, cuda=True, flags=flags)
    return _reference(*ops, cfg=cfg, dims=dims, sm=sm)


def _backward(args, cfg: Config, dims: Dims, sm):
    """One device's backward: ops, out, dout, lse -> dq, dk, dv, dbias, d softmax_offset
    [Hq] (summed over the batch) and, with a score_mod, d of its operands."""
    ops = args[:N_OPS]
    if _is_f64(ops):
        return _f64(args, cfg, dims, sm, _ffi_bwd, _bwd_reference,
                    lambda a: _backward(a, cfg, dims, sm))
    gpu = heads_padded(_gpu_backward, backward=True)
    return _per_platform(args, cfg, dims, sm, _ffi_bwd, gpu, _bwd_reference)


def _gpu_backward(*args, cfg: Config, dims: Dims, sm):
    """The backward on the GPU (head dims whole 16-byte chunks: heads_padded)."""
    ops = args[:N_OPS]
    name, flags = _gpu_fused(ops, cfg, dims, True, sm)
    if cfg.deterministic and name in ("cudnn", "cuda_flash"):
        choice = _lib.backend_choice(_params_of(ops, cfg, dims), _lib.PLATFORM_CUDA, 0,
                                     None if sm is None else _sm_key(sm), cfg.want_max_logit,
                                     flags | _call_flags(cfg))
        if choice.backward == "none":
            raise NotImplementedError(
                "fused_attn: deterministic mode (fusedattn.determinism) has no backward for "
                f"this call on the GPU: {choice.reason}. Leave the mode off for it, or run it "
                "where the Hopper backward or cuDNN serves it (bf16 / fp16)")
    gpu = _bwd_reference
    if name == "cudnn":
        # over chunks: dbias of a batch-broadcast bias, d softmax_offset and the score_mod
        # operand grads sum
        batched = _batch_args(args[:N_OPS + (sm is not None)], dims, len(args))
        gpu = _chunked(functools.partial(_ffi_bwd, cuda=True, flags=flags, sm_grads=False),
                       _cudnn_chunk(ops, dims, sm), batched,
                       sums=(4, 5) if 3 in batched else (3, 4, 5))
        if not cfg.thd and _nan_rows.enabled():  # NaN rows: the reference's gradients
            gpu = _nan_rows.nan_exact(gpu)
    elif name == "cuda_flash":  # the CPU engine's NaN rules already
        gpu = functools.partial(_ffi_bwd, cuda=True, flags=flags)
    return gpu(*args, cfg=cfg, dims=dims, sm=sm)


def _fused_fwd(static, training: bool, *ops):
    """ops: q, k, v, bias, offset, seed, q_lens, kv_lens, q_offs, kv_offs, index_base
    (the N_OPS), and with a score_mod sm (else None) its concatenated operands ->
    (out, lse, max_logit). Training keeps the log-sum-exp for the backward."""
    cfg, dims, sm = static
    if training:
        cfg = dataclasses.replace(cfg, want_lse=True)
        if _has_gpu() and jax.default_backend() != "cpu":
            _warn_once(*_choice(ops[:N_OPS], cfg, dims, True, sm)[:2])
    return _FWD((cfg, dims, sm, training, "fwd"), *ops)


def _fused_bwd(static, *args):
    """ops, out, dout, lse, max_logit -> the gradients of q, k, v, bias, softmax_offset
    and (with a score_mod) its operands; lse and max_logit carry none."""
    cfg, dims, sm = static
    ops, (out, dout, lse, _) = args[:-4], args[-4:]
    cfg = dataclasses.replace(cfg, want_lse=True)  # the decision the training forward made
    grads = _BWD((cfg, dims, sm, "bwd"), *ops, out, dout.astype(out.dtype), lse)
    if cfg.keep_mask:  # a keep mask takes no gradient (_differentiable_ops)
        grads = (*grads[:3], *grads[4:])
    return grads


def _reference_out(static, *ops):
    cfg, dims, sm = static
    return _reference(*ops, cfg=cfg, dims=dims, sm=sm)[0]


def _differentiable_ops(static, n_ops: int) -> tuple:
    """q, k, v, bias (not a boolean keep mask), softmax_offset, and a score_mod's operands."""
    cfg = static[0]
    bias = () if cfg.keep_mask else (3,)
    return (0, 1, 2, *bias, 4) + ((N_OPS,) if n_ops > N_OPS else ())


def _specialize(static, live: tuple):
    """The static of a call differentiated in the operands at positions `live` (the others'
    tangents are symbolic zeros): a bias without one needs no dbias from the kernels; a
    score_mod's array operands with one want their gradient (cuDNN computes none)."""
    cfg, dims, sm = static
    changes = {}
    if 3 not in live and cfg.want_dbias:
        changes["want_dbias"] = False
    if sm is not None and N_OPS in live and sm.operand_shapes and not cfg.sm_grads:
        changes["sm_grads"] = True  # the GPU route may pick the kernels that compute it
    return (dataclasses.replace(cfg, **changes), dims, sm) if changes else static


# grad: the fused forward and backward; jvp and higher orders: the reference's
# derivatives around them (_autodiff.py).
# context_checkpoint_name tags out, lse and max_logit (the backward's residuals): a remat
# policy naming it saves them, so the forward does not run again.
_attention = _autodiff.Differentiable("fusedattn_attention", _fused_fwd, _fused_bwd,
                                      _reference_out, _differentiable_ops,
                                      checkpoint_name=lambda static: static[0].checkpoint_name,
                                      specialize=_specialize)


# ---------------------------------------------------------------------------
# Partitioning (_partition.py). The forward and the backward are each one partitioned
# primitive around the per-device call above: batch (and vmap) dims and the q heads shard
# with no collective in the forward; k / v follow the q heads when their heads divide
# (else they stay whole and each device takes the kv heads its q heads use). Each device
# gets its shard's global batch and head base as the index_base operand (dropout's
# Philox counters and score_mod's batch_idx / head_idx are global, so the result does
# not depend on the mesh) and its slice of every score_mod operand. The backward sums
# what the math needs: dbias over the axes that shard a dim the bias broadcasts,
# d softmax_offset over the batch axes, score_mod operand gradients over the batch and
# head axes, replicated k / v's gradients over the head axes.


def _q_rank(cfg: Config) -> int:
    return 5 if cfg.layout in QKV_PACKED else 4


def _attn_roles(static, arg_shapes, res_shapes):
    cfg, dims, sm, kind = static[0], static[1], static[2], static[-1]
    n_lead = len(arg_shapes[0]) - _q_rank(cfg)
    lead = _partition.lead(n_lead)
    packed3, packed2 = cfg.layout in QKV_PACKED, cfg.layout in KV_PACKED
    c, ckv = ("c", "ckv") if cfg.cp is not None else (None, None)
    qr = ("b", c, None, "h", None) if packed3 else ("b", c, "h", None)
    kr = ("b", ckv, None, "k", None) if packed2 else ("b", ckv, "k", None)
    flat = (None,)

    def fit(roles, shape):
        """roles for a dims-shaped operand; an empty one (or a broadcast dim) gets None."""
        body = shape[n_lead:]
        if len(body) != len(roles) or 0 in body:
            return lead + (None,) * len(body)
        full = {"b": dims.B, "h": dims.Hq, "k": dims.Hkv, "c": dims.Sq, "ckv": dims.Skv}
        return lead + tuple(r if r is not None and d == full[r] else None
                            for r, d in zip(roles, body))

    q_op, k_op, v_op, bias, offset = arg_shapes[:5]
    ops = [fit(qr, q_op), fit(kr, k_op), fit(kr, v_op),
           fit(("b", "h", None, None), bias), fit(("h",), offset), lead + flat,
           fit(("b", None), arg_shapes[6]), fit(("b", None), arg_shapes[7]),
           fit(("b", None), arg_shapes[8]), fit(("b", None), arg_shapes[9]), lead + flat]
    if sm is not None:
        ops.append(lead + flat)
    out = lead + ("b", c, "h", None)
    lse = lead + (("b", c, "h") if cfg.thd else ("b", "h", c))
    if kind == "fwd":
        return ops, [out, lse, lead + ("b", "h")]
    results = ops[:4] + [fit(("h",), res_shapes[4])] + ([lead + flat] if sm is not None else [])
    return ops + [out, out, lse], results


def _sm_starts(plan, local: Dims, global_shapes, local_shapes):
    """Where each local score_mod operand sits in its global one: at this device's batch
    and head base on the dims it does not broadcast."""
    b0, h0 = plan.index("b") * local.B, plan.index("h") * local.Hq
    return [(b0 if g[0] != l[0] else 0, h0 if g[1] != l[1] else 0, 0, 0)
            for g, l in zip(global_shapes, local_shapes)]


def _local_sm(sm, dims: Dims, local: Dims, plan, flat, n_lead):
    """Each device's slice of the score_mod operands (float32 [.., N] flat, the global
    shapes in sm) and the ScoreMod of the local shapes."""
    shapes = [(local.B if s[0] == dims.B else 1, local.Hq if s[1] == dims.Hq else 1, s[2], s[3])
              for s in sm.operand_shapes]
    starts = _sm_starts(plan, local, sm.operand_shapes, shapes)

    def cut(f):
        return _sm.concat_operands([jax.lax.dynamic_slice(a, st, s) for a, st, s in
                                    zip(_sm.split_operands(f, sm), starts, shapes)])

    return dataclasses.replace(sm, operand_shapes=tuple(shapes)), _partition.per_slice(
        cut, n_lead)(flat)


def _global_sm_grad(sm, local_sm, local: Dims, plan, dflat, n_lead):
    """The local score_mod operand gradients placed at this device's slice of the global
    operands, summed over the batch and head axes."""
    starts = _sm_starts(plan, local, sm.operand_shapes, local_sm.operand_shapes)

    def place(f):
        return _sm.concat_operands([
            jax.lax.dynamic_update_slice(jnp.zeros(s, jnp.float32), a, st)
            for a, st, s in zip(_sm.split_operands(f, local_sm), starts, sm.operand_shapes)])

    return jax.lax.psum(_partition.per_slice(place, n_lead)(dflat), plan.reduce_axes("b", "h"))


def _localize(cfg: Config, dims: Dims, sm, plan, ops):
    """The operands of one device's call: (ops, local dims, local ScoreMod, the kv head
    indices taken or None, n_lead)."""
    ops = list(ops)
    n_lead = ops[0].ndim - _q_rank(cfg)
    q = ops[0]
    if cfg.layout in QKV_PACKED:
        B, Hq = q.shape[n_lead], q.shape[n_lead + 3]
        local = dataclasses.replace(dims, B=B, Hq=Hq, Hkv=Hq)
        return ops, local, sm, None, n_lead
    B, Hq = q.shape[n_lead], q.shape[n_lead + 2]
    kv_axis = n_lead + (3 if cfg.layout in KV_PACKED else 2)
    kv_ops = (ops[1],) if cfg.layout in KV_PACKED else (ops[1], ops[2])
    taken, kv_ops = _partition.take_kv_heads(plan, kv_axis, Hq, dims.Hq, dims.Hkv, *kv_ops)
    ops[1:1 + len(kv_ops)] = kv_ops
    local = dataclasses.replace(dims, B=B, Hq=Hq, Hkv=ops[1].shape[kv_axis])
    if plan is None or not plan.reduce_axes("b", "h"):
        return ops, local, sm, taken, n_lead
    if cfg.dropout_on or sm is not None:
        base = jnp.stack([plan.index("b") * B, plan.index("h") * Hq]).astype(jnp.int32)
        if ops[10].size:  # a base of its own (a block's positions too): the shard's added
            ops[10] = ops[10].at[..., :2].add(base)
        else:
            ops[10] = jnp.broadcast_to(base, q.shape[:n_lead] + (2,))
    if sm is not None and sm.operand_shapes:
        sm, ops[11] = _local_sm(sm, dims, local, plan, ops[11], n_lead)
    return ops, local, sm, taken, n_lead


def _fwd_impl(static, plan, *ops):
    cfg, dims, sm, training, _ = static
    ops, local, lsm, _, n_lead = _localize(cfg, dims, sm, plan, ops)
    cp = context_parallel.run_of(cfg, plan)
    if cp is not None:
        local = context_parallel.global_dims(cfg, local, lsm, plan, cp, ops)
        context_parallel.check_divisible(cp, local.Sq, local.Skv, cfg.dropout_on)
        call = lambda o, c, d, s: _forward(o, c, d, s, training)

        def fwd(*o):
            return context_parallel.forward(context_parallel.split_qkv(cfg, o), cfg, local, lsm,
                                            training, cp, context_parallel.shard_base(o), call)
    else:
        fwd = lambda *o: _forward(o, cfg, local, lsm, training)
    return _partition.per_slice(fwd, n_lead)(*ops)


def _bwd_impl(static, plan, *args):
    cfg, dims, sm, _ = static
    n = N_OPS + (sm is not None)
    ops, rest = args[:n], args[n:]
    lops, local, lsm, taken, n_lead = _localize(cfg, dims, sm, plan, ops)
    cp = context_parallel.run_of(cfg, plan)
    if cp is not None:
        local = context_parallel.global_dims(cfg, local, lsm, plan, cp, lops)

        def bwd(*a):
            o = a[:n]
            g = context_parallel.backward(context_parallel.split_qkv(cfg, o), *a[n:], cfg, local,
                                          lsm, cp, context_parallel.shard_base(o), _backward)
            return context_parallel.join_grads(cfg, g)
    else:
        bwd = lambda *a: _backward(a, cfg, local, lsm)
    grads = list(_partition.per_slice(bwd, n_lead)(*lops, *rest))
    if plan is None:
        return grads
    if taken is not None:
        axis = n_lead + (3 if cfg.layout in KV_PACKED else 2)
        hkv = ops[1].shape[axis]
        if cfg.layout in KV_PACKED:
            grads[1], = _partition.put_kv_heads(plan, taken, axis, hkv, grads[1])
        else:
            grads[1], grads[2] = _partition.put_kv_heads(plan, taken, axis, hkv, *grads[1:3])
    bias = ops[3]
    if bias.size and not cfg.keep_mask:
        axes = ((plan.of("b") if bias.shape[n_lead] == 1 else ())
                + (plan.of("h") if bias.shape[n_lead + 1] == 1 else ()))
        if axes:
            grads[3] = jax.lax.psum(grads[3].astype(jnp.float32), axes).astype(bias.dtype)
    if ops[4].size and plan.of("b"):
        grads[4] = jax.lax.psum(grads[4], plan.of("b"))
    if sm is not None and sm.operand_shapes and plan.reduce_axes("b", "h"):
        grads[5] = _global_sm_grad(sm, lsm, local, plan, grads[5], n_lead)
    return grads


_OPERAND_NAMES = ("q", "k", "v", "bias", "softmax_offset", "seed", "q_seqlens", "kv_seqlens",
                  "q_offsets", "kv_offsets", "index_base")


def _names(static):
    sm_names = ("score_mod_operands",) if static[2] is not None else ()
    tail = ("out", "dout", "softmax_aux") if static[-1] == "bwd" else ()
    return _OPERAND_NAMES + sm_names + tail


_FWD = _partition.Partitioned("fused_attn", _fwd_impl, _attn_roles, _names,
                              forced=context_parallel.forced_axes)
_BWD = _partition.Partitioned("fused_attn_bwd", _bwd_impl, _attn_roles, _names,
                              forced=context_parallel.forced_axes)


_warned: set[str] = set()


def _warn_once(name: str, reason: str) -> None:
    if name == "xla_reference" and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"fusedattn on {jax.default_backend()}: {reason}", RuntimeWarning,
                      stacklevel=4)


def _warn_if_fallback(call, sm) -> None:
    """Warns (once per reason) when XLA's reference will serve this call off the CPU."""
    if jax.default_backend() == "cpu":
        return
    if not _has_gpu():  # another accelerator: the reference runs
        if sm is not None:
            _warn_once("xla_reference", "score_mod runs XLA's reference on this platform")
            return
        name, _, reason = _lib.select_backend(call.params, _lib.PLATFORM_CUDA)
        _warn_once(name, reason)
        return
    _warn_once(*_choice(call.operands, call.cfg, call.dims, False, sm)[:2])


_SMALL_SEQ_LAYOUTS = (QKVLayout.BSHD_BSHD_BSHD, QKVLayout.THD_THD_THD)


def _small_seq_route(params: _lib.AttnParams, qkv, sequence_descriptor,
                     platform: str | None) -> tuple[bool, str]:
    """Whether fused_attn hands this call to the small-seq backend: only when the
    descriptor promises max_segment_seqlen_kv, and the backend serves the rest."""
    if getattr(sequence_descriptor, "max_segment_seqlen_kv", None) is None:
        return False, "no max_segment_seqlen_kv promise in the sequence_descriptor"
    if QKVLayout(params.layout) not in _SMALL_SEQ_LAYOUTS:
        return False, "small-seq takes separate q, k, v (BSHD_BSHD_BSHD or THD_THD_THD)"
    q, k = qkv[0], qkv[1]
    return small_seq.fused_attn_eligibility(params, sequence_descriptor,
                                            tokens_q=int(q.shape[-3]),
                                            tokens_kv=int(k.shape[-3]), platform=platform)


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
               return_aux=False,
               score_mod=None,
               score_mod_operands=(),
               score_mod_bprop=None,
               check_descriptors=False,
               context_parallel_strategy=context_parallel.CPStrategy.DEFAULT,
               context_parallel_axis="",
               context_parallel_causal_load_balanced=False,
               stripe_size=None,
               context_checkpoint_name="context",
               dropout_broadcast=False,
               _mask_bias=False,
               _mask_keep_only=False,
               _average_empty_rows=False):
    """Fused scaled-dot-product attention (semantics: reference.py's docstring).

    qkv, by qkv_layout (float32, bfloat16 or float16, all the same; float64 under
    jax_enable_x64 too: on the CPU the engine in double, O(S) memory (with a score_mod the
    reference in float64), the float32 kernels on the GPU):
      BSHD_BSHD_BSHD, THD_THD_THD: (q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv])
      BSHD_BS2HD, THD_T2HD: (q [B, Sq, Hq, D], kv [B, Skv, 2, Hkv, D])
      BS3HD, T3HD: qkv [B, S, 3, H, D] (or a 1-tuple of it)
      Hq a multiple of Hkv (GQA/MQA). THD layouts pack several sequences per row, as the
      sequence_descriptor says (max_segments_per_seq of them), and need a padding mask.
    bias: None, or [1|B, 1|Hq, Sq, Skv] with attn_bias_type PRE_SCALE_BIAS / POST_SCALE_BIAS
      (cast to q's dtype); differentiable.
    sequence_descriptor: SequenceDescriptor (required by the padding masks) or None; a
      dense mask [B, 1, Sq, Skv] (True = masked out) is TransformerEngine's deprecated form,
      taken for BSHD layouts as TE takes it (a DeprecationWarning; only each row's lengths
      are read from it: sequence.from_dense_mask).
    seed: dropout seed (None, an int, an integer scalar array, a raw uint32 [2] key or a
      typed PRNG key; its kind is checked always); read only when is_training and
      dropout_probability > 0.
    dropout_broadcast (a static bool): one dropout mask for every batch entry and head (Flax's
      broadcast_dropout; the mask of query i, key j is the one of batch entry 0, head 0);
      off (default), each (batch entry, head) draws its own. On the GPU the CUDA flash
      kernels run such a call (cuDNN draws one mask per batch entry and head).
    dropout_probability (a static float in [0, 1)), is_training (a static bool) and
    max_segments_per_seq (a static int) are not traced. The descriptor is resolved to
    max_segments_per_seq at call time (segment ids found, TransformerEngine's -1-padded
    lengths / offsets compacted: sequence.py's docstring); with a BSHD layout a value
    above 1 warns and is taken as 1, as in TransformerEngine.
    context_checkpoint_name: the name out and the softmax statistics are tagged with
      (jax.ad_checkpoint.checkpoint_name; TransformerEngine's keyword and default), so
      jax.checkpoint(..., policy=jax.checkpoint_policies.save_only_these_names("context"))
      keeps them and the backward does not run the forward again; None: no tag.
    Bad arguments raise at trace time, naming the argument: ValueError, or for the wrong
    kind of argument (a list for an array, a str or float for an int, a traced value for a
    static one) fusedattn._args.ArgumentTypeError, a TypeError that is also a ValueError.
    scaling_factor: multiplies q.k before the softmax; None means 1/sqrt(D). A Python or
      NumPy number, or a 0-d float array, traced under jit or grad too (as
      jax.nn.dot_product_attention's scale): a traced scale s is folded into the operands
      (q becomes s * q rounded to q's dtype, a PRE_SCALE_BIAS s * bias) and the kernels run
      with scale 1.0, so gradients reach s. NaN/inf are rejected only when static.
    window_size: None or (left, right) Python ints, -1 = unbounded (sliding window attention).
    softmax_offset: [Hq] or [1, Hq, 1, 1] float, the per-head extra logit of
      LEARNABLE_SOFTMAX; differentiable.

    score_mod: fn(score, batch_idx, head_idx, q_idx, kv_idx, *operands) -> score, written
      with jax.numpy on scalars (flex attention; score_mod.py has the rules): applied to the
      scaled, biased logits before the masks and the softmax, inside the CPU kernel
      (forward and backward, with the derivative traced from fn) and, on the GPU, as
      pointwise nodes of cuDNN's graph (a bias, or a graph cuDNN declines, runs the
      reference with fn over the materialized scores; so does an operand's gradient on
      the GPU). score_mod_operands: arrays
      broadcastable to [B, Hq, Sq, Skv] (differentiable) or Python/NumPy scalars (baked
      in). In THD layouts each segment is a sequence of its own: q_idx and kv_idx count
      from its first query and key token (so relative positions, ALiBi and a causal
      score_mod act per segment), batch_idx is the packed row, and the operands are read
      at those positions ([.., Sq, Skv] tables indexed per segment). score_mod_bprop(dscore, score, batch_idx, head_idx, q_idx, kv_idx, *operands)
      -> dscore of the input score: overrides the derived backward.
    check_descriptors: off (default), an invalid runtime sequence_descriptor is clamped by
      one rule on every backend (sequence.py's docstring: a THD segment ends at the next
      segment's offset, one whose offset is below an earlier one is empty, everything is
      clamped to the buffers). On, it is an error instead: offsets outside the buffer or
      out of order, negative lengths, a segment past the buffer or overlapping the next
      one, more segment-id runs than max_segments_per_seq (sequence.check_descriptor).
      The checks are jax.experimental.checkify checks: eagerly they raise at once; under
      jit, use err, out = checkify.checkify(jax.jit(f))(...); err.throw().
    Context parallelism (context_parallel.py; under jit on a mesh, or inside shard_map
    with the axis manual): context_parallel_axis names the mesh axis that shards the
    sequence of q and k / v ("" (TransformerEngine's default) or None: none); context_parallel_strategy ALL_GATHER (DEFAULT)
    or RING (CPStrategy or its name); context_parallel_causal_load_balanced: the inputs
    come in reorder_causal_load_balancing's dual-chunk order (and the output, aux and
    gradients leave in it). Every feature keeps the unsharded call's result (masks,
    windows, bias, sinks, dropout, score_mod). THD layouts: the packed tokens sharded
    (sequence_descriptor global), load-balanced by stripes: stripe_size (the inputs in
    reorder_causal_load_balancing(..., ReorderStrategy.Striped, cp, stripe_size=...) order);
    no bias. Off a mesh with that axis the call is the plain one.
    A sequence_descriptor that promises max_segment_seqlen_kv (<= 64, one query per
    segment) sends the call to the small-seq backend (fused_attn_small_seq) when it serves
    it and no statistics are asked for; get_backend reports "small_seq".

    Transformations: jit, vmap, grad / vjp (the fused forward and backward), jvp, jacfwd,
    linearize (the fused forward; the tangent by the reference's JVP, which materializes
    the scores), higher orders (hessian, grad of grad: the reference's derivatives of the
    fused backward), checkpoint, shard_map and sharded jit (_autodiff.py).

    Returns out [B, Sq, Hq, Dv] in q's dtype, or (out, aux) when return_max_logit or
    return_aux is set: aux["max_logit"] f32 [Hq] (max over batch, queries and kept keys
    of the logits after scale and bias), aux["softmax_aux"] f32 [B, Hq, Sq, 1] ([B, Sq, Hq, 1]
    for THD layouts; both f64 for float64 qkv): the log-sum-exp of each row (extra softmax logit included; -inf for
    padding rows). Neither carries a gradient.

    NaN in, NaN out (reference.py is the spec): a NaN among a query's kept logits (from q,
    k, bias or score_mod) or a NaN softmax_offset makes that row's output and log-sum-exp
    NaN (and max_logit, for a logit), and the gradients it touches; a row that keeps no
    key still gives 0 and lse -inf. A +inf softmax_offset takes all its head's mass:
    output 0, lse +inf, no gradient.

    _mask_bias (internal: dot_product_attention's): the bias is a folded boolean mask that
    holds _lib.masked_bias_value(dtype) at the keys it drops; the CPU engine then drops
    them as a -inf bias does (a row that keeps none gives 0 and lse -inf, for the caller
    to fix) and skips the key tiles they fill.
    _mask_keep_only (internal, with _mask_bias): no bias came beside the mask, and the bias
    operand is the boolean mask itself (True keeps the key; _lib.REQUEST_MASK_KEEP_ONLY): the
    engine folds it into the masked value only for the kernels that add a bias's values (the
    Hopper kernels read the mask's bytes; the Hopper backward at head dim 64 then takes
    128-query blocks). It takes no gradient.
    _average_empty_rows (internal: dot_product_attention's): that fix, by every backend
    (_lib.REQUEST_AVERAGE_EMPTY_ROWS): rows below their q_seqlen whose lse is at most half
    the folded mask's value get the average of all values of their kv head (jax's softmax
    over equal masked logits), gradient to value only. BSHD layouts, vanilla softmax, no
    dropout, no context parallelism.
    """
    call = prepare(qkv, bias, sequence_descriptor, seed, attn_bias_type=attn_bias_type,
                   attn_mask_type=attn_mask_type, qkv_layout=qkv_layout,
                   softmax_type=softmax_type, scaling_factor=scaling_factor,
                   dropout_probability=dropout_probability, is_training=is_training,
                   max_segments_per_seq=max_segments_per_seq, window_size=window_size,
                   softmax_offset=softmax_offset, context_checkpoint_name=context_checkpoint_name,
                   dropout_broadcast=dropout_broadcast,
                   keep_mask=bool(_mask_bias) and bool(_mask_keep_only) and bias is not None)
    sequence_descriptor = call.sequence_descriptor  # resolved to the call's max_segments_per_seq
    if check_descriptors and sequence_descriptor is not None:
        d = call.dims
        check_descriptor(*call.operands[6:10], seqlen_q=d.Sq, seqlen_kv=d.Skv,
                         thd=call.cfg.thd, padding=call.cfg.mask_type.is_padding(),
                         q_runs=sequence_descriptor.q_runs, kv_runs=sequence_descriptor.kv_runs,
                         runs_of=sequence_descriptor.runs_of)
    if isinstance(context_parallel_axis, str) and not context_parallel_axis:
        context_parallel_axis = None  # TransformerEngine's default "": no axis
    cp = context_parallel.config(context_parallel_strategy, context_parallel_axis,
                    context_parallel_causal_load_balanced, stripe_size, call.cfg)
    if cp is not None:
        call = dataclasses.replace(call, cfg=dataclasses.replace(call.cfg, cp=cp))
    if _average_empty_rows:
        c = call.cfg
        why = ("a THD layout" if c.thd else
               "a softmax offset" if c.softmax_type != SoftmaxType.VANILLA_SOFTMAX else
               "dropout" if c.dropout_on else "context parallelism" if cp is not None else None)
        if why:
            raise ValueError(f"fused_attn: _average_empty_rows takes a BSHD layout, vanilla "
                             f"softmax, no dropout and no context parallelism; the call has {why}")
    sm = None
    if score_mod is not None:
        d = call.dims
        sm, arrays4 = _sm.make_score_mod(score_mod, score_mod_operands, score_mod_bprop,
                                         (d.B, d.Hq, d.Sq, d.Skv))
    elif (not (return_max_logit or return_aux or _average_empty_rows) and cp is None
            and _small_seq_route(call.params, qkv, sequence_descriptor, None)[0]):
        return small_seq.fused_attn_small_seq(
            qkv, None, sequence_descriptor, seed, attn_mask_type=attn_mask_type,
            qkv_layout=qkv_layout,
            scaling_factor=call.cfg.scale if call.traced_scale is None else call.traced_scale,
            dropout_probability=dropout_probability, is_training=is_training)
    call = dataclasses.replace(call, cfg=dataclasses.replace(
        call.cfg, want_lse=bool(return_aux or _average_empty_rows),
        want_max_logit=bool(return_max_logit),
        mask_bias=bool(_mask_bias) and call.operands[3].size > 0,
        mask_keep_only=bool(_mask_keep_only) and bool(_mask_bias) and call.operands[3].size > 0,
        average_empty_rows=bool(_average_empty_rows)))
    _warn_if_fallback(call, sm)
    ops = call.operands if sm is None else (*call.operands, _sm.concat_operands(arrays4))
    out, lse, max_logit = _attention((call.cfg, call.dims, sm), False, *ops)
    return _results(out, lse, max_logit, return_max_logit, return_aux)


def _results(out, lse, max_logit, return_max_logit, return_aux):
    """out, or (out, aux) with the statistics asked for (no gradient through them)."""
    if not (return_max_logit or return_aux):
        return out
    aux = {}
    if return_max_logit:
        aux["max_logit"] = jax.lax.stop_gradient(nan_max(max_logit, axis=0))
    if return_aux:
        aux["softmax_aux"] = jax.lax.stop_gradient(lse[..., None])
    return out, aux
