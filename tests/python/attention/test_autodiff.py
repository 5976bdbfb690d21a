"""Every JAX transformation of fused_attn (_autodiff.py): forward mode (jvp, jacfwd,
linearize) and higher orders (grad of grad, hessian, jvp of grad) equal the same
transformation of the plain-JAX reference; first-order reverse mode runs the fused
backward (no reference in its jaxpr); vmap and jit compose with all of them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnBiasType, AttnMaskType, SequenceDescriptor, SoftmaxType
from fusedattn.reference import attention_reference

B, Sq, Skv, Hq, Hkv, D = 2, 12, 16, 4, 2, 8
TOL = dict(rtol=2e-5, atol=2e-5)


def inputs(key, dtype=jnp.float32):
    kq, kk, kv, kb, ko = jax.random.split(key, 5)
    return (normal(kq, (B, Sq, Hq, D), dtype), normal(kk, (B, Skv, Hkv, D), dtype),
            normal(kv, (B, Skv, Hkv, D), dtype), normal(kb, (1, Hq, Sq, Skv), dtype),
            normal(ko, (Hq,), dtype))


# (name, fused fn(q, k, v, bias, offset), reference fn(q, k, v, bias, offset))
SD = SequenceDescriptor.from_seqlens((jnp.array([Sq, 7], jnp.int32),
                                      jnp.array([Skv, 9], jnp.int32)))
CASES = {
    "causal": (dict(attn_mask_type=AttnMaskType.CAUSAL_MASK), dict(attn_mask_type=AttnMaskType.CAUSAL_MASK)),
    "bias_sink_window": (
        dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS, window_size=(5, 2),
             softmax_type=SoftmaxType.LEARNABLE_SOFTMAX, uses=("bias", "offset")),
        dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS, window_size=(5, 2),
             softmax_type=SoftmaxType.LEARNABLE_SOFTMAX)),
    "padding": (dict(attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK, sd=SD),
                dict(attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                     q_seqlens=SD.q_seqlens, kv_seqlens=SD.kv_seqlens)),
}


def fns(case):
    kw, rkw = dict(CASES[case][0]), CASES[case][1]
    uses = kw.pop("uses", ())
    sd = kw.pop("sd", None)

    def fused(q, k, v, bias, offset):
        return fusedattn.fused_attn(
            (q, k, v), bias if "bias" in uses else None, sd, None,
            softmax_offset=offset if "offset" in uses else None, **kw)

    def ref(q, k, v, bias, offset):
        extra = {}
        if "bias" in uses:
            extra["bias"] = bias
        if "offset" in uses:
            extra["softmax_offset"] = offset
        return attention_reference(q, k, v, **rkw, **extra)[0]

    return fused, ref


def close(got, want, what, tol=TOL):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, what
        assert np.isfinite(g).all() == np.isfinite(w).all(), f"{what}[{i}]: NaN/inf"
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(g / scale, w / scale, err_msg=f"{what}[{i}]", **tol)


@pytest.mark.parametrize("case", list(CASES))
def test_jvp_equals_reference(key, case):
    fused, ref = fns(case)
    primals = inputs(key)
    tangents = inputs(jax.random.fold_in(key, 1))
    out, t = jax.jvp(fused, primals, tangents)
    rout, rt = jax.jvp(ref, primals, tangents)
    close(out, rout, "primal")
    close(t, rt, "tangent")
    # linearize: the same tangent map, applied twice
    _, lin = jax.linearize(fused, *primals)
    close(lin(*tangents), rt, "linearize")
    close(jax.jit(lin)(*tangents), rt, "linearize under jit")


@pytest.mark.parametrize("case", list(CASES))
def test_grad_of_grad_equals_reference(key, case):
    fused, ref = fns(case)
    q, k, v, bias, offset = inputs(key)
    w = normal(jax.random.fold_in(key, 2), (B, Sq, Hq, D))

    def outer(f):
        def loss(q, k, v, bias, offset):
            g = jax.grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2, 3, 4))(
                q, k, v, bias, offset)
            return sum(jnp.sum(jnp.sin(x)) for x in g)
        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))

    close(jax.jit(outer(fused))(q, k, v, bias, offset), outer(ref)(q, k, v, bias, offset),
          "grad of grad", dict(rtol=1e-4, atol=1e-4))


def test_hessian_and_jacfwd(key):
    # A tiny problem: the hessian in q of a scalar loss, and jacfwd in k.
    fused, ref = fns("causal")
    q, k, v, bias, offset = (x[:1, :3, :2, :4] if x.ndim == 4 else x for x in inputs(key))
    k, v = k[:, :3, :1], v[:, :3, :1]
    loss = lambda f: (lambda q: jnp.sum(jnp.tanh(f(q, k, v, bias, offset))))
    close(jax.hessian(loss(fused))(q), jax.hessian(loss(ref))(q), "hessian",
          dict(rtol=1e-4, atol=1e-4))
    jf = jax.jacfwd(lambda k: fused(q, k, v, bias, offset))(k)
    jr = jax.jacfwd(lambda k: ref(q, k, v, bias, offset))(k)
    close(jf, jr, "jacfwd")
    jb = jax.jacrev(lambda k: fused(q, k, v, bias, offset))(k)
    close(jb, jr, "jacrev")


def test_jvp_of_grad_and_vmap(key):
    fused, ref = fns("bias_sink_window")
    q, k, v, bias, offset = inputs(key)
    tq = normal(jax.random.fold_in(key, 3), q.shape)

    def hvp(f):
        g = lambda q: jax.grad(lambda q: jnp.sum(f(q, k, v, bias, offset) ** 2))(q)
        return jax.jvp(g, (q,), (tq,))[1]

    close(hvp(fused), hvp(ref), "jvp of grad", dict(rtol=1e-4, atol=1e-4))
    # vmap over a stack of q tangents and of queries
    tqs = jnp.stack([tq, -tq, 2 * tq])
    got = jax.vmap(lambda t: jax.jvp(lambda q: fused(q, k, v, bias, offset), (q,), (t,))[1])(tqs)
    want = jax.vmap(lambda t: jax.jvp(lambda q: ref(q, k, v, bias, offset), (q,), (t,))[1])(tqs)
    close(got, want, "vmap of jvp")
    qs = jnp.stack([q, 0.5 * q])
    gf = jax.grad(lambda qs: jnp.sum(jax.vmap(lambda q: fused(q, k, v, bias, offset))(qs) ** 2))
    gr = jax.grad(lambda qs: jnp.sum(jax.vmap(lambda q: ref(q, k, v, bias, offset))(qs) ** 2))
    close(gf(qs), gr(qs), "grad of vmap")
    gg = jax.vmap(jax.grad(lambda q: jnp.sum(fused(q, k, v, bias, offset) ** 2)))(qs)
    gr2 = jax.vmap(jax.grad(lambda q: jnp.sum(ref(q, k, v, bias, offset) ** 2)))(qs)
    close(gg, gr2, "vmap of grad")


def _custom_calls(jaxpr_text: str) -> set:
    import re
    return set(re.findall(r"fusedattn_attn_(?:fwd|bwd)\w*", jaxpr_text))


def test_first_order_reverse_mode_is_fused(key):
    # grad lowers to the fused forward and backward calls and no reference (which would
    # materialize [.., Sq, Skv] scores).
    fused, _ = fns("causal")
    q, k, v, bias, offset = inputs(key)
    loss = lambda q, k, v: jnp.sum(fused(q, k, v, bias, offset) ** 2)
    hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).as_text()
    assert {"fusedattn_attn_fwd", "fusedattn_attn_bwd"} <= _custom_calls(hlo), hlo[:2000]
    assert f"{Sq}x{Skv}" not in hlo.replace(" ", ""), "scores materialized in first-order grad"


def test_gradients_under_checkpoint(key):
    fused, ref = fns("causal")
    q, k, v, bias, offset = inputs(key)
    f = jax.checkpoint(lambda q, k, v: jnp.sum(fused(q, k, v, bias, offset) ** 3))
    r = lambda q, k, v: jnp.sum(ref(q, k, v, bias, offset) ** 3)
    close(jax.grad(f, argnums=(0, 1, 2))(q, k, v), jax.grad(r, argnums=(0, 1, 2))(q, k, v),
          "grad under checkpoint", dict(rtol=1e-4, atol=1e-4))
    close(jax.jvp(f, (q, k, v), (q, k, v))[1], jax.jvp(r, (q, k, v), (q, k, v))[1],
          "jvp under checkpoint", dict(rtol=1e-4, atol=1e-4))
