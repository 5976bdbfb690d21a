"""score_mod (flex attention) on the CPU engine: the lowered program run inside the kernel,
forward, gradients (q, k, v and the operands) and statistics against the reference with
fn applied over the materialized scores; the lowering's checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import assert_close, normal
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType
from fusedattn import score_mod as sm_mod
from fusedattn.reference import attention_reference

B, S, HQ, HKV, D = 2, 80, 4, 2, 32


def softcap(s, b, h, q, k):
    return jnp.tanh(s / 2.0) * 2.0


def alibi(s, b, h, q, k, slopes):
    return s - slopes * jnp.abs(q - k).astype(jnp.float32)


def relpos(s, b, h, q, k, table, scale):
    return s + scale * table * jnp.maximum(q - k, 0).astype(jnp.float32) / 80.0


def causal(s, b, h, q, k):
    return jnp.where(q >= k, s, -jnp.inf)


def learnable(s, b, h, q, k, w):
    return s * w + jax.nn.sigmoid(s)


def alibi_plus_table(s, b, h, q, k, slopes, table):
    return s - slopes * jnp.abs(q - k).astype(jnp.float32) + table


def inputs(key, dtype=jnp.float32, Sq=S, Skv=S):
    kq, kk, kv, kd = jax.random.split(key, 4)
    return (normal(kq, (B, Sq, HQ, D), dtype), normal(kk, (B, Skv, HKV, D), dtype),
            normal(kv, (B, Skv, HKV, D), dtype), normal(kd, (B, Sq, HQ, D), dtype))


def ref_call(q, k, v, fn, operands, **kw):
    """The reference with fn over the grid (float32 math); THD calls pass the segments'
    positions (reference.sequence_positions) on to fn."""
    Sq, Skv = q.shape[1], k.shape[1]
    m, arrays4 = sm_mod.make_score_mod(fn, operands, None, (B, HQ, Sq, Skv))
    thd = kw.get("thd", False)
    out, lse, mx = attention_reference(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
        score_mod=lambda s, qp, kp: sm_mod.apply_reference(
            m.fn, s, arrays4, *((qp, kp) if thd else ())), **kw)
    return out, lse, mx


def check_grads(ours, ref, args, dout):
    """Gradients of sum(out * dout) by q, k, v and the array operands (args after the
    first three): ours (jit) against the reference; operands get 10x the float32 bound
    (their gradient sums over the grid)."""
    argnums = tuple(range(len(args)))
    loss = lambda f: lambda *a: jnp.sum(f(*a)[0] * dout)
    g = jax.jit(jax.grad(loss(ours), argnums=argnums))(*args)
    rg = jax.grad(loss(ref), argnums=argnums)(*args)
    for i, (a, b) in enumerate(zip(g, rg)):
        name_i = ("dq", "dk", "dv")[i] if i < 3 else f"d operand {i - 3}"
        assert a.shape == b.shape, name_i
        scale = max(1.0, float(jnp.max(jnp.abs(b))))
        err = float(jnp.max(jnp.abs(a - b)))
        assert not np.isnan(np.asarray(a)).any(), name_i
        assert err <= 2e-5 * scale * (10 if i >= 3 else 1), f"{name_i}: {err} (max {scale})"


CASES = {
    "softcap": (softcap, lambda key: ()),
    "alibi": (alibi, lambda key: (jnp.exp2(-jnp.arange(1, HQ + 1, dtype=jnp.float32))
                                  .reshape(1, HQ, 1, 1),)),
    "relpos": (relpos, lambda key: (normal(key, (1, 1, S, S)), 0.5)),
    "causal": (causal, lambda key: ()),
    "learnable": (learnable, lambda key: (jnp.float32(0.7),)),
    # two array operands of sizes that are not multiples of the 16-float alignment
    "two_arrays": (alibi_plus_table, lambda key: (
        jnp.exp2(-jnp.arange(1, HQ + 1, dtype=jnp.float32)).reshape(1, HQ, 1, 1),
        normal(key, (B, 1, S, 1)))),
}


def array_operands(ops):
    """(indices of the array operands in ops, full(arrays) -> ops with those arrays put back):
    the tests differentiate with respect to the arrays only; scalars stay Python floats."""
    idx = [i for i, x in enumerate(ops) if not isinstance(x, float)]

    def full(arr):
        f = list(ops)
        for i, a in zip(idx, arr):
            f[i] = a
        return tuple(f)

    return idx, full


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_grads_match_the_reference(key, name):
    fn, make_ops = CASES[name]
    q, k, v, dout = inputs(key)
    ops = make_ops(jax.random.fold_in(key, 1))
    arr_idx, full = array_operands(ops)

    def ours(q, k, v, *arr):
        return fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                    score_mod_operands=full(arr), return_max_logit=True,
                                    return_aux=True)

    def ref(q, k, v, *arr):
        return ref_call(q, k, v, fn, full(arr))

    arrs = [ops[i] for i in arr_idx]
    out, aux = jax.jit(ours)(q, k, v, *arrs)
    ref_out, ref_lse, ref_max = ref(q, k, v, *arrs)
    assert "fusedattn_attn_fwd_sm" in jax.jit(ours).lower(q, k, v, *arrs).as_text()
    assert_close("out", out, ref_out)
    np.testing.assert_allclose(np.asarray(aux["softmax_aux"][..., 0]), np.asarray(ref_lse),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(aux["max_logit"]), np.asarray(jnp.max(ref_max, 0)),
                               rtol=1e-5, atol=1e-5)
    check_grads(ours, ref, (q, k, v, *arrs), dout)


def test_causal_score_mod_equals_the_causal_mask(key):
    q, k, v, _ = inputs(key)
    a = fusedattn.fused_attn((q, k, v), None, None, None, score_mod=causal)
    b = fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=2e-6)


def test_composes_with_mask_bias_gqa_sink_bf16(key):
    q, k, v, dout = inputs(key, jnp.bfloat16, Sq=48, Skv=96)
    bias = normal(jax.random.fold_in(key, 2), (1, HQ, 48, 96), jnp.bfloat16)
    offset = normal(jax.random.fold_in(key, 3), (HQ,))
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK,
              attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
              softmax_type=SoftmaxType.LEARNABLE_SOFTMAX, window_size=(30, 0))

    def ours(q, k, v):
        return fusedattn.fused_attn((q, k, v), bias, None, None, softmax_offset=offset,
                                    score_mod=softcap, **kw)

    def ref(q, k, v):
        return ref_call(q, k, v, softcap, (), bias=bias, softmax_offset=offset, **kw)[0]

    out = ours(q, k, v)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref(q, k, v)),
                               rtol=2e-2, atol=2e-2)
    loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) * dout.astype(jnp.float32))
    for a, b in zip(jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v),
                    jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), rtol=3e-2,
                                   atol=3e-2)


# THD: two packed rows of T tokens, four segment slots each (ragged, one empty, padding
# between and after segments, q and kv segments at different offsets).
T = 80
THD_Q = (np.array([[20, 0, 7, 40], [60, 15, 0, 0]]), np.array([[0, 20, 20, 30, 70],
                                                               [2, 62, 77, 77, 77]]))
THD_KV = (np.array([[25, 3, 9, 30], [50, 20, 0, 0]]), np.array([[5, 30, 33, 42, 72],
                                                                [0, 50, 70, 70, 70]]))


def thd_call(fn, mask, ops):
    """(ours, reference): functions of (q, k, v, *array operands) -> (out, lse) for THD."""
    sd = fusedattn.SequenceDescriptor.from_seqlens_and_offsets(
        (jnp.asarray(THD_Q[0]), jnp.asarray(THD_KV[0])),
        (jnp.asarray(THD_Q[1]), jnp.asarray(THD_KV[1])))
    arr_idx, full = array_operands(ops)

    def ours(q, k, v, *arr):
        out, aux = fusedattn.fused_attn(
            (q, k, v), None, sd, None, attn_mask_type=mask, qkv_layout=QKVLayout.THD_THD_THD,
            max_segments_per_seq=4, score_mod=fn, score_mod_operands=full(arr), return_aux=True)
        return out, aux["softmax_aux"][..., 0]

    def ref(q, k, v, *arr):
        out, lse, _ = ref_call(q, k, v, fn, full(arr), attn_mask_type=mask, thd=True,
                               q_seqlens=THD_Q[0], kv_seqlens=THD_KV[0], q_offsets=THD_Q[1],
                               kv_offsets=THD_KV[1])
        return out, jnp.swapaxes(lse, 1, 2)

    return ours, ref, [ops[i] for i in arr_idx]


@pytest.mark.parametrize("name, mask", [
    ("alibi", AttnMaskType.PADDING_MASK), ("relpos", AttnMaskType.PADDING_MASK),
    ("softcap", AttnMaskType.PADDING_CAUSAL_MASK),
    ("relpos", AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK)])
def test_thd_segments_count_positions_from_their_start(key, name, mask):
    """THD: q_idx / kv_idx are positions in the segment, operands are read there, and the
    forward, lse and every gradient (operands too) match the reference."""
    fn, make_ops = CASES[name]
    ops = make_ops(jax.random.fold_in(key, 1))
    if name == "relpos":  # a [1, 1, T, T] table, read at in-segment positions
        ops = (normal(jax.random.fold_in(key, 1), (1, 1, T, T)), ops[1])
    q, k, v, dout = inputs(key, Sq=T, Skv=T)
    ours, ref, arrs = thd_call(fn, mask, ops)
    out, lse = jax.jit(ours)(q, k, v, *arrs)
    ref_out, ref_lse = ref(q, k, v, *arrs)
    assert_close("out", out, ref_out)
    live = np.isfinite(np.asarray(ref_lse))
    np.testing.assert_allclose(np.asarray(lse)[live], np.asarray(ref_lse)[live], rtol=1e-5,
                               atol=1e-5)
    check_grads(ours, ref, (q, k, v, *arrs), dout)


def test_thd_causal_score_mod_equals_the_causal_mask(key):
    """Positions restart in every segment: a causal score_mod over a padding mask is the
    per-segment PADDING_CAUSAL_MASK."""
    q, k, v, _ = inputs(key, Sq=T, Skv=T)
    a = thd_call(causal, AttnMaskType.PADDING_MASK, ())[0](q, k, v)[0]
    b = thd_call(None, AttnMaskType.PADDING_CAUSAL_MASK, ())[0](q, k, v)[0]
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=2e-6)


def test_reference_positions_path_equals_the_grid_path(key):
    """apply_reference with explicit positions (the THD path) and without (BSHD) agree
    when the positions are the grid's own indices."""
    s = normal(key, (B, HQ, 24, 40))
    table = normal(jax.random.fold_in(key, 1), (1, 1, 24, 40))
    m, arrays4 = sm_mod.make_score_mod(relpos, (table, 0.5), None, s.shape)
    qp = jnp.broadcast_to(jnp.arange(24, dtype=jnp.int32), (B, 24))
    kp = jnp.broadcast_to(jnp.arange(40, dtype=jnp.int32), (B, 24, 40))
    np.testing.assert_array_equal(np.asarray(sm_mod.apply_reference(m.fn, s, arrays4, qp, kp)),
                                  np.asarray(sm_mod.apply_reference(m.fn, s, arrays4)))


def test_user_bprop_overrides_the_derived_backward(key):
    q, k, v, dout = inputs(key)
    # a bprop that is the true derivative of softcap gives the same grads as the derived one
    good = lambda ds, s, b, h, qi, ki: ds * (1 - jnp.tanh(s / 2.0) ** 2)
    zero = lambda ds, s, b, h, qi, ki: ds * 0.0

    def grads(bprop):
        f = lambda q: jnp.sum(fusedattn.fused_attn((q, k, v), None, None, None, score_mod=softcap,
                                                   score_mod_bprop=bprop) * dout)
        return jax.grad(f)(q)

    np.testing.assert_allclose(np.asarray(grads(good)), np.asarray(grads(None)), rtol=1e-5,
                               atol=1e-5)
    assert float(jnp.max(jnp.abs(grads(zero)))) == 0.0


def test_vmap_and_jit(key):
    q, k, v, _ = inputs(key)
    slopes = jnp.stack([jnp.full((1, HQ, 1, 1), 0.1), jnp.full((1, HQ, 1, 1), 0.3)])
    f = lambda s: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=alibi,
                                       score_mod_operands=(s,))
    got = jax.jit(jax.vmap(f))(slopes)
    for i in range(2):
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(f(slopes[i])), rtol=1e-6,
                                   atol=1e-6)


@pytest.mark.parametrize("fn, what", [
    (lambda s, b, h, q, k: jnp.sum(jnp.ones(3)) * s, "works on scalars"),
    (lambda s, b, h, q, k: jnp.cumsum(s), "must return one float scalar"),
    (lambda s, b, h, q, k: q, "must return one float scalar"),
    (lambda s, b, h, q, k: s + (q & k), "bitwise 'and'"),
    (lambda s, b, h, q, k: jnp.arctan2(s, 1.0), "operation 'atan2' is not supported"),
])
def test_bad_functions_are_rejected(fn, what):
    x = jnp.ones((1, 8, 2, 16))
    with pytest.raises(ValueError, match=what.replace("(", r"\(")):
        fusedattn.fused_attn((x, x, x), None, None, None, score_mod=fn)


def test_bad_operands_are_rejected():
    x = jnp.ones((1, 8, 2, 16))
    with pytest.raises(ValueError, match=r"score_mod_operands\[0\] has shape \(3,\)"):
        fusedattn.fused_attn((x, x, x), None, None, None, score_mod=alibi,
                             score_mod_operands=(jnp.ones((3,)),))
    with pytest.raises(ValueError, match="score_mod must be a function"):
        fusedattn.fused_attn((x, x, x), None, None, None, score_mod=3)


def test_the_program_matches_the_function():
    m, arrays4 = sm_mod.make_score_mod(relpos, (jnp.ones((1, 1, 4, 4)), 0.5), None, (1, 1, 4, 4))
    s = np.linspace(-3, 3, 16, dtype=np.float32).reshape(1, 1, 4, 4)
    grid = np.meshgrid(*[np.arange(n) for n in (1, 1, 4, 4)], indexing="ij")
    got = m.fwd.evaluate(s, *grid, np.broadcast_to(np.asarray(arrays4[0]), s.shape))
    want = sm_mod.apply_reference(m.fn, jnp.asarray(s), arrays4)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6, atol=1e-6)


def test_get_backend_names_the_score_mod_path():
    x = jax.ShapeDtypeStruct((1, 8, 2, 16), jnp.float32)
    info = fusedattn.get_backend((x, x, x), score_mod=softcap, platform="cpu")
    assert (info.name, info.fused) == ("cpu_flash", True), info
    # the CPU engine computes the operands' gradient in-kernel too
    slopes = jnp.ones((1, 2, 1, 1))
    info = fusedattn.get_backend((x, x, x), score_mod=alibi, score_mod_operands=(slopes,),
                                 platform="cpu", is_training=True, score_mod_grads=True)
    assert (info.name, info.fused) == ("cpu_flash", True), info
    # On the GPU a score_mod call goes where the plain call goes (cuDNN for bf16) ...
    bf = jax.ShapeDtypeStruct((1, 8, 2, 16), jnp.bfloat16)
    plain = fusedattn.get_backend((bf, bf, bf), platform="gpu")
    info = fusedattn.get_backend((bf, bf, bf), score_mod=softcap, platform="gpu")
    assert info.name == plain.name, (info, plain)
    assert fusedattn.get_backend((x, x, x), score_mod=softcap, platform="gpu").name != "cudnn"
    # ... but not with a bias, which cuDNN would add after the score_mod
    bias = jax.ShapeDtypeStruct((1, 2, 8, 8), jnp.bfloat16)
    info = fusedattn.get_backend((bf, bf, bf), bias, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                                 score_mod=softcap, platform="gpu")
    assert info.name != "cudnn", info
    if plain.name == "cudnn":  # the CUDA flash kernels run it, the program in their tiles
        assert info.name == "cuda_flash" and "bias after the score_mod" in info.reason, info
        # ... and with the gradient of an operand taken (cuDNN computes none)
        info = fusedattn.get_backend((bf, bf, bf), score_mod=alibi, platform="gpu",
                                     score_mod_operands=(jnp.ones((1, 2, 1, 1)),),
                                     is_training=True, score_mod_grads=True)
        assert info.name == "cuda_flash", info

def test_operands_may_be_shapes_only():
    """get_backend lowers the score_mod with ShapeDtypeStruct operands (no values)."""
    slopes = jax.ShapeDtypeStruct((HQ, 1, 1), jnp.float32)
    m, arrays4 = sm_mod.make_score_mod(alibi, (slopes,), None, (B, HQ, S, S))
    assert arrays4 == [jax.ShapeDtypeStruct((1, HQ, 1, 1), jnp.float32)]
    real, _ = sm_mod.make_score_mod(alibi, (jnp.ones((HQ, 1, 1)),), None, (B, HQ, S, S))
    assert m.fwd == real.fwd and m.bwd == real.bwd


def _bwd_flags(hlo: str) -> list:
    """backend_flags of every backward custom call in a lowered (StableHLO) text."""
    import re
    return [int(re.search(r"backend_flags = (\d+)", m.group(0)).group(1))
            for m in re.finditer(r"custom_call @fusedattn_attn_bwd[^\n]*", hlo)]


def test_the_call_says_whether_the_operands_gradient_is_taken(key):
    """jax.grad in the operands marks the call (_lib.REQUEST_SCORE_MOD_GRADS: on the GPU
    cuDNN computes no operand gradient, the CUDA flash kernels do); jax.grad in q alone
    does not, and the gradients are the same either way."""
    from fusedattn import _lib
    fn, make_ops = CASES["alibi"]
    slopes = make_ops(key)[0]
    q, k, v, dout = inputs(key)
    loss = lambda q, s: jnp.sum(fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                     score_mod_operands=(s,)) * dout)
    both, q_only = jax.jit(jax.grad(loss, argnums=(0, 1))), jax.jit(jax.grad(loss))
    flags = _bwd_flags(both.lower(q, slopes).as_text())
    assert flags and all(f & _lib.REQUEST_SCORE_MOD_GRADS for f in flags), flags
    flags = _bwd_flags(q_only.lower(q, slopes).as_text())
    assert flags and not any(f & _lib.REQUEST_SCORE_MOD_GRADS for f in flags), flags
    np.testing.assert_array_equal(np.asarray(both(q, slopes)[0]), np.asarray(q_only(q, slopes)))
