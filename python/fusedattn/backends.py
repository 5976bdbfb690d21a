"""get_backend / is_fused_attn_kernel_available: which backend serves a call and why, from
the same C++ select_backend() the FFI handlers run (and, with a GPU at hand, cuDNN's own
graph check: _gpu_route.py).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from . import _lib
from . import score_mod as _sm
from ._gpu_route import _fields, _gpu_choice, _has_gpu, _sm_key, gpu_params
from ._args import ArgumentTypeError, static_bool, static_float, static_int
from ._prepare import Config, enum, prepare, window
from .attention import _small_seq_route
from .enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType

__all__ = ["get_backend", "is_fused_attn_kernel_available", "BackendInfo"]


def _score_mod_backend(call, fn, operands, platform, training, want_max_logit, flags=0):
    f64 = call.params.dtype == _lib.ATTN_DTYPE_CODES["float64"]
    cpu = _platform_code(platform) == _lib.PLATFORM_CPU
    if cpu and not f64:
        return BackendInfo("cpu_flash", True, "score_mod runs inside the CPU engine (its "
                           "lowered program, forward and backward)")
    # The engine reads the program: it decides the Hopper forward and the bias rule (and
    # on the CPU, that float64 with a score_mod runs the reference).
    d = call.dims
    sm, _ = _sm.make_score_mod(fn, operands, None, (d.B, d.Hq, d.Sq, d.Skv))
    key = _sm_key(sm)
    if cpu:
        choice = _lib.backend_choice(call.params, _lib.PLATFORM_CPU, 0, key, want_max_logit)
        return BackendInfo(choice.name, choice.name in _FUSED_BACKENDS, choice.reason)
    params = gpu_params(call.params)
    note = _padding_note(call.params, params)
    choice = _lib.backend_choice(params, _lib.PLATFORM_CUDA, 0, key, want_max_logit, flags)
    if choice.name != "cudnn":  # (cuda_flash's passes may be the Hopper kernels': softcap, ALiBi)
        return BackendInfo(choice.name, choice.name in _FUSED_BACKENDS, choice.reason + note,
                           choice.forward, choice.backward)
    if _has_gpu():  # the graphs themselves are asked
        name, reason, _ = _gpu_choice(_fields(params), False, want_max_logit, training,
                                      key, flags)
        if name != "cudnn":
            return BackendInfo(name, name in _FUSED_BACKENDS, reason + note)
        return BackendInfo(name, True, choice.reason + note, choice.forward, choice.backward)
    return BackendInfo("cudnn", True, "score_mod runs in the cuDNN graph as pointwise nodes "
                       "(where cuDNN builds the graph; otherwise the CUDA flash kernels)" + note)


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """Which backend runs a call: name is "cpu_flash", "cudnn", "cuda_flash" (fusedattn's
    generic CUDA flash kernels: every GPU call cuDNN declines), "small_seq",
    "xla_reference" or "none".

    fused is True when one of fusedattn's own kernels serves the call; reason says
    why this backend and why not the others (or, for "none", what is wrong).
    forward and backward name the kernels that run each pass: name's own, except that
    calls served by "cudnn" may run the forward on "hopper" (fusedattn's sm_90 flash
    forward: softcap and ALiBi score_mods, dense masks, and plain calls where its
    checked-in measurement found it faster; head dims 64, 128 and 256, sinks and max_logit
    included) and the backward on "hopper" (the sm_90 flash backward at head dims 64, 128 and
    256: dense masks, softcap and ALiBi, deterministic mode, and plain
    calls where its measurement found it faster), and calls served by
    "cuda_flash" may run the forward on "hopper" (a bias it reads as tiles, Skv a multiple
    of 8; a PRE_SCALE_BIAS at head dim 256; softcap or ALiBi with a bias beside it as tiles,
    ALiBi with its slopes' gradient taken; any call without a score_mod it can run under
    FUSEDATTN_HOPPER_FWD=1), and the
    backward on "hopper" where that kernel can run it (else the CUDA flash kernels, from
    the forward's lse).
    """

    name: str
    fused: bool
    reason: str
    forward: str | None = None  # None: name
    backward: str | None = None  # None: name

    def __post_init__(self):
        for field in ("forward", "backward"):
            if getattr(self, field) is None:
                object.__setattr__(self, field, self.name)


_FUSED_BACKENDS = {"cpu_flash", "cudnn", "cuda_flash", "small_seq"}


def _platform_code(platform: str | None) -> int:
    platform = platform or jax.default_backend()
    if platform == "cpu":
        return _lib.PLATFORM_CPU
    if platform in ("gpu", "cuda"):
        return _lib.PLATFORM_CUDA
    raise ValueError(f"get_backend: platform={platform!r}; allowed 'cpu', 'gpu' or 'cuda'")


def _padding_note(params: _lib.AttnParams, padded: _lib.AttnParams) -> str:
    if (params.head_dim_qk, params.head_dim_v) == (padded.head_dim_qk, padded.head_dim_v):
        return ""
    return (f" [head dims {params.head_dim_qk} / {params.head_dim_v} run zero-padded to "
            f"{padded.head_dim_qk} / {padded.head_dim_v}: the GPU kernels read rows of whole "
            "16-byte chunks]")


def _backend_info(params: _lib.AttnParams, platform: str | None, training: bool = False,
                  want_max_logit: bool = False, flags: int = 0) -> BackendInfo:
    code = _platform_code(platform)
    note = ""
    if code == _lib.PLATFORM_CUDA:
        padded = gpu_params(params)  # the head dims the GPU runs
        params, note = padded, _padding_note(params, padded)
    choice = _lib.backend_choice(params, code, 0, None, want_max_logit, flags)
    if code == _lib.PLATFORM_CUDA and _has_gpu():
        # With a GPU at hand the cuDNN graphs themselves are asked too.
        name, reason, gflags = _gpu_choice(_fields(params), False, want_max_logit, training,
                                           flags=flags)
        if name != choice.name:  # cuDNN rejected a graph: the kernels the handler then runs
            c = _lib.backend_choice(params, code, 0, None, want_max_logit, gflags)
            return BackendInfo(name, name in _FUSED_BACKENDS, reason + note, c.forward, c.backward)
    return BackendInfo(choice.name, choice.name in _FUSED_BACKENDS, choice.reason + note,
                       choice.forward, choice.backward)


def get_backend(qkv, bias=None, sequence_descriptor=None, seed=0, *,
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
                platform: str | None = None,
                score_mod=None,
                score_mod_operands=(),
                score_mod_grads=False,
                dropout_broadcast=False,
                bias_grads=True) -> BackendInfo:
    """The backend fused_attn would use for these arguments (arrays or ShapeDtypeStructs).
    score_mod / score_mod_operands: as fused_attn's (on the GPU: cuDNN's graph, where it
    builds and no bias comes with the score_mod; else fusedattn's CUDA flash kernels).
    score_mod_grads: the caller takes the gradient of the score_mod's array operands (a
    learnable ALiBi slope; fused_attn learns it from the jvp rule, so a call can only say
    it here): with is_training, the GPU answer is then the CUDA flash kernels' (cuDNN
    computes no operand gradient). dropout_broadcast: as fused_attn's (on the GPU with
    dropout on: the CUDA flash kernels). bias_grads: the caller takes the bias's gradient
    (fused_attn learns it from the jvp rule); False answers for a bias that takes none (a
    constant, a folded mask: on the GPU the Hopper backward can add it).

    platform: "cpu" or "gpu" (anything else raises ValueError); None means
    jax.default_backend(). On a machine with a GPU, a GPU query also builds the cuDNN
    graphs the call needs (the backward too when is_training), so the answer is the
    one the call will get. A bad attention call does not raise: it returns name
    "none" with the error as the reason.
    """
    try:
        call = prepare(qkv, bias, sequence_descriptor, seed, attn_bias_type=attn_bias_type,
                       attn_mask_type=attn_mask_type, qkv_layout=qkv_layout,
                       softmax_type=softmax_type, scaling_factor=scaling_factor,
                       dropout_probability=dropout_probability, is_training=is_training,
                       max_segments_per_seq=max_segments_per_seq, window_size=window_size,
                       softmax_offset=softmax_offset, build=False,
                       dropout_broadcast=dropout_broadcast)
    except (ValueError, NotImplementedError) as e:
        return BackendInfo("none", False, str(e))
    request = call.cfg.request_flags | (_lib.REQUEST_NO_DBIAS if not bias_grads else 0)
    if score_mod is not None:
        flags = _lib.REQUEST_SCORE_MOD_GRADS if score_mod_grads and is_training else 0
        flags |= request
        return _score_mod_backend(call, score_mod, score_mod_operands, platform,
                                  bool(is_training), bool(return_max_logit), flags)
    if not return_max_logit:
        served, reason = _small_seq_route(call.params, qkv, call.sequence_descriptor,
                                          platform)
        if served:
            return BackendInfo("small_seq", True, reason)
    return _backend_info(call.params, platform, bool(is_training), bool(return_max_logit),
                         request)


def is_fused_attn_kernel_available(is_training, q_dtype, kv_dtype, qkv_layout, attn_bias_type,
                                   attn_mask_type, softmax_type, dropout_probability,
                                   q_num_heads, kv_num_heads, q_max_seqlen, kv_max_seqlen,
                                   head_dim_qk, head_dim_v, window_size=None, platform=None):
    """True when one of fusedattn's fused kernels serves this configuration. Arguments of
    the wrong kind (a str or float for a size, an unknown dtype) raise TypeError naming
    them; sizes the engine does not take (0, past int64) give False."""
    where = "is_fused_attn_kernel_available"
    try:
        q_dtype, kv_dtype = jnp.dtype(q_dtype), jnp.dtype(kv_dtype)
    except TypeError:
        raise ArgumentTypeError(f"{where}: q_dtype and kv_dtype must be dtypes; got {q_dtype!r}, "
                                f"{kv_dtype!r}") from None
    sizes = {}
    for name, value in (("q_num_heads", q_num_heads), ("kv_num_heads", kv_num_heads),
                        ("q_max_seqlen", q_max_seqlen), ("kv_max_seqlen", kv_max_seqlen),
                        ("head_dim_qk", head_dim_qk), ("head_dim_v", head_dim_v)):
        try:
            sizes[name] = static_int(value, name, where, "a Python int")
        except ArgumentTypeError:
            raise
        except ValueError:  # past int64: no kernel serves it
            return False
    if q_dtype != kv_dtype:
        return False
    if q_dtype == jnp.float64 and _platform_code(platform) == _lib.PLATFORM_CUDA:
        return False  # no GPU kernel computes in float64 (the GPU runs it as float32)
    try:
        win = window(window_size, "window_size", where)
    except ArgumentTypeError:
        raise
    except ValueError:
        return False
    cfg = Config(enum(QKVLayout, qkv_layout, "qkv_layout", where),
                 enum(AttnMaskType, attn_mask_type, "attn_mask_type", where),
                 enum(AttnBiasType, attn_bias_type, "attn_bias_type", where),
                 enum(SoftmaxType, softmax_type, "softmax_type", where), 1.0,
                 static_float(dropout_probability, "dropout_probability", where),
                 static_bool(is_training, "is_training", where), win)
    # A bias of shape [1, Hq, Sq, Skv] stands for any bias of this configuration.
    bias_extent = (0, 0) if cfg.bias_type == AttnBiasType.NO_BIAS else (1, sizes["q_num_heads"])
    params = cfg.params(q_dtype, 1, sizes["q_max_seqlen"], sizes["kv_max_seqlen"],
                        sizes["q_num_heads"], sizes["kv_num_heads"], sizes["head_dim_qk"],
                        sizes["head_dim_v"], 1, *bias_extent)
    return _backend_info(params, platform, bool(is_training)).fused
