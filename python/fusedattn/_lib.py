"""Loads libfusedattn.so once (ctypes) and registers its XLA FFI handlers.

The library has no Python in it: this module is the only bridge. It mirrors every
params struct of the C API (FaAttnParams, FaSoftmaxParams, FaSmallSeqParams) and wraps
the C functions that take them, so Python asks the engine's own validate() /
select_backend() / eligibility at trace time. The ops' modules (attention.py,
softmax.py, small_seq.py) import from here and never touch ctypes themselves.
"""

from __future__ import annotations

import ctypes
import os
import typing

import jax

_LIB_FILE = "libfusedattn.so"

# FaDType codes (params.h).
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
# attention's: float64 too (the CPU engine computes it in double; the GPU runs it as float32)
ATTN_DTYPE_CODES = {**DTYPE_CODES, "float64": 3}
STATUS_OK, STATUS_INVALID, STATUS_UNIMPLEMENTED, STATUS_INTERNAL = 0, 1, 2, 3
PLATFORM_CPU, PLATFORM_CUDA = 0, 1


class AttnParams(ctypes.Structure):
    """Mirror of FaAttnParams in csrc/fusedattn/attention/params.h (same field order)."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_kv", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim_qk", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int64),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("max_segments", ctypes.c_int64),
        ("bias_batch", ctypes.c_int64),
        ("bias_heads", ctypes.c_int64),
        ("num_slices", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("layout", ctypes.c_int32),
        ("mask_type", ctypes.c_int32),
        ("bias_type", ctypes.c_int32),
        ("softmax_type", ctypes.c_int32),
        ("is_training", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("dropout", ctypes.c_float),
    ]


SOFTMAX_MAX_RANK = 8


class SoftmaxParams(ctypes.Structure):
    """Mirror of FaSoftmaxParams in csrc/fusedattn/softmax/params.h (same field order)."""

    _fields_ = [
        ("dims", ctypes.c_int64 * SOFTMAX_MAX_RANK),
        ("mask_dims", ctypes.c_int64 * SOFTMAX_MAX_RANK),
        ("rank", ctypes.c_int32),
        ("has_mask", ctypes.c_int32),
        ("softmax_type", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("scale", ctypes.c_float),
    ]


class SmallSeqParams(ctypes.Structure):
    """Mirror of FaSmallSeqParams in csrc/fusedattn/small_seq/params.h (same field order)."""

    _fields_ = [
        ("packs", ctypes.c_int64),
        ("num_segments", ctypes.c_int64),
        ("tokens_q", ctypes.c_int64),
        ("tokens_kv", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim_qk", ctypes.c_int64),
        ("head_dim_v", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_kv", ctypes.c_int64),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("layout", ctypes.c_int32),
        ("mask_type", ctypes.c_int32),
        ("bias_type", ctypes.c_int32),
        ("softmax_type", ctypes.c_int32),
        ("is_training", ctypes.c_int32),
        ("has_q_seqlens", ctypes.c_int32),
        ("has_kv_seqlens", ctypes.c_int32),
        ("has_offsets", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("dropout", ctypes.c_float),
    ]


def _load() -> ctypes.CDLL:
    # FUSEDATTN_LIBRARY: the path of another build of the library to load instead of the
    # package's own (e.g. the sanitized build scripts/test.sh runs a pytest selection with).
    path = os.environ.get("FUSEDATTN_LIBRARY") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), _LIB_FILE)
    if not os.path.exists(path):
        raise ImportError(
            f"fusedattn: {path} is missing; install the package with `pip install .` "
            "so that CMake builds the engine")
    lib = ctypes.CDLL(path)
    lib.fa_version.restype = ctypes.c_char_p
    lib.fa_backend_name.restype = ctypes.c_char_p
    lib.fa_backend_name.argtypes = [ctypes.c_int]
    lib.fa_validate.argtypes = [ctypes.POINTER(AttnParams), ctypes.c_char_p, ctypes.c_int]
    intp = ctypes.POINTER(ctypes.c_int)
    lib.fa_select_backend.argtypes = [
        ctypes.POINTER(AttnParams), ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int32),
        ctypes.c_int64, ctypes.c_int, ctypes.c_int, intp, intp, intp, ctypes.c_char_p,
        ctypes.c_int]
    lib.fa_cudnn_graphs_built.restype = ctypes.c_int64
    lib.fa_hopper_fwd_launches.restype = ctypes.c_int64
    lib.fa_hopper_bwd_launches.restype = ctypes.c_int64
    lib.fa_set_hopper_fwd.argtypes = [ctypes.c_int]
    lib.fa_set_hopper_bwd.argtypes = [ctypes.c_int]
    i32p = ctypes.POINTER(ctypes.c_int32)
    lib.fa_cuda_attn_workspace_bytes.argtypes = [
        ctypes.POINTER(AttnParams), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_int, i32p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p, ctypes.c_int]
    lib.fa_cudnn_check.argtypes = [ctypes.POINTER(AttnParams), ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_int, i32p, ctypes.c_int64,
                                   ctypes.c_char_p, ctypes.c_int]
    lib.fa_set_num_threads.argtypes = [ctypes.c_int]
    lib.fa_masked_bias_value.restype = ctypes.c_float
    lib.fa_masked_bias_value.argtypes = [ctypes.c_int]
    lib.fa_request_flag.restype = ctypes.c_int32
    lib.fa_request_flag.argtypes = [ctypes.c_char_p]
    lib.fa_softmax_type_name.restype = ctypes.c_char_p
    lib.fa_softmax_type_name.argtypes = [ctypes.c_int]
    lib.fa_softmax_validate.argtypes = [ctypes.POINTER(SoftmaxParams), ctypes.c_char_p,
                                        ctypes.c_int]
    lib.fa_softmax_kernel_available.argtypes = [
        ctypes.POINTER(SoftmaxParams), ctypes.c_int, ctypes.POINTER(ctypes.c_int),
        ctypes.c_char_p, ctypes.c_int]
    lib.fa_small_seq_validate.argtypes = [ctypes.POINTER(SmallSeqParams), ctypes.c_char_p,
                                          ctypes.c_int]
    lib.fa_small_seq_eligible.argtypes = [ctypes.POINTER(SmallSeqParams), ctypes.c_int,
                                          ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                                          ctypes.c_int]
    for name, struct in (("fa_params_size", AttnParams),
                         ("fa_softmax_params_size", SoftmaxParams),
                         ("fa_small_seq_params_size", SmallSeqParams)):
        size = getattr(lib, name)()
        if size != ctypes.sizeof(struct):
            raise ImportError(
                f"fusedattn: {path} has {struct.__name__} of {size} bytes, Python expects "
                f"{ctypes.sizeof(struct)}: the library and the package are out of step")
    return lib


lib = _load()

# The one registration table: FFI target name -> {platform: exported handler symbol}.
# Python wrappers call a target by its name; XLA picks the handler of the platform
# the computation runs on. CUDA handlers exist only in a build with CUDA (and
# registering them needs no GPU: jax keeps them until a CUDA backend starts).
TARGETS = {
    "fusedattn_attn_fwd": {"cpu": "fa_cpu_attn_fwd"},
    "fusedattn_attn_fwd_sm": {"cpu": "fa_cpu_attn_fwd_sm"},
    "fusedattn_attn_bwd_sm": {"cpu": "fa_cpu_attn_bwd_sm"},
    "fusedattn_attn_bwd": {"cpu": "fa_cpu_attn_bwd"},
    # The CUDA handlers take one more result: their workspace (attention/ffi_cuda.cc).
    "fusedattn_attn_fwd_cuda": {"CUDA": "fa_cuda_attn_fwd"},
    "fusedattn_attn_bwd_cuda": {"CUDA": "fa_cuda_attn_bwd"},
    "fusedattn_attn_fwd_sm_cuda": {"CUDA": "fa_cuda_attn_fwd_sm"},
    "fusedattn_attn_bwd_sm_cuda": {"CUDA": "fa_cuda_attn_bwd_sm"},
    "fusedattn_softmax_fwd": {"cpu": "fa_cpu_softmax_fwd", "CUDA": "fa_cuda_softmax_fwd"},
    "fusedattn_softmax_bwd": {"cpu": "fa_cpu_softmax_bwd", "CUDA": "fa_cuda_softmax_bwd"},
    "fusedattn_small_seq_fwd": {"cpu": "fa_cpu_small_seq_fwd", "CUDA": "fa_cuda_small_seq_fwd"},
    "fusedattn_small_seq_bwd": {"cpu": "fa_cpu_small_seq_bwd", "CUDA": "fa_cuda_small_seq_bwd"},
}


def _register(targets) -> None:
    cuda = bool(lib.fa_built_with_cuda())
    for name, symbols in targets.items():
        for platform, symbol in symbols.items():
            if platform == "CUDA" and not cuda:
                continue
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)),
                                        platform=platform)


_register(TARGETS)


def validate(params: AttnParams) -> tuple[int, str]:
    buf = ctypes.create_string_buffer(1024)
    code = lib.fa_validate(ctypes.byref(params), buf, len(buf))
    return code, buf.value.decode()


class BackendChoice(typing.NamedTuple):
    """select_backend()'s answer: name serves the call (whose FFI handler runs it: "cpu_flash",
    "cudnn" or "cuda_flash" for the CUDA handler, "xla_reference" or "none"); forward and
    backward are the
    kernels that run (e.g. "hopper" and "cudnn"); status is validate()'s code."""
    name: str
    forward: str
    backward: str
    status: int
    reason: str


# BackendRequest's flags (attention/backend.h): the call's index_base must be honoured
# (a block's positions, or a shard's base with dropout or a score_mod); cuDNN's graph
# check rejected the call; float32 matmuls at float32 accuracy (the CUDA flash kernels'
# 3xTF32 instead of TF32: jax's matmul precision asked for it); the bias is a folded
# boolean mask holding masked_bias_value at the keys it drops (the CPU engine drops them
# and skips the key tiles they fill; the other kernels add it as any bias).
REQUEST_INDEX_BASE = 1
REQUEST_CUDNN_REJECTED = 2
REQUEST_F32_EXACT = 4
REQUEST_MASK_BIAS = 8
REQUEST_NO_DBIAS = 16
REQUEST_SCORE_MOD_GRADS = 32
# One dropout mask for every batch entry and head (fused_attn's dropout_broadcast, Flax's
# broadcast_dropout): the CPU engine and the CUDA flash kernels; cuDNN declines it.
REQUEST_DROPOUT_BROADCAST = 64
# A bitwise repeatable backward (determinism.py; backend.h's kRequestDeterministic).
REQUEST_DETERMINISTIC = 128
# jax.nn.dot_product_attention's rows that keep nothing: the average of all values
# (backend.h's kRequestAverageEmptyRows)
REQUEST_AVERAGE_EMPTY_ROWS = 256
# With REQUEST_MASK_BIAS: the bias operand is the boolean mask itself (a mask alone, no
# values; backend.h's kRequestMaskKeepOnly): the engine folds it where a kernel adds a
# bias's values; the Hopper kernels classify its bytes (head dim 64's backward: 128-query
# blocks).
REQUEST_MASK_KEEP_ONLY = 512


def backend_choice(params: AttnParams, platform: int, device: int = 0, score_mod=None,
                   want_max_logit: bool = False, flags: int = 0) -> BackendChoice:
    """The engine's select_backend(); a CUDA query reads the capabilities of CUDA device
    `device` (and the cuDNN the process can load). score_mod: the packed program
    attribute of a flex-attention call (or None); flags: REQUEST_* bits."""
    forward, backward, status = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    buf = ctypes.create_string_buffer(1024)
    ptr, n = _int32_array(score_mod)
    backend = lib.fa_select_backend(ctypes.byref(params), platform, device, ptr, n,
                                    int(want_max_logit), int(flags), ctypes.byref(forward),
                                    ctypes.byref(backward), ctypes.byref(status), buf, len(buf))
    name = lambda code: lib.fa_backend_name(code).decode()
    return BackendChoice(name(backend), name(forward.value), name(backward.value), status.value,
                         buf.value.decode())


def select_backend(params: AttnParams, platform: int, device: int = 0, score_mod=None,
                   want_max_logit: bool = False, flags: int = 0) -> tuple[str, int, str]:
    """(backend name, validate status code, reason) of backend_choice()."""
    c = backend_choice(params, platform, device, score_mod, want_max_logit, flags)
    return c.name, c.status, c.reason


def _int32_array(words):
    """(pointer, length) of an int32 sequence for the C API; (None, 0) for None."""
    if words is None:
        return None, 0
    arr = (ctypes.c_int32 * len(words))(*[int(w) for w in words])
    return arr, len(words)


def cudnn_check(params: AttnParams, device: int, want_lse: bool, want_max_logit: bool,
                backward: bool, score_mod=None, flags: int = 0) -> tuple[int, str]:
    """Builds (once; the graph cache keeps it) the cuDNN graph that will serve the call:
    (status code, message). The last word on whether cuDNN supports a configuration.
    score_mod: the packed program attribute of a flex-attention call (or None); flags:
    REQUEST_* bits (REQUEST_DETERMINISTIC: the deterministic backward graph)."""
    buf = ctypes.create_string_buffer(2048)
    ptr, n = _int32_array(score_mod)
    code = lib.fa_cudnn_check(ctypes.byref(params), device, int(want_lse), int(want_max_logit),
                              int(backward), int(flags), ptr, n, buf, len(buf))
    return code, buf.value.decode()


def softmax_validate(params: SoftmaxParams) -> tuple[int, str]:
    buf = ctypes.create_string_buffer(1024)
    code = lib.fa_softmax_validate(ctypes.byref(params), buf, len(buf))
    return code, buf.value.decode()


def softmax_kernel_available(params: SoftmaxParams, platform: int) -> tuple[bool, int, str]:
    """Returns (our kernel serves it, validate status code, reason)."""
    status = ctypes.c_int(0)
    buf = ctypes.create_string_buffer(1024)
    ok = lib.fa_softmax_kernel_available(ctypes.byref(params), platform, ctypes.byref(status),
                                         buf, len(buf))
    return bool(ok), status.value, buf.value.decode()


def small_seq_validate(params: SmallSeqParams) -> tuple[int, str]:
    buf = ctypes.create_string_buffer(1024)
    code = lib.fa_small_seq_validate(ctypes.byref(params), buf, len(buf))
    return code, buf.value.decode()


def small_seq_eligible(params: SmallSeqParams, platform: int) -> tuple[bool, str]:
    """Returns (the small-seq backend serves it, reason)."""
    status = ctypes.c_int(0)
    buf = ctypes.create_string_buffer(1024)
    served = lib.fa_small_seq_eligible(ctypes.byref(params), platform, ctypes.byref(status), buf,
                                       len(buf))
    return bool(served), buf.value.decode()


def cuda_attn_workspace_bytes(params: AttnParams, device: int, want_lse: bool,
                              want_max_logit: bool, backward: bool, score_mod=None,
                              flags: int = 0) -> int:
    """Bytes of the CUDA attention handler's workspace result (builds the graph if needed;
    flags: the call's REQUEST_* bits)."""
    n = ctypes.c_int64(0)
    buf = ctypes.create_string_buffer(2048)
    ptr, count = _int32_array(score_mod)
    code = lib.fa_cuda_attn_workspace_bytes(ctypes.byref(params), device, int(want_lse),
                                            int(want_max_logit), int(backward), int(flags),
                                            ptr, count,
                                            ctypes.byref(n), buf, len(buf))
    if code != STATUS_OK:
        raise RuntimeError(f"fusedattn: CUDA workspace query failed: {buf.value.decode()}")
    return int(n.value)


def cudnn_graphs_built() -> int:
    """cuDNN graphs built so far in this process (each distinct configuration once)."""
    return int(lib.fa_cudnn_graphs_built())


def hopper_fwd_launches() -> int:
    """Launches of the Hopper flash forward (cuda/hopper) so far in this process."""
    return int(lib.fa_hopper_fwd_launches())


def hopper_bwd_launches() -> int:
    """Calls of the Hopper flash backward (cuda/hopper) so far in this process."""
    return int(lib.fa_hopper_bwd_launches())


_HOPPER_MODES = {"off": 0, "always": 1, "measured": 2, None: -1}


def set_hopper_fwd(mode) -> None:
    """Which calls the Hopper flash forward takes in this process from now on: "off",
    "always" (every call it can run), "measured" (plain calls where hopper/measured.h found
    it faster than cuDNN; its score_mods always), or None (FUSEDATTN_HOPPER_FWD's choice).
    Decided when a call runs, so compiled functions follow it too."""
    if mode not in _HOPPER_MODES:
        raise ValueError(f"mode: got {mode!r}; allowed 'off', 'always', 'measured' or None")
    lib.fa_set_hopper_fwd(_HOPPER_MODES[mode])


def set_hopper_bwd(mode) -> None:
    """set_hopper_fwd for the Hopper flash backward: "off", "always", "measured" (plain
    calls where hopper/measured_bwd.h found it faster than cuDNN's backward; dense masks
    always) or None (FUSEDATTN_HOPPER_BWD's choice)."""
    if mode not in _HOPPER_MODES:
        raise ValueError(f"mode: got {mode!r}; allowed 'off', 'always', 'measured' or None")
    lib.fa_set_hopper_bwd(_HOPPER_MODES[mode])


def version() -> str:
    return lib.fa_version().decode()


def built_with_cuda() -> bool:
    return bool(lib.fa_built_with_cuda())


def set_num_threads(n: int) -> None:
    """Threads of the CPU engine (n < 1: one per hardware thread)."""
    lib.fa_set_num_threads(int(n))


def num_threads() -> int:
    return int(lib.fa_num_threads())


def request_flag(name: str) -> int:
    """The engine's REQUEST_* bit of a name ("mask_bias", ...; backend.h's kRequest*), -1 for
    an unknown name: what the REQUEST_* constants here must equal."""
    return int(lib.fa_request_flag(name.encode()))


def masked_bias_value(dtype_name: str) -> float:
    """The bias a folded boolean mask puts at the keys it drops, for an engine dtype
    ("float32", "bfloat16", "float16", "float64"): exact in that dtype, finite
    (REQUEST_MASK_BIAS)."""
    return float(lib.fa_masked_bias_value(ATTN_DTYPE_CODES[dtype_name]))
