"""fused_attn_small_seq under jit, vmap, grad and checkpoint; agreement with fused_attn
where both serve a call; the eligibility query that fused_attn's dispatch will ask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SmallSeqDescriptor, SoftmaxType
from fusedattn import _lib
from fusedattn import small_seq as ss
from small_seq_cases import bshd_case, thd_case

P, N, H, D = 3, 5, 2, 64


def packs(key):
    """P packs of THD segments, each with its own offsets and lengths, same shapes."""
    cases = [thd_case(jax.random.fold_in(key, i), np.random.default_rng(i).integers(0, 9, N),
                      width=8, heads=(H, H), dim=D, pad_kv=1) for i in range(P)]
    tq = max(c.q.shape[0] for c in cases)
    tkv = max(c.k.shape[0] for c in cases)
    pad = lambda x, t: jnp.pad(x, ((0, t - x.shape[0]), (0, 0), (0, 0)))
    q = jnp.stack([pad(c.q, tq) for c in cases])
    k = jnp.stack([pad(c.k, tkv) for c in cases])
    v = jnp.stack([pad(c.v, tkv) for c in cases])
    sd = SmallSeqDescriptor.from_cu_seqlens(
        np.stack([c.q_offsets for c in cases]), np.stack([c.kv_offsets for c in cases]),
        max_segment_seqlen_kv=8, q_seqlens=np.stack([c.q_lens for c in cases]),
        kv_seqlens=np.stack([c.kv_lens for c in cases]))
    return q, k, v, sd


def call(q, k, v, sd, layout=QKVLayout.THD_THD_THD, mask=AttnMaskType.PADDING_MASK):
    return fusedattn.fused_attn_small_seq((q, k, v), None, sd, None, attn_mask_type=mask,
                                          qkv_layout=layout)


def slice_sd(sd, i):
    return jax.tree.map(lambda x: x[i], sd)


def test_jit_with_traced_offsets_matches_eager(key):
    c = thd_case(key, [3, 0, 5, 8], heads=(H, H), dim=D, pad_kv=2)
    eager = call(c.q, c.k, c.v, c.sd)
    jitted = jax.jit(call)(c.q, c.k, c.v, c.sd)
    np.testing.assert_array_equal(np.asarray(eager), np.asarray(jitted))


def test_vmap_over_thd_packs(key):
    q, k, v, sd = packs(key)
    got = jax.jit(jax.vmap(call))(q, k, v, sd)
    for i in range(P):
        np.testing.assert_array_equal(np.asarray(got[i]),
                                      np.asarray(call(q[i], k[i], v[i], slice_sd(sd, i))))


def test_vmap_grad_over_thd_packs(key):
    q, k, v, sd = packs(key)
    dout = normal(key, q.shape)
    loss = lambda q, k, v, sd: jnp.sum(call(q, k, v, sd) * dout[0])
    g = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(q, k, v, sd)
    for i in range(P):
        gi = jax.grad(loss, argnums=(0, 1, 2))(q[i], k[i], v[i], slice_sd(sd, i))
        for a, b in zip(g, gi):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_vmap_over_bshd(key):
    ks = jax.random.split(key, 3)
    q = normal(ks[0], (P, N, 1, H, D))
    k = normal(ks[1], (P, N, 7, H, D))
    v = normal(ks[2], (P, N, 7, H, D))
    f = lambda q, k, v: call(q, k, v, None, QKVLayout.BSHD_BSHD_BSHD, AttnMaskType.NO_MASK)
    got = jax.vmap(f)(q, k, v)
    for i in range(P):
        np.testing.assert_array_equal(np.asarray(got[i]), np.asarray(f(q[i], k[i], v[i])))


def test_checkpoint_gives_the_same_grads(key):
    c = thd_case(key, [3, 7, 1], heads=(H, H), dim=D)
    loss = lambda q, k, v: jnp.sum(call(q, k, v, c.sd) * c.dout)
    g1 = jax.grad(loss, argnums=(0, 1, 2))(c.q, c.k, c.v)
    g2 = jax.grad(jax.checkpoint(loss), argnums=(0, 1, 2))(c.q, c.k, c.v)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("mask", [AttnMaskType.NO_MASK, AttnMaskType.PADDING_MASK,
                                  AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK])
def test_agrees_with_fused_attn_on_bshd(key, mask):
    c = bshd_case(key, 6, 12, kv_lens=[12, 3, 1, 0, 7, 12] if mask.is_padding() else None,
                  heads=(4, 2), dim=64, mask=mask)
    ours = c.call()
    general = fusedattn.fused_attn((c.q, c.k, c.v), None, c.sd, None, attn_mask_type=mask)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(general), rtol=2e-6, atol=2e-6)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * c.dout)
    g1 = jax.grad(loss(lambda q, k, v: c.call(q, k, v)), argnums=(0, 1, 2))(c.q, c.k, c.v)
    g2 = jax.grad(loss(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, c.sd, None, attn_mask_type=mask)), argnums=(0, 1, 2))(c.q, c.k, c.v)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Eligibility (what fused_attn's dispatch asks)


def attn_params(**overrides):
    p = dict(batch=30720, seqlen_q=1, seqlen_kv=16, heads_q=8, heads_kv=8, head_dim_qk=128,
             head_dim_v=128, window_left=-1, window_right=-1,
             dtype=_lib.DTYPE_CODES["bfloat16"], layout=int(QKVLayout.BSHD_BSHD_BSHD),
             mask_type=int(AttnMaskType.NO_MASK), bias_type=int(AttnBiasType.NO_BIAS),
             softmax_type=int(SoftmaxType.VANILLA_SOFTMAX), is_training=1, scale=0.1,
             dropout=0.0)
    p.update(overrides)
    return _lib.AttnParams(**p)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_bshd_one_query_is_served(platform):
    served, reason = ss.small_seq_eligibility(ss.small_seq_params(attn_params()), platform)
    assert served == (platform == "cpu" or _lib.built_with_cuda()), reason
    if served:
        assert reason.startswith("small_seq:"), reason


def test_head_dim_512_is_served():
    served, reason = ss.small_seq_eligibility(
        ss.small_seq_params(attn_params(head_dim_qk=512, head_dim_v=512)), "cpu")
    assert served, reason


def test_thd_with_the_promises_is_served():
    p = ss.small_seq_params(attn_params(layout=int(QKVLayout.THD_THD_THD),
                                        mask_type=int(AttnMaskType.PADDING_MASK)),
                            num_segments=30720, tokens_q=30720, tokens_kv=30720 * 16,
                            max_segment_seqlen_q=1, max_segment_seqlen_kv=16)
    served, reason = ss.small_seq_eligibility(p, "cpu")
    assert served, reason


@pytest.mark.parametrize("overrides, hints, why", [
    (dict(seqlen_q=2), {}, "one query per segment"),
    (dict(seqlen_kv=65), {}, "1..64"),
    (dict(head_dim_qk=96, head_dim_v=96), {}, "64, 128, 256 or 512"),
    (dict(head_dim_v=64), {}, "head dims"),
    (dict(bias_type=int(AttnBiasType.POST_SCALE_BIAS)), {}, "attn_bias_type"),
    (dict(softmax_type=int(SoftmaxType.OFF_BY_ONE_SOFTMAX)), {}, "softmax_type"),
    (dict(dropout=0.1), {}, "dropout"),
    (dict(window_left=4), {}, "window_size"),
    (dict(layout=int(QKVLayout.BS3HD)), {}, "BSHD_BSHD_BSHD or THD_THD_THD"),
    (dict(layout=int(QKVLayout.THD_THD_THD), mask_type=int(AttnMaskType.PADDING_MASK)),
     dict(num_segments=10, tokens_q=10, tokens_kv=40), "max_segment_seqlen_kv"),
])
def test_not_served_says_why(overrides, hints, why):
    served, reason = ss.small_seq_eligibility(
        ss.small_seq_params(attn_params(**overrides), **hints), "cpu")
    assert not served
    assert why in reason, reason


def test_eligibility_platform_names():
    with pytest.raises(ValueError, match="platform='tpu'"):
        ss.small_seq_eligibility(ss.small_seq_params(attn_params()), "tpu")


def test_fused_attn_eligibility_reads_the_descriptor():
    thd = attn_params(layout=int(QKVLayout.THD_THD_THD), mask_type=int(AttnMaskType.PADDING_MASK))
    cu = np.arange(11, dtype=np.int32)
    sd = SmallSeqDescriptor.from_cu_seqlens(cu, cu * 4, max_segment_seqlen_kv=4)
    served, reason = ss.fused_attn_eligibility(thd, sd, tokens_q=10, tokens_kv=40, platform="cpu")
    assert served, reason
    # Without the promise of THD keys per segment it does not serve, and says so.
    plain = fusedattn.SequenceDescriptor.from_seqlens(np.ones(10, np.int32))
    served, reason = ss.fused_attn_eligibility(thd, plain, tokens_q=10, tokens_kv=40,
                                               platform="cpu")
    assert not served and "max_segment_seqlen_kv" in reason, reason
    # BSHD: the shapes are the promise.
    served, reason = ss.fused_attn_eligibility(attn_params(), None, platform="cpu")
    assert served, reason


# ---------------------------------------------------------------------------
# Automatic dispatch from fused_attn


def _targets(f, *args):
    return jax.jit(f).lower(*args).as_text()


def test_fused_attn_dispatches_thd_with_the_promise(key):
    """fusedattn.SequenceDescriptor with max_segment_seqlen_kv: fused_attn runs the
    small-seq kernels (seen in the HLO), get_backend says so, and the answer (forward
    and gradients) is the general backend's."""
    q, k, v, sd = packs(key)
    lens_q, lens_kv = np.asarray(sd.q_seqlens), np.asarray(sd.kv_seqlens)
    plain = fusedattn.SequenceDescriptor.from_seqlens_and_offsets(
        (lens_q, lens_kv), (np.asarray(sd.q_offsets), np.asarray(sd.kv_offsets)))
    promised = plain.with_max_segment_seqlens(1, 8)
    kw = dict(attn_mask_type=AttnMaskType.PADDING_MASK, qkv_layout=QKVLayout.THD_THD_THD,
              max_segments_per_seq=N)
    f = lambda sd_: lambda q, k, v: fusedattn.fused_attn((q, k, v), None, sd_, None, **kw)
    assert "fusedattn_small_seq_fwd" in _targets(f(promised), q, k, v)
    assert "fusedattn_small_seq_fwd" not in _targets(f(plain), q, k, v)
    info = fusedattn.get_backend((q, k, v), None, promised, **kw)
    assert info.name == "small_seq" and info.fused, info
    assert fusedattn.get_backend((q, k, v), None, plain, **kw).name != "small_seq"
    np.testing.assert_allclose(np.asarray(f(promised)(q, k, v)),
                               np.asarray(f(plain)(q, k, v)), rtol=2e-6, atol=2e-6)
    dout = normal(jax.random.fold_in(key, 7), q.shape, q.dtype)
    grads = lambda g: jax.grad(lambda *a: jnp.sum(g(*a) * dout), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(grads(f(promised)), grads(f(plain))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_fused_attn_dispatches_bshd_with_the_promise(key):
    c = bshd_case(key, 6, 12, kv_lens=[12, 3, 1, 0, 7, 12], heads=(4, 2), dim=64,
                  mask=AttnMaskType.PADDING_MASK)
    plain = fusedattn.SequenceDescriptor.from_seqlens((np.ones(6, np.int32), c.kv_lens))
    promised = fusedattn.SequenceDescriptor.from_seqlens(
        (np.ones(6, np.int32), c.kv_lens), max_segment_seqlen_q=1, max_segment_seqlen_kv=12)
    f = lambda sd_: lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, sd_, None, attn_mask_type=AttnMaskType.PADDING_MASK)
    assert "fusedattn_small_seq_fwd" in _targets(f(promised), c.q, c.k, c.v)
    assert fusedattn.get_backend((c.q, c.k, c.v), None, promised,
                                 attn_mask_type=AttnMaskType.PADDING_MASK).name == "small_seq"
    np.testing.assert_allclose(np.asarray(f(promised)(c.q, c.k, c.v)),
                               np.asarray(f(plain)(c.q, c.k, c.v)), rtol=2e-6, atol=2e-6)


def test_fused_attn_keeps_the_general_backend_when_small_seq_cannot_serve(key):
    """Statistics, a bias or a softmax type small-seq does not have: the promise is
    read, the general backend runs, and get_backend says which."""
    c = bshd_case(key, 4, 8, heads=(2, 2), dim=64, mask=AttnMaskType.NO_MASK)
    promised = fusedattn.SequenceDescriptor.from_seqlens(
        (np.ones(4, np.int32), np.full(4, 8, np.int32)), max_segment_seqlen_kv=8)
    out, aux = fusedattn.fused_attn((c.q, c.k, c.v), None, promised, None,
                                    return_max_logit=True)
    assert aux["max_logit"].shape == (2,)
    info = fusedattn.get_backend((c.q, c.k, c.v), None, promised,
                                 softmax_type=SoftmaxType.OFF_BY_ONE_SOFTMAX)
    assert info.name != "small_seq", info
    assert "fusedattn_small_seq_fwd" not in _targets(
        lambda q, k, v: fusedattn.fused_attn((q, k, v), None, promised, None,
                                             softmax_type=SoftmaxType.OFF_BY_ONE_SOFTMAX),
        c.q, c.k, c.v)


def test_promise_must_be_a_positive_int():
    sd = fusedattn.SequenceDescriptor.from_seqlens(np.ones(2, np.int32))
    with pytest.raises(ValueError, match="max_segment_seqlen_kv must be a Python int >= 1"):
        sd.with_max_segment_seqlens(1, 0)
