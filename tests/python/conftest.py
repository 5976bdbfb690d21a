"""Shared helpers of the fusedattn test suite: inputs, references, tolerances, the gpu marker.

Shapes follow the library: q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv],
out [B, Sq, Hq, Dv], lse [B, Hq, Sq] f32.

Tolerance (FlashAttention's rule): in float32 the fused result must match the float32
reference to ~1e-5 relative. In bfloat16/float16 the inputs are first rounded to that
dtype; the fused result's error against the float32 reference of those rounded inputs
must stay within `multiple` times the error of the same reference computed in that low
precision (reference_lowp), plus a small floor. NaN never passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import zlib

# The multi-device tests (tests/python/sharding) run on 8 virtual CPU devices: the flag must
# be set before jax starts. Single-device tests run on device 0 as before.
_FLAGS = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _FLAGS:
    os.environ["XLA_FLAGS"] = (_FLAGS + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, SequenceDescriptor, SoftmaxType
from fusedattn.reference import dropout_keep, segment_mask

# Tests are grouped by op (tests/python/<op>/); the op folders' helper modules
# (features, small_seq_cases, softmax_helpers) import from any folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _op in ("attention", "score_mod", "small_seq", "softmax"):
    if os.path.join(_HERE, _op) not in sys.path:
        sys.path.insert(0, os.path.join(_HERE, _op))

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
ALL_MASKS = list(AttnMaskType)
PADDING_MASKS = [m for m in AttnMaskType if m.is_padding()]


# ---------------------------------------------------------------------------
# The gpu marker, the device, the engine's thread count


def _has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


_GPU_REASON = "marked gpu and jax sees no GPU here (scripts/gpu_test.sh runs them on a GPU machine)"


def pytest_collection_modifyitems(config, items):
    """Without a GPU the gpu-marked tests are deselected, not skipped one by one: the run's
    last lines say how many and why (pytest_terminal_summary), instead of a skip per test."""
    if _has_gpu():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
        config._fusedattn_gpu_deselected = len(gpu)


def pytest_report_header(config):
    return "gpu-marked tests: " + ("run (jax sees a GPU)" if _has_gpu() else
                                   "deselected: " + _GPU_REASON)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = getattr(config, "_fusedattn_gpu_deselected", 0)
    if n:
        terminalreporter.write_line(f"{n} gpu tests deselected: {_GPU_REASON}")


@pytest.fixture(autouse=True)
def _cpu_device_unless_marked_gpu(request):
    """Tests of the CPU engine run on the CPU device, also on a host that has a GPU."""
    if request.node.get_closest_marker("gpu") is not None:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def set_threads():
    """fusedattn.set_num_threads for one test; the default (one per hardware thread) after."""
    yield fusedattn.set_num_threads
    fusedattn.set_num_threads(0)


# ---------------------------------------------------------------------------
# Inputs


@pytest.fixture
def key(request):
    """A PRNG key of its own for every test (reproducible: derived from the test id)."""
    return jax.random.PRNGKey(zlib.crc32(request.node.nodeid.encode()))


@contextlib.contextmanager
def hopper_kernels(mode):
    """The Hopper forward and backward set to mode ("off", "always") for the block, then back
    to the default (for tests whose subject is another kernel that serves the same call)."""
    from fusedattn import _lib
    _lib.set_hopper_fwd(mode)
    _lib.set_hopper_bwd(mode)
    try:
        yield
    finally:
        _lib.set_hopper_fwd(None)
        _lib.set_hopper_bwd(None)


def normal(key, shape, dtype=jnp.float32):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def qkv(key, B, Sq, Skv, Hq, Hkv, D, Dv=None, dtype=jnp.float32):
    """Unit-normal q, k, v: with the default scale 1/sqrt(D) the logits are O(1)."""
    kq, kk, kv = jax.random.split(key, 3)
    Dv = D if Dv is None else Dv
    return (normal(kq, (B, Sq, Hq, D), dtype), normal(kk, (B, Skv, Hkv, D), dtype),
            normal(kv, (B, Skv, Hkv, Dv), dtype))


def descriptor(q_lens, kv_lens) -> SequenceDescriptor:
    return SequenceDescriptor.from_seqlens((jnp.asarray(q_lens, jnp.int32),
                                            jnp.asarray(kv_lens, jnp.int32)))


# Ragged lengths for B = 2, as functions of (Sq, Skv): 0, 1, full and in-between.
LENS_PATTERNS = {
    "q0_full": lambda sq, skv: ([0, sq], [skv, skv]),
    "kv0": lambda sq, skv: ([sq, max(sq // 2, 1)], [0, skv]),
    "ones": lambda sq, skv: ([1, sq], [skv, 1]),
    "ragged": lambda sq, skv: ([sq // 2 + 1, max(sq - 1, 1)], [max(skv - 7, 1), skv // 3 + 1]),
    "q_longer": lambda sq, skv: ([sq, max(sq - 2, 1)], [max(min(skv, sq) // 2, 1), 2]),
}


# ---------------------------------------------------------------------------
# References


def reference_f32(q, k, v, mask_type=AttnMaskType.NO_MASK, q_lens=None, kv_lens=None,
                  scale=None, **features):
    """attention_reference of the inputs upcast to float32: (out, lse, max_logit [B, Hq]).
    features: attention_reference's other keywords (offsets, thd, window_size, bias, ...)."""
    f32 = lambda x: x.astype(jnp.float32)
    if features.get("bias") is not None:
        features = dict(features, bias=f32(features["bias"]))
    return fusedattn.attention_reference(f32(q), f32(k), f32(v), attn_mask_type=mask_type,
                                         scaling_factor=scale, q_seqlens=q_lens,
                                         kv_seqlens=kv_lens, **features)


def reference_lowp(q, k, v, mask_type=AttnMaskType.NO_MASK, q_lens=None, kv_lens=None,
                   scale=None, *, q_offsets=None, kv_offsets=None, thd=False, window_size=None,
                   bias=None, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                   softmax_type=SoftmaxType.VANILLA_SOFTMAX, softmax_offset=None,
                   dropout_probability=0.0, seed=None):
    """out [B, Sq, Hq, Dv] by the reference's math in q.dtype: the two matmuls (and the
    bias add) round to q.dtype, the softmax runs in float32 and its (dropped) probabilities
    round to q.dtype (like FlashAttention's `upcast=False` baseline). Differentiable;
    fully masked rows give 0."""
    dt = q.dtype
    B, Sq, Hq, D = q.shape
    _, Skv, Hkv, _ = k.shape
    g = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q.reshape(B, Sq, Hkv, g, D), k,
                   preferred_element_type=dt).reshape(B, Hq, Sq, Skv)
    if bias is not None and AttnBiasType(attn_bias_type) == AttnBiasType.PRE_SCALE_BIAS:
        s = (s + bias.astype(dt)) * jnp.asarray(scale, dt)
    else:
        s = s * jnp.asarray(scale, dt)
        if bias is not None:
            s = s + bias.astype(dt)
    s = s.astype(jnp.float32)
    keep, _ = segment_mask(mask_type, B, Sq, Skv, q_lens, kv_lens, q_offsets, kv_offsets, thd,
                           window_size)
    keep = keep[:, None]
    m = jnp.max(jnp.where(keep, s, -jnp.inf), axis=-1, keepdims=True)
    sink = None
    if SoftmaxType(softmax_type) != SoftmaxType.VANILLA_SOFTMAX:
        sink = (jnp.zeros((Hq,)) if SoftmaxType(softmax_type) == SoftmaxType.OFF_BY_ONE_SOFTMAX
                else jnp.asarray(softmax_offset, jnp.float32).reshape(Hq))[None, :, None, None]
        m = jnp.maximum(m, jax.lax.stop_gradient(sink))
    # As reference.py: NaN and +inf (a +inf sink) pass, and a +inf sink's exp is 1.
    m = jax.lax.stop_gradient(jnp.where(m == -jnp.inf, 0.0, m))
    p = jnp.where(keep, jnp.exp(jnp.where(keep, s, 0.0) - m), 0.0)
    l = jnp.sum(p, axis=-1, keepdims=True)
    if sink is not None:
        l = l + jnp.exp(jnp.where(sink == jnp.inf, 0.0, sink - m))
    p = jnp.where(keep, p / jnp.where(l == 0, 1.0, l), 0.0)
    if dropout_probability > 0:
        z = dropout_keep(seed, dropout_probability, B, Hq, Sq, Skv)
        p = jnp.where(z, p / (1.0 - jnp.float32(dropout_probability)), 0.0)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(dt).reshape(B, Hkv, g, Sq, Skv), v,
                     preferred_element_type=dt).reshape(B, Sq, Hq, -1)
    # As reference.py: a row that keeps no key is 0 whatever v holds (no 0 * inf).
    return jnp.where((~keep[:, 0].any(axis=-1))[:, :, None, None], jnp.zeros((), dt), out)


def stored_out_grads(out, lse, dout, dtype, lse_fn, args, argnums):
    """The part of a flash backward's gradients that comes from its stored output.

    Every flash backward (the CPU engine's bwd.cc row_deltas, FlashAttention 2/3, cuDNN)
    forms dS = P * (Z * dP - delta) with delta_i = rowsum(dO_i * O_i) of the output the
    forward stored, rounded to dtype: O is all it keeps. The exact delta is sum_j P dP
    of the unrounded O. The difference, d_i = rowsum(dO_i * (round(O_i) - O_i)), is of size
    |dO| |O| eps/2, and it adds -P_ij d_i to dS_ij: the gradient of -sum_i d_i lse_i (with
    d held constant, since d lse_i / d s_ij = P_ij; the same for bias and the sink, none
    for v). On rows where dS cancels (a dominant or single kept key: dP_j ~ delta) that
    term is far above the cancelled result itself, and reference_lowp's autodiff (its
    float32 softmax VJP forms sum_j P dP) has no counterpart of it, so its error is no
    measure of it. This computes it exactly from the float32 reference: out [B, Sq, Hq, Dv]
    and lse [B, Hq, Sq] of lse_fn(*args) (both float32), dout the cotangent. Returns the
    gradients w.r.t. args[argnums] (zeros in float32: nothing is rounded)."""
    f32 = jnp.float32
    rounded = out.astype(dtype).astype(f32)
    d = jnp.sum(dout.astype(f32) * (rounded - out), axis=-1)  # [B, Sq, Hq]
    d = jax.lax.stop_gradient(jnp.swapaxes(d, 1, 2))

    def term(*a):
        lse = lse_fn(*a)
        return -jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * d)  # padding rows: none

    return jax.grad(term, argnums=argnums)(*args)


def fused(q, k, v, mask_type=AttnMaskType.NO_MASK, q_lens=None, kv_lens=None, scale=None,
          **kwargs):
    sd = None if q_lens is None else descriptor(q_lens, kv_lens)
    return fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask_type,
                                scaling_factor=scale, **kwargs)


def loss_fn(attn, dout):
    """(q, k, v) -> sum(attn(q, k, v) * dout) in float32: dout is the output cotangent."""
    def loss(q, k, v):
        return jnp.sum(attn(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
    return loss


# ---------------------------------------------------------------------------
# Tolerances


@dataclasses.dataclass(frozen=True)
class Tolerance:
    multiple: float  # of the low-precision reference's error (0: not used)
    floor: float     # times max(1, max |reference|)


def tolerance(dtype) -> Tolerance:
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return Tolerance(multiple=0.0, floor=1e-5)
    # The floor (a quarter of a unit roundoff) only matters where the baseline error is ~0,
    # e.g. rows that keep a single key, whose output is that key's v in both computations.
    return Tolerance(multiple=2.0, floor=float(jnp.finfo(dtype).eps) / 8)


def _max_abs(x) -> float:
    return float(np.max(np.abs(x))) if x.size else 0.0


def assert_close(name, got, ref, lowp=None, *, dtype=None, slack=1.0, stored_out=None):
    """got vs the float32 reference ref; lowp (needed for bf16/fp16) is reference_lowp's.
    slack multiplies the bound (for reductions whose order the kernels choose).
    stored_out (gradients): stored_out_grads' term of this gradient, the flash backward's
    own deviation from the exact gradient (delta from the dtype output); its max |.| is
    added to the bound once, unmultiplied: it is computed, not estimated."""
    dtype = jnp.dtype(got.dtype if dtype is None else dtype)
    got = np.asarray(jnp.asarray(got, jnp.float32))
    ref = np.asarray(jnp.asarray(ref, jnp.float32))
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, expected {ref.shape}"
    assert not np.isnan(got).any(), f"{name}: {int(np.isnan(got).sum())} NaN values"
    assert np.isfinite(ref).all(), f"{name}: the reference is not finite (a test bug)"
    tol = tolerance(dtype)
    err = _max_abs(got - ref)
    bound = tol.floor * max(1.0, _max_abs(ref))
    baseline = 0.0
    if tol.multiple:
        assert lowp is not None, f"{name}: {dtype.name} needs the low-precision reference"
        baseline = _max_abs(np.asarray(jnp.asarray(lowp, jnp.float32)) - ref)
        bound += tol.multiple * baseline
    bound *= slack
    inherent = 0.0
    if stored_out is not None:
        inherent = _max_abs(np.asarray(jnp.asarray(stored_out, jnp.float32)))
        bound += inherent
    where = np.unravel_index(np.argmax(np.abs(got - ref)), got.shape) if got.size else ()
    assert err <= bound, (f"{name} ({dtype.name}): max |err| {err:.3g} at {where} > bound "
                          f"{bound:.3g} (low-precision baseline {baseline:.3g}, "
                          f"stored-output term {inherent:.3g}, max |ref| {_max_abs(ref):.3g})")


def assert_lse_close(name, got, ref):
    """lse-like f32 arrays: -inf exactly where the reference has -inf, close elsewhere."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, expected {ref.shape}"
    assert got.dtype == np.float32, f"{name}: dtype {got.dtype}, expected float32"
    assert not np.isnan(got).any(), f"{name}: NaN values"
    ninf = np.isneginf(ref)
    np.testing.assert_array_equal(np.isneginf(got), ninf, err_msg=f"{name}: -inf pattern")
    assert np.isfinite(got[~ninf]).all(), f"{name}: inf where the reference is finite"
    assert_close(name, got[~ninf], ref[~ninf], dtype=jnp.float32)


def kept(mask_type, B, Sq, Skv, q_lens=None, kv_lens=None):
    """bool [B, Sq, Skv]: key j is kept by query row i (the padding/causal rule, in numpy)."""
    mask_type = AttnMaskType(mask_type)
    if mask_type.is_padding():
        q_len = np.clip(np.asarray(q_lens).reshape(B), 0, Sq)[:, None, None]
        kv_len = np.clip(np.asarray(kv_lens).reshape(B), 0, Skv)[:, None, None]
    else:
        q_len, kv_len = np.full((B, 1, 1), Sq), np.full((B, 1, 1), Skv)
    i = np.arange(Sq)[None, :, None]
    j = np.arange(Skv)[None, None, :]
    keep = (i < q_len) & (j < kv_len)
    if mask_type.is_causal():
        keep &= j <= i + (kv_len - q_len if mask_type.is_bottom_right() else 0)
    return keep


def padded_rows(mask_type, B, Sq, Skv, q_lens=None, kv_lens=None):
    """bool [B, Sq]: query rows that keep no key (output 0, lse -inf, dq 0)."""
    return ~kept(mask_type, B, Sq, Skv, q_lens, kv_lens).any(axis=2)


def unused_keys(mask_type, B, Sq, Skv, q_lens=None, kv_lens=None):
    """bool [B, Skv]: keys no query row keeps (dk 0, dv 0)."""
    return ~kept(mask_type, B, Sq, Skv, q_lens, kv_lens).any(axis=1)


def pairwise(*axes):
    """Three axes (dtype, mask, case) -> the triples whose indices sum to an even number:
    half the full product, yet every pair of values of two axes meets (the third axis
    supplies an index of the needed parity, so each axis needs at least 2 values)."""
    (n0, a0), (n1, a1), (n2, a2) = [(len(a), list(a)) for a in axes]
    return [(a0[i], a1[j], a2[c]) for i in range(n0) for j in range(n1) for c in range(n2)
            if (i + j + c) % 2 == 0]
