"""TransformerEngine's attention test grid (TE's tests/jax/test_fused_attn.py), run on
fusedattn with TE's call forms unchanged: the migrating user's imports, the inputs built as
TE's FusedAttnRunner builds them, fused_attn called as TE's customcall_fused_dpa calls it,
compared with TE's own reference formula (general_dot_product_attention over TE's dense
mask) and TE's checks. Written from TE's test, not copied; shared by
tests/python/attention/test_te_grid.py (a sample) and dev/te_grid/run_grid.py (all of it).

The grid is TE's cartesian product (its pytest parametrization):
  test_backward (TE's CI test): attn_mask_type (4) x qkv_layout (6) x data shape (7) x
    dropout (0, 0.1) x swa (no / (s_kv // 10, 0)) x sequence descriptor format (Mask,
    Seqlens, SegmentIDs) x softmax_type (3: TE's newer grid) x bias (NO_BIAS,
    POST_SCALE_BIAS 1HSS);
  test_forward (TE keeps it for development): the same x is_training (2) x bias (NO_BIAS,
    POST_SCALE_BIAS 1HSS / B1SS / BHSS / 11SS).
Shapes are scaled down so that the CPU engine runs the grid: sequence lengths 2048 / 1024
/ 128 -> 128 / 64 / 32, heads 12 / 6 / 16 -> 4 / 2 / 4, head dims 128 / 64 / 32 -> 32 / 16 /
8, TE's batch sizes and dtypes. TE's own skips are kept (THD needs a padding mask, packed
qkv needs equal lengths and heads, a window with s_q > s_kv, q/k and v head dims apart need
separate tensors, THD with a dense mask, B1SS/BHSS/11SS bias with padding masks); its
backend-availability skips are not (fusedattn runs every configuration on the CPU).
Adapted from TE on purpose, and only here: the tolerance is TE's rule (rtol = atol =
eps(dtype)^(2/3)); the zero-dbias-where-masked check needs one mask for the whole batch,
which THD rows do not share (TE's GPU backends skip THD with a bias), so it is left out
there; with LEARNABLE_SOFTMAX the offset's gradient is compared too.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

# What a TE test imports, from fusedattn.
from fusedattn import (AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVLayout,
                       SequenceDescriptor, fused_attn, make_swa_mask)


class BiasShape(enum.Enum):
    _1HSS = "1HSS"
    _B1SS = "B1SS"
    _BHSS = "BHSS"
    _11SS = "11SS"


class SeqDescFormat(enum.Enum):
    Mask = enum.auto()
    Seqlens = enum.auto()
    SegmentIDs = enum.auto()


MASKS = [AttnMaskType.NO_MASK, AttnMaskType.PADDING_MASK, AttnMaskType.CAUSAL_MASK,
         AttnMaskType.PADDING_CAUSAL_MASK]
LAYOUTS = [QKVLayout.BS3HD, QKVLayout.BSHD_BS2HD, QKVLayout.BSHD_BSHD_BSHD, QKVLayout.T3HD,
           QKVLayout.THD_T2HD, QKVLayout.THD_THD_THD]
# TE's (b, s_q, s_kv, h_q, h_kv, d_qk, d_v, dtype), scaled (module docstring), TE's ids.
SHAPES = {
    "2-2048-2048-12-12-64-64-BF16-SELF": (2, 128, 128, 4, 4, 16, 16, jnp.bfloat16),
    "2-2048-1024-12-12-64-64-BF16-CROSS": (2, 128, 64, 4, 4, 16, 16, jnp.bfloat16),
    "2-2048-2048-12-6-64-64-BF16-GQA": (2, 128, 128, 4, 2, 16, 16, jnp.bfloat16),
    "4-128-128-16-16-64-64-FP16-SELF": (4, 32, 32, 4, 4, 16, 16, jnp.float16),
    "4-128-128-16-16-64-32-FP16-SELF": (4, 32, 32, 4, 4, 16, 8, jnp.float16),
    "2-2048-1024-12-12-64-32-BF16-CROSS": (2, 128, 64, 4, 4, 16, 8, jnp.bfloat16),
    "2-2048-2048-12-6-128-64-FP16-GQA": (2, 128, 128, 4, 2, 32, 16, jnp.float16),
}
DROPOUTS = [0.0, 0.1]
SWA = [False, True]
FORMATS = [SeqDescFormat.Mask, SeqDescFormat.Seqlens, SeqDescFormat.SegmentIDs]
SOFTMAX = [AttnSoftmaxType.VANILLA_SOFTMAX, AttnSoftmaxType.OFF_BY_ONE_SOFTMAX,
           AttnSoftmaxType.LEARNABLE_SOFTMAX]
BACKWARD_BIASES = [(AttnBiasType.NO_BIAS, None), (AttnBiasType.POST_SCALE_BIAS, BiasShape._1HSS)]
FORWARD_BIASES = BACKWARD_BIASES + [(AttnBiasType.POST_SCALE_BIAS, s) for s in
                                    (BiasShape._B1SS, BiasShape._BHSS, BiasShape._11SS)]


@dataclasses.dataclass(frozen=True)
class Case:
    test: str  # "backward" or "forward"
    attn_mask_type: AttnMaskType
    qkv_layout: QKVLayout
    shape: str
    dropout_prob: float
    swa: bool
    seq_desc_format: SeqDescFormat
    softmax_type: AttnSoftmaxType
    attn_bias_type: AttnBiasType
    bias_shape: BiasShape | None
    is_training: bool = True

    @property
    def id(self) -> str:
        bias = self.attn_bias_type.name + ("" if self.bias_shape is None
                                           else "-" + self.bias_shape.value)
        parts = [self.test, self.attn_mask_type.name, self.qkv_layout.name, self.shape,
                 f"DROP_{self.dropout_prob}", "SWA" if self.swa else "NO_SWA",
                 self.seq_desc_format.name, self.softmax_type.name, bias]
        if self.test == "forward":
            parts.append("TRAINING" if self.is_training else "INFERENCE")
        return "-".join(parts)


def cases(test: str = "backward") -> list[Case]:
    """Every case of TE's grid for test_backward or test_forward, in pytest's order."""
    biases = BACKWARD_BIASES if test == "backward" else FORWARD_BIASES
    training = [True] if test == "backward" else [True, False]
    grid = itertools.product(MASKS, LAYOUTS, SHAPES, DROPOUTS, SWA, FORMATS, SOFTMAX, biases,
                             training)
    return [Case(test, m, l, s, p, w, f, sm, b, bs, t) for m, l, s, p, w, f, sm, (b, bs), t
            in grid]


def te_skip(case: Case) -> str | None:
    """TE's own reason to skip a case (its _check_configs and input setup), or None."""
    b, s_q, s_kv, h_q, h_kv, d_qk, d_v, _ = SHAPES[case.shape]
    layout, mask = case.qkv_layout, case.attn_mask_type
    if layout.is_thd() and not mask.is_padding():
        return "THD format requires padding masks"
    if layout.is_qkvpacked() and (s_q != s_kv or h_q != h_kv):
        return f"{layout.name} requires max_seqlen_q == max_seqlen_kv and num_heads_q == num_heads_kv"
    if s_q > s_kv and case.swa:
        return "seqlen_q > seqlen_kv is not supported with sliding window attention in cuDNN"
    if d_qk != d_v and not layout.is_separate():
        return "head_dim_qk != head_dim_v needs BSHD_BSHD_BSHD or THD_THD_THD"
    if (case.attn_bias_type == AttnBiasType.POST_SCALE_BIAS and case.bias_shape != BiasShape._1HSS
            and mask.is_padding()):
        return "B1SS, BHSS and 11SS bias shapes are only supported for non-padding mask"
    if layout.is_thd() and case.seq_desc_format == SeqDescFormat.Mask:
        return "THD doesn't support mask input"
    return None


# ---------------------------------------------------------------------------
# TE's reference: general_dot_product_attention over TE's dense mask (True = masked out).


def te_reference(query, key, value, bias, mask, dropout_rng, softmax_offset, *,
                 attn_bias_type, softmax_type, scaling_factor, dropout_probability,
                 is_training):
    """TE's jax_dpa: float32 math, GQA by groups, the bias after the scale (before it for
    PRE_SCALE_BIAS), masked logits at float32's min, the extra logit of OFF_BY_ONE (0) and
    LEARNABLE (softmax_offset[h]) softmax, jax.random dropout; out in query's dtype."""
    out_dtype = query.dtype
    q, k, v = (x.astype(jnp.float32) for x in (query, key, value))
    b, s_q, h_q, d = q.shape
    _, s_kv, h_kv, _ = k.shape
    g = h_q // h_kv
    qk = jnp.einsum("bqhgd,bkhd->bhgqk", q.reshape(b, s_q, h_kv, g, d), k)
    if bias is not None:
        bias5 = jnp.broadcast_to(bias.astype(jnp.float32), (b, h_q, s_q, s_kv)).reshape(
            b, h_kv, g, s_q, s_kv)
        logits = (scaling_factor * (qk + bias5) if attn_bias_type == AttnBiasType.PRE_SCALE_BIAS
                  else scaling_factor * qk + bias5)
    else:
        logits = scaling_factor * qk
    if mask is not None:
        logits = jnp.where(mask[:, :, None], jnp.finfo(jnp.float32).min, logits)
    if softmax_type == AttnSoftmaxType.VANILLA_SOFTMAX:
        probs = jax.nn.softmax(logits)
    else:
        extra = (jnp.zeros((h_q,), jnp.float32) if softmax_type ==
                 AttnSoftmaxType.OFF_BY_ONE_SOFTMAX else softmax_offset.reshape(h_q))
        col = jnp.broadcast_to(extra.reshape(1, h_kv, g, 1, 1), logits.shape[:-1] + (1,))
        probs = jax.nn.softmax(jnp.concatenate([logits, col], -1))[..., :-1]
    if is_training and dropout_probability > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_probability, probs.shape)
        probs = probs * keep / (1.0 - dropout_probability)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v)
    return out.reshape(b, s_q, h_q, v.shape[-1]).astype(out_dtype)


def te_mask(ids_q, ids_kv, pos_q, pos_kv, mask_type, window_size=None):
    """TE's make_mask: True = masked out. Kept: the same non-zero segment id, the causal
    order of positions (causal types), the sliding window (make_swa_mask)."""
    if pos_q is None:
        pos_q = jnp.broadcast_to(jnp.arange(ids_q.shape[-1], dtype=jnp.int32), ids_q.shape)
    if pos_kv is None:
        pos_kv = jnp.broadcast_to(jnp.arange(ids_kv.shape[-1], dtype=jnp.int32), ids_kv.shape)
    keep = (ids_q[:, :, None] == ids_kv[:, None, :]) & (ids_q[:, :, None] != 0)
    if mask_type.is_causal():
        keep &= pos_q[:, :, None] >= pos_kv[:, None, :]
    keep &= make_swa_mask(pos_q, pos_kv, window_size, jnp.bool_).reshape(keep.shape)
    return jnp.logical_not(keep)[:, None]  # [B, 1, Sq, Skv]


# ---------------------------------------------------------------------------
# TE's inputs


def te_segments(batch, length, num_segments, seed, min_segment_len=None):
    """TE's generate_random_segment_ids: segments of random sizes (at most length //
    num_segments), each with padding at its end, positions counting through it."""
    rng = np.random.default_rng(seed=seed)
    ids = np.zeros((batch, length), np.int32)
    pos = np.zeros((batch, length), np.int32)
    pad = np.zeros((batch, length), np.int32)
    biggest = length // num_segments
    for i in range(batch):
        cur = 0
        for s in range(num_segments):
            smallest = 1 if min_segment_len is None else int(min_segment_len[i][s])
            size = int(rng.integers(smallest, biggest + 1))
            if cur + size > length:
                break
            ids[i, cur:cur + size] = s + 1
            pos[i, cur:cur + size] = np.arange(size)
            valid = int(rng.integers(smallest, size + 1))
            pad[i, cur + valid:cur + size] = 1
            cur += size
        pad[i, cur:] = 1
    ids, pos, pad = map(jnp.asarray, (ids, pos, pad))
    return jnp.where(pad, 0, ids), pos, pad


def te_seqlens_and_offsets(ids):
    """TE's get_seqlens_and_offsets: lengths by id [B, S] and segment starts [B, S + 1],
    -1 where none (no end offset)."""
    B, S = ids.shape
    counts = jax.vmap(partial(jnp.bincount, length=S))(ids.astype(jnp.int32))[:, 1:]
    lens = jnp.concatenate([counts, jnp.zeros((B, 1), counts.dtype)], axis=1)
    lens = jnp.where(lens != 0, lens, -1)
    starts = jnp.concatenate([ids[:, :1] != 0, (ids[:, 1:] != ids[:, :-1]) & (ids[:, 1:] != 0)],
                             axis=1)
    offs = jax.vmap(lambda r: jnp.argwhere(r, size=S, fill_value=-1)[:, 0])(starts)
    offs = jnp.concatenate([offs, jnp.full((B, 1), -1, offs.dtype)], axis=1)
    return lens, offs


@dataclasses.dataclass
class Inputs:
    q: jax.Array
    k: jax.Array
    v: jax.Array
    bias: jax.Array | None
    softmax_offset: jax.Array | None
    mask: jax.Array          # the reference's [B, 1, Sq, Skv], True = masked out
    pad_q: jax.Array         # [B, Sq], 1 = padding
    pad_kv: jax.Array
    sequence_descriptor: object
    dropout_rng: jax.Array | None
    kwargs: dict             # fused_attn's keywords, as TE passes them


_KEYS = jax.random.split(jax.random.PRNGKey(0), 5)  # TE's q, k, v, bias, dropout keys


@functools.lru_cache(maxsize=None)
def _qkv(shape: str):
    b, s_q, s_kv, h_q, h_kv, d_qk, d_v, dtype = SHAPES[shape]
    return (jax.random.uniform(_KEYS[0], (b, s_q, h_q, d_qk), dtype, -1.0),
            jax.random.uniform(_KEYS[1], (b, s_kv, h_kv, d_qk), dtype, -1.0),
            jax.random.uniform(_KEYS[2], (b, s_kv, h_kv, d_v), dtype, -1.0))


@functools.lru_cache(maxsize=None)
def _bias(shape: str, bias_shape: BiasShape):
    b, s_q, s_kv, h_q, _, _, _, dtype = SHAPES[shape]
    dims = {BiasShape._1HSS: (1, h_q, s_q, s_kv), BiasShape._B1SS: (b, 1, s_q, s_kv),
            BiasShape._BHSS: (b, h_q, s_q, s_kv), BiasShape._11SS: (1, 1, s_q, s_kv)}[bias_shape]
    if bias_shape == BiasShape._1HSS:
        return jax.random.uniform(_KEYS[3], dims, dtype, -1.0)
    # TE's arbitrary mask as a bias: 0 in diagonal blocks, cuDNN's -inf elsewhere
    neg = -(2.0 ** 27) if dtype == jnp.bfloat16 else -(2.0 ** 15)
    bias = np.full(dims, neg, np.float32)
    top = min(s_q, s_kv)
    cuts = jax.random.randint(_KEYS[3], (top * 5 // 128,), 0, top).tolist()
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        bias[:, :, lo:hi, lo:hi] = 0.0
    return jnp.asarray(bias, dtype)


def te_inputs(case: Case) -> Inputs:
    """TE's FusedAttnRunner._setup_inputs for one case."""
    b, s_q, s_kv, h_q, h_kv, d_qk, d_v, dtype = SHAPES[case.shape]
    window = (s_kv // 10, 0) if case.swa else None
    bias_key, dropout_key = _KEYS[3], _KEYS[4]
    q, k, v = _qkv(case.shape)
    bias = (None if case.attn_bias_type == AttnBiasType.NO_BIAS
            else _bias(case.shape, case.bias_shape))
    offset = None
    if case.softmax_type == AttnSoftmaxType.LEARNABLE_SOFTMAX:
        offset = jax.random.uniform(jax.random.fold_in(bias_key, 1), (1, h_q, 1, 1),
                                    jnp.float32, -1.0)
    layout, mask_type = case.qkv_layout, case.attn_mask_type
    if layout.is_thd():
        segments = 2
        ids_q, pos_q, pad_q = te_segments(b, s_q, segments, seed=42)
        lens_q, offs_q = te_seqlens_and_offsets(ids_q)
        if layout == QKVLayout.T3HD or s_q == s_kv:
            ids_kv, pos_kv, pad_kv = ids_q, pos_q, pad_q
        else:
            ids_kv, pos_kv, pad_kv = te_segments(b, s_kv, segments, seed=2024,
                                                 min_segment_len=None if window is None
                                                 else lens_q)
        lens_kv, offs_kv = te_seqlens_and_offsets(ids_kv)
        max_segments = segments + 1  # TE: + 1 for runtime segments < max segments
    else:
        pad_ratio = 0.3 if mask_type.is_padding() else 0.0

        def valid(length):
            pad = int(length * pad_ratio)
            tokens = jnp.concatenate([jnp.ones((b, length - pad)), jnp.zeros((b, pad))], -1)
            return tokens, jnp.logical_not(tokens)

        (ids_q, pad_q), (ids_kv, pad_kv) = valid(s_q), valid(s_kv)
        pos_q = pos_kv = None
        max_segments = 1
    mask = te_mask(ids_q, ids_kv, pos_q, pos_kv, mask_type, window)
    fmt = case.seq_desc_format
    if layout.is_thd():
        if fmt == SeqDescFormat.Seqlens:
            sd = SequenceDescriptor.from_seqlens_and_offsets((lens_q, lens_kv), (offs_q, offs_kv))
        else:
            sd = SequenceDescriptor.from_segment_ids_and_pos((ids_q, ids_kv), (pos_q, pos_kv))
    elif fmt == SeqDescFormat.Mask:
        sd = (None if mask_type == AttnMaskType.NO_MASK
              else te_mask(ids_q, ids_kv, pos_q, pos_kv, mask_type))
    elif fmt == SeqDescFormat.Seqlens:
        sd = SequenceDescriptor.from_seqlens((ids_q.sum(axis=-1).astype(jnp.int32),
                                              ids_kv.sum(axis=-1).astype(jnp.int32)))
    else:
        sd = SequenceDescriptor.from_segment_ids_and_pos((ids_q, ids_kv), None)
    kwargs = dict(attn_bias_type=case.attn_bias_type, attn_mask_type=mask_type,
                  softmax_type=case.softmax_type, scaling_factor=1.0 / np.sqrt(d_qk),
                  dropout_probability=case.dropout_prob, is_training=case.is_training,
                  qkv_layout=layout, max_segments_per_seq=max_segments, window_size=window)
    return Inputs(q, k, v, bias, offset, mask, pad_q, pad_kv, sd,
                  dropout_key if case.dropout_prob > 0 else None, kwargs)


def te_call(query, key, value, bias, softmax_offset, sequence_descriptor, dropout_rng,
            **kwargs):
    """TE's customcall_fused_dpa: the layout's packing, then fused_attn as TE calls it."""
    layout = kwargs["qkv_layout"]
    if layout.is_qkvpacked():
        qkv_args = (jnp.stack([query, key, value], axis=-3),)
    elif layout.is_kvpacked():
        qkv_args = (query, jnp.stack([key, value], axis=-3))
    else:
        qkv_args = (query, key, value)
    return fused_attn(qkv_args, bias, sequence_descriptor, dropout_rng,
                      softmax_offset=softmax_offset, **kwargs).astype(query.dtype)


def reference_call(query, key, value, bias, softmax_offset, mask, dropout_rng, **kwargs):
    return te_reference(query, key, value, bias, mask, dropout_rng, softmax_offset,
                        attn_bias_type=kwargs["attn_bias_type"],
                        softmax_type=kwargs["softmax_type"],
                        scaling_factor=kwargs["scaling_factor"],
                        dropout_probability=kwargs["dropout_probability"],
                        is_training=kwargs["is_training"])


# ---------------------------------------------------------------------------
# TE's checks


class Mismatch(AssertionError):
    pass


def tolerance(dtype) -> float:
    """TE's dtype_tols: rtol = atol = eps^(2/3)."""
    return float(jnp.finfo(dtype).eps) ** (2.0 / 3.0)


def assert_close(what, got, want, dtype):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    tol = tolerance(dtype)
    if got.shape != want.shape:
        raise Mismatch(f"{what}: shape {got.shape}, expected {want.shape}")
    bad = ~(np.abs(got - want) <= tol + tol * np.abs(want))
    if bad.any():
        err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).all() else float("nan")
        raise Mismatch(f"{what}: {int(bad.sum())} of {bad.size} elements off (max |err| {err:.3g},"
                       f" tol {tol:.3g})")


def _split(x, pad):
    p = pad[..., None, None].astype(bool)
    return jnp.where(p, 0, x), jnp.where(p, x, 0)


def run_case(case: Case) -> str:
    """Runs one case as TE's test does. Returns "passed" or "uncompared" (dropout: TE
    compares nothing then); raises Mismatch for a failed check, anything else for a call
    fusedattn rejects."""
    inp = te_inputs(case)
    dtype = SHAPES[case.shape][7]
    kw = inp.kwargs
    if case.test == "forward":
        got = te_call(inp.q, inp.k, inp.v, inp.bias, inp.softmax_offset,
                      inp.sequence_descriptor, inp.dropout_rng, **kw).astype(jnp.float32)
        if case.is_training and case.dropout_prob > 0.0:
            return _finite(got)
        want = reference_call(inp.q, inp.k, inp.v, inp.bias, inp.softmax_offset, inp.mask,
                              inp.dropout_rng, **kw).astype(jnp.float32)
        (g_valid, g_pad), (w_valid, _) = _split(got, inp.pad_q), _split(want, inp.pad_q)
        assert_close("out (padding)", g_pad, jnp.zeros_like(g_pad), dtype)
        assert_close("out", g_valid, w_valid, dtype)
        return "passed"

    multiplier = case_multiplier(case)

    def loss(fn, q, k, v, bias, offset, *rest):
        out = jnp.where(inp.pad_q[..., None, None], 0, fn(q, k, v, bias, offset, *rest, **kw))
        return (jnp.mean(out.astype(jnp.float32)) * multiplier).astype(dtype)

    argnums = [0, 1, 2]
    if case.bias_shape == BiasShape._1HSS:
        argnums.append(3)
    if inp.softmax_offset is not None:
        argnums.append(4)
    args = (inp.q, inp.k, inp.v, inp.bias, inp.softmax_offset)
    got, g_grads = jax.jit(jax.value_and_grad(partial(loss, te_call), argnums))(
        *args, inp.sequence_descriptor, inp.dropout_rng)
    if case.dropout_prob > 0.0:  # TE runs its reference too, then compares nothing
        return _finite(got, *g_grads)
    want, w_grads = jax.jit(jax.value_and_grad(partial(loss, reference_call), argnums))(
        *args, inp.mask, inp.dropout_rng)
    assert_close("loss", got, want, dtype)
    for name, g, w, pad in zip(("dq", "dk", "dv"), g_grads, w_grads,
                               (inp.pad_q, inp.pad_kv, inp.pad_kv)):
        (g_valid, g_pad), (w_valid, w_pad) = _split(g, pad), _split(w, pad)
        assert_close(f"{name} (padding)", g_pad, jnp.zeros_like(g_pad), dtype)
        assert_close(f"{name} (padding) vs reference", g_pad, w_pad, dtype)
        assert_close(name, g_valid, w_valid, dtype)
    rest = list(zip(argnums[3:], g_grads[3:], w_grads[3:]))
    for i, g, w in rest:
        if i == 3:
            masked = inp.mask[0, 0]
            if not case.qkv_layout.is_thd():  # one mask for the batch (module docstring)
                assert_close("dbias (masked)", jnp.where(masked, g, 0), jnp.zeros_like(g), dtype)
            assert_close("dbias (masked) vs reference", jnp.where(masked, g, 0),
                         jnp.where(masked, w, 0), dtype)
            assert_close("dbias", jnp.where(masked, 0, g), jnp.where(masked, 0, w), dtype)
        else:
            assert_close("d softmax_offset", g, w, dtype)
    return "passed"


def case_multiplier(case: Case) -> float:
    """TE's gradient multiplier: max_seqlen_q * num_heads_q, / 10 for causal masks."""
    _, s_q, _, h_q, *_ = SHAPES[case.shape]
    return s_q * h_q / (10 if case.attn_mask_type.is_causal() else 1)


def _finite(*xs) -> str:
    for x in xs:
        if not np.isfinite(np.asarray(x, np.float32)).all():
            raise Mismatch("not finite (dropout: TE compares nothing else)")
    return "uncompared"


def outcome(case: Case) -> tuple[str, str]:
    """(status, detail): skipped (TE's reason), passed, uncompared, mismatched (the check),
    rejected (the exception's type and first line)."""
    reason = te_skip(case)
    if reason:
        return "skipped", reason
    try:
        return run_case(case), ""
    except Mismatch as e:
        return "mismatched", str(e)
    except Exception as e:  # noqa: BLE001 -- a call fusedattn does not take
        first = (str(e).strip().splitlines() or [""])[0]
        return "rejected", f"{type(e).__name__}: {first}"


def summarize(results) -> str:
    """results: [(case, status, detail)] -> counts and the grouped messages."""
    counts = collections.Counter(status for _, status, _ in results)
    ran = len(results) - counts["skipped"]
    lines = [f"cases {len(results)}: skipped by TE's own rules {counts['skipped']}, calls {ran}: "
             f"rejected {counts['rejected']}, mismatched {counts['mismatched']}, passed "
             f"{counts['passed']} (+ {counts['uncompared']} with dropout, run but compared by "
             "TE with nothing)"]
    for status in ("rejected", "mismatched"):
        groups = collections.Counter(d for _, s, d in results if s == status)
        for detail, n in groups.most_common():
            example = next(c.id for c, s, d in results if s == status and d == detail)
            lines.append(f"  {status} x{n}: {detail}\n      e.g. {example}")
    return "\n".join(lines)


def ci_sample() -> list[Case]:
    """A deterministic sample of the grid for CI: every layout x mask x bias of
    test_backward that TE runs, once each, the other axes' values taken in turn (dropout on
    one case in four: TE compares nothing then), and test_forward's other bias shapes,
    training and inference."""
    def pick(pool, want):
        return max(pool, key=lambda c: sum(getattr(c, a) == v for a, v in want.items()))

    shapes = list(SHAPES)
    picked = []
    backward = [c for c in cases("backward") if te_skip(c) is None]
    for i, (layout, mask, (bias, shape)) in enumerate(itertools.product(LAYOUTS, MASKS,
                                                                         BACKWARD_BIASES)):
        pool = [c for c in backward if (c.qkv_layout, c.attn_mask_type, c.attn_bias_type,
                                        c.bias_shape) == (layout, mask, bias, shape)]
        if pool:
            picked.append(pick(pool, dict(
                shape=shapes[i % len(shapes)], seq_desc_format=FORMATS[i % 3],
                softmax_type=SOFTMAX[(i // 3) % 3], swa=bool(i // 2 % 2),
                dropout_prob=DROPOUTS[i % 4 == 3])))
    forward = [c for c in cases("forward") if te_skip(c) is None]
    for i, (bias_shape, training) in enumerate(itertools.product(
            [None, BiasShape._B1SS, BiasShape._BHSS, BiasShape._11SS], [True, False])):
        pool = [c for c in forward if (c.bias_shape, c.is_training) == (bias_shape, training)]
        picked.append(pick(pool, dict(shape=shapes[(i + 3) % len(shapes)],
                                      dropout_prob=DROPOUTS[not training],
                                      seq_desc_format=FORMATS[i % 3], swa=bool(i % 2),
                                      softmax_type=SOFTMAX[i % 3])))
    return picked
