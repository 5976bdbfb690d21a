"""The plain-JAX reference of fused attention: materialized scores, float32 math.

Every backend is tested against it, and XLA runs it where no fused kernel serves a
call. Semantics (shared with csrc/fusedattn/attention/mask.h, cpu/score_ops.h and philox.h):

* Scores per (batch, q head, query, key); q head h reads kv head h // (Hq // Hkv):
  s = scale * q.k (+ bias: POST_SCALE_BIAS s = scale * q.k + bias, PRE_SCALE_BIAS
  s = scale * (q.k + bias)); bias [1|B, 1|Hq, Sq, Skv] broadcasts.
* Sequences: row b holds segments s < M; segment s has queries
  [q_off[b, s], q_off[b, s] + q_len[b, s]) and keys [kv_off[b, s], ... + kv_len[b, s]).
  BSHD layouts have one segment starting at token 0, whose lengths are the
  descriptor's under the padding masks and the full extents otherwise. Offsets and
  lengths are clamped to the tensor's extent, and (THD) a segment ends at the next
  segment's offset at the latest (off[b, M] bounds the last), and is empty when its
  offset is below an earlier segment's: segments never overlap (each side separately).
  A query attends only to keys of its own segment; tokens outside every segment are
  padding: output 0, lse -inf, no gradient.
* Inside a segment, with local positions i, j and diag = 0 (top-left) or
  kv_len - q_len (the *_BOTTOM_RIGHT masks), key j is kept for query i when
  i + diag - left <= j <= i + diag + right, where window_size = (left, right) and
  -1 is unbounded; a causal mask sets right = 0.
* Softmax: OFF_BY_ONE adds one extra logit 0 to the denominator, LEARNABLE one extra
  logit softmax_offset[h]; it has no value. lse includes the extra term: a query of a
  segment that keeps no key has output 0 and lse equal to that logit (-inf under
  VANILLA). max_logit [B, Hq] is the max of the kept scores (bias included, extra
  logit not), -inf where nothing is kept. A +inf extra logit takes all the mass:
  output 0, lse +inf, no gradient.
* NaN in, NaN out: a NaN among a query's kept scores (from q, k, bias or score_mod) or
  a NaN extra logit makes that query's output and lse NaN, and its head's max_logit;
  in the backward every gradient its probabilities touch is NaN. NaN at masked
  positions and padding queries change nothing.
* Dropout (dropout_probability > 0 and a seed): the normalized probabilities times
  keep / (1 - p), keep from Philox4x32-10 exactly as csrc/fusedattn/core/philox.h: counter
  (key // 4, query, head, batch), key words (seed[0], seed[1]), word key % 4 kept when
  >= floor(p * 2^32). So this reference (and the XLA fallback built on it) draws the
  same mask as the CPU engine; other GPU backends may use their own generator.
* index_base (batch_base, head_base): the call is one shard of a bigger one, whose batch
  entry 0 and q head 0 are entry batch_base and head head_base of the whole. Dropout's
  counter and score_mod's batch / head indices are the global ones; every array (and
  score_mod's operands) is the shard's own. (0, 0) without it.
* index_base (batch_base, head_base, q_pos, kv_pos, q_extent, kv_extent[, stripe,
  stride]), any layout: the shard is also a block of the bigger call along the sequence
  (context parallelism). Its tokens are some of the whole call's, by one map per side:
  local query t is token q_pos + (t // stripe) * stride + t % stripe of the whole call's
  q_extent queries, local key t the same from kv_pos of its kv_extent keys (6 elements:
  stripe = stride = 1, contiguous; stripes of cp devices: stride = cp * stripe; 1 <=
  stripe, stride a multiple of stripe, every local token inside the extent). Everything
  is in those global tokens, so the block computes the whole call's scores there: the
  sequences are the whole call's (its descriptor is the global one: BSHD, one segment
  whose lengths are the descriptor's under the padding masks, else the extents; THD, the
  segments of the global packed row of q_extent / kv_extent tokens by the rule above),
  global query g keeps the global keys the rule above keeps for it in the segment that
  holds it (none when no segment holds g, which makes it padding), cut to the block's
  keys; dropout's counter takes the global query and key (the engine asks kv_pos, and a
  striped block's stripe, to be multiples of 4 under dropout); score_mod's q_idx / kv_idx
  are the global positions (BSHD: global tokens; THD: positions in the segment), while its
  operands are the block's own slices, read at the local positions (BSHD; THD blocks take
  operands without a sequence dim). out, lse and max_logit are those of the block's kept
  keys alone (a query that keeps none of them: output 0 and lse -inf, or the extra logit
  for a query of a segment), so blocks over the keys merge by their lse (an extra logit
  enters every block's lse).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .enums import AttnBiasType, AttnMaskType, SoftmaxType

# ---------------------------------------------------------------------------
# Philox4x32-10 on uint32 arrays (no 64-bit integers needed)


def _mulhilo(a: int, b):
    """(hi, lo) 32-bit halves of the 64-bit product of constant a and uint32 array b."""
    u32 = jnp.uint32
    a_lo, a_hi = u32(a & 0xFFFF), u32(a >> 16)
    b_lo, b_hi = b & u32(0xFFFF), b >> u32(16)
    lolo, hilo, lohi, hihi = a_lo * b_lo, a_hi * b_lo, a_lo * b_hi, a_hi * b_hi
    cross = (lolo >> u32(16)) + (hilo & u32(0xFFFF)) + lohi  # < 2^32: no overflow
    hi = hihi + (hilo >> u32(16)) + (cross >> u32(16))
    return hi, u32(a) * b


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counters (c0..c3, uint32 arrays) under key (k0, k1) -> 4 words."""
    c = [jnp.asarray(x, jnp.uint32) for x in (c0, c1, c2, c3)]
    k0, k1 = jnp.asarray(k0, jnp.uint32), jnp.asarray(k1, jnp.uint32)
    for _ in range(10):
        hi0, lo0 = _mulhilo(0xD2511F53, c[0])
        hi1, lo1 = _mulhilo(0xCD9E8D57, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0 = k0 + jnp.uint32(0x9E3779B9)
        k1 = k1 + jnp.uint32(0xBB67AE85)
    return c


def dropout_threshold(p: float) -> int:
    """Words at or above it keep their element (philox.h's dropout_threshold)."""
    return min(int(float(np.float32(p)) * 2.0 ** 32), 2 ** 32 - 1)


def index_base_vector(index_base):
    """index_base (ints or an int32 array of 2, 6 or 8 elements, maybe traced; a [1, n]
    array too) as an int32 vector [2], [6] or [8]."""
    base = jnp.asarray(index_base, jnp.int32)
    if base.size not in (2, 6, 8):
        raise ValueError(f"index_base: got shape {base.shape}; expected 2 elements (batch_base, "
                         "head_base), 6 (batch_base, head_base, q_pos, kv_pos, q_extent, "
                         "kv_extent) or 8 (.., stripe, stride)")
    return base.reshape(-1)


def block_tokens(n: int, pos, stripe=1, stride=1):
    """int32 [n]: the whole call's token of each of a block's n local tokens t (mask.h's
    global_token): pos + (t // stripe) * stride + t % stripe (values maybe traced)."""
    t = jnp.arange(n, dtype=jnp.int32)
    return pos + (t // stripe) * stride + t % stripe


def block_positions(block, Sq: int, Skv: int):
    """(global query tokens int32 [Sq], global key tokens int32 [Skv]) of a block:
    block = index_base[2:], int32 [4] (q_pos, kv_pos, q_extent, kv_extent) or [6] (..,
    stripe, stride)."""
    stripe, stride = (block[4], block[5]) if block.shape[0] == 6 else (1, 1)
    return (block_tokens(Sq, block[0], stripe, stride),
            block_tokens(Skv, block[1], stripe, stride))


def dropout_keep(seed, p: float, B: int, H: int, Sq: int, Skv: int, index_base=None,
                 broadcast: bool = False):
    """bool [B, H, Sq, Skv]: the keep mask of dropout with probability p; index_base
    (batch_base, head_base) shifts the batch and head of the counter, and with 6 or 8
    elements (.., q_pos, kv_pos, q_extent, kv_extent[, stripe, stride]) its query and key
    are the block's global tokens (None: no shift). broadcast: one mask for every batch
    entry and head, batch entry 0's and head 0's (the bases too)."""
    if broadcast:
        base = None
        if index_base is not None:
            base = index_base_vector(index_base)
            base = base.at[:2].set(0)
        one = dropout_keep(seed, p, 1, 1, Sq, Skv, base)
        return jnp.broadcast_to(one, (B, H, Sq, Skv))
    seed = jnp.asarray(seed, jnp.uint32)
    b = jnp.arange(B, dtype=jnp.uint32)[:, None, None, None]
    h = jnp.arange(H, dtype=jnp.uint32)[None, :, None, None]
    i = jnp.arange(Sq, dtype=jnp.uint32)[None, None, :, None]
    j = jnp.arange(Skv, dtype=jnp.uint32)[None, None, None, :]
    if index_base is not None:
        base = index_base_vector(index_base)
        b, h = b + base[0].astype(jnp.uint32), h + base[1].astype(jnp.uint32)
        if base.shape[0] > 2:
            gi, gj = block_positions(base[2:], Sq, Skv)
            i = gi.astype(jnp.uint32)[None, None, :, None]
            j = gj.astype(jnp.uint32)[None, None, None, :]
    words = philox4x32_10(j >> 2, i, h, b, seed[0], seed[1])
    word = jnp.select([(j & 3) == t for t in range(3)], words[:3], words[3])
    return word >= jnp.uint32(dropout_threshold(p))


# ---------------------------------------------------------------------------
# Masks


def _segments(lens, offsets, S, M, thd, padding):
    """(begin, length) int32 [B, M] of each segment by mask.h's rule (segment_side): a
    THD segment runs [off[s], min(off[s] + len[s], off[s + 1], S)) with offsets clamped
    to [0, S], and is empty when off[s] is below an earlier segment's offset."""
    if thd:
        offs = jnp.clip(jnp.asarray(offsets, jnp.int32)[:, :M + 1], 0, S)
        begin = offs[:, :M]
        earlier = jax.lax.cummax(begin, axis=1)  # the largest offset up to each segment
        in_order = begin >= jnp.pad(earlier, ((0, 0), (1, 0)))[:, :M]
        end = jnp.where(in_order, offs[:, 1:], begin)
    else:
        begin = jnp.zeros((lens.shape[0], M), jnp.int32)
        end = jnp.full_like(begin, S)
    if padding:
        end = jnp.minimum(end, begin + jnp.clip(jnp.asarray(lens, jnp.int32), 0, S))
    return begin, jnp.maximum(end - begin, 0)


def _token_segment(begin, length, tokens):
    """Segment index [B, n] of each of the tokens int [n] (-1: padding); segments never
    overlap."""
    t = tokens[None, :, None]
    inside = (t >= begin[:, None, :]) & (t < (begin + length)[:, None, :])  # [B, n, M]
    M = begin.shape[1]
    last = M - 1 - jnp.argmax(inside[..., ::-1], axis=-1)
    return jnp.where(inside.any(-1), last, -1)


def _segment_tables(mask_type, B, Sq, Skv, q_seqlens, kv_seqlens, q_offsets, kv_offsets, thd,
                    block=None):
    """Segments (begin, length) [B, M] of queries and keys, each token's segment [B, Sq]
    and [B, Skv], and the tokens' positions in the row int32 [Sq] and [Skv]: the call's
    own, or with block (index_base[2:]) the whole call's segments and the block's global
    tokens."""
    padding = AttnMaskType(mask_type).is_padding()
    if padding:
        q_lens = jnp.asarray(q_seqlens, jnp.int32).reshape(B, -1)
        kv_lens = jnp.asarray(kv_seqlens, jnp.int32).reshape(B, -1)
    else:
        q_lens = kv_lens = jnp.zeros((B, 1), jnp.int32)  # unread
    M = q_lens.shape[1]
    if block is None:
        q_ext, kv_ext = Sq, Skv
        gi, gj = jnp.arange(Sq, dtype=jnp.int32), jnp.arange(Skv, dtype=jnp.int32)
    else:
        q_ext, kv_ext = block[2], block[3]
        gi, gj = block_positions(block, Sq, Skv)
    qb, ql = _segments(q_lens, q_offsets, q_ext, M, thd, padding)
    kb, kl = _segments(kv_lens, kv_offsets, kv_ext, M, thd, padding)
    return qb, ql, kb, kl, _token_segment(qb, ql, gi), _token_segment(kb, kl, gj), gi, gj


def _take(x, seg):
    """x [B, M] at each token's segment seg [B, S] (padding tokens read segment 0)."""
    return jnp.take_along_axis(x, jnp.maximum(seg, 0), axis=1)


def _keep(mask_type, tables, window_size):
    """(keep bool [B, Sq, Skv], real bool [B, Sq]) from _segment_tables' tables."""
    qb, ql, kb, kl, qs, ks, gi, gj = tables
    li = gi[None] - _take(qb, qs)  # positions in the segment
    lj = gj[None] - _take(kb, ks)
    diag = _take(kl - ql, qs) if mask_type.is_bottom_right() else jnp.zeros_like(qs)
    left, right = (-1, -1) if window_size is None else window_size
    if mask_type.is_causal():
        right = 0
    keep = (qs[:, :, None] >= 0) & (qs[:, :, None] == ks[:, None, :])
    pos = li[:, :, None] + diag[:, :, None]  # the diagonal key of each query
    if left >= 0:
        keep &= lj[:, None, :] >= pos - left
    if right >= 0:
        keep &= lj[:, None, :] <= pos + right
    return keep, qs >= 0


def segment_mask(mask_type, B, Sq, Skv, q_seqlens=None, kv_seqlens=None, q_offsets=None,
                 kv_offsets=None, thd=False, window_size=None):
    """(keep bool [B, Sq, Skv], real bool [B, Sq]): keep[b, i, j] when query i keeps key j;
    real[b, i] when query i belongs to a segment (not padding)."""
    mask_type = AttnMaskType(mask_type)
    tables = _segment_tables(mask_type, B, Sq, Skv, q_seqlens, kv_seqlens, q_offsets,
                             kv_offsets, thd)
    return _keep(mask_type, tables, window_size)


def block_mask(mask_type, B, Sq, Skv, positions, q_seqlens=None, kv_seqlens=None,
               window_size=None, q_offsets=None, kv_offsets=None, thd=False):
    """(keep bool [B, Sq, Skv], real bool [B, Sq]) of a block of a bigger call (module
    docstring; mask.h's block_keys). positions: (q_pos, kv_pos, q_extent, kv_extent[,
    stripe, stride]), int32 [4] or [6] maybe traced: query t and key t are the whole
    call's tokens q_pos + (t // stripe) * stride + t % stripe and the same from kv_pos;
    q_seqlens / kv_seqlens [B] or [B, M] and (thd) q_offsets / kv_offsets [B, M + 1] are
    the whole call's descriptor."""
    mask_type = AttnMaskType(mask_type)
    tables = _segment_tables(mask_type, B, Sq, Skv, q_seqlens, kv_seqlens, q_offsets,
                             kv_offsets, thd, jnp.asarray(positions, jnp.int32))
    return _keep(mask_type, tables, window_size)


def sequence_positions(mask_type, B, Sq, Skv, q_seqlens=None, kv_seqlens=None, q_offsets=None,
                       kv_offsets=None, thd=False, block=None):
    """(q_pos int32 [B, Sq], kv_pos int32 [B, Sq, Skv]): the positions score_mod sees,
    counted from the first query and key token of query i's sequence (a THD segment
    is a sequence of its own; in BSHD layouts they are i and j). block (index_base[2:],
    THD): the positions of the block's global tokens in the whole call's segments. Only
    kept keys matter; the others are clipped into [0, Skv) (a block: [0, kv_extent))."""
    if not thd:
        return (jnp.broadcast_to(jnp.arange(Sq, dtype=jnp.int32), (B, Sq)),
                jnp.broadcast_to(jnp.arange(Skv, dtype=jnp.int32), (B, Sq, Skv)))
    if block is not None:
        block = jnp.asarray(block, jnp.int32)
    qb, _, kb, _, qs, _, gi, gj = _segment_tables(mask_type, B, Sq, Skv, q_seqlens, kv_seqlens,
                                                  q_offsets, kv_offsets, thd, block)
    q_ext, kv_ext = (Sq, Skv) if block is None else (block[2], block[3])
    q_pos = jnp.clip(gi[None] - _take(qb, qs), 0, q_ext - 1)
    kv_pos = gj[None, None] - _take(kb, qs)[:, :, None]
    return q_pos.astype(jnp.int32), jnp.clip(kv_pos, 0, kv_ext - 1).astype(jnp.int32)


def attention_mask(mask_type: AttnMaskType, batch: int, seqlen_q: int, seqlen_kv: int,
                   q_seqlens=None, kv_seqlens=None) -> jax.Array:
    """bool [B, 1, Sq, Skv] of a BSHD call without window, True = the key is kept."""
    return segment_mask(mask_type, batch, seqlen_q, seqlen_kv, q_seqlens, kv_seqlens)[0][:, None]


# ---------------------------------------------------------------------------
# Attention


def nan_max(x, axis, keepdims=False):
    """jnp.max that is NaN wherever x has a NaN: XLA's fused reductions may drop it."""
    m = jnp.max(x, axis=axis, keepdims=keepdims)
    return jnp.where(jnp.isnan(x).any(axis=axis, keepdims=keepdims), jnp.nan, m)


def attention_reference(q, k, v, *, attn_mask_type=AttnMaskType.NO_MASK, scaling_factor=None,
                        q_seqlens=None, kv_seqlens=None, q_offsets=None, kv_offsets=None,
                        thd=False, window_size=None, bias=None,
                        attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                        softmax_type=SoftmaxType.VANILLA_SOFTMAX, softmax_offset=None,
                        dropout_probability=0.0, seed=None, score_mod=None, index_base=None,
                        dropout_broadcast=False):
    """q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv]; q_seqlens / kv_seqlens
    int [B] or [B, M]; q_offsets / kv_offsets int [B, M + 1] (read when thd); bias
    [1|B, 1|Hq, Sq, Skv] (with attn_bias_type); softmax_offset [Hq] (LEARNABLE_SOFTMAX);
    seed uint32 [2] (dropout_probability > 0: dropout on); dropout_broadcast: one dropout
    mask for every batch entry and head (dropout_keep's broadcast). score_mod: None, or a function
    score_mod(s, q_pos, kv_pos) of the scaled (and biased) logits s [B, Hq, Sq, Skv] f32
    and the positions of sequence_positions() giving the scores the masks and softmax
    then see (fused_attn's score_mod, applied over the grid). index_base: None, or
    (batch_base, head_base) (ints or int32 [2], maybe traced) of a shard, or (batch_base,
    head_base, q_pos, kv_pos, q_extent, kv_extent[, stripe, stride]) (int32 [6] or [8]) of
    a block of a bigger call, BSHD or THD (module docstring): the mask is block_mask()'s
    (the descriptor is the whole call's), dropout draws the global mask, and score_mod is
    called as score_mod(s, q_pos, kv_pos, index_base=index_base) (q_pos, kv_pos: BSHD, the
    block's own local ones; THD, sequence_positions(block=) of its global tokens) so that
    it can give fn the global batch, head and q / kv indices (score_mod.apply_reference's
    index_base).

    Returns (out [B, Sq, Hq, Dv] in q's dtype, lse [B, Hq, Sq] f32, max_logit [B, Hq] f32;
    float64 inputs: lse, max_logit and the math in float64);
    max_logit is per batch entry here, fused_attn reduces it over the batch.
    """
    B, Sq, Hq, D = q.shape
    _, Skv, Hkv, _ = k.shape
    block = None
    if index_base is not None:
        index_base = index_base_vector(index_base)
        if index_base.shape[0] > 2:
            block = index_base[2:]
    scale = D ** -0.5 if scaling_factor is None else scaling_factor
    group = Hq // Hkv
    # float32 math; float64 inputs (under jax_enable_x64) in float64
    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    qf = q.astype(acc).reshape(B, Sq, Hkv, group, D)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qf, k.astype(acc), precision="highest")
    s = s.reshape(B, Hq, Sq, Skv)
    if bias is not None:
        bias = jnp.broadcast_to(bias.astype(acc), (B, Hq, Sq, Skv))
        s = (s + bias) * scale if AttnBiasType(attn_bias_type) == AttnBiasType.PRE_SCALE_BIAS \
            else s * scale + bias
    else:
        s = s * scale
    if score_mod is not None:
        pos = sequence_positions(attn_mask_type, B, Sq, Skv, q_seqlens, kv_seqlens, q_offsets,
                                 kv_offsets, thd, block)
        s = (score_mod(s, *pos) if index_base is None
             else score_mod(s, *pos, index_base=index_base))
    if block is None:
        keep, real = segment_mask(attn_mask_type, B, Sq, Skv, q_seqlens, kv_seqlens, q_offsets,
                                  kv_offsets, thd, window_size)
    else:
        keep, real = block_mask(attn_mask_type, B, Sq, Skv, block, q_seqlens, kv_seqlens,
                                window_size, q_offsets, kv_offsets, thd)
    keep = keep[:, None]  # [B, 1, Sq, Skv]
    neg_inf = acc(-jnp.inf)
    m_keys = nan_max(jnp.where(keep, s, neg_inf), axis=-1, keepdims=True)
    softmax_type = SoftmaxType(softmax_type)
    if softmax_type == SoftmaxType.VANILLA_SOFTMAX:
        sink = None
        m = m_keys
    else:
        sink = (jnp.zeros((Hq,), acc) if softmax_type == SoftmaxType.OFF_BY_ONE_SOFTMAX
                else jnp.asarray(softmax_offset, acc).reshape(Hq))
        sink = sink[None, :, None, None]
        m = jnp.maximum(m_keys, jax.lax.stop_gradient(sink))
    # m -inf: nothing kept. A NaN m passes, so that the whole row is NaN; a +inf m
    # (a +inf sink) passes too: exp(s - m) is 0 for every finite s.
    m_safe = jax.lax.stop_gradient(jnp.where(m == neg_inf, 0.0, m))
    # The inner where keeps masked entries out of exp (no inf, no NaN gradients).
    p = jnp.where(keep, jnp.exp(jnp.where(keep, s, 0.0) - m_safe), 0.0)
    l = jnp.sum(p, axis=-1, keepdims=True)
    if sink is not None:
        # exp(sink - m) is 1 for a +inf sink (where inf - inf would be NaN); padding
        # queries have no sink term: their output stays 0.
        e_sink = jnp.exp(jnp.where(sink == jnp.inf, 0.0, sink - m_safe))
        l = l + jnp.where(real[:, None, :, None], e_sink, 0.0)
    l_safe = jnp.where(l == 0, 1.0, l)  # a NaN l passes
    probs = jnp.where(keep, p / l_safe, 0.0)  # masked keys stay 0 in a NaN row
    if dropout_probability > 0.0:
        keep_drop = dropout_keep(seed, dropout_probability, B, Hq, Sq, Skv, index_base,
                                 broadcast=dropout_broadcast)
        probs = jnp.where(keep_drop, probs / (1.0 - acc(dropout_probability)), 0.0)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.reshape(B, Hkv, group, Sq, Skv),
                     v.astype(acc), precision="highest").reshape(B, Sq, Hq, -1)
    # A row that keeps no key (padding, or all its mass on the sink) is 0 whatever v
    # holds: the einsum's 0 * inf would make it NaN.
    empty = ~keep[:, 0].any(axis=-1)  # [B, Sq]
    out = jnp.where(empty[:, :, None, None], 0.0, out)
    live = (l != 0)[..., 0] & real[:, None, :]
    lse = jnp.where(live, (m_safe + jnp.log(l_safe))[..., 0], neg_inf)
    if sink is not None:
        # A NaN sink makes its real rows' lse NaN, and the output of those that keep a
        # key; said explicitly, because under jit XLA's max may drop the NaN on its way.
        nan_sink = jnp.isnan(sink[..., 0])  # [1, Hq, 1]
        # (added, not selected, so that gradients still flow through out and lse)
        lse = lse + jnp.where(nan_sink & real[:, None, :], jnp.nan, 0.0)
        nan_out = nan_sink & keep.any(-1)  # [B, Hq, Sq]
        out = out + jnp.where(jnp.swapaxes(nan_out, 1, 2)[..., None], jnp.nan, 0.0)
    max_logit = nan_max(m_keys[..., 0], axis=-1)
    return out.astype(q.dtype), lse, max_logit
