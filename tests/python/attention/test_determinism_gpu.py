"""Deterministic mode (fusedattn.determinism) on an H100 / H200 (pytest -m gpu; skipped without
an sm_90 GPU): the Hopper backward's ordered dQ and cuDNN's deterministic backward give
gradients that are bitwise the same call after call (three more calls of one compiled
gradient), and correct (test_score_mod_gpu.check's rule against the float32 reference),
softcap's too;
get_backend names the deterministic kernel; a call whose backward only the CUDA flash
kernels serve (float32) raises when its backward is traced, and its forward runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnMaskType, _lib
from test_hopper_fwd_gpu import PLAIN_TARGETS, _is_hopper, identity, inputs
from test_score_mod import ref_call
from test_score_mod_gpu import check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _is_hopper(), reason="needs an sm_90 GPU (H100, H200)")]


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def assert_repeatable(loss, args, calls=3):
    """One compiled gradient of loss, called calls more times: every gradient bitwise the
    first call's."""
    g = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    first = [_bits(x) for x in jax.block_until_ready(g(*args))]
    for _ in range(calls):
        again = jax.block_until_ready(g(*args))
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            diff = int(np.sum(a != _bits(b)))
            assert diff == 0, f"{name}: {diff} values differ between two calls"


def _loss(fn, dout):
    return lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * dout.astype(jnp.float32))


# (mask, head dim, kv heads, dtype): long enough that 8-16 key blocks add to each dQ block.
HOPPER_CASES = [
    pytest.param(AttnMaskType.CAUSAL_MASK, 128, 2, jnp.bfloat16, id="causal-d128-gqa-bf16"),
    pytest.param(AttnMaskType.NO_MASK, 128, 4, jnp.float16, id="full-d128-fp16"),
    pytest.param(AttnMaskType.CAUSAL_MASK, 64, 4, jnp.float16, id="causal-d64-fp16"),
    pytest.param(AttnMaskType.NO_MASK, 64, 1, jnp.bfloat16, id="full-d64-mqa-bf16"),
    pytest.param(AttnMaskType.CAUSAL_MASK, 256, 2, jnp.bfloat16, id="causal-d256-gqa-bf16"),
    pytest.param(AttnMaskType.NO_MASK, 256, 4, jnp.float16, id="full-d256-fp16")]


@pytest.mark.parametrize("mask,d,hkv,dtype", HOPPER_CASES)
def test_hopper_backward_is_bitwise_repeatable(key, mask, d, hkv, dtype):
    q, k, v, dout = inputs(key, dtype, 1024, 1024, hkv, 2.0, d=d)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=mask)
    with fusedattn.deterministic():
        info = fusedattn.get_backend((q, k, v), attn_mask_type=mask, is_training=True)
        assert info.backward == "hopper" and "deterministic dQ" in info.reason, info
        before = _lib.hopper_bwd_launches()
        check(ours, ref, (q, k, v), dout, PLAIN_TARGETS)
        assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"
        assert_repeatable(_loss(ours, dout), (q, k, v))
    assert "deterministic" not in fusedattn.get_backend(
        (q, k, v), attn_mask_type=mask, is_training=True).reason


def _holes_mask(n):
    """Causal with every third 128-key block dropped (key tiles it empties, which the turn
    count must skip as the kernel does); every row keeps its first 8 keys."""
    i = jnp.arange(n)
    holes = (i[:, None] >= i[None, :]) & ((i[None, :] // 128) % 3 != 1)
    return holes.at[:, :8].set(True)[None, None]


def _dense_repeatable_and_right(q, k, v, dout, mask):
    """In deterministic mode: dot_product_attention(mask=mask)'s backward through the Hopper
    kernel is bitwise repeatable, and its gradients are float32 jax's with the same mask."""
    dense = lambda q, k, v: fusedattn.dot_product_attention(q, k, v, mask=mask)
    with fusedattn.deterministic():
        before = _lib.hopper_bwd_launches()
        assert_repeatable(_loss(dense, dout), (q, k, v))
        assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"
        f32 = lambda q, k, v: jax.nn.dot_product_attention(
            q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), mask=mask)
        want = jax.grad(_loss(f32, dout), argnums=(0, 1, 2))(q, k, v)
        got = jax.jit(jax.grad(_loss(dense, dout), argnums=(0, 1, 2)))(q, k, v)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            err = float(jnp.max(jnp.abs(a.astype(jnp.float32) - b)))
            assert err <= 3e-2 * max(1.0, float(jnp.max(jnp.abs(b)))), (name, err)


def test_windowed_and_dense_mask_backward_is_bitwise_repeatable(key):
    """A sliding window, and a dense boolean mask with holes through dot_product_attention."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 1024, 1024, 2, 2.0)
    win = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                               attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                               window_size=(300, 0))
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                   window_size=(300, 0))
    with fusedattn.deterministic():
        check(win, ref, (q, k, v), dout, PLAIN_TARGETS)
        before = _lib.hopper_bwd_launches()
        assert_repeatable(_loss(win, dout), (q, k, v))
        assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"
    _dense_repeatable_and_right(q, k, v, dout, _holes_mask(1024))


def test_head_dim_64_mask_alone_backward_is_bitwise_repeatable(key):
    """Head dim 64 with a mask alone (no bias: REQUEST_MASK_KEEP_ONLY, the backward's
    128-query blocks and their counters), GQA, in deterministic mode."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 1024, 1024, 2, 2.0, 64)
    _dense_repeatable_and_right(q, k, v, dout, _holes_mask(1024))


def test_softcap_backward_is_bitwise_repeatable(key):
    """softcap's backward (the Hopper kernel with tanh's derivative) in the mode: the ordered
    dQ, bitwise repeatable and correct."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 1024, 1024, 2, 2.0)
    cap = lambda s, b, h, qi, ki: jnp.tanh(s / 5.0) * 5.0
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=cap,
                                                attn_mask_type=AttnMaskType.CAUSAL_MASK)
    ref = lambda q, k, v: ref_call(q, k, v, cap, (), attn_mask_type=AttnMaskType.CAUSAL_MASK)
    with fusedattn.deterministic():
        info = fusedattn.get_backend((q, k, v), attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                     score_mod=cap, is_training=True)
        assert info.backward == "hopper" and "deterministic dQ" in info.reason, info
        before = _lib.hopper_bwd_launches()
        check(ours, ref, (q, k, v), dout)
        assert _lib.hopper_bwd_launches() > before, "the Hopper backward did not run"
        assert_repeatable(_loss(ours, dout), (q, k, v))


def test_cudnn_deterministic_backward_at_head_dim_256(key):
    """Head dim 256 with the Hopper backward off (FUSEDATTN_HOPPER_BWD=0): cuDNN's
    deterministic algorithm."""
    q, k, v, dout = inputs(key, jnp.bfloat16, 1024, 1024, 2, 1.0, d=256)
    mask = AttnMaskType.CAUSAL_MASK
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)
    ref = lambda q, k, v: ref_call(q, k, v, identity, (), attn_mask_type=mask)
    _lib.set_hopper_bwd("off")
    try:
        with fusedattn.deterministic():
            info = fusedattn.get_backend((q, k, v), attn_mask_type=mask, is_training=True)
            assert info.backward == "cudnn" and "deterministic algorithm" in info.reason, info
            before = _lib.hopper_bwd_launches()
            check(ours, ref, (q, k, v), dout, PLAIN_TARGETS)
            assert_repeatable(_loss(ours, dout), (q, k, v))
            assert _lib.hopper_bwd_launches() == before
    finally:
        _lib.set_hopper_bwd(None)


def test_flash_kernels_have_no_deterministic_backward(key):
    """float32 runs the CUDA flash kernels (dq by float32 atomics): the forward runs in
    deterministic mode, the backward raises when traced, naming the mode."""
    q, k, v, dout = inputs(key, jnp.float32, 256, 256, 2, 1.0)
    ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None,
                                                attn_mask_type=AttnMaskType.CAUSAL_MASK)
    with fusedattn.deterministic():
        info = fusedattn.get_backend((q, k, v), attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                     is_training=True)
        assert info.name == "cuda_flash" and info.backward == "none", info
        out = jax.jit(ours)(q, k, v)
        assert np.isfinite(np.asarray(out)).all()
        with pytest.raises(NotImplementedError, match="deterministic mode"):
            jax.grad(_loss(ours, dout))(q, k, v)
    jax.block_until_ready(jax.grad(_loss(ours, dout))(q, k, v))  # the mode off: it runs
