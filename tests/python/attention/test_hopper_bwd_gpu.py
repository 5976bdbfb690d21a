"""The Hopper flash backward on plain calls (csrc/fusedattn/attention/hopper/bwd_kernel.cuh) on
an H100 / H200 (pytest -m gpu; skipped without an sm_90 GPU): with set_hopper_bwd("always") it
runs every plain call it can (its launch counter moves), after the Hopper forward or after
cuDNN's (either forward's log-sum-exp serves it); gradients of q, k and v against the float32
reference by test_score_mod_gpu.check's rule, in bf16 and fp16, over the masks, windows, GQA /
MQA, ragged lengths and head dims 64, 128 and 256; sinks (a learnable one's gradient), softcap
and ALiBi (their backward always runs here); a bias without dbias. Dense masks:
test_hopper_fwd_gpu.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnMaskType, _lib
from test_hopper_fwd_gpu import (POST, PRE, PADDING_CASES, PLAIN_CASES, PLAIN_IDS, PLAIN_TARGETS,
                                 SM_TARGETS, _is_hopper, identity, inputs)
from test_score_mod import B, HQ, ref_call
from test_score_mod_gpu import check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _is_hopper(), reason="needs an sm_90 GPU (H100, H200)")]


@pytest.fixture(params=["hopper-fwd", "cudnn-fwd"])
def hopper_bwd(request):
    """The Hopper backward for every call it can run, after either forward; then back."""
    _lib.set_hopper_fwd("always" if request.param == "hopper-fwd" else "off")
    _lib.set_hopper_bwd("always")
    yield
    _lib.set_hopper_fwd(None)
    _lib.set_hopper_bwd(None)


def check_hopper_bwd(ours, ref, args, dout, targets=PLAIN_TARGETS):
    before = _lib.hopper_bwd_launches()
    check(ours, ref, args, dout, targets)
    assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"


# Every plain case at head dim 128 (64-query blocks), the first four at 64 (128-query blocks)
# and at 256 (64-key blocks, dQ by atomics).
PLAIN_D = ([pytest.param(*c, 128, id=i) for c, i in zip(PLAIN_CASES, PLAIN_IDS)] +
           [pytest.param(*c, 64, id=i + "-d64") for c, i in zip(PLAIN_CASES[:4], PLAIN_IDS)] +
           [pytest.param(*c, 256, id=i + "-d256") for c, i in zip(PLAIN_CASES[:4], PLAIN_IDS)])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,window,d", PLAIN_D)
def test_plain_gradients(key, hopper_bwd, dtype, mask, Sq, Skv, hkv, window, d):
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                                window_size=window)
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=mask, window_size=window)
    check_hopper_bwd(ours, ref, (q, k, v), dout)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,window,ql,kl", PADDING_CASES,
                         ids=["padding", "padding-causal", "padding-bottom-right",
                              "padding-causal-window-empty-row"])
def test_padding_gradients(key, hopper_bwd, dtype, mask, Sq, Skv, hkv, window, ql, kl):
    """Padding (a sequence of no queries and one of no keys among them): gradients of padded
    rows and keys 0, the rest as the reference."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0)
    qlen, kvlen = jnp.asarray(ql, jnp.int32), jnp.asarray(kl, jnp.int32)
    sd = fusedattn.SequenceDescriptor.from_seqlens((qlen, kvlen))
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask,
                                                window_size=window)
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=mask, window_size=window,
                                   q_seqlens=qlen, kv_seqlens=kvlen)
    check_hopper_bwd(ours, ref, (q, k, v), dout)


def test_one_compiled_function_takes_either_backward(key):
    """set_hopper_bwd decides when a call runs: one compiled gradient runs the Hopper backward,
    then cuDNN's (its workspace sized for both), and the two agree to 16-bit rounding."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 1024, 1024, 2, 2.0)
    loss = lambda q, k, v: jnp.sum(fusedattn.dot_product_attention(q, k, v, is_causal=True)
                                   .astype(jnp.float32) * dout.astype(jnp.float32))
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    g.lower(q, k, v).compile()
    try:
        got = {}
        for mode in ("always", "off"):
            _lib.set_hopper_bwd(mode)
            before = _lib.hopper_bwd_launches()
            got[mode] = [np.asarray(x, np.float32) for x in jax.block_until_ready(g(q, k, v))]
            assert (_lib.hopper_bwd_launches() > before) == (mode == "always"), mode
    finally:
        _lib.set_hopper_bwd(None)
    for what, a, b in zip(("dq", "dk", "dv"), got["always"], got["off"]):
        assert not np.isnan(a).any(), what
        assert np.abs(a - b).max() <= 2e-2 * max(1.0, float(np.abs(b).max())), what


def test_other_calls_keep_cudnns_backward(key):
    """Calls the Hopper backward does not take run cuDNN's even with set_hopper_bwd("always"):
    a score_mod other than softcap and ALiBi; head dim 256 it takes, in deterministic mode too
    (its ordered dQ)."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 512, 512, 2, 1.0, d=256)
    wave = lambda s, b, h, qi, ki: s + 0.5 * jnp.sin(s)
    causal = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                  attn_mask_type=AttnMaskType.CAUSAL_MASK)
    other = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=wave)
    q128 = tuple(x[..., :128] for x in (q, k, v))

    def launches(fn, args, det):
        g = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32))))
        before = _lib.hopper_bwd_launches()
        with fusedattn.deterministic(det):
            jax.block_until_ready(g(*args))
        return _lib.hopper_bwd_launches() - before

    _lib.set_hopper_bwd("always")
    try:
        with fusedattn.deterministic(True):
            info = fusedattn.get_backend((q, k, v), attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                         is_training=True, platform="gpu")
        assert info.backward == "hopper" and "deterministic dQ" in info.reason, info
        assert launches(other, q128, False) == 0, "a score_mod other than softcap and ALiBi"
        assert launches(causal, (q, k, v), True) > 0, "head dim 256, deterministic"
        assert launches(causal, (q, k, v), False) > 0, "head dim 256"
    finally:
        _lib.set_hopper_bwd(None)


@pytest.mark.parametrize("S", [1024, 16384])
def test_plain_calls_follow_the_backward_measurement(key, S):
    """Without an override a plain call's backward is the one hopper/measured_bwd.h picks for
    its class, head dim and length, and get_backend names the kernel that then runs (head dim
    64, causal: the table's rows at S 1024 and 16384)."""
    q, k, v, dout = (x[:1, :, :2] for x in inputs(key, jnp.bfloat16, S, S, 2, 1.0, d=64))
    causal = AttnMaskType.CAUSAL_MASK
    info = fusedattn.get_backend((q, k, v), attn_mask_type=causal, is_training=True, platform="gpu")
    assert info.backward in ("hopper", "cudnn"), info
    assert ("measured_bwd.h" in info.reason if info.backward == "hopper"
            else "cuDNN's backward measured" in info.reason), info.reason
    loss = lambda q, k, v: jnp.sum(fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=causal)
                                   .astype(jnp.float32) * dout.astype(jnp.float32))
    before = _lib.hopper_bwd_launches()
    grads = jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert (_lib.hopper_bwd_launches() > before) == (info.backward == "hopper"), info
    assert not any(np.isnan(np.asarray(g, np.float32)).any() for g in grads)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("softmax,mask", [
    (fusedattn.SoftmaxType.LEARNABLE_SOFTMAX, AttnMaskType.CAUSAL_MASK),
    (fusedattn.SoftmaxType.LEARNABLE_SOFTMAX, AttnMaskType.NO_MASK),
    (fusedattn.SoftmaxType.OFF_BY_ONE_SOFTMAX, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK)],
    ids=["learnable-causal", "learnable-full", "off-by-one-bottom-right"])
def test_sink_gradients(key, hopper_bwd, dtype, softmax, mask):
    """Sinks: dq, dk, dv from the lse that holds the extra logit, and a learnable offset's
    gradient (-sum exp(sink - lse) D, per batch entry, summed) against the reference; a
    bottom-right mask with Sq < Skv. (Rows that keep only the sink, Sq > Skv bottom-right, are
    no Hopper call: its forward declines them; the kernel tests cover them.)"""
    learnable = softmax == fusedattn.SoftmaxType.LEARNABLE_SOFTMAX
    Sq, Skv = (512, 640) if mask == AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK else (512, 512)
    q, k, v, dout = inputs(key, dtype, Sq, Skv, 2, 2.0)
    off = jnp.linspace(-1.0, 3.0, q.shape[2]).astype(jnp.float32)  # some above the scores

    def ours(q, k, v, *o):
        return fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                    softmax_type=softmax, softmax_offset=o[0] if o else None)

    def ref(q, k, v, *o):
        return fusedattn.attention_reference(
            q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
            attn_mask_type=mask, softmax_type=softmax, softmax_offset=o[0] if o else None)

    args = (q, k, v, off) if learnable else (q, k, v)
    check_hopper_bwd(ours, ref, args, dout)


def _softcap(c):
    def softcap(s, b, h, q, k):
        return jnp.tanh(s / c) * c
    return softcap


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,d,cap", [
    (AttnMaskType.CAUSAL_MASK, 512, 512, 2, 128, 2.0),
    (AttnMaskType.NO_MASK, 300, 260, 1, 128, 30.0),
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 256, 384, 2, 64, 5.0),
    (AttnMaskType.NO_MASK, 384, 384, 4, 64, 1.0)],
    ids=["causal-cap2", "full-mqa-ragged-cap30", "bottom-right-d64-cap5", "full-d64-cap1"])
def test_softcap_gradients(key, hopper_bwd, dtype, mask, Sq, Skv, hkv, d, cap):
    """softcap (c tanh(s / c)): the Hopper backward takes its gradients (tanh's derivative in
    the kernel) after either forward; small caps saturate tanh (derivative near 0)."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    fn = _softcap(cap)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                                score_mod=fn)
    ref = lambda q, k, v: ref_call(q, k, v, fn, (), attn_mask_type=mask)
    check_hopper_bwd(ours, ref, (q, k, v), dout, SM_TARGETS)


def _alibi_abs(s, b, h, q, k, slopes):
    return s - slopes * jnp.abs(q - k).astype(jnp.float32)


def _alibi_signed(s, b, h, q, k, slopes):
    return s - slopes * (q - k).astype(jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,d,fn,per_head", [
    (AttnMaskType.CAUSAL_MASK, 512, 512, 2, 128, _alibi_signed, True),
    (AttnMaskType.NO_MASK, 300, 260, 1, 128, _alibi_abs, True),
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 256, 384, 2, 64, _alibi_signed, False),
    (AttnMaskType.NO_MASK, 384, 384, 4, 64, _alibi_abs, False),
    (AttnMaskType.CAUSAL_MASK, 384, 384, 2, 256, _alibi_signed, True),
    (AttnMaskType.NO_MASK, 300, 260, 1, 256, _alibi_abs, False)],
    ids=["causal-gqa", "full-mqa-ragged-abs", "bottom-right-d64-one-slope", "full-d64-abs-one-slope",
         "causal-gqa-d256", "full-mqa-ragged-d256-abs-one-slope"])
def test_alibi_gradients(key, hopper_bwd, dtype, mask, Sq, Skv, hkv, d, fn, per_head):
    """ALiBi (slopes a constant here: their gradient taken sends the call to the CUDA flash
    kernels): the Hopper backward adds the bias as the forward does."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    hq = q.shape[2]
    slopes = (jnp.exp2(-8.0 * jnp.arange(1, hq + 1, dtype=jnp.float32) / hq).reshape(1, hq, 1, 1)
              if per_head else jnp.full((1, 1, 1, 1), 0.25, jnp.float32))
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                                score_mod=fn, score_mod_operands=(slopes,))
    ref = lambda q, k, v: ref_call(q, k, v, fn, (slopes,), attn_mask_type=mask)
    check_hopper_bwd(ours, ref, (q, k, v), dout, SM_TARGETS)


BIAS_BWD = [  # bias type, mask, Sq, Skv, Hkv, the bias's batch and head extents, head dim, window
    pytest.param(PRE, AttnMaskType.CAUSAL_MASK, 512, 512, 2, (1, HQ), 128, None, id="pre-causal-1h"),
    pytest.param(PRE, AttnMaskType.NO_MASK, 300, 777, 4, (B, 1), 64, None, id="pre-full-b1-d64"),
    pytest.param(POST, AttnMaskType.NO_MASK, 640, 640, 2, (B, HQ), 128, None, id="post-full-bh"),
    pytest.param(POST, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 4, (1, 1), 64, (100, 0),
                 id="post-window-bottom-right-11-d64"),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("bias_type,mask,Sq,Skv,hkv,extents,d,window", BIAS_BWD)
def test_bias_gradients_without_dbias(key, dtype, bias_type, mask, Sq, Skv, hkv, extents, d, window):
    """A bias that takes no gradient (a constant here): the Hopper backward adds it, before
    the scale or after (by default: after the CUDA flash kernels' forward for a pre-scale
    bias, which cuDNN does not serve, after cuDNN's for a post-scale one). Gradients of q, k
    and v against the float32 reference; bias rows of whole 16-byte chunks (Skv 512, 640:
    the tiles through the copy engine) and not (777, 650: read from global memory)."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    bias = (2.0 * jax.random.normal(jax.random.fold_in(key, 9), extents + (Sq, Skv))).astype(dtype)
    kw = dict(attn_mask_type=mask, window_size=window, attn_bias_type=bias_type)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), bias, None, None, **kw)
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), bias=bias.astype(jnp.float32), **kw)
    info = lambda grads: fusedattn.get_backend(
        (q, k, v), bias, attn_bias_type=bias_type, attn_mask_type=mask, window_size=window,
        is_training=True, platform="gpu", bias_grads=grads)
    # with dbias wanted: the Hopper backward's dbias where the flash kernels' is the other
    # choice (cuDNN serves no pre-scale bias, nor a bias with a window) or where the bias has
    # the call's extents and rows of whole 16-byte units (each element written once: faster
    # than cuDNN's), else cuDNN's (faster than a broadcast bias's float32 sums: bench/RESULTS.md)
    full = extents == (B, HQ) and Skv % 8 == 0
    assert info(False).backward == "hopper", info(False)
    assert info(True).backward == ("hopper" if bias_type == PRE or window or full else "cudnn"), info(True)
    check_hopper_bwd(ours, ref, (q, k, v), dout)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("bias_type,mask,Sq,Skv,hkv,extents,d,window", BIAS_BWD)
def test_bias_gradients_with_dbias(key, dtype, bias_type, mask, Sq, Skv, hkv, extents, d, window):
    """The bias's gradient from the Hopper backward (dS, times the scale before it; summed in
    float32 where the bias broadcasts): by default for a pre-scale bias and a post-scale one
    of the call's extents (whole 16-byte rows), with set_hopper_bwd("always") for the other
    post-scale ones. Gradients of q, k, v and the bias against the float32 reference."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    bias = (2.0 * jax.random.normal(jax.random.fold_in(key, 9), extents + (Sq, Skv))).astype(dtype)
    kw = dict(attn_mask_type=mask, window_size=window, attn_bias_type=bias_type)
    ours = lambda q, k, v, b: fusedattn.fused_attn((q, k, v), b, None, None, **kw)
    ref = lambda q, k, v, b: ref_call(q, k, v, identity, (), bias=b.astype(jnp.float32), **kw)
    if bias_type == POST:
        _lib.set_hopper_bwd("always")
    try:
        check_hopper_bwd(ours, ref, (q, k, v, bias), dout)
    finally:
        _lib.set_hopper_bwd(None)
