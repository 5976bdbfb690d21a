"""One harness for the feature tests: a Spec names a call (layout, mask, descriptor, bias,
softmax type, window, dropout), check() runs fused_attn and the references on fresh random
inputs under one jit and compares out, softmax_aux, max_logit and every gradient (q, k, v,
bias, softmax_offset) by the tolerance rule of conftest.py.

Inputs are made unpacked (q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv]) and
packed for the layout inside the differentiated function, so the gradients of the packed
layouts arrive as dq, dk, dv through the packing's own VJP.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from conftest import (assert_close, assert_lse_close, normal, reference_f32, reference_lowp,
                      stored_out_grads)
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn.reference import segment_mask
from fusedattn.sequence import packed_offsets

THD = (QKVLayout.THD_THD_THD, QKVLayout.T3HD, QKVLayout.THD_T2HD)
QKV_PACKED = (QKVLayout.BS3HD, QKVLayout.T3HD)
KV_PACKED = (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD)


@dataclasses.dataclass(frozen=True)
class Spec:
    dtype: object = jnp.float32
    layout: QKVLayout = QKVLayout.BSHD_BSHD_BSHD
    mask: AttnMaskType = AttnMaskType.NO_MASK
    B: int = 2
    Sq: int = 64
    Skv: int = 64
    Hq: int = 4
    Hkv: int = 2
    D: int = 32
    Dv: int | None = None
    sd: SequenceDescriptor | None = None
    M: int = 1
    bias_shape: tuple | None = None
    bias_type: AttnBiasType = AttnBiasType.POST_SCALE_BIAS
    softmax: SoftmaxType = SoftmaxType.VANILLA_SOFTMAX
    offset_4d: bool = False  # softmax_offset as [1, Hq, 1, 1] instead of [Hq]
    window: tuple | None = None
    dropout: float = 0.0
    seed: object = 0
    scale: float | None = None
    max_logit: bool = True  # ask for (and check) aux["max_logit"]

    @property
    def dv(self):
        return self.D if self.Dv is None else self.Dv


def inputs(key, spec: Spec):
    """q, k, v, bias (or None), softmax_offset (or None), dout."""
    s = spec
    ks = jax.random.split(key, 6)
    q = normal(ks[0], (s.B, s.Sq, s.Hq, s.D), s.dtype)
    k = normal(ks[1], (s.B, s.Skv, s.Hkv, s.D), s.dtype)
    v = normal(ks[2], (s.B, s.Skv, s.Hkv, s.dv), s.dtype)
    bias = None if s.bias_shape is None else normal(ks[3], s.bias_shape, s.dtype)
    offset = None
    if s.softmax == SoftmaxType.LEARNABLE_SOFTMAX:
        offset = normal(ks[4], (1, s.Hq, 1, 1) if s.offset_4d else (s.Hq,))
    dout = normal(ks[5], (s.B, s.Sq, s.Hq, s.dv), s.dtype)
    return q, k, v, bias, offset, dout


def pack(spec: Spec, q, k, v):
    if spec.layout in QKV_PACKED:
        return jnp.stack([q, k, v], axis=2)
    if spec.layout in KV_PACKED:
        return (q, jnp.stack([k, v], axis=2))
    return (q, k, v)


def fused_fn(spec: Spec, **extra):
    """(q, k, v, bias, offset) -> (out, aux) through fused_attn with spec's layout."""
    def f(q, k, v, bias, offset):
        return fusedattn.fused_attn(
            pack(spec, q, k, v), bias, spec.sd, spec.seed,
            attn_bias_type=AttnBiasType.NO_BIAS if bias is None else spec.bias_type,
            attn_mask_type=spec.mask, qkv_layout=spec.layout, softmax_type=spec.softmax,
            scaling_factor=spec.scale, dropout_probability=spec.dropout,
            is_training=spec.dropout > 0, max_segments_per_seq=spec.M, window_size=spec.window,
            softmax_offset=offset, return_max_logit=spec.max_logit, return_aux=True, **extra)
    return f


def descriptor_arrays(spec: Spec):
    """(q_lens, kv_lens [B, M], q_offsets, kv_offsets [B, M + 1]) of spec.sd (None: none)."""
    if spec.sd is None:
        return None, None, None, None
    ql = jnp.asarray(spec.sd.q_seqlens, jnp.int32).reshape(spec.B, -1)
    kl = jnp.asarray(spec.sd.kv_seqlens, jnp.int32).reshape(spec.B, -1)
    qo = packed_offsets(ql) if spec.sd.q_offsets is None else spec.sd.q_offsets
    ko = packed_offsets(kl) if spec.sd.kv_offsets is None else spec.sd.kv_offsets
    return ql, kl, qo, ko


def reference_features(spec: Spec, bias, offset):
    ql, kl, qo, ko = descriptor_arrays(spec)
    seed = fusedattn._prepare.seed_words(spec.seed) if spec.dropout > 0 else None
    return dict(q_lens=ql, kv_lens=kl, scale=spec.scale, q_offsets=qo, kv_offsets=ko,
                thd=spec.layout in THD, window_size=spec.window, bias=bias,
                attn_bias_type=spec.bias_type, softmax_type=spec.softmax,
                softmax_offset=offset, dropout_probability=spec.dropout, seed=seed)


def masks(spec: Spec):
    """numpy (keep [B, Sq, Skv], real [B, Sq]) of the spec's sequences and window."""
    ql, kl, qo, ko = descriptor_arrays(spec)
    keep, real = segment_mask(spec.mask, spec.B, spec.Sq, spec.Skv, ql, kl, qo, ko,
                              spec.layout in THD, spec.window)
    return np.asarray(keep), np.asarray(real)


def run(key, spec: Spec, grads=True):
    """Jitted: fused (out, aux, grads), reference f32 (out, lse, max_logit, grads), lowp
    (out, grads). Grads are of sum(out * dout) w.r.t. (q, k, v, bias, offset)."""
    q, k, v, bias, offset, dout = inputs(key, spec)
    f = fused_fn(spec)

    def ref(q, k, v, bias, offset):
        feats = reference_features(spec, bias, offset)
        ql, kl, scale = feats.pop("q_lens"), feats.pop("kv_lens"), feats.pop("scale")
        return reference_f32(q, k, v, spec.mask, ql, kl, scale, **feats)

    def lowp(q, k, v, bias, offset):
        feats = reference_features(spec, bias, offset)
        ql, kl, scale = feats.pop("q_lens"), feats.pop("kv_lens"), feats.pop("scale")
        return reference_lowp(q, k, v, spec.mask, ql, kl, scale, **feats)

    argnums = tuple(i for i, x in enumerate((q, k, v, bias, offset)) if x is not None)

    def grad_of(fn):
        loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * dout.astype(jnp.float32))
        return jax.grad(loss, argnums=argnums)(q, k, v, bias, offset)

    f32 = lambda x: None if x is None else x.astype(jnp.float32)

    @jax.jit
    def go(q, k, v, bias, offset):
        r = dict(fused=f(q, k, v, bias, offset), ref=ref(q, k, v, bias, offset),
                 lowp=lowp(q, k, v, bias, offset))
        if grads:
            r["fused_g"] = grad_of(lambda *a: f(*a)[0])
            args32 = (f32(q), f32(k), f32(v), f32(bias), offset)
            r["ref_g"] = jax.grad(lambda *a: jnp.sum(ref(*a)[0] * f32(dout)), argnums=argnums)(
                *args32)
            ref_out, ref_lse = r["ref"][:2]
            r["stored_g"] = stored_out_grads(ref_out, ref_lse, dout, spec.dtype,
                                             lambda *a: ref(*a)[1], args32, argnums)
            r["lowp_g"] = grad_of(lowp)
        return r

    return go(q, k, v, bias, offset), argnums


GRAD_NAMES = ("dq", "dk", "dv", "dbias", "dsoftmax_offset")


def check(key, spec: Spec, grads=True, slack=1.0):
    """fused_attn vs the references for one spec; returns the run's results. slack
    multiplies the bounds of out and the gradients (assert_close's)."""
    r, argnums = run(key, spec, grads)
    out, aux = r["fused"]
    ref_out, ref_lse, ref_max = r["ref"]
    assert out.dtype == spec.dtype and out.shape == (spec.B, spec.Sq, spec.Hq, spec.dv)
    assert_close("out", out, ref_out, r["lowp"], slack=slack)
    lse = aux["softmax_aux"][..., 0]
    if spec.layout in THD:
        assert aux["softmax_aux"].shape == (spec.B, spec.Sq, spec.Hq, 1)
        lse = jnp.swapaxes(lse, 1, 2)
    else:
        assert aux["softmax_aux"].shape == (spec.B, spec.Hq, spec.Sq, 1)
    assert_lse_close("softmax_aux", lse, ref_lse)
    if spec.max_logit:
        assert_lse_close("max_logit", aux["max_logit"], jnp.max(ref_max, axis=0))
    keep, real = masks(spec)
    empty = ~keep.any(axis=2)  # [B, Sq]: rows that keep no key
    assert not np.asarray(out, np.float32)[empty].any(), "rows that keep no key must give 0"
    assert np.isneginf(np.asarray(lse).transpose(0, 2, 1)[~real]).all(), "padding rows: lse -inf"
    if grads:
        for i, g, rg, lg, sg in zip(argnums, r["fused_g"], r["ref_g"], r["lowp_g"],
                                    r["stored_g"]):
            name = GRAD_NAMES[i]
            assert g.shape == rg.shape, f"{name}: shape {g.shape}, expected {rg.shape}"
            # dsoftmax_offset sums a term of every row of the batch: cuDNN accumulates
            # those bf16-rounded terms in its own order, so it gets twice the room.
            # sg: the gradient's share of delta = rowsum(dO * O) of the stored, rounded O
            # (conftest.stored_out_grads), an error of the flash algorithm itself.
            assert_close(name, g, rg, lg, dtype=spec.dtype,
                         slack=(2.0 if name == "dsoftmax_offset" else 1.0) * slack,
                         stored_out=sg)
        dq = np.asarray(r["fused_g"][0], np.float32)
        assert not dq[empty].any(), "dq must be 0 at rows that keep no key"
    return r
