"""fused_attn sharded over the local GPUs (issues 21 and 22), against the same call on one
GPU: data, tensor and context parallelism (ring and all-gather, load-balanced), forward
and gradients, bfloat16. Skips without 2 GPUs (scripts/gpu_multi.sh runs it on a
multi-GPU machine). The 8-CPU-device tests beside it prove every feature in float32;
this file proves the same code on real devices and NCCL.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fusedattn
from fusedattn import AttnMaskType
from fusedattn.context_parallel import (ReorderStrategy, inverse_reorder_causal_load_balancing,
                                        reorder_causal_load_balancing)


def _gpus():
    try:
        return jax.devices("gpu")
    except RuntimeError:
        return []


pytestmark = pytest.mark.skipif(len(_gpus()) < 2, reason="needs 2 GPUs")

B, S, H, D = 4, 2048, 8, 128
MODES = {
    "dp": (P("x"), {}),
    "tp": (P(None, None, "x"), {}),
    "cp_ring": (P(None, "x"), dict(context_parallel_strategy="ring")),
    "cp_all_gather": (P(None, "x"), dict(context_parallel_strategy="all_gather")),
}


def _call(kw, window=None):
    def f(q, k, v, proj):
        out = fusedattn.fused_attn((q, k, v), None, None, 0, attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                   window_size=window, **kw)
        return jnp.sum(out.astype(jnp.float32) * proj), out

    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize("window", [None, (256, 0)], ids=["causal", "window"])
@pytest.mark.parametrize("mode", list(MODES))
def test_sharded_equals_one_gpu(mode, window):
    gpus = _gpus()
    n = len(gpus)
    mesh = Mesh(np.array(gpus), ("x",))
    ks = jax.random.split(jax.random.key(1), 4)
    q, k, v = (jax.random.normal(x, (B, S, H, D), jnp.bfloat16) for x in ks[:3])
    proj = jax.random.normal(ks[3], (B, S, H, D), jnp.float32)
    (_, want), want_g = _call({}, window)(*(jax.device_put(x, gpus[0]) for x in (q, k, v, proj)))
    spec, kw = MODES[mode]
    cp = mode.startswith("cp")
    if cp:
        kw = dict(kw, context_parallel_axis="x", context_parallel_causal_load_balanced=True)
    order = (lambda x: reorder_causal_load_balancing(x, ReorderStrategy.DualChunkSwap, n, 1)
             ) if cp else (lambda x: x)
    undo = (lambda x: inverse_reorder_causal_load_balancing(
        x, ReorderStrategy.DualChunkSwap, n, 1)) if cp else (lambda x: x)
    args = [jax.device_put(order(x), NamedSharding(mesh, spec)) for x in (q, k, v, proj)]
    (_, out), grads = _call(kw, window)(*args)
    assert len(out.sharding.device_set) == n
    got = np.asarray(undo(out), np.float32)
    ref = np.asarray(want, np.float32)
    assert np.isfinite(got).all()
    # bf16: the sharded and the one-GPU call round differently (the cp merges in float32)
    np.testing.assert_allclose(got, ref, atol=2e-2, rtol=2e-2)
    for name, g, w in zip("qkv", grads, want_g):
        g, w = np.asarray(undo(g), np.float32), np.asarray(w, np.float32)
        scale = np.max(np.abs(w))
        assert np.max(np.abs(g - w)) <= 2e-2 * scale, (name, np.max(np.abs(g - w)), scale)


@pytest.mark.parametrize("strategy", ["ring", "all_gather"])
def test_thd_striped_equals_one_gpu(strategy):
    """THD under context parallelism, striped, on the GPUs: the blocks that need positions
    run XLA's reference per block (forward, and the backward given the call's out / lse)."""
    from fusedattn import QKVLayout, SequenceDescriptor
    gpus = _gpus()
    n = len(gpus)
    mesh = Mesh(np.array(gpus), ("x",))
    T, st = 512, 8
    ks = jax.random.split(jax.random.key(2), 4)
    q, k, v = (jax.random.normal(x, (2, T, H, 64), jnp.bfloat16) for x in ks[:3])
    proj = jax.random.normal(ks[3], (2, T, H, 64), jnp.float32)
    lens = jnp.array([[200, 300, 12], [512, 0, 0]], jnp.int32)

    def f(kw):
        def loss(q, k, v, proj, lens):
            out = fusedattn.fused_attn((q, k, v), None, SequenceDescriptor.from_seqlens((lens, lens)),
                                       0, qkv_layout=QKVLayout.THD_THD_THD,
                                       attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                                       max_segments_per_seq=3, **kw)
            return jnp.sum(out.astype(jnp.float32) * proj), out
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

    (_, want), want_g = f({})(*(jax.device_put(x, gpus[0]) for x in (q, k, v, proj, lens)))
    order = lambda x: reorder_causal_load_balancing(x, ReorderStrategy.Striped, n, 1, stripe_size=st)
    undo = lambda x: inverse_reorder_causal_load_balancing(x, ReorderStrategy.Striped, n, 1,
                                                           stripe_size=st)
    sh = NamedSharding(mesh, P(None, "x"))
    args = [jax.device_put(order(x), sh) for x in (q, k, v, proj)] + [lens]
    kw = dict(context_parallel_axis="x", context_parallel_strategy=strategy,
              context_parallel_causal_load_balanced=True, stripe_size=st)
    (_, out), grads = f(kw)(*args)
    np.testing.assert_allclose(np.asarray(undo(out), np.float32), np.asarray(want, np.float32),
                               atol=2e-2, rtol=2e-2)
    for name, g, w in zip("qkv", grads, want_g):
        g, w = np.asarray(undo(g), np.float32), np.asarray(w, np.float32)
        assert np.max(np.abs(g - w)) <= 2e-2 * np.max(np.abs(w)), name
