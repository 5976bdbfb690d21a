"""float64 on the CPU (under jax_enable_x64): the fused engine in double, O(S) memory, against
reference.py in float64 at ~1e-12: out, lse, max_logit and the gradients of q, k, v, bias and
softmax_offset, over the feature set (masks, windows, padding, THD, GQA, bias pre and post,
dropout, sinks, head dim 384). A score_mod in float64 runs the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn._prepare import seed_words
from fusedattn.reference import attention_reference, nan_max

F64 = jnp.float64
RTOL = 1e-12
B, Sq, Skv, Hq, Hkv, D = 2, 70, 90, 4, 2, 24
LENS = (jnp.array([Sq, 33], jnp.int32), jnp.array([61, Skv], jnp.int32))
# THD rows [B, 80] with 3 segments each (gaps, an empty one)
THD_LENS = (jnp.array([[30, 0, 41], [12, 50, 9]], jnp.int32),
            jnp.array([[25, 3, 40], [20, 44, 16]], jnp.int32))
THD_OFFS = (jnp.array([[0, 32, 32, 73], [0, 12, 62, 71]], jnp.int32),
            jnp.array([[5, 30, 33, 73], [0, 20, 64, 80]], jnp.int32))


@pytest.fixture(autouse=True)
def _x64():
    # on the CPU engine also on a machine with a GPU (whose float64 runs as float32)
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        yield


def close(name, got, want, rtol=RTOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.dtype == want.dtype == np.float64
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite, err_msg=f"{name}: inf/NaN where")
    np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=name)
    scale = np.max(np.abs(want[finite]), initial=0.0)
    err = np.max(np.abs(got[finite] - want[finite]), initial=0.0)
    assert err <= rtol * max(scale, 1.0), f"{name}: max error {err:.3g} vs max |ref| {scale:.3g}"


# name -> fused_attn keywords (the reference takes the same, by reference.py's names)
CASES = {
    "plain": {},
    "causal_gqa": dict(attn_mask_type=AttnMaskType.CAUSAL_MASK),
    "padding_bottom_right": dict(attn_mask_type=AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
                                 lens=LENS),
    "window": dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, window_size=(9, 0)),
    "window_both_sides": dict(window_size=(5, 7)),
    "post_bias_sink": dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS, bias=(1, Hq),
                           softmax_type=SoftmaxType.LEARNABLE_SOFTMAX),
    "pre_bias_off_by_one": dict(attn_bias_type=AttnBiasType.PRE_SCALE_BIAS, bias=(B, 1),
                                softmax_type=SoftmaxType.OFF_BY_ONE_SOFTMAX,
                                attn_mask_type=AttnMaskType.PADDING_MASK, lens=LENS),
    "dropout": dict(dropout_probability=0.3, attn_mask_type=AttnMaskType.CAUSAL_MASK),
    "dropout_bias_sink": dict(dropout_probability=0.1, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                              bias=(B, Hq), softmax_type=SoftmaxType.LEARNABLE_SOFTMAX),
    "thd": dict(qkv_layout=QKVLayout.THD_THD_THD, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                thd=True),
    "thd_window_sink": dict(qkv_layout=QKVLayout.THD_THD_THD, attn_mask_type=AttnMaskType.PADDING_MASK,
                            window_size=(6, 4), softmax_type=SoftmaxType.LEARNABLE_SOFTMAX,
                            thd=True),
    "head_dim_384": dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, D=384, scale=0.07),
}


def run_case(key, case):
    case = dict(case)
    d = case.pop("D", D)
    sq, skv = (80, 80) if case.get("thd") else (Sq, Skv)
    thd = case.pop("thd", False)
    lens = case.pop("lens", None)
    bias_shape = case.pop("bias", None)
    scale = case.pop("scale", None)
    kq, kk, kv, kb, ko, kd = jax.random.split(key, 6)
    q, k, v = (normal(kq, (B, sq, Hq, d), F64), normal(kk, (B, skv, Hkv, d), F64),
               normal(kv, (B, skv, Hkv, d), F64))
    dout = normal(kd, (B, sq, Hq, d), F64)
    bias = None if bias_shape is None else normal(kb, (*bias_shape, sq, skv), F64)
    learnable = case.get("softmax_type") == SoftmaxType.LEARNABLE_SOFTMAX
    offset = normal(ko, (Hq,), F64) if learnable else None
    seq = {}
    if thd:
        sd = SequenceDescriptor.from_seqlens_and_offsets(THD_LENS, THD_OFFS)
        seq = dict(q_seqlens=THD_LENS[0], kv_seqlens=THD_LENS[1], q_offsets=THD_OFFS[0],
                   kv_offsets=THD_OFFS[1], thd=True)
        case["max_segments_per_seq"] = 3
    elif lens is not None:
        sd = SequenceDescriptor.from_seqlens(lens)
        seq = dict(q_seqlens=lens[0], kv_seqlens=lens[1])
    else:
        sd = None
    dropout = case.get("dropout_probability", 0.0)

    def fused(q, k, v, bias, offset):
        out, aux = fusedattn.fused_attn((q, k, v), bias, sd, 7, scaling_factor=scale,
                                        is_training=True, softmax_offset=offset,
                                        return_aux=True, return_max_logit=True, **case)
        lse = aux["softmax_aux"][..., 0]
        return out, (jnp.swapaxes(lse, 1, 2) if thd else lse), aux["max_logit"]

    ref_kw = {k_: v_ for k_, v_ in case.items() if k_ not in ("qkv_layout", "max_segments_per_seq")}
    if dropout:
        ref_kw["seed"] = seed_words(7)

    def reference(q, k, v, bias, offset):
        out, lse, max_logit = attention_reference(q, k, v, bias=bias, softmax_offset=offset,
                                                  scaling_factor=scale, **seq, **ref_kw)
        return out, lse, nan_max(max_logit, axis=0)

    got, want = jax.jit(fused)(q, k, v, bias, offset), reference(q, k, v, bias, offset)
    for name, g, w in zip(("out", "lse", "max_logit"), got, want):
        assert g.dtype == F64, name
        close(name, g, w)

    argnums = tuple(i for i, x in enumerate((q, k, v, bias, offset)) if x is not None)
    loss = lambda f: lambda *a: jnp.sum(f(*a)[0] * dout)
    g = jax.jit(jax.grad(loss(fused), argnums=argnums))(q, k, v, bias, offset)
    w = jax.grad(loss(reference), argnums=argnums)(q, k, v, bias, offset)
    for i, gi, wi in zip(argnums, g, w):
        assert gi.dtype == F64
        close(("dq", "dk", "dv", "dbias", "dsoftmax_offset")[i], gi, wi)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_float64_reference(key, name):
    run_case(key, CASES[name])


def test_float32_accuracy_would_fail(key):
    # The tolerance is tight enough that the float32 engine (the old float64 route on a
    # GPU: rounded to float32) cannot pass it.
    q, k, v = (normal(jax.random.fold_in(key, i), (B, Sq, Hq, D), F64) for i in range(3))
    got32 = fusedattn.fused_attn(tuple(x.astype(jnp.float32) for x in (q, k, v)), None, None, None)
    want = attention_reference(q, k, v)[0]
    with pytest.raises(AssertionError):
        close("out", got32.astype(F64), want)
    close("out", fusedattn.fused_attn((q, k, v), None, None, None), want)


def test_get_backend_names_the_engine():
    q = jax.ShapeDtypeStruct((B, Sq, Hq, D), F64)
    k = jax.ShapeDtypeStruct((B, Skv, Hkv, D), F64)
    info = fusedattn.get_backend((q, k, k), platform="cpu")
    assert (info.name, info.fused) == ("cpu_flash", True), info
    assert "double" in info.reason
    # The GPU runs float64 as float32: its answer is the float32 call's.
    assert fusedattn.get_backend((q, k, k), platform="gpu") == fusedattn.get_backend(
        tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, k)), platform="gpu")


def softcap(s, b, h, q_idx, kv_idx):
    return 30.0 * jnp.tanh(s / 30.0)


def test_score_mod_runs_the_reference(key):
    q, k, v = (normal(jax.random.fold_in(key, i), (B, Sq, Hkv, D), F64) for i in range(3))
    info = fusedattn.get_backend((q, k, v), score_mod=softcap, platform="cpu")
    assert (info.name, info.fused) == ("xla_reference", False), info
    assert "float64" in info.reason and "score_mod" in info.reason
    f = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=softcap)
    assert "fusedattn_attn_fwd" not in jax.jit(f).lower(q, k, v).as_text()
    want = attention_reference(q, k, v, score_mod=lambda s, *_: 30.0 * jnp.tanh(s / 30.0))[0]
    close("out", jax.jit(f)(q, k, v), want)


def compiled(S):
    q = jax.ShapeDtypeStruct((1, S, 2, 16), F64)
    f = lambda q, k, v: jnp.sum(fusedattn.fused_attn((q, k, v), None, None, None,
                                                     attn_mask_type=AttnMaskType.CAUSAL_MASK) ** 2)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2))).lower(q, q, q).compile()


def test_runs_the_engine_in_linear_memory():
    # The compiled program calls the engine forward and backward and holds no [S, S] scores:
    # XLA's temporaries grow with S, not S^2 (the reference's would).
    small, big = compiled(136), compiled(4 * 136)
    text = big.as_text()
    assert "fusedattn_attn_fwd" in text and "fusedattn_attn_bwd" in text
    assert "544,544]" not in text
    t_small = small.memory_analysis().temp_size_in_bytes
    t_big = big.memory_analysis().temp_size_in_bytes
    assert t_big < 8 * max(t_small, 1), (t_small, t_big)
    assert t_big < 544 * 544 * 8, t_big  # less than one head's scores
