"""score_mod (flex attention) on an NVIDIA GPU (pytest -m gpu; skipped without one): the
program runs inside the cuDNN graph (the compiled program must call the _sm_cuda targets,
not the reference), forward and gradients of q, k, v and the operands against the float32
reference with fn over the materialized scores, in bf16 and fp16, with padding, causal and
THD masks built inside the score_mod graph.

The CUDA flash kernels ("cuda_flash") run the program too, with its derivative and the
operands' gradients in-kernel: the calls cuDNN declines (a score_mod with a bias, a shard's
index_base) go there, and the tests below force every other case there as well (as if
cuDNN had rejected the graph), in bf16, fp16 and float32, head dims 64 and 256, THD,
masks and GQA; the compiled gradient holds no [S, S] array. (options.h's
FUSEDATTN_FLASH_SCORE_MOD=0 turns that path off: these tests then fail.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal, stored_out_grads
from fusedattn import AttnBiasType, AttnMaskType, _gpu_route, _lib, backends
from test_score_mod import (CASES, HQ, T, array_operands, causal, ref_call, softcap,
                            thd_call)

pytestmark = pytest.mark.gpu
S, D = 128, 64


def close(name, got, ref, tol=3e-2, inherent=0.0):
    """inherent: the flash backward's stored-output term of this gradient (max |.|), added
    to the bound unmultiplied (conftest.assert_close's stored_out)."""
    got = np.asarray(jnp.asarray(got, jnp.float32))
    ref = np.asarray(ref, np.float32)
    assert not np.isnan(got).any(), f"{name}: NaN"
    scale = max(1.0, float(np.max(np.abs(ref))))
    err = float(np.max(np.abs(got - ref)))
    assert err <= tol * scale + inherent, (f"{name}: max |err| {err:.3g} (max |ref| {scale:.3g}, "
                                           f"stored-output term {inherent:.3g})")


def gpu_inputs(key, dtype, Sq=S, Skv=S, B=2, hkv=2):
    ks = jax.random.split(key, 4)
    return (normal(ks[0], (B, Sq, HQ, D), dtype), normal(ks[1], (B, Skv, hkv, D), dtype),
            normal(ks[2], (B, Skv, hkv, D), dtype), normal(ks[3], (B, Sq, HQ, D), dtype))


def gpu_operands(name, kop):
    """CASES[name]'s operands at this file's S (relpos' table, two_arrays' second array)."""
    return {"relpos": lambda: (normal(kop, (1, 1, S, S)), 0.5),
            "two_arrays": lambda: (CASES["alibi"][1](kop)[0], normal(kop, (2, 1, S, 1)))}.get(
                name, lambda: CASES[name][1](kop))()


def check(ours, ref, args, dout, targets=("fusedattn_attn_fwd_sm_cuda",
                                          "fusedattn_attn_bwd_sm_cuda"), tol=3e-2):
    """ours (out) against ref (out, lse [B, Hq, Sq], ...: ref_call's float32 reference), the
    output and the gradients of sum(out * dout) by every argument. In 16-bit every flash
    backward (cuDNN's too) forms delta from the output it stored, rounded: its exact effect
    (conftest.stored_out_grads) joins each gradient's bound. It dominates where dS cancels:
    an operand added per query (two_arrays' second) has an exact gradient of 0."""
    loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) * dout.astype(jnp.float32))
    ref_out = lambda *a: ref(*a)[0]
    argnums = tuple(range(len(args)))
    grad = jax.jit(jax.grad(loss(ours), argnums=argnums))
    hlo = grad.lower(*args).compile().as_text()
    for t in targets:
        assert f'custom_call_target="{t}"' in hlo, f"{t} missing: the reference ran instead"
    out, lse = ref(*args)[:2]
    close("out", jax.jit(ours)(*args), out, tol)
    dtype = jnp.dtype(args[0].dtype)
    stored = ([jnp.zeros(())] * len(args) if dtype == jnp.float32 else
              stored_out_grads(out, lse, dout, dtype, lambda *a: ref(*a)[1], args, argnums))
    for i, (a, b) in enumerate(zip(grad(*args), jax.grad(loss(ref_out), argnums=argnums)(*args))):
        close(("dq", "dk", "dv")[i] if i < 3 else f"d operand {i - 3}", a, b, tol,
              float(jnp.max(jnp.abs(stored[i]))))


def thd_ref(ref):
    """thd_call's reference, its lse back to [B, Hq, Sq]."""
    return lambda *a: (lambda r: (r[0], jnp.swapaxes(r[1], 1, 2)))(ref(*a))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["softcap", "alibi", "relpos", "causal", "learnable",
                                  "two_arrays"])
def test_matches_the_reference(key, name, dtype):
    fn = CASES[name][0]
    ops = gpu_operands(name, jax.random.fold_in(key, 1))
    q, k, v, dout = gpu_inputs(key, dtype)
    arr_idx, full = array_operands(ops)
    ours = lambda q, k, v, *arr: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                      score_mod_operands=full(arr))
    ref = lambda q, k, v, *arr: ref_call(q, k, v, fn, full(arr))
    check(ours, ref, (q, k, v, *[ops[i] for i in arr_idx]), dout)


@pytest.mark.parametrize("mask", [AttnMaskType.CAUSAL_MASK, AttnMaskType.PADDING_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK])
def test_masks_inside_the_score_mod_graph(key, mask):
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16, Sq=96, Skv=128)
    lens = (jnp.array([96, 40]), jnp.array([128, 77]))
    sd = fusedattn.SequenceDescriptor.from_seqlens(lens) if mask.is_padding() else None
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd, None, score_mod=softcap,
                                                attn_mask_type=mask)
    kw = dict(q_seqlens=lens[0], kv_seqlens=lens[1]) if mask.is_padding() else {}
    ref = lambda q, k, v: ref_call(q, k, v, softcap, (), attn_mask_type=mask, **kw)
    check(ours, ref, (q, k, v), dout)


def test_thd_segments(key):
    """THD: positions restart in every segment inside the cuDNN graph too."""
    fn, make_ops = CASES["alibi"]
    ops = make_ops(key)
    ours, ref, arrs = thd_call(fn, AttnMaskType.PADDING_CAUSAL_MASK, ops)
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16, Sq=T, Skv=T)
    first = lambda f: lambda *a: f(*a)[0]
    check(first(ours), thd_ref(ref), (q, k, v, *arrs), dout)


def test_get_backend_reports_cudnn(key):
    bf = jax.ShapeDtypeStruct((2, S, HQ, D), jnp.bfloat16)
    info = fusedattn.get_backend((bf, bf, bf), score_mod=causal, platform="gpu",
                                 is_training=True)
    assert info.name == "cudnn", info
    slopes = jax.ShapeDtypeStruct((1, HQ, 1, 1), jnp.float32)  # operands as shapes too
    info = fusedattn.get_backend((bf, bf, bf), score_mod=CASES["alibi"][0], platform="gpu",
                                 score_mod_operands=(slopes,), is_training=True)
    assert info.name == "cudnn", info


def test_get_backend_knows_operand_gradients():
    """The slopes' gradient taken: cuDNN computes none, so the flash branch takes the call:
    ALiBi's forward and backward in the Hopper kernels (the slopes' gradient summed in the
    backward); in deterministic mode no backward (both sum it with float32 atomics)."""
    bf = jax.ShapeDtypeStruct((2, S, HQ, D), jnp.bfloat16)
    slopes = jax.ShapeDtypeStruct((1, HQ, 1, 1), jnp.float32)
    kw = dict(score_mod=CASES["alibi"][0], platform="gpu", score_mod_operands=(slopes,),
              score_mod_grads=True)
    info = fusedattn.get_backend((bf, bf, bf), is_training=True, **kw)
    assert info.name == "cuda_flash" and "score_mod's operands" in info.reason, info
    assert (info.forward, info.backward) == ("hopper", "hopper"), info
    assert "slopes' gradient summed in the kernel" in info.reason, info
    assert fusedattn.get_backend((bf, bf, bf), is_training=False, **kw).name == "cudnn"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("bias", [False, True], ids=["alone", "constant_bias"])
def test_alibi_slopes_gradient_in_the_hopper_backward(key, dtype, head_dim, bias):
    """Learnable ALiBi slopes (GQA, causal, S 256): the Hopper forward and backward, the
    slopes' gradient from the backward kernel, against the float32 reference; with a
    constant bias beside them too (its dense variants; at head dim 256 its values read from
    global memory)."""
    Sl = 256
    fn = CASES["alibi"][0]
    slopes = gpu_operands("alibi", jax.random.fold_in(key, 1))[0]
    ks = jax.random.split(key, 5)
    q = normal(ks[0], (2, Sl, HQ, head_dim), dtype)
    k, v = (normal(x, (2, Sl, 2, head_dim), dtype) for x in ks[1:3])
    dout = normal(ks[3], (2, Sl, HQ, head_dim), dtype)
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_MASK)
    b = None
    if bias:
        b = normal(ks[4], (1, HQ, Sl, Sl), dtype)
        kw["attn_bias_type"] = AttnBiasType.POST_SCALE_BIAS
    info = flash_backend(q, k, v, fn, (slopes,), b, score_mod_grads=True, bias_grads=False, **kw)
    assert (info.forward, info.backward) == ("hopper", "hopper"), info
    ours = lambda q, k, v, s: fusedattn.fused_attn((q, k, v), b, None, None, score_mod=fn,
                                                   score_mod_operands=(s,), **kw)
    ref = lambda q, k, v, s: ref_call(q, k, v, fn, (s,), bias=b, **kw)
    check(ours, ref, (q, k, v, slopes), dout, tol=3e-2)


# ---------------------------------------------------------------------------
# The CUDA flash kernels' interpreter

_choice = _gpu_route._gpu_choice


def _rejected(fields, want_lse, want_max_logit, training, score_mod=None, flags=0):
    return _choice(fields, want_lse, want_max_logit, training, score_mod,
                   flags | _lib.REQUEST_CUDNN_REJECTED)


@pytest.fixture
def flash_forced(monkeypatch):
    """Every call traced in the test goes as if cuDNN had rejected its graph: to cuda_flash."""
    monkeypatch.setattr(_gpu_route, "_gpu_choice", _rejected)
    monkeypatch.setattr(backends, "_gpu_choice", _rejected)


@pytest.fixture
def hopper_off():
    """The Hopper kernels off (set_hopper_fwd / _bwd "off"): softcap and ALiBi calls the flash
    branch would give them run the CUDA flash kernels' closed forms instead."""
    _lib.set_hopper_fwd("off")
    _lib.set_hopper_bwd("off")
    yield
    _lib.set_hopper_fwd(None)
    _lib.set_hopper_bwd(None)


FLASH_TOL = {jnp.bfloat16: 3e-2, jnp.float16: 3e-2, jnp.float32: 1e-4}


def flash_backend(q, k, v, fn, ops, bias=None, **kw):
    shapes = lambda xs: tuple(jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype)
                              if not isinstance(x, float) else x for x in xs)
    return fusedattn.get_backend(shapes((q, k, v)), None if bias is None else shapes((bias,))[0],
                                 score_mod=fn, score_mod_operands=shapes(ops), platform="gpu",
                                 is_training=True, **kw)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32],
                         ids=["bf16", "fp16", "f32"])
@pytest.mark.parametrize("name", ["softcap", "alibi", "relpos", "causal", "learnable",
                                  "two_arrays"])
def test_flash_kernels_match_the_reference(key, name, dtype, flash_forced, hopper_off):
    fn = CASES[name][0]
    ops = gpu_operands(name, jax.random.fold_in(key, 1))
    q, k, v, dout = gpu_inputs(key, dtype)
    info = flash_backend(q, k, v, fn, ops)
    assert (info.name, info.forward, info.backward) == ("cuda_flash",) * 3, info
    arr_idx, full = array_operands(ops)
    ours = lambda q, k, v, *arr: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                      score_mod_operands=full(arr))
    ref = lambda q, k, v, *arr: ref_call(q, k, v, fn, full(arr))
    with jax.default_matmul_precision("highest"):
        check(ours, ref, (q, k, v, *[ops[i] for i in arr_idx]), dout, tol=FLASH_TOL[dtype])


@pytest.mark.parametrize("bias_type", [AttnBiasType.POST_SCALE_BIAS, AttnBiasType.PRE_SCALE_BIAS],
                         ids=["post", "pre"])
@pytest.mark.parametrize("name", ["alibi", "softcap", "relpos", "two_arrays"])
def test_score_mod_with_a_bias_runs_the_flash_kernels(key, name, bias_type):
    """cuDNN would add the bias after the score_mod: these calls go to cuda_flash unforced,
    the bias, its gradient and the operands' gradients from the kernels; ALiBi's and
    softcap's run the Hopper kernels (the bias's tiles joining q.k before the modifier; the
    backward's dense variants with dbias and ALiBi's slopes' gradient)."""
    fn = CASES[name][0]
    ops = gpu_operands(name, jax.random.fold_in(key, 1))
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16)
    bias = normal(jax.random.fold_in(key, 2), (1, HQ, S, S), jnp.bfloat16)
    info = flash_backend(q, k, v, fn, ops, bias, attn_bias_type=bias_type,
                         attn_mask_type=AttnMaskType.CAUSAL_MASK)
    why = ("bias after the score_mod" if bias_type == AttnBiasType.POST_SCALE_BIAS else
           "PRE_SCALE_BIAS is not served")
    assert info.name == "cuda_flash" and why in info.reason, info
    kernel = "hopper" if name in ("alibi", "softcap") else "cuda_flash"
    assert (info.forward, info.backward) == (kernel, kernel), info
    arr_idx, full = array_operands(ops)
    kw = dict(attn_bias_type=bias_type, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    ours = lambda q, k, v, b, *arr: fusedattn.fused_attn((q, k, v), b, None, None, score_mod=fn,
                                                         score_mod_operands=full(arr), **kw)
    ref = lambda q, k, v, b, *arr: ref_call(q, k, v, fn, full(arr), bias=b, **kw)
    check(ours, ref, (q, k, v, bias, *[ops[i] for i in arr_idx]), dout, tol=3e-2)


@pytest.mark.parametrize("bias_type", [AttnBiasType.POST_SCALE_BIAS, AttnBiasType.PRE_SCALE_BIAS],
                         ids=["post", "pre"])
def test_alibi_with_a_constant_bias_runs_the_hopper_kernels(key, bias_type):
    """ALiBi with a bias that takes no gradient (nor do the slopes): the Hopper forward and
    backward (its dense variants' bias stages); with the bias's gradient taken, the same
    (test_score_mod_with_a_bias_runs_the_flash_kernels checks that gradient)."""
    fn = CASES["alibi"][0]
    ops = gpu_operands("alibi", jax.random.fold_in(key, 1))
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16)
    bias = normal(jax.random.fold_in(key, 2), (1, HQ, S, S), jnp.bfloat16)
    kw = dict(attn_bias_type=bias_type, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    info = flash_backend(q, k, v, fn, ops, bias, bias_grads=False, **kw)
    assert (info.forward, info.backward) == ("hopper", "hopper"), info
    info = flash_backend(q, k, v, fn, ops, bias, **kw)
    assert (info.forward, info.backward) == ("hopper", "hopper"), info
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), bias, None, None, score_mod=fn,
                                                score_mod_operands=ops, **kw)
    ref = lambda q, k, v: ref_call(q, k, v, fn, ops, bias=bias, **kw)
    check(ours, ref, (q, k, v), dout, tol=3e-2)


@pytest.mark.parametrize("bias_type", [AttnBiasType.POST_SCALE_BIAS, AttnBiasType.PRE_SCALE_BIAS],
                         ids=["post", "pre"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_softcap_with_a_bias_runs_the_hopper_kernels(key, head_dim, dtype, bias_type):
    """softcap beside a bias (a cap with a relative-position or padding bias): the Hopper
    forward, the bias's tiles joining q.k before the tanh (the engine's order), and the
    Hopper backward's dense variants (dbias with softcap's 1 - t^2). A cap of 2 on scores of
    |s| up to ~6: the tanh saturates. The bias per batch row and head, its gradient taken; GQA, causal with
    Sq != Skv."""
    fn = CASES["softcap"][0]
    ks = jax.random.split(key, 5)
    B, Sq, Skv = 2, 96, 160
    q = normal(ks[0], (B, Sq, HQ, head_dim), dtype) * 2
    k = normal(ks[1], (B, Skv, 2, head_dim), dtype) * 2
    v = normal(ks[2], (B, Skv, 2, head_dim), dtype)
    dout = normal(ks[3], (B, Sq, HQ, head_dim), dtype)
    bias = normal(ks[4], (B, HQ, Sq, Skv), dtype) * 2
    kw = dict(attn_bias_type=bias_type, attn_mask_type=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK)
    info = flash_backend(q, k, v, fn, (), bias, **kw)
    assert (info.name, info.forward, info.backward) == ("cuda_flash", "hopper", "hopper"), info
    ours = lambda q, k, v, b: fusedattn.fused_attn((q, k, v), b, None, None, score_mod=fn, **kw)
    ref = lambda q, k, v, b: ref_call(q, k, v, fn, (), bias=b, **kw)
    check(ours, ref, (q, k, v, bias), dout, tol=3e-2)


@pytest.mark.parametrize("bias_type", [AttnBiasType.POST_SCALE_BIAS, AttnBiasType.PRE_SCALE_BIAS],
                         ids=["post", "pre"])
def test_softcap_with_a_bias_any_constants(key, bias_type):
    """5 tanh(s / 8): the FFI folds k1 k2 = 0.625 into the kernel's scale, so a post-scale
    bias must join q.k times 1 / the call's own scale (post_bias_mul), not the folded one's."""
    fn = lambda s, b, h, q, k: 5.0 * jnp.tanh(s * 0.125)
    ks = jax.random.split(key, 5)
    q, k, v, dout = gpu_inputs(ks[0], jnp.bfloat16)
    q = q * 3
    bias = normal(ks[1], (2, HQ, S, S), jnp.bfloat16) * 4
    kw = dict(attn_bias_type=bias_type, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    info = flash_backend(q, k, v, fn, (), bias, **kw)
    assert (info.forward, info.backward) == ("hopper", "hopper"), info
    ours = lambda q, k, v, b: fusedattn.fused_attn((q, k, v), b, None, None, score_mod=fn, **kw)
    ref = lambda q, k, v, b: ref_call(q, k, v, fn, (), bias=b, **kw)
    check(ours, ref, (q, k, v, bias), dout, tol=3e-2)


@pytest.mark.parametrize("dims", [(60, 60), (36, 100), (12, 20)], ids=["d60", "d36_dv100",
                                                                         "d12_dv20"])
def test_head_dims_not_whole_chunks_run_padded(key, dims):
    """Head dims that are not whole 16-byte chunks: q, k, v run zero-padded (heads_padded),
    so a score_mod with a bias still runs the flash kernels (it ran XLA's reference)."""
    fn = CASES["alibi"][0]
    ops = CASES["alibi"][1](jax.random.fold_in(key, 1))
    D, Dv = dims
    ks = jax.random.split(key, 5)
    q, k = normal(ks[0], (2, S, HQ, D), jnp.bfloat16), normal(ks[1], (2, S, 2, D), jnp.bfloat16)
    v = normal(ks[2], (2, S, 2, Dv), jnp.bfloat16)
    dout = normal(ks[3], (2, S, HQ, Dv), jnp.bfloat16)
    bias = normal(ks[4], (1, HQ, S, S), jnp.bfloat16)
    kw = dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
              attn_mask_type=AttnMaskType.CAUSAL_MASK)
    info = flash_backend(q, k, v, fn, ops, bias, **kw)
    assert info.name == "cuda_flash" and "zero-padded" in info.reason, info
    arr_idx, full = array_operands(ops)
    ours = lambda q, k, v, b, *arr: fusedattn.fused_attn((q, k, v), b, None, None, score_mod=fn,
                                                         score_mod_operands=full(arr), **kw)
    ref = lambda q, k, v, b, *arr: ref_call(q, k, v, fn, full(arr), bias=b, **kw)
    check(ours, ref, (q, k, v, bias, *[ops[i] for i in arr_idx]), dout, tol=3e-2)


@pytest.mark.parametrize("mask", [AttnMaskType.CAUSAL_MASK, AttnMaskType.PADDING_MASK,
                                  AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK])
def test_flash_kernels_with_masks_gqa_and_cross_lengths(key, mask, flash_forced):
    fn = CASES["two_arrays"][0]
    ops = (CASES["alibi"][1](key)[0], normal(jax.random.fold_in(key, 1), (2, 1, 96, 1)))
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16, Sq=96, Skv=128)
    lens = (jnp.array([96, 40]), jnp.array([128, 77]))
    sd = fusedattn.SequenceDescriptor.from_seqlens(lens) if mask.is_padding() else None
    ours = lambda q, k, v, a, b: fusedattn.fused_attn((q, k, v), None, sd, None, score_mod=fn,
                                                      score_mod_operands=(a, b),
                                                      attn_mask_type=mask)
    kw = dict(q_seqlens=lens[0], kv_seqlens=lens[1]) if mask.is_padding() else {}
    ref = lambda q, k, v, a, b: ref_call(q, k, v, fn, (a, b), attn_mask_type=mask, **kw)
    check(ours, ref, (q, k, v, *ops), dout, tol=3e-2)


def test_flash_kernels_thd_segments(key, flash_forced):
    """THD: positions and operand reads restart in every segment in the kernels too."""
    fn, make_ops = CASES["alibi"]
    ops = make_ops(key)
    ours, ref, arrs = thd_call(fn, AttnMaskType.PADDING_CAUSAL_MASK, ops)
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16, Sq=T, Skv=T)
    first = lambda f: lambda *a: f(*a)[0]
    check(first(ours), thd_ref(ref), (q, k, v, *arrs), dout, tol=3e-2)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_flash_kernels_head_dim_256(key, dtype, flash_forced):
    """Head dims past 128: the wide kernels (output in column chunks; chunk 0 adds the
    operands' gradients)."""
    fn = CASES["two_arrays"][0]
    ops = (CASES["alibi"][1](key)[0], normal(jax.random.fold_in(key, 1), (2, 1, S, 1)))
    ks = jax.random.split(key, 4)
    q, k, v = (normal(ks[i], (2, S, HQ if i == 0 else 2, 256), dtype) for i in range(3))
    dout = normal(ks[3], (2, S, HQ, 256), dtype)
    ours = lambda q, k, v, a, b: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                      score_mod_operands=(a, b),
                                                      attn_mask_type=AttnMaskType.CAUSAL_MASK)
    ref = lambda q, k, v, a, b: ref_call(q, k, v, fn, (a, b),
                                         attn_mask_type=AttnMaskType.CAUSAL_MASK)
    with jax.default_matmul_precision("highest"):
        check(ours, ref, (q, k, v, *ops), dout, tol=FLASH_TOL[dtype])


def test_flash_operand_gradients_hold_no_score_matrix(key):
    """Learnable ALiBi slopes at S 2048, unforced: a gradient in the slopes routes the call
    to the CUDA flash kernels (REQUEST_SCORE_MOD_GRADS), and its program has no [.., S, S]
    array (the slopes' gradient used to be XLA's vjp of the reference, beside cuDNN)."""
    Sl = 2048
    fn, make_ops = CASES["alibi"]
    slopes = make_ops(key)[0]
    q, k, v, _ = gpu_inputs(key, jnp.bfloat16, Sq=Sl, Skv=Sl)
    loss = lambda q, k, v, s: jnp.sum(fusedattn.fused_attn(
        (q, k, v), None, None, None, score_mod=fn, score_mod_operands=(s,),
        attn_mask_type=AttnMaskType.CAUSAL_MASK).astype(jnp.float32))
    hlo = jax.jit(jax.grad(loss, argnums=(0, 3))).lower(q, k, v, slopes).compile().as_text()
    assert 'custom_call_target="fusedattn_attn_bwd_sm_cuda"' in hlo
    assert f"{Sl},{Sl}]" not in hlo, "a [.., S, S] array in the compiled gradient"
