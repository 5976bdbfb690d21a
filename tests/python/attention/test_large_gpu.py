"""Issue 20's large shapes on an NVIDIA GPU (pytest -m gpu; skipped without one): bf16
calls with more than 2^31 elements in q/k/v (or the logits), and one whose scores have
more than 2^31 elements, through cuDNN, the Hopper forward (H100/H200 only), small-seq and
softmax. Each runs correctly -- a few rows of its first and last batch entries and heads
(the offsets past 2^31) against a float32 reference computed on those slices -- or is
routed away from a kernel that counts in 32 bits, with the reason (THD ragged offsets).
The inputs differ everywhere (one key per batch entry, never a tiled block), so a wrapped
offset that reads another entry's rows shows. Sized for an 80 GB card, each test a few
seconds on an H100. The index arithmetic itself, and each 32-bit limit, is covered
without allocating by tests/cpp/attention/test_large.cc; test_large.py is the CPU twin."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor, SmallSeqDescriptor

pytestmark = pytest.mark.gpu

BF16 = jnp.bfloat16
E31 = 2 ** 31
# [B, S, H, D] with B * S * H * D = 33 * 2^26 > 2^31: batch entry 32 starts past 2^31.
B, S, H, D = 33, 4096, 128, 128


def _is_hopper():
    try:
        return any(getattr(d, "compute_capability", "") == "9.0" for d in jax.devices("gpu"))
    except RuntimeError:
        return False


def big_normal(key, shape, dtype=BF16):
    """normal of shape in dtype (no float32 copy), one key per leading index (each draw
    < 2^31 elements)."""
    keys = jax.random.split(key, shape[0])
    return jax.jit(jax.vmap(lambda k: jax.random.normal(k, shape[1:], dtype)))(keys)


def assert_bf16_close(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    # bf16 output of O(1) values (FlashAttention-style kernels land within a few bf16 ulps).
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2, err_msg=what)


def ref_attention(q, k, v, scale, causal, cap=None):
    """q [Sq, D], k/v [Skv, D] (one batch entry and head) -> out [Sq, D] f32, lse [Sq]."""
    q, k, v = (jnp.asarray(x, jnp.float32) for x in (q, k, v))
    s = q @ k.T * scale
    if cap is not None:
        s = cap * jnp.tanh(s / cap)
    if causal:
        Sq, Skv = s.shape
        s = jnp.where(jnp.arange(Skv)[None, :] <= jnp.arange(Sq)[:, None] + (Skv - Sq), s,
                      -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    return jnp.exp(s - lse[:, None]) @ v, lse


SLICES = [(0, 0), (B - 1, H - 1), (B - 1, 0)]  # (batch entry, head); the last past 2^31


def _qkv(key):
    ks = jax.random.split(key, 4)
    q, k, v, do = (big_normal(kk, (B, S, H, D)) for kk in ks)
    assert q.size > E31
    return q, k, v, do


def test_cudnn_bshd_past_2e31_elements_forward_and_backward(key):
    q, k, v, do = _qkv(key)
    scale = D ** -0.5
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, scaling_factor=scale)
    info = fusedattn.get_backend((q, k, v), None, None, None, is_training=True, **kw)
    assert info.name == "cudnn", info.reason

    @jax.jit
    def run(q, k, v, do):
        out, vjp = jax.vjp(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                                is_training=True, **kw), q, k, v)
        return out, *vjp(do)

    out, dq, dk, dv = run(q, k, v, do)
    for b, h in SLICES:
        sl = lambda x: x[b, :, h]
        f = lambda q, k, v: ref_attention(q, k, v, scale, True)[0]
        r_out, r_vjp = jax.vjp(f, sl(q), sl(k), sl(v))
        r_dq, r_dk, r_dv = r_vjp(jnp.asarray(sl(do), jnp.float32))
        for name, got, want in (("out", out, r_out), ("dq", dq, r_dq), ("dk", dk, r_dk),
                                ("dv", dv, r_dv)):
            assert_bf16_close(sl(got), want, f"{name}[{b}, :, {h}]")


@pytest.mark.skipif(not _is_hopper(), reason="the Hopper forward needs an sm_90 GPU")
def test_hopper_forward_past_2e31_elements(key):
    q, k, v, _ = _qkv(key)
    scale, cap = D ** -0.5, 30.0
    softcap = lambda s, b, h, i, j: cap * jnp.tanh(s / cap)
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, scaling_factor=scale, score_mod=softcap)
    info = fusedattn.get_backend((q, k, v), None, None, None, **kw)
    assert info.forward == "hopper", info.reason
    before = fusedattn._lib.hopper_fwd_launches()
    out = jax.block_until_ready(jax.jit(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, None, None, **kw))(q, k, v))
    assert fusedattn._lib.hopper_fwd_launches() > before, "the Hopper forward did not run"
    for b, h in SLICES:
        r_out, _ = ref_attention(q[b, :, h], k[b, :, h], v[b, :, h], scale, True, cap)
        assert_bf16_close(out[b, :, h], r_out, f"out[{b}, :, {h}]")


def test_cudnn_scores_past_2e31_elements(key):
    # q/k/v small (2^26 elements), scores 2 x 4 x 2^16 x 2^16 = 2^35: never materialized.
    Bs, Ss, Hs = 2, 2 ** 16, 4
    ks = jax.random.split(key, 3)
    q, k, v = (jax.random.normal(kk, (Bs, Ss, Hs, D), jnp.float32).astype(BF16) for kk in ks)
    scale = D ** -0.5
    info = fusedattn.get_backend((q, k, v), None, None, None, scaling_factor=scale)
    assert info.name == "cudnn", info.reason
    out, aux = jax.jit(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, None, None, scaling_factor=scale, return_aux=True))(q, k, v)
    rows = np.array([0, 1, 4095, 32768, Ss - 1])
    for b, h in ((0, 0), (Bs - 1, Hs - 1)):
        r_out, r_lse = ref_attention(q[b, rows, h], k[b, :, h], v[b, :, h], scale, False)
        assert_bf16_close(out[b, rows, h], r_out, f"out[{b}, rows, {h}]")
        np.testing.assert_allclose(np.asarray(aux["softmax_aux"][b, h, rows, 0]),
                                   np.asarray(r_lse), rtol=1e-2, atol=1e-2)


def test_cudnn_thd_past_2e31_elements_is_routed_with_the_reason():
    # THD ragged offsets are int32 element offsets: cuDNN is not chosen past them (running
    # the XLA fallback here would materialize the scores, so only the choice is checked).
    shape = jax.ShapeDtypeStruct((2, 2 ** 20, 8, 128), BF16)  # 2^31 elements
    lens = jnp.ones((2, 4), jnp.int32)
    offs = jnp.zeros((2, 5), jnp.int32)
    sd = SequenceDescriptor.from_seqlens_and_offsets((lens, lens), (offs, offs))
    info = fusedattn.get_backend((shape, shape, shape), None, sd, None,
                                 attn_mask_type=AttnMaskType.PADDING_MASK,
                                 qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=4)
    assert info.name == "cuda_flash" and "int32 ragged offsets" in info.reason, info.reason
    # Under 2^31 / 3 (the packed bound) cuDNN serves it.
    small = jax.ShapeDtypeStruct((2, 2 ** 18, 8, 128), BF16)
    info = fusedattn.get_backend((small, small, small), None, sd, None,
                                 attn_mask_type=AttnMaskType.PADDING_MASK,
                                 qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=4)
    assert info.name == "cudnn", info.reason


def test_small_seq_past_2e31_elements(key):
    # 2^17 segments of one query and 17 keys, 8 heads of 128: k/v [2228224, 8, 128] =
    # 2.28e9 elements each.
    N, W, Hs = 2 ** 17, 17, 8
    ks = jax.random.split(key, 4)
    q = big_normal(ks[0], (N, Hs, D))
    k = big_normal(ks[1], (N * W, Hs, D))
    v = big_normal(ks[2], (N * W, Hs, D))
    do = big_normal(ks[3], (N, Hs, D))
    assert k.size > E31
    sd = SmallSeqDescriptor.from_cu_seqlens(np.arange(N + 1, dtype=np.int32),
                                            np.arange(N + 1, dtype=np.int32) * W,
                                            max_segment_seqlen_kv=W)
    scale = D ** -0.5

    @jax.jit
    def run(q, k, v, do):
        out, vjp = jax.vjp(lambda q, k, v: fusedattn.fused_attn_small_seq(
            (q, k, v), None, sd, None, scaling_factor=scale), q, k, v)
        return out, *vjp(do)

    out, dq, dk, dv = run(q, k, v, do)
    for s in (0, N // 2, N - 1):
        for h in (0, Hs - 1):
            kv = slice(s * W, (s + 1) * W)
            f = lambda q, k, v: ref_attention(q, k, v, scale, False)[0]
            r_out, r_vjp = jax.vjp(f, q[s:s + 1, h], k[kv, h], v[kv, h])
            r_dq, r_dk, r_dv = r_vjp(jnp.asarray(do[s:s + 1, h], jnp.float32))
            for name, got, want in (("out", out[s:s + 1, h], r_out), ("dq", dq[s:s + 1, h], r_dq),
                                    ("dk", dk[kv, h], r_dk), ("dv", dv[kv, h], r_dv)):
                assert_bf16_close(got, want, f"{name} of segment {s}, head {h}")


def _softmax_case(key):
    # logits [2, 33, 2^13, 2^12] bf16 (2.2e9 elements) under a [2, 1, 2^13, 2^12] mask.
    shape = (2, 33, 2 ** 13, 2 ** 12)
    x = big_normal(key, shape)
    mask = jax.random.bernoulli(jax.random.fold_in(key, 1), 0.3, (2, 1) + shape[2:])
    return shape, x, mask


def _softmax_ref(x, mask, b, h, rows):
    xs = jnp.asarray(x[b, h, rows], jnp.float32) * 0.5
    keep = ~mask[b, 0, rows]
    r_y = jax.nn.softmax(jnp.where(keep, xs, -jnp.inf), axis=-1)
    return jnp.where(keep.any(-1, keepdims=True), r_y, 0.0)


def test_softmax_past_2e31_elements(key):
    shape, x, mask = _softmax_case(key)
    y = jax.jit(lambda x: fusedattn.softmax(x, mask, 0.5, "scaled_masked"))(x)
    rows = np.array([0, 5, shape[2] - 1])
    for b, h in ((0, 0), (1, 32)):
        assert_bf16_close(y[b, h, rows], _softmax_ref(x, mask, b, h, rows), f"y[{b}, {h}, rows]")


@pytest.mark.skip(reason="XLA's GPU compiler segfaults compiling this jitted backward (jax "
                  "0.11.2 + CUDA 13 plugin, H100, 2026-11-25: backend_compile_and_load); "
                  "issue 20's open item, run by hand to check a newer jax")
def test_softmax_backward_past_2e31_elements(key):
    shape, x, mask = _softmax_case(key)
    dy = big_normal(jax.random.fold_in(key, 2), shape)
    y, vjp = jax.vjp(lambda x: fusedattn.softmax(x, mask, 0.5, "scaled_masked"), x)
    dx, = jax.jit(vjp)(dy)
    rows = np.array([0, 5, shape[2] - 1])
    for b, h in ((0, 0), (1, 32)):
        r_y = _softmax_ref(x, mask, b, h, rows)
        g = jnp.asarray(dy[b, h, rows], jnp.float32)
        r_dx = 0.5 * r_y * (g - (g * r_y).sum(-1, keepdims=True))
        assert_bf16_close(dx[b, h, rows], r_dx, f"dx[{b}, {h}, rows]")


def test_softmax_past_2e32_rows(key):
    # logits [4100, 2^20, 2] bf16: 4.3e9 rows (the kernels' 64-bit row arithmetic), 8.6e9
    # elements, 17 GB; forward only.
    shape = (4100, 2 ** 20, 2)
    x = big_normal(key, shape)
    y = jax.jit(lambda x: fusedattn.softmax(x, None, 1.5, "scaled"))(x)
    assert shape[0] * shape[1] > 2 ** 32
    for b in (0, shape[0] - 1):
        rows = np.array([0, shape[1] - 1])
        r_y = jax.nn.softmax(jnp.asarray(x[b, rows], jnp.float32) * 1.5, axis=-1)
        assert_bf16_close(y[b, rows], r_y, f"y[{b}, rows]")
