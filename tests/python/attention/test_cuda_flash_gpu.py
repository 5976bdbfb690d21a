"""Issue 24: the generic CUDA flash attention ("cuda_flash") serves the GPU calls that cuDNN
and the Hopper forward decline, which used to run reference.py under XLA (materialized
[B, H, Sq, Skv] scores, backend "xla_reference").

Every configuration that used to fall back is run against the float32 reference on fresh
random inputs by features.check (out, softmax_aux, max_logit, dq, dk, dv, dbias,
d softmax_offset; FlashAttention's tolerance rule for bf16/fp16, NaN never passes), under
jax.default_matmul_precision("highest") so that the reference's float32 matmuls are not TF32
(the kernel then multiplies in 3xTF32: float32 accuracy, hence float32's bound x F32_SLACK;
at jax's default precision it multiplies in TF32, as XLA does: test_float32_default_is_tf32).
Each case first asserts which backend serves it (`served`), so a call that silently goes
elsewhere fails. Further: dropout's keep mask is reference.py's Philox rule exactly; a
shard with dropout (index_base) and blocks of a context-parallel call (index_base with
positions) match attention._reference on the same FFI operands; the compiled memory grows
linearly in S (no [.., S, S] array in the HLO); one long float32 sequence (-k large).

The checks are backend-agnostic: each test takes a platform, "gpu" (marked gpu: deselected
without one, expects "cuda_flash") or "cpu" (the CPU engine, "cpu_flash"), so a few of the
cases also run on the CPU in CI and exercise this file's logic there.
"""

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import assert_close, assert_lse_close, hopper_kernels, normal
from features import KV_PACKED, QKV_PACKED, Spec, check, fused_fn, inputs
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn import attention as attn_mod
from fusedattn._prepare import N_OPS, prepare
from fusedattn.reference import dropout_keep

F32, BF16, FP16 = jnp.float32, jnp.bfloat16, jnp.float16
# The backend each platform must report for every case of this file.
EXPECTED = {"gpu": "cuda_flash", "cpu": "cpu_flash"}
# float32 bound (conftest: 1e-5 x max(1, max |ref|)) times this: ~4e-5, room for 3xTF32
# (each product ~2^-22 relative) summed over a GQA group's rows into dk (measured on the
# H200, 2026-11-26: dk of pre_bias_1h_gqa 3.3e-5 at |ref| 1.53).
F32_SLACK = 4.0
CAUSAL = AttnMaskType.CAUSAL_MASK
PADDING = AttnMaskType.PADDING_MASK
PADDING_CAUSAL = AttnMaskType.PADDING_CAUSAL_MASK
BOTTOM_RIGHT = AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK
PADDING_BOTTOM_RIGHT = AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK
PRE, POST = AttnBiasType.PRE_SCALE_BIAS, AttnBiasType.POST_SCALE_BIAS
OFF_BY_ONE, LEARNABLE = SoftmaxType.OFF_BY_ONE_SOFTMAX, SoftmaxType.LEARNABLE_SOFTMAX


def _device(platform):
    return jax.devices("gpu" if platform == "gpu" else "cpu")[0]


def grid(cases, cpu):
    """(platform, name) params: every case on the GPU (marked gpu), the names in cpu on
    the CPU too."""
    return ([pytest.param("gpu", n, marks=pytest.mark.gpu, id=f"gpu-{n}") for n in cases]
            + [pytest.param("cpu", n, id=f"cpu-{n}") for n in cpu])


PLATFORMS = [pytest.param("gpu", marks=pytest.mark.gpu, id="gpu"), pytest.param("cpu", id="cpu")]


# ---------------------------------------------------------------------------
# Which backend serves a call, and what the compiled program holds


def backend_of(spec: Spec, platform: str, training=True) -> fusedattn.BackendInfo:
    """get_backend for spec's call (as features.fused_fn makes it) on platform."""
    s = spec
    q = jax.ShapeDtypeStruct((s.B, s.Sq, s.Hq, s.D), s.dtype)
    k = jax.ShapeDtypeStruct((s.B, s.Skv, s.Hkv, s.D), s.dtype)
    v = jax.ShapeDtypeStruct((s.B, s.Skv, s.Hkv, s.dv), s.dtype)
    if s.layout in QKV_PACKED:
        qkv = (jax.ShapeDtypeStruct((s.B, s.Sq, 3, s.Hq, s.D), s.dtype),)
    elif s.layout in KV_PACKED:
        qkv = (q, jax.ShapeDtypeStruct((s.B, s.Skv, 2, s.Hkv, s.D), s.dtype))
    else:
        qkv = (q, k, v)
    bias = None if s.bias_shape is None else jax.ShapeDtypeStruct(s.bias_shape, s.dtype)
    offset = None
    if s.softmax == LEARNABLE:
        offset = jax.ShapeDtypeStruct((1, s.Hq, 1, 1) if s.offset_4d else (s.Hq,), F32)
    return fusedattn.get_backend(
        qkv, bias, s.sd, s.seed, attn_bias_type=s.bias_type if bias else AttnBiasType.NO_BIAS,
        attn_mask_type=s.mask, qkv_layout=s.layout, softmax_type=s.softmax,
        scaling_factor=s.scale, dropout_probability=s.dropout, is_training=training,
        max_segments_per_seq=s.M, window_size=s.window, softmax_offset=offset,
        return_max_logit=s.max_logit, platform=platform)


def served(spec: Spec, platform: str, expected=None, training=True):
    """Asserts that expected (default: EXPECTED[platform]; a tuple: any of them) serves
    spec's call on platform, forward and (training) backward."""
    expected = EXPECTED[platform] if expected is None else expected
    names = expected if isinstance(expected, tuple) else (expected,)
    info = backend_of(spec, platform, training)
    assert info.name in names and info.fused, info
    assert info.forward == info.name and info.backward == info.name, info
    return info


def check_served(key, spec: Spec, platform: str, expected=None):
    """served, then features.check on platform's device (float32 matmuls exact)."""
    served(spec, platform, expected)
    slack = F32_SLACK if jnp.dtype(spec.dtype) == F32 else 1.0
    with jax.default_device(_device(platform)), jax.default_matmul_precision("highest"):
        return check(key, spec, slack=slack)


def compiled_text(fn, *args) -> str:
    """The optimized HLO of jit(fn) for args (arrays or ShapeDtypeStructs with a sharding)."""
    return jax.jit(fn).lower(*args).compile().as_text()


def custom_call_targets(hlo: str) -> set:
    return set(re.findall(r'custom_call_target="([^"]+)"', hlo))


def assert_fused(hlo: str, *directions):
    """The program calls the engine's FFI targets (fusedattn_attn_fwd[_sm][_cuda], ...) for
    each direction ("fwd", "bwd"): no reference fallback in it."""
    targets = custom_call_targets(hlo)
    for d in directions:
        assert any(t.startswith(f"fusedattn_attn_{d}") for t in targets), (d, targets)


def sds(shape, dtype, platform):
    return jax.ShapeDtypeStruct(shape, dtype,
                                sharding=jax.sharding.SingleDeviceSharding(_device(platform)))


# ---------------------------------------------------------------------------
# Descriptors


def lens(q, kv):
    return SequenceDescriptor.from_seqlens((jnp.array(q, jnp.int32), jnp.array(kv, jnp.int32)))


def thd_descriptor():
    """B = 2 packed rows of 96 tokens, up to 4 segments each (empty ones too); the kv
    segments of row 0 start past the q ones (offsets of their own)."""
    return SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.array([[20, 0, 1, 40], [96, 0, 0, 0]]), jnp.array([[25, 3, 1, 0], [60, 10, 0, 0]])),
        (jnp.array([[0, 25, 25, 30, 70], [0, 96, 96, 96, 96]]),
         jnp.array([[5, 35, 38, 39, 39], [0, 60, 70, 70, 70]])))


def thd(**kw):
    return Spec(**{**dict(layout=QKVLayout.THD_THD_THD, mask=PADDING_CAUSAL, Sq=96, Skv=96,
                          Hq=4, Hkv=2, D=64, sd=thd_descriptor(), M=4), **kw})


def bshd(**kw):
    return Spec(**{**dict(Sq=256, Skv=256, Hq=4, Hkv=4, D=64), **kw})


# ---------------------------------------------------------------------------
# float32: every call of this dtype fell back (cuDNN computes in bf16/fp16 only)

F32_CASES = {
    "no_mask": bshd(),
    "odd_sizes": bshd(Sq=131, Skv=197, Hq=2, Hkv=2, D=36, scale=0.3),
    "causal": bshd(mask=CAUSAL),
    "causal_sq_lt_skv": bshd(mask=CAUSAL, Sq=128, Skv=320),
    "padding": bshd(mask=PADDING, Sq=192, Skv=256, sd=lens([150, 77], [0, 201])),
    "padding_causal": bshd(mask=PADDING_CAUSAL, Sq=192, Skv=256, sd=lens([192, 100], [256, 31])),
    "thd_segments": thd(),
    "thd_padding": thd(mask=PADDING),
    "t3hd_bottom_right": thd(layout=QKVLayout.T3HD, mask=PADDING_BOTTOM_RIGHT, Hkv=4),
    "thd_t2hd_window": thd(layout=QKVLayout.THD_T2HD, window=(8, 0)),
    "bs3hd_causal": bshd(layout=QKVLayout.BS3HD, mask=CAUSAL, Sq=192, Skv=192),
    "sliding_window": bshd(window=(48, 16)),
    "causal_window": bshd(mask=CAUSAL, window=(64, 0)),
    "bottom_right_sq_gt_skv": bshd(mask=BOTTOM_RIGHT, Sq=256, Skv=160),
    "bottom_right_window_sq_gt_skv": bshd(mask=BOTTOM_RIGHT, Sq=256, Skv=128, window=(32, 0)),
    "padding_bottom_right_sq_gt_skv": bshd(mask=PADDING_BOTTOM_RIGHT, Sq=256, Skv=160,
                                           sd=lens([256, 200], [160, 50])),
    "gqa": bshd(mask=CAUSAL, Hq=8, Hkv=2),
    "mqa_padding": bshd(mask=PADDING, Sq=128, Skv=192, Hq=4, Hkv=1,
                        sd=lens([128, 60], [100, 192])),
    "off_by_one": bshd(mask=CAUSAL, Sq=192, Skv=192, softmax=OFF_BY_ONE),
    "learnable": bshd(Sq=160, Skv=224, softmax=LEARNABLE),
    "learnable_4d_gqa_padding": bshd(mask=PADDING_CAUSAL, Hq=8, Hkv=2, softmax=LEARNABLE,
                                     offset_4d=True, sd=lens([256, 90], [256, 130])),
    "post_bias": bshd(mask=CAUSAL, bias_shape=(2, 4, 256, 256), bias_type=POST),
    "post_bias_1h": bshd(bias_shape=(1, 4, 256, 256), bias_type=POST),
    "post_bias_b1": bshd(Sq=192, bias_shape=(2, 1, 192, 256), bias_type=POST),
    "pre_bias": bshd(mask=CAUSAL, bias_shape=(2, 4, 256, 256), bias_type=PRE),
    "pre_bias_1h_gqa": bshd(Hq=8, Hkv=2, bias_shape=(1, 8, 256, 256), bias_type=PRE),
    "pre_bias_b1_padding": bshd(mask=PADDING, Sq=160, Skv=224, bias_shape=(2, 1, 160, 224),
                                bias_type=PRE, sd=lens([160, 3], [0, 177])),
    "pre_bias_11_sink": bshd(bias_shape=(1, 1, 256, 256), bias_type=PRE, softmax=LEARNABLE),
    "dropout": bshd(mask=CAUSAL, dropout=0.2, seed=1234),
    "dropout_gqa_bias_window": bshd(Hq=8, Hkv=2, dropout=0.1, seed=77, window=(40, 40),
                                    bias_shape=(1, 8, 256, 256), bias_type=POST),
    "dropout_thd": thd(dropout=0.25, seed=5),
    "thd_bias_sink_dropout": thd(bias_shape=(1, 4, 96, 96), bias_type=PRE, softmax=LEARNABLE,
                                 dropout=0.1, seed=9, window=(16, 0)),
}
F32_CASES.update({
    # head dims 65-128 (float32 there: the backward's half-tile buffer, BwdSmem's HALF)
    "d128_causal_partial_dropout": bshd(mask=CAUSAL, Sq=200, Skv=200, D=128, dropout=0.1, seed=3),
    "d128_pre_bias_gqa_padding": bshd(mask=PADDING, Sq=160, Skv=224, Hq=4, Hkv=2, D=128,
                                      bias_shape=(2, 4, 160, 224), bias_type=PRE,
                                      sd=lens([150, 77], [0, 201])),
    "d96_window_sq_ne_skv": bshd(Sq=192, Skv=256, D=96, window=(48, 16)),
    # head dims past 128 (flash_mma_bwd_wide.cu: head-dim chunks of 32 for float32)
    "d256_causal_gqa_dropout": bshd(mask=CAUSAL, Sq=192, Skv=192, Hq=4, Hkv=2, D=256,
                                    dropout=0.1, seed=4),
    "d384_dv128_post_bias": bshd(Sq=160, Skv=192, D=384, Dv=128, bias_shape=(1, 4, 160, 192),
                                 bias_type=POST),
    # the wide forward with the query tile held whole (q/k head dims up to 256 in float32):
    # 256-column output chunks; q/k's two chunks of 32 (the wait for V after a key tile)
    "d256_causal_gqa": bshd(mask=CAUSAL, Sq=200, Skv=200, Hq=4, Hkv=2, D=256),
    "d64_dv192_window": bshd(Sq=200, Skv=264, D=64, Dv=192, window=(96, 40)),
})
F32_ON_CPU = ["causal", "thd_segments", "learnable", "pre_bias_b1_padding", "dropout"]


@pytest.mark.parametrize("platform, name", grid(F32_CASES, F32_ON_CPU))
def test_float32_against_reference(key, platform, name):
    check_served(key, F32_CASES[name], platform)


# ---------------------------------------------------------------------------
# bf16 / fp16: the calls cuDNN declines (head dims not a multiple of 8 or past 256,
# PRE_SCALE_BIAS, THD with a bias, bottom-right masks and windows with Sq > Skv, a sink
# with max_logit). name -> (spec, the GPU backends accepted: cuDNN may serve some)

LOWP_CASES = {
    "d100_causal": (bshd(dtype=BF16, mask=CAUSAL, Sq=192, Skv=192, Hkv=2, D=100),
                    ("cudnn", "cuda_flash")),  # zero-padded to 104: cuDNN serves it
    "d36_padding": (bshd(dtype=BF16, mask=PADDING, Sq=160, Skv=224, D=36,
                         sd=lens([160, 41], [224, 97])), ("cudnn", "cuda_flash")),
    "d384": (bshd(dtype=BF16, Sq=128, Skv=160, Hq=2, Hkv=2, D=384), None),
    "d512_causal_gqa": (bshd(dtype=BF16, mask=CAUSAL, Sq=128, Skv=128, Hq=2, Hkv=1, D=512),
                        None),
    "d192_dv128": (bshd(dtype=BF16, mask=CAUSAL, Sq=128, Skv=128, Hkv=2, D=192, Dv=128),
                   ("cudnn", "cuda_flash")),
    "d320_dv200": (bshd(dtype=BF16, Sq=128, Skv=128, Hq=2, Hkv=2, D=320, Dv=200), None),
    "d72_dv36": (bshd(dtype=BF16, mask=CAUSAL, Sq=128, Skv=192, D=72, Dv=36),
                 ("cudnn", "cuda_flash")),
    # head dims past 128: flash_mma_bwd_wide.cu (output chunks of 128 columns; the first
    # chunk's block alone adds dbias; q/k and v dims apart, one of them past the other's chunks)
    "d256_pre_bias_dropout_padding": (bshd(dtype=BF16, mask=PADDING_CAUSAL, Sq=192, Skv=224, D=256,
                                           bias_shape=(2, 4, 192, 224), bias_type=PRE,
                                           dropout=0.1, seed=11, sd=lens([192, 70], [224, 150])),
                                      None),
    "d160_dv288_bottom_right_gqa": (bshd(dtype=BF16, mask=BOTTOM_RIGHT, Sq=200, Skv=136, Hq=4,
                                         Hkv=2, D=160, Dv=288), None),
    "fp16_d512_thd_window_sink": (thd(dtype=FP16, D=512, Dv=256, window=(16, 0),
                                      softmax=LEARNABLE), None),
    # q/k in one head-dim chunk of 64, v past 256 (the wide forward waits for V per key tile)
    "d64_dv320_causal": (bshd(dtype=BF16, mask=CAUSAL, Sq=200, Skv=264, D=64, Dv=320), None),
    # the wide forward's 128-column chunks where v's head dim is 128 (256 elsewhere)
    "d192_dv128_pre_bias_gqa": (bshd(dtype=BF16, mask=CAUSAL, Sq=160, Skv=192, Hq=4, Hkv=2, D=192, Dv=128,
                                     bias_shape=(1, 4, 160, 192), bias_type=PRE), None),
    "pre_bias": (bshd(dtype=BF16, mask=CAUSAL, bias_shape=(2, 4, 256, 256), bias_type=PRE),
                 None),
    "pre_bias_1h_d128": (bshd(dtype=BF16, Sq=192, D=128, bias_shape=(1, 4, 192, 256),
                              bias_type=PRE), None),
    "thd_bias": (thd(dtype=BF16, bias_shape=(1, 4, 96, 96), bias_type=POST), None),
    "thd_pre_bias_b1": (thd(dtype=BF16, mask=PADDING, bias_shape=(2, 1, 96, 96),
                            bias_type=PRE), None),
    "bottom_right_window_sq_gt_skv": (bshd(dtype=BF16, mask=BOTTOM_RIGHT, Sq=256, Skv=128,
                                           window=(32, 0)), None),
    "bottom_right_sq_gt_skv_gqa": (bshd(dtype=BF16, mask=BOTTOM_RIGHT, Sq=256, Skv=160, Hq=8,
                                        Hkv=2), None),
    "sink_max_logit": (bshd(dtype=BF16, mask=CAUSAL, softmax=LEARNABLE), None),
    "fp16_d100_pre_bias": (bshd(dtype=FP16, Sq=128, Skv=192, D=100, bias_shape=(2, 4, 128, 192),
                                bias_type=PRE), None),
    "fp16_thd_bias_dropout": (thd(dtype=FP16, bias_shape=(1, 4, 96, 96), bias_type=POST,
                                  dropout=0.2, seed=3), None),
}
LOWP_ON_CPU = ["d100_causal", "thd_bias", "bottom_right_window_sq_gt_skv"]


@pytest.mark.parametrize("platform, name", grid(LOWP_CASES, LOWP_ON_CPU))
def test_low_precision_against_reference(key, platform, name):
    """(On the GPU with the Hopper kernels off: by default they take the forward and backward
    of some of these calls, a pre-scale bias's among them; test_hopper_*_gpu.py tests them.)"""
    spec, gpu_names = LOWP_CASES[name]
    if platform != "gpu":
        check_served(key, spec, platform)
        return
    with hopper_kernels("off"):
        check_served(key, spec, platform, gpu_names)


# ---------------------------------------------------------------------------
# Dropout: reference.py's Philox rule exactly, forward and backward


@pytest.mark.parametrize("platform", PLATFORMS)
def test_dropout_keep_mask_is_the_reference_rule(key, platform):
    # V = identity (Dv = Skv): each output row is its dropped, rescaled probabilities.
    B, S, H, p = 2, 128, 4, 0.3
    seed = jnp.array([7, 99], jnp.uint32)
    spec = Spec(B=B, Sq=S, Skv=S, Hq=H, Hkv=H, D=32, Dv=S, dropout=p, seed=seed,
                max_logit=False)
    served(spec, platform)
    with jax.default_device(_device(platform)), jax.default_matmul_precision("highest"):
        kq, kk = jax.random.split(key)
        q, k = normal(kq, (B, S, H, 32)), normal(kk, (B, S, H, 32))
        v = jnp.broadcast_to(jnp.eye(S)[None, :, None, :], (B, S, H, S))
        f = jax.jit(lambda q, k, p: fusedattn.fused_attn(
            (q, k, v), None, None, seed, dropout_probability=p, is_training=True),
            static_argnums=2)
        dropped, plain = np.asarray(f(q, k, p)), np.asarray(f(q, k, 0.0))
        again = np.asarray(f(q, k, p))  # at the same matmul precision
    keep = dropped.transpose(0, 2, 1, 3) != 0
    np.testing.assert_array_equal(keep, np.asarray(dropout_keep(seed, p, B, H, S, S)))
    kept = dropped != 0
    assert (plain > 0).all(), "every probability is positive, so 0 means dropped"
    np.testing.assert_allclose(dropped[kept], plain[kept] / (1 - p), rtol=2e-5)
    np.testing.assert_array_equal(again, dropped)  # a fixed seed reproduces


@pytest.mark.parametrize("platform", PLATFORMS)
def test_dropout_backward_drops_what_the_forward_dropped(key, platform):
    # d out / d v[j] = sum_i P~_ij dout_i: with dout = 1 on one query row i and 0 elsewhere,
    # dv's rows are P~_ij, the forward's dropped probabilities (out's row i with V = I).
    B, S, H, p, row = 1, 128, 2, 0.4, 77
    seed = 2024
    # float32 accuracy (3xTF32 on the GPU): the forward's and the backward's recomputed
    # probabilities agree to float32 rounding (in TF32 they would to TF32's).
    with jax.default_device(_device(platform)), jax.default_matmul_precision("highest"):
        kq, kk = jax.random.split(key)
        q, k = normal(kq, (B, S, H, 32)), normal(kk, (B, S, H, 32))
        v = jnp.broadcast_to(jnp.eye(S)[None, :, None, :], (B, S, H, S))
        dout = jnp.zeros((B, S, H, S)).at[:, row].set(1.0)
        attn = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, seed,
                                                    dropout_probability=p, is_training=True)
        out, dv = jax.jit(lambda q, k, v: (attn(q, k, v), jax.grad(
            lambda v: jnp.sum(attn(q, k, v) * dout))(v)))(q, k, v)
    fwd = np.asarray(out)[0, row]                       # [H, S]: P~[row, :] per head
    bwd = np.asarray(dv)[0, :, :, 0].T                  # [H, S]: dv[j, h, d] = P~[row, j]
    np.testing.assert_array_equal(fwd != 0, bwd != 0)
    np.testing.assert_allclose(bwd, fwd, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_broadcast_dropout_is_the_reference_rule(key, platform):
    """dropout_broadcast (one mask for every batch entry and head): bf16, a call cuDNN would
    serve without it, runs the CUDA flash kernels on the GPU; the keep mask (V = identity)
    is reference.py's broadcast mask, and the backward drops what the forward dropped."""
    B, S, H, p, row = 2, 128, 4, 0.3, 45
    seed = jnp.array([5, 17], jnp.uint32)
    qkv = (jax.ShapeDtypeStruct((B, S, H, 32), jnp.bfloat16),) * 2 + (
        jax.ShapeDtypeStruct((B, S, H, S), jnp.bfloat16),)
    info = fusedattn.get_backend(qkv, platform=platform, dropout_probability=p, is_training=True,
                                 dropout_broadcast=True)
    assert info.name == EXPECTED[platform] and info.backward == info.name, info
    with jax.default_device(_device(platform)):
        kq, kk = jax.random.split(key)
        q = normal(kq, (B, S, H, 32)).astype(jnp.bfloat16)
        k = normal(kk, (B, S, H, 32)).astype(jnp.bfloat16)
        v = jnp.broadcast_to(jnp.eye(S, dtype=jnp.bfloat16)[None, :, None, :], (B, S, H, S))
        dout = jnp.zeros((B, S, H, S), jnp.bfloat16).at[:, row].set(1.0)
        attn = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, seed,
                                                    dropout_probability=p, is_training=True,
                                                    dropout_broadcast=True)
        out, dv = jax.jit(lambda q, k, v: (attn(q, k, v), jax.grad(
            lambda v: jnp.sum(attn(q, k, v).astype(jnp.float32) * dout))(v)))(q, k, v)
    keep = np.asarray(out).transpose(0, 2, 1, 3) != 0
    np.testing.assert_array_equal(keep, np.asarray(dropout_keep(seed, p, B, H, S, S, broadcast=True)))
    fwd = np.asarray(out.astype(jnp.float32))[:, row]          # [B, H, S]: P~[row, :]
    bwd = np.asarray(dv.astype(jnp.float32))[:, :, :, 0].transpose(0, 2, 1)  # dv[b, j, h, 0]
    np.testing.assert_array_equal(fwd != 0, bwd != 0)


# ---------------------------------------------------------------------------
# index_base: a shard with dropout, blocks of a context-parallel call. attention._reference
# on the same FFI operands is the spec (what the GPU ran before issue 24).

SB, SS, SHQ, SHKV, SD = 4, 96, 4, 2, 32


def _call(q, k, v, p, mask=CAUSAL, window=None, sd=None, seed=1234):
    return prepare((q, k, v), None, sd, seed if p else None, attn_bias_type=AttnBiasType.NO_BIAS,
                   attn_mask_type=mask, qkv_layout=QKVLayout.BSHD_BSHD_BSHD,
                   softmax_type=SoftmaxType.VANILLA_SOFTMAX, scaling_factor=None,
                   dropout_probability=p, is_training=True, max_segments_per_seq=1,
                   window_size=window, softmax_offset=None)


def _with_base(ops, base):
    return (*ops[:N_OPS - 1], base, *ops[N_OPS:])


def _fused_and_reference(cfg, dims, ops, dout, platform):
    """(out, lse) and the backward's (dq, dk, dv) given the fused out and lse, by the
    engine (one program, asserted to call its FFI targets) and by attention._reference."""
    cfg = dataclasses.replace(cfg, want_lse=True)

    def fused(*ops):
        out, lse, _ = attn_mod._attention((cfg, dims, None), False, *ops)
        grads = attn_mod._BWD((cfg, dims, None, "bwd"), *ops, out, dout, lse)
        return out, lse, grads[:3]

    def reference(*ops):
        out, lse, _ = attn_mod._reference(*ops, cfg=cfg, dims=dims)
        return out, lse

    def reference_bwd(out, lse, *ops):
        return attn_mod._bwd_reference(*ops, out, dout, lse, cfg=cfg, dims=dims)[:3]

    with jax.default_device(_device(platform)), jax.default_matmul_precision("highest"):
        args = [sds(x.shape, x.dtype, platform) for x in ops]
        assert_fused(compiled_text(fused, *args), "fwd", "bwd")
        out, lse, grads = jax.jit(fused)(*ops)
        r_out, r_lse = jax.jit(reference)(*ops)
        r_grads = jax.jit(reference_bwd)(out, lse, *ops)
    assert_close("out", out, r_out, slack=F32_SLACK)
    assert_lse_close("lse", lse, r_lse)
    for name, g, rg in zip(("dq", "dk", "dv"), grads, r_grads):
        assert_close(name, g, rg, slack=F32_SLACK)
    return out


@pytest.mark.parametrize("platform", PLATFORMS)
def test_shard_with_dropout_takes_its_index_base(key, platform):
    kq, kk, kv, kd = jax.random.split(key, 4)
    b0, nb, h0, nh = 1, 2, 2, 2
    q = normal(kq, (nb, SS, nh, SD))
    k, v = normal(kk, (nb, SS, nh // 2, SD)), normal(kv, (nb, SS, nh // 2, SD))
    dout = normal(kd, (nb, SS, nh, SD))
    call = _call(q, k, v, 0.3)
    base = _with_base(call.operands, jnp.array([b0, h0], jnp.int32))
    out = _fused_and_reference(call.cfg, call.dims, base, dout, platform)
    # Without its base the shard draws another mask (the test is not vacuous).
    with jax.default_device(_device(platform)):
        local = jax.jit(lambda *o: attn_mod._attention((call.cfg, call.dims, None), False,
                                                       *o)[0])(*call.operands)
    assert np.max(np.abs(np.asarray(local - out))) > 1e-3


BQ, BKV = 160, 224  # the whole call's sequence lengths
BLOCK_CASES = {
    "causal": (CAUSAL, None, None, 0.0),
    "bottom_right": (BOTTOM_RIGHT, None, None, 0.0),
    "padding_bottom_right_window": (PADDING_BOTTOM_RIGHT, (30, 0), ([120, 160], [200, 224]), 0.0),
    "window_dropout": (AttnMaskType.NO_MASK, (40, 40), None, 0.2),
}


# A block's sequence_descriptor holds the whole call's lengths (longer than the block):
# prepare warns that it clamps them to the block's buffers.
@pytest.mark.filterwarnings("ignore:fused_attn. sequence_descriptor")
@pytest.mark.parametrize("case", BLOCK_CASES)
@pytest.mark.parametrize("platform", PLATFORMS)
def test_context_parallel_block(key, platform, case):
    # The block q [64, 160) x kv [96, 224) of a [160 x 224] call (index_base: batch and
    # head base 0, q_pos, kv_pos and the whole call's extents).
    mask, window, seqlens, p = BLOCK_CASES[case]
    q0, q1, kv0, kv1 = 64, 160, 96, 224
    kq, kk, kv, kd = jax.random.split(key, 4)
    q = normal(kq, (2, q1 - q0, SHQ, SD))
    k, v = normal(kk, (2, kv1 - kv0, SHKV, SD)), normal(kv, (2, kv1 - kv0, SHKV, SD))
    dout = normal(kd, (2, q1 - q0, SHQ, SD))
    call = _call(q, k, v, p, mask, window, None if seqlens is None else lens(*seqlens))
    base = jnp.array([0, 0, q0, kv0, BQ, BKV], jnp.int32)
    _fused_and_reference(call.cfg, call.dims, _with_base(call.operands, base), dout, platform)


# ---------------------------------------------------------------------------
# O(S) memory: the compiled forward and backward hold no [S, S] array


def _memory(platform, S, grad, B=1, H=4, D=64):
    def fwd(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=CAUSAL)

    def fwd_bwd(q, k, v, dout):
        return jax.grad(lambda q, k, v: jnp.sum(fwd(q, k, v) * dout), argnums=(0, 1, 2))(q, k, v)

    shape = sds((B, S, H, D), F32, platform)
    compiled = jax.jit(fwd_bwd if grad else fwd).lower(
        *([shape] * (4 if grad else 3))).compile()
    return compiled.memory_analysis().temp_size_in_bytes, compiled.as_text()


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_memory_is_linear_in_the_sequence(platform, grad):
    H, D = 4, 64
    temps = {}
    for S in (2048, 4096, 8192):
        temps[S], hlo = _memory(platform, S, grad, H=H, D=D)
        assert_fused(hlo, "fwd", *(("bwd",) if grad else ()))
        square = re.findall(rf"f32\[[0-9,]*{S},{S}\]", hlo)
        assert not square, f"S = {S}: an [.., S, S] array in the program: {square[:3]}"
    S = 8192
    assert temps[8192] <= 2.5 * max(temps[4096], 1 << 20), temps
    assert temps[8192] < 64 * S * H * D * 4, temps  # the scores alone: S * S * H * 4 = 1 GiB


@pytest.mark.parametrize("platform, S", [pytest.param("gpu", 65536, marks=pytest.mark.gpu,
                                                      id="gpu-65536"),
                                         pytest.param("cpu", 4096, id="cpu-4096")])
def test_large_float32_causal_forward(key, platform, S):
    # B 1, H 2, D 64: the first and last 64 query rows against the reference on those rows
    # and every key (top-left causal: row i keeps keys <= i).
    H, D = 2, 64
    spec = Spec(Sq=S, Skv=S, Hq=H, Hkv=H, D=D, B=1, mask=CAUSAL, max_logit=False)
    served(spec, platform, training=False)
    with jax.default_device(_device(platform)), jax.default_matmul_precision("highest"):
        kq, kk, kv = jax.random.split(key, 3)
        q, k, v = (normal(kk_, (1, S, H, D)) for kk_ in (kq, kk, kv))
        out, aux = jax.jit(lambda q, k, v: fusedattn.fused_attn(
            (q, k, v), None, None, None, attn_mask_type=CAUSAL, return_aux=True))(q, k, v)
        lse = aux["softmax_aux"][..., 0]

        @jax.jit
        def rows_ref(qr, k, v, first):
            s = jnp.einsum("qhd,khd->hqk", qr, k) * D ** -0.5
            i = first + jnp.arange(qr.shape[0])
            s = jnp.where(jnp.arange(S)[None, None, :] <= i[None, :, None], s, -jnp.inf)
            r_lse = jax.nn.logsumexp(s, axis=-1)
            return jnp.einsum("hqk,khd->qhd", jnp.exp(s - r_lse[..., None]), v), r_lse

        for first in (0, S - 64):
            rows = slice(first, first + 64)
            r_out, r_lse = rows_ref(q[0, rows], k[0], v[0], first)
            assert_close(f"out[{first}:+64]", out[0, rows], r_out, slack=F32_SLACK)
            assert_lse_close(f"lse[{first}:+64]", lse[0, :, rows], r_lse)


# TF32 at jax's default precision: the plain instance of the backward (causal, window;
# partial tiles, GQA, head dim 128's one buffer) and the general element step (a bias,
# padding rows) on inputs rounded to TF32 once a call (flash.cu's round_inputs_tf32), and
# the wide kernels (head dims above 128).
TF32_CASES = {
    "causal": Spec(Sq=512, Skv=512, Hq=4, Hkv=4, D=64, mask=CAUSAL, max_logit=False),
    "causal-gqa-d128-partial": Spec(Sq=500, Skv=500, Hq=4, Hkv=2, D=128, B=1, mask=CAUSAL, max_logit=False),
    "window": Spec(Sq=384, Skv=384, Hq=2, Hkv=2, D=64, mask=CAUSAL, window=(96, 0), max_logit=False),
    "bias-full": Spec(Sq=320, Skv=256, Hq=2, Hkv=1, D=64, bias_shape=(1, 2, 320, 256), max_logit=False),
    "padding": Spec(Sq=200, Skv=200, Hq=2, Hkv=2, D=64, B=2, mask=PADDING_CAUSAL, max_logit=True,
                    sd=lens([200, 77], [200, 77])),
    # head dims above 128: the wide kernels (chunked head dims), TF32 per fragment
    "wide-d192-gqa": Spec(Sq=320, Skv=320, Hq=4, Hkv=2, D=192, B=1, mask=CAUSAL, max_logit=False),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(TF32_CASES))
def test_float32_default_is_tf32(key, name):
    # At jax's default matmul precision the kernels multiply float32 in TF32 (as XLA's own
    # float32 matmuls on the GPU): within TF32's error of the exact result, and not the
    # 3xTF32 result that "highest" gives (so the request reaches the kernel).
    spec = TF32_CASES[name]
    served(spec, "gpu", training=True)
    q, k, v, bias, offset, dout = inputs(key, spec)
    f = fused_fn(spec)

    def run():
        out = jax.jit(lambda q, k, v, b: f(q, k, v, b, offset)[0])(q, k, v, bias)
        grads = jax.jit(jax.grad(lambda q, k, v, b: jnp.sum(f(q, k, v, b, offset)[0] * dout),
                                 argnums=(0, 1, 2)))(q, k, v, bias)
        return [np.asarray(x) for x in (out, *grads)]

    with jax.default_device(_device("gpu")):
        fast = run()
        with jax.default_matmul_precision("highest"):
            exact = run()
    for nm, a, b in zip(("out", "dq", "dk", "dv"), fast, exact):
        assert not np.isnan(a).any() and not np.isnan(b).any(), nm
        scale = max(1.0, float(np.max(np.abs(b))))
        err = float(np.max(np.abs(a - b))) / scale
        assert err < 2e-2, (nm, err)  # TF32: 10-bit mantissas
        assert err > 1e-6, (nm, err)  # not the 3xTF32 result


# sm_80's shared memory a block may opt into (163 KiB): the kernels an A100 runs where an H100
# has more (the float32 wide backward's 128-column chunks, the forward's 128-column ones).
SM80_SMEM = 166912
SM80_DIMS = ("d128", "d192", "d256", "d384")  # the case names' head dims


@pytest.mark.gpu
def test_sm80_shared_memory():
    """This file's float32 cases at head dims 128 and above (the kernels whose shared memory
    passes sm_80's: the forward at 128 and the wide kernels) again in a process whose CUDA
    flash kernels pick their variants as on an sm_80 (FUSEDATTN_CUDA_SMEM_LIMIT, options.h)."""
    root = pathlib.Path(__file__).resolve().parents[3]
    env = dict(os.environ, FUSEDATTN_CUDA_SMEM_LIMIT=str(SM80_SMEM))
    r = subprocess.run([sys.executable, "-m", "pytest", str(pathlib.Path(__file__).resolve()), "-q",
                        "-p", "no:cacheprovider", "-m", "gpu", "-k", f"test_float32 and ({' or '.join(SM80_DIMS)})"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    tail = (r.stdout + r.stderr)[-4000:]
    assert r.returncode == 0, tail
    passed = re.search(r"(\d+) passed", r.stdout)
    want = sum(any(d in n for d in SM80_DIMS) for n in [*F32_CASES, *TF32_CASES])
    assert want >= 6 and passed and int(passed.group(1)) == want, tail
