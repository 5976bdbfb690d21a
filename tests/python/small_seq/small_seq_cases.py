"""Shared inputs and checks of the small-seq tests (test_small_seq_*.py).

A Case is one small-seq call: THD tensors with segment offsets/lengths (ragged, empty and
padded slots, a padded tail of rows that belong to no segment) or BSHD tensors. Results
are compared against the plain-JAX reference (fusedattn.small_seq_reference) with the
FlashAttention tolerance rule of conftest.py: the float32 reference of the rounded inputs,
and the same reference computed in the low precision as the error baseline.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from conftest import assert_close, normal, reference_lowp
from fusedattn import AttnMaskType, QKVLayout, SmallSeqDescriptor
from fusedattn import small_seq as ss
from fusedattn.small_seq_reference import small_seq_reference


@dataclasses.dataclass
class Case:
    layout: QKVLayout
    q: jax.Array
    k: jax.Array
    v: jax.Array
    dout: jax.Array
    sd: object            # SmallSeqDescriptor / SequenceDescriptor / None
    mask: AttnMaskType
    scale: float | None
    max_q: int            # bounds of the reference's gather (at least every length present)
    max_kv: int
    width: int            # P's width (the promise)
    q_lens: np.ndarray | None = None
    kv_lens: np.ndarray | None = None
    q_offsets: np.ndarray | None = None
    kv_offsets: np.ndarray | None = None

    def call(self, q=None, k=None, v=None):
        q = self.q if q is None else q
        k = self.k if k is None else k
        v = self.v if v is None else v
        return fusedattn.fused_attn_small_seq((q, k, v), None, self.sd, None,
                                              attn_mask_type=self.mask, qkv_layout=self.layout,
                                              scaling_factor=self.scale)

    def reference(self, q, k, v):
        """(out, probs, stats) of the reference (any dtype in, the math in float32)."""
        return small_seq_reference(q, k, v, qkv_layout=self.layout, attn_mask_type=self.mask,
                                   scaling_factor=self.scale, q_seqlens=self.q_lens,
                                   kv_seqlens=self.kv_lens, q_offsets=self.q_offsets,
                                   kv_offsets=self.kv_offsets, max_q=self.max_q,
                                   max_kv=self.max_kv, width=self.width)

    def reference_lowp(self, q, k, v):
        """out by conftest.reference_lowp (the math in q's dtype) on the gathered segments."""
        if self.layout == QKVLayout.BSHD_BSHD_BSHD:
            B = q.shape[0]
            full = lambda s: np.full((B,), s, np.int32)
            ql = self.q_lens if self.q_lens is not None else full(q.shape[1])
            kl = self.kv_lens if self.kv_lens is not None else full(k.shape[1])
            return reference_lowp(q, k, v, self.mask, ql, kl, self.scale)
        from fusedattn.small_seq_reference import _gather, _slots
        qs_, qu = _slots(jnp.asarray(self.q_offsets), self.q_lens, q.shape[0])
        ks_, ku = _slots(jnp.asarray(self.kv_offsets), self.kv_lens, k.shape[0])
        qg, q_idx = _gather(q, qs_, qu, self.max_q)
        kg, _ = _gather(k, ks_, ku, self.max_kv)
        vg, _ = _gather(v, ks_, ku, self.max_kv)
        out = reference_lowp(qg, kg, vg, self.mask, qu, ku, self.scale)
        return jnp.zeros_like(q).at[q_idx.reshape(-1)].set(
            out.reshape(-1, *q.shape[1:]), mode="drop")

    def internal(self):
        """(q, k, v, segment arrays, config) as fused_attn_small_seq prepares them."""
        return ss._prepare((self.q, self.k, self.v), None, self.sd, attn_mask_type=self.mask,
                           qkv_layout=self.layout, scaling_factor=self.scale,
                           dropout_probability=0.0, is_training=True)


def _slots_with_padding(rng, lens, pad):
    return lens + (rng.integers(0, pad + 1, len(lens)) if pad else 0)


def thd_case(key, kv_lens, *, q_lens=None, heads=(2, 2), dim=64, dtype=jnp.float32,
             width=None, pad_kv=0, pad_q=0, tail=0, mask=AttnMaskType.PADDING_MASK, scale=None,
             with_lengths=True, offsets=True):
    """THD segments with the given kv lengths (and q lengths, default 1 each). pad_* adds
    up to that many unused rows at the end of each slot, tail unused rows after the last
    slot. width defaults to max(kv_lens) (the promise kept). offsets=False: the descriptor
    gives lengths only (segments packed back to back; needs pad_* = 0)."""
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    kv_lens = np.asarray(kv_lens, np.int32)
    q_lens = np.ones_like(kv_lens) if q_lens is None else np.asarray(q_lens, np.int32)
    slot_q = _slots_with_padding(rng, q_lens, pad_q)
    slot_kv = _slots_with_padding(rng, kv_lens, pad_kv)
    cu_q = np.concatenate([[0], np.cumsum(slot_q)]).astype(np.int32)
    cu_kv = np.concatenate([[0], np.cumsum(slot_kv)]).astype(np.int32)
    Tq, Tkv = int(cu_q[-1]) + tail, int(cu_kv[-1]) + tail
    Tq, Tkv = max(Tq, 1), max(Tkv, 1)
    hq, hkv = heads
    kq, kk, kv, kd = jax.random.split(key, 4)
    q, k, v = (normal(kq, (Tq, hq, dim), dtype), normal(kk, (Tkv, hkv, dim), dtype),
               normal(kv, (Tkv, hkv, dim), dtype))
    dout = normal(kd, (Tq, hq, dim), dtype)
    width = int(max(kv_lens.max(initial=1), 1)) if width is None else width
    if offsets:
        sd = SmallSeqDescriptor.from_cu_seqlens(
            cu_q, cu_kv, max_segment_seqlen_kv=width,
            q_seqlens=q_lens if with_lengths else None,
            kv_seqlens=kv_lens if with_lengths else None)
        lens = (q_lens, kv_lens) if with_lengths else (slot_q, slot_kv)
    else:
        assert not pad_q and not pad_kv
        sd = SmallSeqDescriptor.from_seqlens(q_lens, kv_lens, max_segment_seqlen_kv=width)
        lens = (q_lens, kv_lens)
    return Case(QKVLayout.THD_THD_THD, q, k, v, dout, sd, mask, scale,
                max_q=int(max(slot_q.max(initial=1), 1)),
                max_kv=int(max(slot_kv.max(initial=1), 1)), width=width, q_lens=lens[0],
                kv_lens=lens[1], q_offsets=cu_q, kv_offsets=cu_kv)


def bshd_case(key, batch, skv, *, kv_lens=None, heads=(2, 2), dim=64, dtype=jnp.float32,
              mask=AttnMaskType.NO_MASK, scale=None):
    """q [B, 1, Hq, D], k/v [B, Skv, Hkv, D]; kv_lens [B] (padding masks) or None."""
    hq, hkv = heads
    kq, kk, kv, kd = jax.random.split(key, 4)
    q, k, v = (normal(kq, (batch, 1, hq, dim), dtype), normal(kk, (batch, skv, hkv, dim), dtype),
               normal(kv, (batch, skv, hkv, dim), dtype))
    dout = normal(kd, (batch, 1, hq, dim), dtype)
    sd = q_lens = None
    if kv_lens is not None:
        kv_lens = np.asarray(kv_lens, np.int32)
        q_lens = np.ones_like(kv_lens)
        sd = fusedattn.SequenceDescriptor.from_seqlens((q_lens, kv_lens))
    return Case(QKVLayout.BSHD_BSHD_BSHD, q, k, v, dout, sd, mask, scale, max_q=1, max_kv=skv,
                width=skv, q_lens=q_lens, kv_lens=kv_lens)


# ---------------------------------------------------------------------------
# Checks


def f32(x):
    return x.astype(jnp.float32)


def check_forward(case: Case, *, poison=True, check_aux=True, check_public=False):
    """out (and with check_aux the saved P and statistics) against the reference, every
    element, with the kernel's outputs poisoned with NaN before it runs; check_public:
    the public call (which saves no P) gives the same output, bit for bit."""
    q, k, v, seg, cfg = case.internal()
    out, probs, stats = jax.jit(lambda q, k, v: ss.forward(
        q, k, v, seg.q_lens, seg.kv_lens, seg.q_offsets, seg.kv_offsets, cfg,
        poison=poison))(q, k, v)
    ref_out, ref_probs, ref_stats = case.reference(f32(q), f32(k), f32(v))
    lowp = None if q.dtype == jnp.float32 else case.reference_lowp(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert_close("out", out, ref_out, lowp)
    if check_aux:
        assert_close("probs", probs, ref_probs, dtype=jnp.float32)
        got, ref = np.asarray(stats), np.asarray(ref_stats)
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), "stats: -inf pattern")
        fin = np.isfinite(ref)
        # The logits come from rounded inputs in both; only the float32 sums differ.
        np.testing.assert_allclose(got[fin], ref[fin], rtol=2e-5, atol=2e-5)
    if check_public:
        np.testing.assert_array_equal(np.asarray(f32(case.call()), np.float32),
                                      np.asarray(f32(out), np.float32))
    return out


def grads(case: Case):
    """(fused grads, float32 reference grads, low-precision reference grads or None)."""
    dout = case.dout

    def loss(f):
        return lambda q, k, v: jnp.sum(f32(f(q, k, v)) * f32(dout))

    g = jax.jit(jax.grad(loss(case.call), argnums=(0, 1, 2)))(case.q, case.k, case.v)
    ref = jax.grad(loss(lambda q, k, v: case.reference(q, k, v)[0]), argnums=(0, 1, 2))(
        f32(case.q), f32(case.k), f32(case.v))
    lowp = None
    if case.q.dtype != jnp.float32:
        lowp = jax.grad(loss(case.reference_lowp), argnums=(0, 1, 2))(case.q, case.k, case.v)
    return g, ref, lowp


def check_grads(case: Case):
    g, ref, lowp = grads(case)
    for i, (name, x) in enumerate(zip(("dq", "dk", "dv"), (case.q, case.k, case.v))):
        assert g[i].shape == x.shape and g[i].dtype == x.dtype, f"{name}: {g[i].shape} {g[i].dtype}"
        assert_close(name, g[i], ref[i], None if lowp is None else lowp[i])
    return g


def check_backward_poisoned(case: Case):
    """The backward FFI call with its outputs poisoned: every element is written."""
    q, k, v, seg, cfg = case.internal()
    out, probs, stats = ss.forward(q, k, v, seg.q_lens, seg.kv_lens, seg.q_offsets,
                                   seg.kv_offsets, cfg)
    dq, dk, dv = jax.jit(lambda *a: ss.backward(*a, seg.q_lens, seg.kv_lens, seg.q_offsets,
                                                seg.kv_offsets, cfg, poison=True))(
        q, k, v, out, case.dout, probs, stats)
    g, ref, lowp = grads(case)
    for i, (name, got) in enumerate(zip(("dq", "dk", "dv"), (dq, dk, dv))):
        assert_close(name, got, ref[i], None if lowp is None else lowp[i])


def check_nan(case: Case, source: str, token: int, head: int):
    """NaN in, NaN out: one NaN element of q, k or v (THD) at (token, head, 0). Forward:
    out NaN exactly where the reference's is (q: that query row; k: the queries of that
    key's segment; v: their column 0), finite and close elsewhere. Backward: the NaN
    query row (q) has a NaN dq row, and the gradients of segments without the NaN stay
    finite."""
    x = dict(q=case.q, k=case.k, v=case.v)
    x[source] = x[source].at[token, head, 0].set(jnp.nan)
    q, k, v = x["q"], x["k"], x["v"]
    out = np.asarray(f32(jax.jit(case.call)(q, k, v)))
    ref = np.asarray(case.reference(f32(q), f32(k), f32(v))[0])
    nan = np.isnan(ref)
    assert nan.any(), "the NaN must reach the reference's output (a test bug)"
    np.testing.assert_array_equal(np.isnan(out), nan, "out: NaN pattern")
    if q.dtype == jnp.float32:
        assert_close("out", out[~nan], ref[~nan])
    else:
        np.testing.assert_allclose(out[~nan], ref[~nan], atol=3e-2, rtol=3e-2)
    loss = lambda q, k, v: jnp.sum(f32(case.call(q, k, v)) * f32(case.dout))
    dq, dk, dv = (np.asarray(f32(g)) for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    if source == "q":
        assert np.isnan(dq[token, head]).all()
    rows_ok = ~np.isnan(out).any(axis=(1, 2))  # queries whose output is finite
    assert np.isfinite(dq[rows_ok]).all(), "dq: NaN at queries whose output is finite"
    return out
