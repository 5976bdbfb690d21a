"""score_mod (flex attention) on an NVIDIA GPU (pytest -m gpu; skipped without one): the
program runs inside the cuDNN graph (the compiled program must call the _sm_cuda targets,
not the reference), forward and gradients of q, k, v and the operands against the float32
reference with fn over the materialized scores, in bf16 and fp16, with padding, causal and
THD masks built inside the score_mod graph."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal
from fusedattn import AttnMaskType
from test_score_mod import (CASES, HQ, T, array_operands, causal, ref_call, softcap,
                            thd_call)

pytestmark = pytest.mark.gpu
S, D = 128, 64


def close(name, got, ref, tol=3e-2):
    got = np.asarray(jnp.asarray(got, jnp.float32))
    ref = np.asarray(ref, np.float32)
    assert not np.isnan(got).any(), f"{name}: NaN"
    scale = max(1.0, float(np.max(np.abs(ref))))
    err = float(np.max(np.abs(got - ref)))
    assert err <= tol * scale, f"{name}: max |err| {err:.3g} (max |ref| {scale:.3g})"


def gpu_inputs(key, dtype, Sq=S, Skv=S, B=2, hkv=2):
    ks = jax.random.split(key, 4)
    return (normal(ks[0], (B, Sq, HQ, D), dtype), normal(ks[1], (B, Skv, hkv, D), dtype),
            normal(ks[2], (B, Skv, hkv, D), dtype), normal(ks[3], (B, Sq, HQ, D), dtype))


def check(ours, ref, args, dout, targets=("fusedattn_attn_fwd_sm_cuda",
                                          "fusedattn_attn_bwd_sm_cuda")):
    loss = lambda f: lambda *a: jnp.sum(f(*a).astype(jnp.float32) * dout.astype(jnp.float32))
    argnums = tuple(range(len(args)))
    grad = jax.jit(jax.grad(loss(ours), argnums=argnums))
    hlo = grad.lower(*args).compile().as_text()
    for t in targets:
        assert f'custom_call_target="{t}"' in hlo, f"{t} missing: the reference ran instead"
    close("out", jax.jit(ours)(*args), ref(*args))
    for i, (a, b) in enumerate(zip(grad(*args), jax.grad(loss(ref), argnums=argnums)(*args))):
        close(("dq", "dk", "dv")[i] if i < 3 else f"d operand {i - 3}", a, b)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["softcap", "alibi", "relpos", "causal", "learnable",
                                  "two_arrays"])
def test_matches_the_reference(key, name, dtype):
    fn, make_ops = CASES[name]
    kop = jax.random.fold_in(key, 1)
    ops = {"relpos": lambda: (normal(kop, (1, 1, S, S)), 0.5),
           "two_arrays": lambda: (CASES["alibi"][1](kop)[0], normal(kop, (2, 1, S, 1)))}.get(
               name, lambda: make_ops(kop))()
    q, k, v, dout = gpu_inputs(key, dtype)
    arr_idx, full = array_operands(ops)
    ours = lambda q, k, v, *arr: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                      score_mod_operands=full(arr))
    ref = lambda q, k, v, *arr: ref_call(q, k, v, fn, full(arr))[0]
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
    ref = lambda q, k, v: ref_call(q, k, v, softcap, (), attn_mask_type=mask, **kw)[0]
    check(ours, ref, (q, k, v), dout)


def test_thd_segments(key):
    """THD: positions restart in every segment inside the cuDNN graph too."""
    fn, make_ops = CASES["alibi"]
    ops = make_ops(key)
    ours, ref, arrs = thd_call(fn, AttnMaskType.PADDING_CAUSAL_MASK, ops)
    q, k, v, dout = gpu_inputs(key, jnp.bfloat16, Sq=T, Skv=T)
    first = lambda f: lambda *a: f(*a)[0]
    check(first(ours), first(ref), (q, k, v, *arrs), dout)


def test_get_backend_reports_cudnn(key):
    bf = jax.ShapeDtypeStruct((2, S, HQ, D), jnp.bfloat16)
    info = fusedattn.get_backend((bf, bf, bf), score_mod=causal, platform="gpu",
                                 is_training=True)
    assert info.name == "cudnn", info
    slopes = jax.ShapeDtypeStruct((1, HQ, 1, 1), jnp.float32)  # operands as shapes too
    info = fusedattn.get_backend((bf, bf, bf), score_mod=CASES["alibi"][0], platform="gpu",
                                 score_mod_operands=(slopes,), is_training=True)
    assert info.name == "cudnn", info
