"""Backend queries (get_backend, is_fused_attn_kernel_available) and which backend a call
really gets: the CPU FFI kernels here, XLA's reference on a GPU (tests marked gpu)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import DTYPES, descriptor, qkv, reference_f32
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType, _gpu_route, _lib

B, S, H, D = 2, 16, 2, 16


def shapes(hq=H, hkv=H, dtype=jnp.float32, d=D):
    return (jax.ShapeDtypeStruct((B, S, hq, d), dtype), jax.ShapeDtypeStruct((B, S, hkv, d), dtype),
            jax.ShapeDtypeStruct((B, S, hkv, d), dtype))


def available(platform="cpu", **overrides):
    args = dict(is_training=True, q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16,
                qkv_layout=QKVLayout.BSHD_BSHD_BSHD, attn_bias_type=AttnBiasType.NO_BIAS,
                attn_mask_type=AttnMaskType.CAUSAL_MASK, softmax_type=SoftmaxType.VANILLA_SOFTMAX,
                dropout_probability=0.0, q_num_heads=4, kv_num_heads=1, q_max_seqlen=128,
                kv_max_seqlen=256, head_dim_qk=128, head_dim_v=128)
    args.update(overrides)
    return fusedattn.is_fused_attn_kernel_available(**args, platform=platform)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("mask", list(AttnMaskType), ids=lambda m: m.name)
def test_valid_cpu_calls_get_cpu_flash(mask, dtype):
    sd = descriptor([S, 3], [S, 0]) if mask.is_padding() else None
    info = fusedattn.get_backend(shapes(hq=4, hkv=1, dtype=dtype), None, sd,
                                 attn_mask_type=mask, platform="cpu")
    assert (info.name, info.fused) == ("cpu_flash", True), info
    assert "cpu_flash" in info.reason


def _gpu_name():
    """What a float32 GPU call gets: the CUDA flash kernels with a CUDA build and a GPU."""
    return "cuda_flash" if _lib.built_with_cuda() and _gpu_route._has_gpu() else "xla_reference"


def test_default_platform_is_jax_default_backend():
    expected = {"cpu": "cpu_flash", "gpu": _gpu_name()}[jax.default_backend()]
    assert fusedattn.get_backend(shapes()).name == expected


def test_get_backend_takes_arrays(key):
    info = fusedattn.get_backend(qkv(key, B, S, S, H, H, D), platform="cpu")
    assert (info.name, info.fused) == ("cpu_flash", True)


@pytest.mark.parametrize("platform", ["gpu", "cuda"])
def test_gpu_platform_gets_cuda_flash_or_the_reference(platform):
    info = fusedattn.get_backend(shapes(), platform=platform)
    assert (info.name, info.fused) == (_gpu_name(), _gpu_name() == "cuda_flash"), info
    assert _gpu_name() in info.reason


@pytest.mark.parametrize("kwargs, why", [
    (dict(qkv=shapes(hq=3, hkv=2)), "multiple"),
    (dict(qkv=shapes(d=600)), "head dim of q and k"),
    (dict(qkv=shapes(dtype=jnp.int32)), "dtype"),
    (dict(attn_mask_type=AttnMaskType.PADDING_MASK), "sequence_descriptor"),
    (dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS), "attn_bias_type=POST_SCALE_BIAS"),
    (dict(softmax_type=SoftmaxType.LEARNABLE_SOFTMAX), "softmax_offset"),
    (dict(dropout_probability=0.2, is_training=True, seed=None), "seed"),
    (dict(window_size=(-4, 0)), "window_size"),
    (dict(qkv_layout=QKVLayout.THD_THD_THD), "qkv_layout=THD_THD_THD"),
    (dict(max_segments_per_seq=0), "max_segments_per_seq"),
], ids=lambda x: x if isinstance(x, str) else None)
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_bad_calls_get_none_with_the_reason(kwargs, why, platform):
    kwargs = dict(kwargs)
    qkv_ = kwargs.pop("qkv", shapes())
    info = fusedattn.get_backend(qkv_, platform=platform, **kwargs)
    assert (info.name, info.fused) == ("none", False), info
    assert why in info.reason, info.reason


# ---------------------------------------------------------------------------
# Forward and backward kernels: the engine's select_backend() names both (on an H100 a
# softcap / ALiBi call runs forward "hopper", backward "cudnn": test_backend.cc).


@pytest.mark.parametrize("training", [False, True])
def test_cpu_runs_cpu_flash_forward_and_backward(training):
    info = fusedattn.get_backend(shapes(), platform="cpu", is_training=training)
    assert (info.name, info.forward, info.backward) == ("cpu_flash",) * 3, info


def test_cpu_score_mod_runs_cpu_flash_forward_and_backward():
    softcap = lambda s, b, h, q, kv: jnp.tanh(s / 30.0) * 30.0
    info = fusedattn.get_backend(shapes(dtype=jnp.bfloat16, d=128), platform="cpu",
                                 attn_mask_type=AttnMaskType.CAUSAL_MASK, score_mod=softcap,
                                 is_training=True)
    assert (info.name, info.forward, info.backward) == ("cpu_flash",) * 3, info


def test_gpu_query_names_one_kernel_both_ways():
    info = fusedattn.get_backend(shapes(), platform="gpu")
    assert (info.forward, info.backward) == (_gpu_name(), _gpu_name()), info


def test_bad_call_names_no_kernel():
    info = fusedattn.get_backend(shapes(hq=3, hkv=2), platform="cpu")
    assert (info.name, info.forward, info.backward) == ("none",) * 3, info


def test_backend_info_kernels_default_to_its_name():
    info = fusedattn.BackendInfo("small_seq", True, "why")
    assert (info.forward, info.backward) == ("small_seq", "small_seq")
    info = fusedattn.BackendInfo("cudnn", True, "why", "hopper", "cudnn")
    assert (info.name, info.forward, info.backward) == ("cudnn", "hopper", "cudnn")


def test_engine_choice_names_both_kernels():
    from fusedattn import _lib
    params = _lib.AttnParams(
        batch=B, seqlen_q=S, seqlen_kv=S, heads_q=H, heads_kv=H, head_dim_qk=D, head_dim_v=D,
        window_left=-1, window_right=-1, dtype=_lib.DTYPE_CODES["bfloat16"],
        layout=int(QKVLayout.BSHD_BSHD_BSHD), mask_type=int(AttnMaskType.CAUSAL_MASK),
        bias_type=int(AttnBiasType.NO_BIAS), softmax_type=int(SoftmaxType.VANILLA_SOFTMAX),
        is_training=1, scale=0.25, dropout=0.0, max_segments=1, num_slices=1)
    c = _lib.backend_choice(params, _lib.PLATFORM_CPU)
    assert (c.name, c.forward, c.backward, c.status) == ("cpu_flash",) * 3 + (_lib.STATUS_OK,)
    assert _lib.select_backend(params, _lib.PLATFORM_CPU) == (c.name, c.status, c.reason)
    # A score_mod program reaches the engine; one it cannot decode is an error.
    c = _lib.backend_choice(params, _lib.PLATFORM_CPU, score_mod=[7, 7, 7])
    assert (c.name, c.forward, c.backward) == ("none",) * 3, c
    assert c.status == _lib.STATUS_INVALID and "score_mod" in c.reason, c.reason


def test_unknown_platform_is_an_error():
    with pytest.raises(ValueError, match="platform='tpu'"):
        fusedattn.get_backend(shapes(), platform="tpu")


def test_kernel_available():
    assert available() is True
    # float32 on a GPU: the CUDA flash kernels (with a CUDA build and a device).
    assert available(platform=None) is (jax.default_backend() == "cpu"
                                        or _gpu_name() == "cuda_flash")
    assert available(attn_mask_type=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK) is True
    assert available(q_dtype=jnp.float32, kv_dtype=jnp.float32, head_dim_qk=256,
                     head_dim_v=32) is True
    assert available(attn_bias_type=AttnBiasType.PRE_SCALE_BIAS) is True
    assert available(softmax_type=SoftmaxType.LEARNABLE_SOFTMAX, window_size=(16, 0)) is True
    assert available(dropout_probability=0.1) is True
    assert available(qkv_layout=QKVLayout.THD_T2HD,
                     attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK) is True


def test_every_feature_gets_cpu_flash():
    q = jax.ShapeDtypeStruct((B, S, 4, D), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((B, S, 2, 2, D), jnp.bfloat16)
    sd = fusedattn.SequenceDescriptor.from_seqlens(jnp.array([[5, 3, 8], [16, 0, 0]]))
    info = fusedattn.get_backend(
        (q, kv), jax.ShapeDtypeStruct((1, 4, S, S), jnp.bfloat16), sd, 1,
        attn_bias_type=AttnBiasType.POST_SCALE_BIAS, qkv_layout=QKVLayout.THD_T2HD,
        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK, max_segments_per_seq=3,
        softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
        softmax_offset=jax.ShapeDtypeStruct((4,), jnp.float32), dropout_probability=0.1,
        is_training=True, window_size=(4, 0), platform="cpu")
    assert (info.name, info.fused) == ("cpu_flash", True), info


def test_kernel_available_on_the_gpu_with_cuda_flash():
    assert available(platform="gpu") is (_gpu_name() == "cuda_flash")


@pytest.mark.parametrize("overrides", [
    dict(kv_dtype=jnp.float16),
    dict(q_num_heads=3, kv_num_heads=2),
    dict(head_dim_qk=600),
    dict(q_max_seqlen=2 ** 20 + 1),
    dict(window_size=(-16, 0)),
    dict(qkv_layout=QKVLayout.BS3HD),  # q and kv lengths and heads differ: cannot be packed
    dict(qkv_layout=QKVLayout.THD_THD_THD),  # THD needs a padding mask
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_kernel_not_available(overrides):
    assert available(**overrides) is False


def test_cpu_calls_run_the_ffi_kernels(key):
    # The program lowered for the CPU calls the engine, forward and backward, rather than
    # the reference.
    q, k, v = qkv(key, B, S, S, H, H, D)
    f = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None)
    lower = lambda g: jax.jit(g).trace(q, k, v).lower(lowering_platforms=("cpu",)).as_text()
    assert "fusedattn_attn_fwd" in lower(f)
    text = lower(jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2)))
    assert "fusedattn_attn_fwd" in text and "fusedattn_attn_bwd" in text


def test_no_fallback_warning_on_cpu(key):
    if jax.default_backend() != "cpu":
        pytest.skip("the fallback warning follows jax.default_backend(), which is not cpu")
    q, k, v = qkv(key, B, S, S, H, H, D)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.eval_shape(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None), q, k, v)


# ---------------------------------------------------------------------------
# On a GPU this build computes the reference through XLA (and says so once).


@pytest.mark.gpu
def test_gpu_default_backend_is_cuda_flash_for_float32():
    info = fusedattn.get_backend(shapes())
    assert (info.name, info.fused) == ("cuda_flash", True), info


@pytest.mark.gpu
@pytest.mark.parametrize("mask", [AttnMaskType.CAUSAL_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK],
                         ids=lambda m: m.name)
def test_gpu_fallback_matches_the_reference(key, mask):
    q, k, v = qkv(key, B, 70, 90, 4, 2, 64)
    lens = ([0, 70], [90, 33]) if mask.is_padding() else (None, None)
    sd = descriptor(*lens) if mask.is_padding() else None
    dout = jax.random.normal(jax.random.fold_in(key, 1), (B, 70, 4, 64))
    # float32 at float32 accuracy (3xTF32; jax's default would be TF32, as XLA's own).
    with warnings.catch_warnings(record=True), jax.default_matmul_precision("highest"):
        warnings.simplefilter("always")
        f = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask)
        out, vjp = jax.vjp(f, q, k, v)
        grads = vjp(dout)  # the backward is traced here too
    ref, ref_vjp = jax.vjp(lambda q, k, v: reference_f32(q, k, v, mask, *lens)[0], q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, ref_vjp(dout)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_gpu_float32_runs_fused_without_a_warning(key):
    q, k, v = qkv(key, B, 8, 8, 2, 2, 16)
    fusedattn.attention._warned.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        jax.block_until_ready(fusedattn.fused_attn((q, k, v), None, None, None))
    assert not [w for w in seen if "xla_reference" in str(w.message)], seen


# ---------------------------------------------------------------------------
# The XLA fallback (platform_dependent's default=, what a GPU runs today) on the CPU: forced
# here so every feature's fallback forward and backward is checked without a GPU.

FALLBACK_SPECS = {
    "bs3hd-causal": dict(layout=QKVLayout.BS3HD, mask=AttnMaskType.CAUSAL_MASK, Hkv=4),
    "bs2hd-window": dict(layout=QKVLayout.BSHD_BS2HD, mask=AttnMaskType.CAUSAL_MASK,
                         window=(9, 0)),
    "thd-t2hd-sink-dropout": dict(layout=QKVLayout.THD_T2HD, M=3,
                                  mask=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
                                  softmax=SoftmaxType.LEARNABLE_SOFTMAX, dropout=0.2),
    "t3hd": dict(layout=QKVLayout.T3HD, mask=AttnMaskType.PADDING_MASK, Hkv=4, M=3),
    "bias-off-by-one": dict(mask=AttnMaskType.CAUSAL_MASK, bias_shape=(2, 1, 48, 48),
                            bias_type=AttnBiasType.PRE_SCALE_BIAS,
                            softmax=SoftmaxType.OFF_BY_ONE_SOFTMAX),
}


@pytest.mark.parametrize("name", FALLBACK_SPECS)
def test_fallback_serves_every_feature(key, name, monkeypatch):
    from features import Spec, check
    monkeypatch.setattr(jax.lax, "platform_dependent",
                        lambda *args, cpu, cuda, default: default(*args))
    spec = dict(FALLBACK_SPECS[name])
    if spec.get("M", 1) > 1:
        spec["sd"] = fusedattn.SequenceDescriptor.from_seqlens(
            (jnp.array([[20, 0, 28], [1, 40, 7]]), jnp.array([[10, 30, 8], [48, 0, 0]])))
    r = check(key, Spec(Sq=48, Skv=48, **spec))
    q, k, v = qkv(key, B, 48, 48, 4, 2, 32)
    lowered = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None)).lower(
        q, k, v).as_text()
    assert "fusedattn_attn_fwd" not in lowered, "the fallback must not call the engine"
    assert r is not None


def test_float64_names_the_engine_on_the_cpu():
    with jax.enable_x64(True):
        info = fusedattn.get_backend(shapes(dtype=jnp.float64), platform="cpu")
    assert (info.name, info.fused) == ("cpu_flash", True) and "float64" in info.reason


def test_float64_kernel_available_on_the_cpu_only():
    # The CPU engine computes float64 in double; no GPU kernel does (the GPU runs it as
    # float32).
    assert available(q_dtype=jnp.float64, kv_dtype=jnp.float64, platform="cpu") is True
    assert available(q_dtype=jnp.float64, kv_dtype=jnp.float64, platform="gpu") is False


@pytest.mark.parametrize("precision, exact", [
    (None, False), ("default", False), ("tensorfloat32", False), ("high", False),
    ("bfloat16", False), ("BF16_BF16_F32_X3", False), ("highest", True), ("float32", True),
    ("F32_F32_F32", True), ("TF32_TF32_F32_X3", True)])
def test_float32_matmul_precision_follows_jax(precision, exact):
    # The CUDA flash kernels multiply float32 as jax's matmul precision at trace time asks:
    # TF32 by default (XLA's own float32 matmuls on the GPU), 3xTF32 (float32 accuracy)
    # under "highest" / "float32"; 16-bit calls never carry the flag.
    with jax.default_matmul_precision(precision):
        assert bool(_gpu_route._precision_flag(jnp.float32) & _lib.REQUEST_F32_EXACT) == exact
        assert _gpu_route._precision_flag(jnp.bfloat16) == 0
        assert _gpu_route._precision_flag(jnp.float16) == 0


def test_set_hopper_fwd_takes_its_modes_only():
    """_lib.set_hopper_fwd: "off", "always", "measured" or None (the environment's); any
    other value is refused with the allowed ones named. (On the GPU,
    test_hopper_fwd_gpu.py checks which kernel each mode runs.)"""
    from fusedattn import _lib
    for mode in ("off", "always", "measured", None):
        _lib.set_hopper_fwd(mode)
    with pytest.raises(ValueError, match="allowed 'off', 'always', 'measured' or None"):
        _lib.set_hopper_fwd("on")
