"""The Hopper flash forward (csrc/fusedattn/attention/hopper) on an H100 (pytest -m gpu; skipped
without an sm_90 GPU): softcap and ALiBi score_mods at head dim 128 run there (its launch
counter moves) at head dims 128, 64 and 256, and plain calls (no score_mod) where the measurement (hopper/measured.h) or
set_hopper_fwd("always") sends them; other calls do not; forward, log-sum-exp and gradients
(the backward, cuDNN's or the Hopper one — softcap's runs there —, reads this forward's
log-sum-exp) against the float32 reference with fn
over the materialized scores, in bf16 and fp16, with and without causal masks, sliding
windows, GQA, ragged lengths and the packed layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType, QKVLayout, _lib
from fusedattn.reference import nan_max
from test_score_mod import B, HQ, alibi, alibi_plus_table, ref_call
from test_score_mod_gpu import check, close

D = 128


def _is_hopper():
    try:
        return any(getattr(d, "compute_capability", "") == "9.0" for d in jax.devices("gpu"))
    except RuntimeError:
        return False


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _is_hopper(), reason="needs an sm_90 GPU (H100, H200)")]


def cap50(s, b, h, q, k):
    return jnp.tanh(s / 50.0) * 50.0


def cap20(s, b, h, q, k):  # the other way round, and a cap the scores reach
    return 20.0 * jnp.tanh(s * (1.0 / 20.0))


def inputs(key, dtype, Sq, Skv, hkv, amp=1.0, d=D):
    ks = jax.random.split(key, 4)
    return (normal(ks[0], (B, Sq, HQ, d), dtype) * amp,
            normal(ks[1], (B, Skv, hkv, d), dtype) * amp,
            normal(ks[2], (B, Skv, hkv, d), dtype), normal(ks[3], (B, Sq, HQ, d), dtype))


def runs_hopper(fn, *args):
    before = _lib.hopper_fwd_launches()
    out = jax.block_until_ready(jax.jit(fn)(*args))
    return out, _lib.hopper_fwd_launches() > before


SM_TARGETS = ("fusedattn_attn_fwd_sm_cuda", "fusedattn_attn_bwd_sm_cuda")
PLAIN_TARGETS = ("fusedattn_attn_fwd_cuda", "fusedattn_attn_bwd_cuda")


def check_on_hopper(ours, ref, q, k, v, dout, targets=SM_TARGETS):
    """ours(q, k, v) -> (out, aux) must run the Hopper forward; out and the log-sum-exp
    against ref(q, k, v) -> (out, lse, _), then q, k, v gradients through the backward select_backend
    picks (targets: the custom calls the gradient's HLO must hold)."""
    ref_out, ref_lse, _ = ref(q, k, v)
    (out, aux), ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    close("out", out, ref_out)
    lse = np.asarray(aux["softmax_aux"])[..., 0]
    assert not np.isnan(lse).any()
    np.testing.assert_allclose(lse, np.asarray(ref_lse).reshape(lse.shape), atol=2e-3, rtol=1e-3)
    check(lambda q, k, v: ours(q, k, v)[0], ref, (q, k, v), dout, targets)  # ref: (out, lse, ...)


CASES = [  # mask, Sq, Skv, Hkv, fn, amp
    (AttnMaskType.NO_MASK, 300, 777, 4, cap50, 1.0),
    (AttnMaskType.CAUSAL_MASK, 512, 512, 2, cap50, 1.0),
    (AttnMaskType.CAUSAL_MASK, 1000, 1000, 1, cap20, 3.0),
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 4, cap20, 3.0),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,fn,amp", CASES,
                         ids=["full-ragged", "causal-gqa", "causal-mqa-cap20", "bottom-right"])
def test_softcap_forward_and_gradients(key, dtype, mask, Sq, Skv, hkv, fn, amp):
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, amp)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                attn_mask_type=mask, return_aux=True)
    check_on_hopper(ours, lambda q, k, v: ref_call(q, k, v, fn, (), attn_mask_type=mask),
                    q, k, v, dout)


def identity(s, b, h, q, k):
    return s


@pytest.fixture
def hopper_always():
    """The Hopper forward takes every call it can run (plain ones too), then back."""
    _lib.set_hopper_fwd("always")
    yield
    _lib.set_hopper_fwd(None)


PLAIN_CASES = [  # mask, Sq, Skv, Hkv, window
    (AttnMaskType.NO_MASK, 300, 777, 4, None),
    (AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, None),
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 1, None),
    (AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, (256, 0)),  # the sliding window
    (AttnMaskType.CAUSAL_MASK, 700, 700, 4, (5, 0)),  # narrower than a key block
    (AttnMaskType.NO_MASK, 700, 700, 4, (100, 37)),
    (AttnMaskType.NO_MASK, 512, 900, 2, (-1, 64)),
    (AttnMaskType.NO_MASK, 600, 900, 2, (130, -1)),
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 300, 1000, 1, (129, 0)),
]
PLAIN_IDS = ["full-ragged", "causal-gqa", "bottom-right-mqa", "causal-window", "causal-window-5",
             "window-both", "window-right", "window-left", "bottom-right-window"]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,window", PLAIN_CASES, ids=PLAIN_IDS)
def test_plain_forward_and_gradients(key, hopper_always, dtype, mask, Sq, Skv, hkv, window):
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                attn_mask_type=mask, window_size=window,
                                                return_aux=True)
    check_on_hopper(ours, lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=mask,
                                                   window_size=window), q, k, v, dout,
                    PLAIN_TARGETS)


D64_CASES = [  # mask, Sq, Skv, Hkv, window, fn
    (AttnMaskType.NO_MASK, 300, 777, 4, None, identity),
    (AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, None, identity),
    (AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, (256, 0), identity),
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 1, None, cap20),
    (AttnMaskType.CAUSAL_MASK, 512, 512, 4, None, cap50),
]


@pytest.mark.parametrize("d", [64, 256], ids=["d64", "d256"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,window,fn", D64_CASES,
                         ids=["full-ragged", "causal-gqa", "causal-window", "bottom-right-cap20",
                              "causal-cap50"])
def test_head_dims_64_256_forward_and_gradients(key, hopper_always, d, dtype, mask, Sq, Skv, hkv,
                                                window, fn):
    """Head dims 64 and 256: the kernel's own tiles (64: one copy box a row, the m64n72 P V
    product; 256: 64-key steps, the m64n256 product, row sums in registers)."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    sm = {} if fn is identity else dict(score_mod=fn)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask,
                                                window_size=window, return_aux=True, **sm)
    check_on_hopper(ours, lambda q, k, v: ref_call(q, k, v, fn, (), attn_mask_type=mask,
                                                   window_size=window), q, k, v, dout,
                    PLAIN_TARGETS if fn is identity else SM_TARGETS)


PADDING_CASES = [  # mask, Sq, Skv, Hkv, window, q lengths, kv lengths (B = 2)
    (AttnMaskType.PADDING_MASK, 512, 700, 2, None, (300, 512), (700, 1)),
    (AttnMaskType.PADDING_CAUSAL_MASK, 640, 640, 4, None, (640, 129), (640, 129)),
    (AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 400, 900, 1, None, (200, 400), (850, 130)),
    (AttnMaskType.PADDING_CAUSAL_MASK, 800, 800, 2, (100, 0), (777, 0), (800, 64)),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,window,ql,kl", PADDING_CASES,
                         ids=["padding", "padding-causal", "padding-bottom-right",
                              "padding-causal-window-empty-row"])
def test_padding_forward_and_gradients(key, hopper_always, dtype, mask, Sq, Skv, hkv, window,
                                       ql, kl):
    """Padding masks (BSHD, per-row lengths; a sequence of no queries and one of no keys
    among them): padded queries give out 0 and lse -inf, the rest as the reference."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0)
    qlen, kvlen = jnp.asarray(ql, jnp.int32), jnp.asarray(kl, jnp.int32)
    sd = fusedattn.SequenceDescriptor.from_seqlens((qlen, kvlen))
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask,
                                                window_size=window, return_aux=True)
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=mask, window_size=window,
                                   q_seqlens=qlen, kv_seqlens=kvlen)
    ref_out, ref_lse, _ = ref(q, k, v)
    (out, aux), ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    close("out", out, ref_out)
    lse = np.asarray(aux["softmax_aux"])[..., 0]
    ref_lse = np.asarray(ref_lse).reshape(lse.shape)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=2e-3, rtol=1e-3)
    check(lambda q, k, v: ours(q, k, v)[0], ref, (q, k, v), dout, PLAIN_TARGETS)


THD_CASES = [  # mask, Hkv, window, fn, (q lengths, q offsets), (kv lengths, kv offsets)
    # self attention: row 0 has a gap, an empty segment and a tail of no segment
    (AttnMaskType.PADDING_CAUSAL_MASK, 2, None, None,
     ([[300, 0, 129, 200], [640, 60, 0, 0]], [[0, 300, 300, 450, 650], [0, 640, 700, 700, 700]]),
     ([[300, 0, 129, 200], [640, 60, 0, 0]], [[0, 300, 300, 450, 650], [0, 640, 700, 700, 700]])),
    # cross lengths and offsets of their own, a window, queries of no keys (row 1's second)
    (AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 1, (64, 0), None,
     ([[150, 250, 0, 0], [200, 100, 0, 0]], [[0, 150, 400, 400, 400], [10, 260, 700, 700, 700]]),
     ([[500, 200, 0, 0], [300, 0, 0, 0]], [[0, 500, 700, 700, 700], [0, 300, 300, 300, 300]])),
    # softcap (positions from each segment's start), full attention inside segments
    (AttnMaskType.PADDING_MASK, 4, None, cap50,
     ([[256, 444, 0, 0], [5, 600, 50, 0]], [[0, 256, 700, 700, 700], [0, 5, 605, 655, 700]]),
     ([[256, 444, 0, 0], [5, 600, 50, 0]], [[0, 256, 700, 700, 700], [0, 5, 605, 655, 700]])),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,hkv,window,fn,qs,kvs", THD_CASES,
                         ids=["thd-causal-gaps", "thd-cross-bottom-right-window", "thd-softcap"])
def test_thd_forward_and_gradients(key, hopper_always, dtype, mask, hkv, window, fn, qs, kvs):
    """THD (packed sequences, 4 a row, S 700): each sequence attends within itself, tokens of
    no sequence give out 0 and lse -inf; forward, lse and gradients (cuDNN's THD backward
    reading this forward's lse) against the reference."""
    S = 700
    q, k, v, dout = inputs(key, dtype, S, S, hkv, 2.0)
    sd = fusedattn.SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.asarray(qs[0], jnp.int32), jnp.asarray(kvs[0], jnp.int32)),
        (jnp.asarray(qs[1], jnp.int32), jnp.asarray(kvs[1], jnp.int32)))
    fn_ = fn or identity
    ours = lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, sd, None, attn_mask_type=mask, qkv_layout=QKVLayout.THD_THD_THD,
        max_segments_per_seq=4, window_size=window, return_aux=True,
        **({"score_mod": fn} if fn else {}))
    ref = lambda q, k, v: ref_call(  # lse [B, Hq, Sq]
        q, k, v, fn_, (), attn_mask_type=mask, window_size=window, thd=True,
        q_seqlens=np.asarray(qs[0]), kv_seqlens=np.asarray(kvs[0]), q_offsets=np.asarray(qs[1]),
        kv_offsets=np.asarray(kvs[1]))
    ref_out, ref_lse = ref(q, k, v)[:2]
    (out, aux), ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    close("out", out, ref_out)
    # THD's softmax_aux is token-major: [B, Sq, Hq, 1]
    lse, ref_lse = np.asarray(aux["softmax_aux"])[..., 0], np.swapaxes(np.asarray(ref_lse), 1, 2)
    assert lse.shape == ref_lse.shape, (lse.shape, ref_lse.shape)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=2e-3, rtol=1e-3)
    check(lambda q, k, v: ours(q, k, v)[0], ref, (q, k, v), dout,
          SM_TARGETS if fn else PLAIN_TARGETS)


def test_softcap_with_window(key):
    q, k, v, dout = inputs(key, jnp.bfloat16, 800, 800, 2, 3.0)
    mask, window = AttnMaskType.CAUSAL_MASK, (200, 0)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=cap20,
                                                attn_mask_type=mask, window_size=window,
                                                return_aux=True)
    check_on_hopper(ours, lambda q, k, v: ref_call(q, k, v, cap20, (), attn_mask_type=mask,
                                                   window_size=window), q, k, v, dout)


def test_plain_calls_follow_the_measurement(key):
    """Without an override a plain call runs the Hopper forward exactly when get_backend
    says so (hopper/measured.h decides), and gives the same answer either way."""
    q, k, v, _ = inputs(key, jnp.bfloat16, 4096, 4096, 2)
    for mask in (AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK):
        fn = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)
        info = fusedattn.get_backend((q, k, v), attn_mask_type=mask, platform="gpu")
        out, ran = runs_hopper(fn, q, k, v)
        assert ran == (info.forward == "hopper"), info
        _lib.set_hopper_fwd("off")
        try:
            cudnn_out, ran_off = runs_hopper(fn, q, k, v)
        finally:
            _lib.set_hopper_fwd(None)
        assert not ran_off
        close("out", out, cudnn_out)


def alibi_causal(s, b, h, q, k, slopes):  # the bench's form
    return s - slopes * (q - k).astype(jnp.float32)


def alibi_reversed(s, b, h, q, k, slopes):  # + (kv - q) * slopes, written the other way round
    return (k - q).astype(jnp.float32) * slopes + s


ALIBI_CASES = [  # mask, Sq, Skv, Hkv, fn, slopes' head extent
    (AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, alibi_causal, HQ),
    (AttnMaskType.NO_MASK, 300, 777, 4, alibi, HQ),  # - slopes |q - kv|
    (AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 1, alibi_reversed, 1),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask,Sq,Skv,hkv,fn,hs", ALIBI_CASES,
                         ids=["causal-gqa", "full-abs-ragged", "bottom-right-one-slope"])
def test_alibi_forward_and_gradients(key, dtype, mask, Sq, Skv, hkv, fn, hs):
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv)
    slopes = jnp.exp2(-8.0 * jnp.arange(1, hs + 1, dtype=jnp.float32) / hs).reshape(1, hs, 1, 1)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                score_mod_operands=(slopes,),
                                                attn_mask_type=mask, return_aux=True)
    check_on_hopper(ours, lambda q, k, v: ref_call(q, k, v, fn, (slopes,), attn_mask_type=mask),
                    q, k, v, dout)


def test_packed_layout(key):
    q, k, v, _ = inputs(key, jnp.bfloat16, 384, 384, HQ)
    qkv = jnp.stack([q, k, v], axis=2)  # [B, S, 3, H, D]
    ours = lambda qkv: fusedattn.fused_attn((qkv,), None, None, None, score_mod=cap50,
                                            attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                            qkv_layout=QKVLayout.BS3HD)
    out, ran = runs_hopper(ours, qkv)
    assert ran
    ref = ref_call(q, k, v, cap50, (), attn_mask_type=AttnMaskType.CAUSAL_MASK)[0]
    close("out", out, ref)


def test_other_calls_stay_on_cudnn(key):
    """ALiBi plus a table, per-query slopes and head dim 96 are not the kernel's: cuDNN runs
    them."""
    q, k, v, _ = inputs(key, jnp.bfloat16, 256, 256, HQ)
    slopes = jnp.linspace(0.1, 0.8, HQ, dtype=jnp.float32).reshape(1, HQ, 1, 1)
    table = jnp.linspace(-1.0, 1.0, 256 * 256, dtype=jnp.float32).reshape(1, 1, 256, 256)
    per_query = jnp.linspace(0.1, 0.8, 256, dtype=jnp.float32).reshape(1, 1, 256, 1)
    calls = [
        (lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                              score_mod=alibi_plus_table,
                                              score_mod_operands=(slopes, table)), (q, k, v)),
        (lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=alibi,
                                              score_mod_operands=(per_query,)), (q, k, v)),
        (lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=cap50),
         (q[..., :96], k[..., :96], v[..., :96])),
    ]
    for fn, args in calls:
        out, ran = runs_hopper(fn, *args)
        assert not ran
        assert not np.isnan(np.asarray(out, np.float32)).any()


def test_get_backend_names_the_kernels_that_run():
    """The engine's one decision: softcap / ALiBi at head dims 128, 64 and 256 run forward "hopper",
    backward "hopper" (ALiBi's at head dim 256: "cudnn", not compiled there); the calls the
    kernel does not take run cuDNN both ways."""
    bf = lambda d: tuple(jax.ShapeDtypeStruct(s, jnp.bfloat16)
                         for s in ((B, 256, HQ, d), (B, 256, HQ, d), (B, 256, HQ, d)))
    slopes = jax.ShapeDtypeStruct((1, HQ, 1, 1), jnp.float32)
    causal = AttnMaskType.CAUSAL_MASK
    for d in (D, 64, 256):
        for fn, ops in ((cap50, ()), (alibi_causal, (slopes,))):
            info = fusedattn.get_backend(bf(d), attn_mask_type=causal, score_mod=fn,
                                         score_mod_operands=ops, is_training=True, platform="gpu")
            bwd = "cudnn" if d == 256 and fn is alibi_causal else "hopper"
            assert (info.name, info.forward, info.backward) == ("cudnn", "hopper", bwd), (d, info)
    info = fusedattn.get_backend(bf(D), attn_mask_type=causal, score_mod=cap50,
                                 return_max_logit=True, is_training=True, platform="gpu")
    assert (info.name, info.forward, info.backward) == ("cudnn", "hopper", "hopper"), info
    info = fusedattn.get_backend(bf(96), attn_mask_type=causal, score_mod=cap50, platform="gpu")
    assert (info.name, info.forward, info.backward) == ("cudnn",) * 3, info


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK],
                         ids=["full", "causal"])
def test_nan_in_q_gives_nan_rows(key, dtype, mask):
    # NaN in, NaN out: fmaxf drops a NaN from the row max, but exp2 of it makes the row sum
    # NaN, and the epilogue must pass it on (out and lse NaN), not take it for "no key"
    # (out 0, lse -inf). One element of row 300 (a query tile of its own past 256) and a
    # whole row 7; every other row stays finite and right.
    q, k, v, _ = inputs(key, dtype, 512, 512, 2)
    q = q.at[1, 300, 3, 17].set(jnp.nan).at[0, 7, 1].set(jnp.nan)
    check_nan_on_hopper(q, k, v, mask)
    (out, aux), _ = runs_hopper(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, None, None, score_mod=cap50, attn_mask_type=mask, return_aux=True),
        q, k, v)
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(aux["softmax_aux"])[..., 0]
    assert np.isnan(out[1, 300, 3]).all() and np.isnan(out[0, 7, 1]).all()
    assert np.isnan(lse[1, 3, 300]) and np.isnan(lse[0, 1, 7])
    assert np.isnan(out).any(axis=-1).sum() == 2, "exactly the two rows"


@pytest.mark.parametrize("d", [D, 256], ids=["d128", "d256"])  # row sums by the tensor cores / in registers
@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK],
                         ids=["full", "causal"])
def test_nan_in_k_gives_nan_rows(key, d, mask):
    # One NaN score per row among finite ones: the row max stays finite, the sum is NaN.
    # Key 100: under the causal mask only rows >= 100 keep it.
    q, k, v, _ = inputs(key, jnp.bfloat16, 512, 512, 2, d=d)
    check_nan_on_hopper(q, k.at[0, 100, 0, 5].set(jnp.nan), v, mask)


def check_nan_on_hopper(q, k, v, mask):
    """Runs the Hopper forward: out and lse NaN exactly where the reference's are, close
    elsewhere."""
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=cap50,
                                                attn_mask_type=mask, return_aux=True)
    (out, aux), ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    ref_out, ref_lse, _ = ref_call(q, k, v, cap50, (), attn_mask_type=mask)
    out = np.asarray(jnp.asarray(out, jnp.float32))
    lse = np.asarray(aux["softmax_aux"])[..., 0]  # [B, Hq, Sq]
    ref_out, ref_lse = np.asarray(ref_out, np.float32), np.asarray(ref_lse).reshape(lse.shape)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref_out))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    assert np.isnan(out).any()
    fin = ~np.isnan(ref_out)
    close("out", out[fin], ref_out[fin])
    np.testing.assert_allclose(lse[~np.isnan(ref_lse)], ref_lse[~np.isnan(ref_lse)],
                               atol=2e-3, rtol=1e-3)


MAX_LOGIT_CASES = [  # d, mask, Sq, Skv, Hkv, window, fn, q lengths (padding; None: none)
    (128, AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, None, None, None),
    (64, AttnMaskType.NO_MASK, 300, 777, 4, None, cap20, None),
    (256, AttnMaskType.CAUSAL_MASK, 700, 700, 1, (100, 0), None, None),
    (128, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 4, None, "alibi", None),
    (128, AttnMaskType.PADDING_CAUSAL_MASK, 640, 640, 2, None, None, (640, 0)),
]


@pytest.mark.parametrize("d,mask,Sq,Skv,hkv,window,fn,ql", MAX_LOGIT_CASES,
                         ids=["causal-gqa", "d64-full-cap20", "d256-window", "bottom-right-alibi",
                              "padding-empty-sequence"])
def test_max_logit_from_the_kernel(key, hopper_always, d, mask, Sq, Skv, hkv, window, fn, ql):
    """return_max_logit runs the Hopper forward: the max over the kept logits (after the
    scale and the score_mod) of each head, as the reference's, with out and lse; a sequence
    of no queries adds nothing."""
    q, k, v, _ = inputs(key, jnp.bfloat16, Sq, Skv, hkv, 2.0, d=d)
    slopes = jnp.exp2(-8.0 * jnp.arange(1, HQ + 1, dtype=jnp.float32) / HQ).reshape(1, HQ, 1, 1)
    sm, ref_fn, ops = {}, identity, ()
    if fn == "alibi":
        sm, ref_fn, ops = dict(score_mod=alibi_causal, score_mod_operands=(slopes,)), alibi_causal, (slopes,)
    elif fn is not None:
        sm, ref_fn = dict(score_mod=fn), fn
    sd, lens = None, {}
    if ql is not None:
        qlen = jnp.asarray(ql, jnp.int32)
        sd = fusedattn.SequenceDescriptor.from_seqlens((qlen, qlen))
        lens = dict(q_seqlens=qlen, kv_seqlens=qlen)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask,
                                                window_size=window, return_max_logit=True,
                                                return_aux=True, **sm)
    (out, aux), ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    ref_out, ref_lse, ref_max = ref_call(q, k, v, ref_fn, ops, attn_mask_type=mask,
                                         window_size=window, **lens)
    close("out", out, ref_out)
    want = np.max(np.asarray(ref_max), axis=0)  # [Hq]
    got = np.asarray(aux["max_logit"])
    assert got.shape == want.shape == (HQ,)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("d", [64, 256], ids=["d64", "d256"])
def test_max_logit_nan_in_k(key, hopper_always, d):
    """A NaN among a head's kept scores makes its max_logit NaN (the other heads' stay)."""
    q, k, v, _ = inputs(key, jnp.bfloat16, 512, 512, 2, d=d)
    k = k.at[0, 100, 1, 5].set(jnp.nan)  # kv head 1: query heads HQ/2 .. HQ-1 see it
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                                return_max_logit=True)
    (_, aux), ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    want = np.asarray(nan_max(
        ref_call(q, k, v, identity, (), attn_mask_type=AttnMaskType.CAUSAL_MASK)[2], axis=0))
    got = np.asarray(aux["max_logit"])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).sum() == HQ // 2
    fin = ~np.isnan(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=2e-3, atol=2e-3)


SINK_CASES = [  # d, softmax, mask, Sq, Skv, Hkv, window, fn, q / kv lengths (padding)
    (128, "off_by_one", AttnMaskType.CAUSAL_MASK, 700, 700, 2, None, None, None),
    (128, "learnable", AttnMaskType.NO_MASK, 300, 777, 4, None, cap50, None),
    (64, "learnable", AttnMaskType.CAUSAL_MASK, 900, 900, 1, (100, 0), None, None),
    (256, "learnable", AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 2, None, None, None),
    (128, "learnable", AttnMaskType.PADDING_CAUSAL_MASK, 640, 640, 2, None, None, ((640, 300), (0, 640))),
]


@pytest.mark.parametrize("d,softmax,mask,Sq,Skv,hkv,window,fn,lens", SINK_CASES,
                         ids=["off-by-one-causal", "learnable-full-cap50", "d64-learnable-window",
                              "d256-learnable-bottom-right", "learnable-rows-of-no-keys"])
def test_sinks_forward_and_gradients(key, hopper_always, d, softmax, mask, Sq, Skv, hkv, window, fn,
                                     lens):
    """Sinks (OFF_BY_ONE / LEARNABLE softmax: one extra logit a head in the denominator and
    lse) in the kernel's epilogue; the backward reads its lse: out, lse, and the
    gradients of q, k, v and the learnable offset against the reference. Rows that keep no
    key (batch row 0 of the last case, no keys) get out 0 and lse = their head's sink."""
    q, k, v, dout = inputs(key, jnp.bfloat16, Sq, Skv, hkv, 2.0, d=d)
    stype = (fusedattn.SoftmaxType.OFF_BY_ONE_SOFTMAX if softmax == "off_by_one"
             else fusedattn.SoftmaxType.LEARNABLE_SOFTMAX)
    offset = jnp.linspace(-3.0, 6.0, HQ, dtype=jnp.float32)
    sd, kw = None, {}
    if lens is not None:
        ql, kl = (jnp.asarray(x, jnp.int32) for x in lens)
        sd = fusedattn.SequenceDescriptor.from_seqlens((ql, kl))
        kw = dict(q_seqlens=ql, kv_seqlens=kl)
    sm = {} if fn is None else dict(score_mod=fn)

    def ours(q, k, v, offset):
        return fusedattn.fused_attn((q, k, v), None, sd, None, attn_mask_type=mask,
                                    window_size=window, softmax_type=stype,
                                    softmax_offset=offset if softmax == "learnable" else None,
                                    return_aux=True, **sm)

    def ref(q, k, v, offset):
        return ref_call(q, k, v, fn or identity, (), attn_mask_type=mask, window_size=window,
                        softmax_type=stype,
                        softmax_offset=offset if softmax == "learnable" else None, **kw)

    ref_out, ref_lse, _ = ref(q, k, v, offset)
    (out, aux), ran = runs_hopper(ours, q, k, v, offset)
    assert ran, "the Hopper forward did not run"
    close("out", out, ref_out)
    lse = np.asarray(aux["softmax_aux"])[..., 0]
    ref_lse = np.asarray(ref_lse).reshape(lse.shape)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=2e-3, rtol=1e-3)
    if lens is not None:  # batch row 0 keeps no key: lse is the sink, out 0
        np.testing.assert_allclose(lse[0], np.broadcast_to(np.asarray(offset)[:, None], lse[0].shape),
                                   rtol=1e-6)
        assert not np.asarray(out[0], np.float32).any()
    args = (q, k, v, offset) if softmax == "learnable" else (q, k, v)
    check(lambda *a: ours(*a, *((offset,) if len(a) == 3 else ()))[0],
          lambda *a: ref(*a, *((offset,) if len(a) == 3 else ())), args, dout,
          SM_TARGETS if fn else PLAIN_TARGETS)


def _dense_mask(name, Sq, Skv):
    i, j = np.arange(Sq)[:, None], np.arange(Skv)[None, :]
    if name == "causal":
        m = (j <= i)[None, None]
    elif name == "window":  # a 300-key causal window, per head a little wider
        m = np.stack([(j <= i) & (j >= i - 300 - 40 * h) for h in range(HQ)])[None]
    elif name == "holes":  # random keys dropped over a band, some rows keep nothing
        rng = np.random.default_rng(0)
        m = ((j <= i + 30) & (j >= i - 200) & (rng.random((Sq, Skv)) < 0.8))[None, None]
        m[..., 7, :] = False
        m[..., 450, :] = False
    else:  # "padding": batch row 1 keeps 400 keys and 500 queries, row 0 everything
        m = np.stack([np.ones((Sq, Skv), bool), (i < 500) & (j < 400)])[:, None]
    return jnp.asarray(m)


DENSE_CASES = [  # name, Sq, Skv, Hkv, head dim
    ("causal", 1000, 1000, 2, D),
    ("window", 700, 900, 4, 64),
    ("holes", 600, 650, 1, 256),
    ("padding", 640, 640, 4, D),
]


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name,Sq,Skv,hkv,d", DENSE_CASES, ids=[c[0] for c in DENSE_CASES])
def test_dense_mask_forward_and_gradients(key, dtype, name, Sq, Skv, hkv, d):
    """dot_product_attention(mask=dense) runs the Hopper forward (the folded mask's dropped keys
    skipped by tile, the mixed tiles read) and the Hopper backward (the same tiles skipped; head
    dim 256's 64-key blocks too; rows that keep nothing: out
    jax's average of V, gradients finite). Output and gradients against float32 jax: within
    3x the error of jax's own XLA path in the same dtype (+ a small floor)."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d)
    mask = _dense_mask(name, Sq, Skv)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
    ours = lambda q, k, v: fusedattn.dot_product_attention(q, k, v, mask=mask)
    xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    f32 = lambda f: lambda q, k, v: f(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
    out, ran = runs_hopper(ours, q, k, v)
    assert ran, "the Hopper forward did not run"
    g = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))
    hlo = g.lower(q, k, v).compile().as_text()
    assert 'custom_call_target="fusedattn_attn_bwd_cuda"' in hlo
    before = _lib.hopper_bwd_launches()
    got = (out,) + tuple(jax.block_until_ready(g(q, k, v)))
    assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"
    base = (jax.jit(xla)(q, k, v),) + tuple(jax.jit(jax.grad(loss(xla), argnums=(0, 1, 2)))(q, k, v))
    ref = (jax.jit(f32(xla))(q, k, v),) + tuple(
        jax.jit(jax.grad(loss(f32(xla)), argnums=(0, 1, 2)))(q, k, v))
    for what, a, b, r in zip(("out", "dq", "dk", "dv"), got, base, ref):
        a, b, r = (np.asarray(jnp.asarray(x, jnp.float32)) for x in (a, b, r))
        assert not np.isnan(a).any(), what
        scale = max(1.0, float(np.abs(r).max()))
        err, err_base = float(np.abs(a - r).max()), float(np.abs(b - r).max())
        assert err <= 3.0 * err_base + 2e-3 * scale, (what, err, err_base)


def test_dense_mask_with_a_learned_bias_gets_the_hopper_dbias(key):
    """A mask with a bias whose gradient is taken: the Hopper backward computes dbias (dS of
    the folded bias, summed over the batch in float32 where it broadcasts), and dq and dbias
    match float32 jax."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 512, 512, 2, 2.0)
    mask = _dense_mask("causal", 512, 512)
    bias = (0.3 * jax.random.normal(jax.random.PRNGKey(7), (1, 1, 512, 512))).astype(jnp.bfloat16)
    loss = lambda f: lambda q, bias: jnp.sum(f(q, bias).astype(jnp.float32) * dout.astype(jnp.float32))
    ours = lambda q, bias: fusedattn.dot_product_attention(q, k, v, bias=bias, mask=mask)
    ref = lambda q, bias: jax.nn.dot_product_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
        bias=bias.astype(jnp.float32), mask=mask, implementation="xla")
    before = _lib.hopper_bwd_launches()
    got = jax.block_until_ready(jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(q, bias))
    assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"
    want = jax.jit(jax.grad(loss(ref), argnums=(0, 1)))(q, bias)
    for what, a, r in zip(("dq", "dbias"), got, want):
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        assert np.abs(a - r).max() <= 2e-2 * max(1.0, np.abs(r).max()), what


def test_dense_causal_mask_equals_the_mask_type(key, hopper_always):
    """The same kernel through a dense causal mask and through CAUSAL_MASK: the diagonal tiles
    read the mask, the others skip it or run clean, so out and lse agree bit for bit."""
    q, k, v, _ = inputs(key, jnp.bfloat16, 1000, 1000, 2, 2.0)
    mask = _dense_mask("causal", 1000, 1000)
    dense = lambda q, k, v: fusedattn.dot_product_attention(q, k, v, mask=mask, return_residual=True)
    typed = lambda q, k, v: fusedattn.dot_product_attention(q, k, v, is_causal=True,
                                                            return_residual=True)
    (a, ra), ran_a = runs_hopper(dense, q, k, v)
    (b, rb), ran_b = runs_hopper(typed, q, k, v)
    assert ran_a and ran_b
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    np.testing.assert_array_equal(np.asarray(ra, np.float32), np.asarray(rb, np.float32))


PRE, POST = fusedattn.AttnBiasType.PRE_SCALE_BIAS, fusedattn.AttnBiasType.POST_SCALE_BIAS
BIAS_CASES = [  # bias type, mask, Sq, Skv, Hkv, the bias's batch and head extents, head dim, window
    (PRE, AttnMaskType.CAUSAL_MASK, 512, 512, 2, (1, HQ), D, None),
    (PRE, AttnMaskType.NO_MASK, 300, 777, 4, (B, 1), 64, None),
    (PRE, AttnMaskType.CAUSAL_MASK, 704, 704, 1, (B, HQ), 256, (200, 0)),
    (POST, AttnMaskType.NO_MASK, 640, 640, 2, (1, HQ), D, None),
    (POST, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 200, 650, 4, (1, 1), 64, None),
    (POST, AttnMaskType.CAUSAL_MASK, 1000, 1000, 2, (B, 1), 64, None),
    (PRE, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, 384, 520, 4, (1, HQ), 256, None),
]
# (Skv a multiple of 8: the bias's rows in 16-byte units, its tiles through the copy engine;
# 777 and 650: read a score at a time.)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("bias_type,mask,Sq,Skv,hkv,extents,d,window", BIAS_CASES,
                         ids=["pre-causal-1h", "pre-full-b1-d64", "pre-window-bh-d256",
                              "post-full-1h", "post-bottom-right-11-d64", "post-causal-b1-d64",
                              "pre-bottom-right-1h-d256"])
def test_bias_forward_and_gradients(key, dtype, bias_type, mask, Sq, Skv, hkv, extents, d, window):
    """A pre- or post-scale bias (not a folded mask): with set_hopper_fwd("always") the Hopper
    forward adds it (by default where Skv is a multiple of 8: its tiles through the copy
    engine, faster than cuDNN's and the CUDA flash kernels' forward; else those, except a
    pre-scale bias at head dim 256: bench/RESULTS.md), the backward (dbias too) is the Hopper
    kernel's, the CUDA flash kernels' or cuDNN's, reading this forward's lse. out, lse, and
    the gradients of q, k, v and the bias against the float32 reference."""
    q, k, v, dout = inputs(key, dtype, Sq, Skv, hkv, 2.0, d=d)
    bias = (2.0 * jax.random.normal(jax.random.fold_in(key, 9), extents + (Sq, Skv))).astype(dtype)
    kw = dict(attn_mask_type=mask, window_size=window, attn_bias_type=bias_type)
    ours = lambda q, k, v, bias: fusedattn.fused_attn((q, k, v), bias, None, None,
                                                      return_aux=True, **kw)
    ref = lambda q, k, v, bias: ref_call(q, k, v, identity, (), bias=bias.astype(jnp.float32), **kw)
    backend = lambda: fusedattn.get_backend((q, k, v), bias, attn_bias_type=bias_type,
                                            attn_mask_type=mask, window_size=window, platform="gpu")
    # the default: the Hopper forward where it reads the bias as tiles (Skv a multiple of 8),
    # or a pre-scale bias at head dim 256
    info = backend()
    assert (info.forward == "hopper") == (Skv % 8 == 0 or (bias_type == PRE and d == 256)), info
    assert info.backward in ("cudnn", "cuda_flash", "hopper"), info
    _lib.set_hopper_fwd("always")
    try:
        info = backend()
        assert info.forward == "hopper" and info.backward in ("cudnn", "cuda_flash", "hopper"), info
        ref_out, ref_lse, _ = ref(q, k, v, bias)
        (out, aux), ran = runs_hopper(ours, q, k, v, bias)
        assert ran, "the Hopper forward did not run"
        close("out", out, ref_out)
        lse = np.asarray(aux["softmax_aux"])[..., 0]
        assert not np.isnan(lse).any()
        np.testing.assert_allclose(lse, np.asarray(ref_lse).reshape(lse.shape), atol=2e-3, rtol=1e-3)
        check(lambda *a: ours(*a)[0], ref, (q, k, v, bias), dout, PLAIN_TARGETS)
    finally:
        _lib.set_hopper_fwd(None)


def test_bias_nan_gives_nan_rows(key):
    """NaN in a pre-scale bias: the rows it reaches give NaN on the Hopper forward (sent
    there by set_hopper_fwd("always")), the others the reference's values."""
    q, k, v, _ = inputs(key, jnp.bfloat16, 256, 256, 2, 1.0)
    bias = (0.5 * jax.random.normal(jax.random.fold_in(key, 3), (1, HQ, 256, 256))).astype(jnp.bfloat16)
    bias = bias.at[0, 1, 37, 200].set(jnp.nan)
    kw = dict(attn_mask_type=AttnMaskType.NO_MASK, attn_bias_type=PRE)
    _lib.set_hopper_fwd("always")
    try:
        out, ran = runs_hopper(lambda q, k, v, b: fusedattn.fused_attn((q, k, v), b, None, None, **kw),
                               q, k, v, bias)
    finally:
        _lib.set_hopper_fwd(None)
    assert ran
    out = np.asarray(out, np.float32)
    nan_rows = np.isnan(out).any(axis=-1)  # [B, Sq, Hq]
    want = np.zeros_like(nan_rows)
    want[:, 37, 1] = True  # the bias broadcasts over the batch
    np.testing.assert_array_equal(nan_rows, want)
    ref_out = ref_call(q, k, v, identity, (), bias=bias.astype(jnp.float32), **kw)[0]
    close("out", np.where(want[..., None], 0.0, out), np.where(want[..., None], 0.0, ref_out))


def test_bias_past_cudnns_indexing(key):
    """A broadcast bias of 2^31 elements ([1, 32, 8192, 8192], 4 GiB): cuDNN indexes 32 bits and
    a broadcast bias cannot be cut into batch chunks, so the call goes to the flash branch,
    whose Hopper forward reads the bias's tiles. The first and last 64 rows of two heads
    against the reference (those rows, every key)."""
    S, H, d = 8192, 32, 64
    ks = jax.random.split(key, 4)
    q, k, v = (jax.random.normal(kk, (1, S, H, d), jnp.bfloat16) for kk in ks[:3])
    bias = jax.random.normal(ks[3], (1, H, S, S), jnp.bfloat16)
    kw = dict(attn_bias_type=POST, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    info = fusedattn.get_backend((q, k, v), bias, platform="gpu", **kw)
    assert info.name == "cuda_flash" and info.forward == "hopper" and "2^31 - 1" in info.reason, info
    out, ran = runs_hopper(lambda q, k, v, b: fusedattn.fused_attn((q, k, v), b, None, None, **kw),
                           q, k, v, bias)
    assert ran, "the Hopper forward did not run"
    f32 = lambda x: np.asarray(x, np.float32)
    for h in (0, H - 1):
        for first in (0, S - 64):
            rows = slice(first, first + 64)
            s = f32(q[0, rows, h]) @ f32(k[0, :, h]).T * d ** -0.5 + f32(bias[0, h, rows])
            s = np.where(np.arange(S)[None, :] <= np.arange(first, first + 64)[:, None], s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            want = (p / p.sum(-1, keepdims=True)) @ f32(v[0, :, h])
            np.testing.assert_allclose(f32(out[0, rows, h]), want, atol=2e-2, rtol=2e-2,
                                       err_msg=f"head {h}, rows {first}..")
