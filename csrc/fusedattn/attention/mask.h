// The one mask rule of fusedattn (host and device): which keys a query row keeps.
//
// Every mask keeps, for each query row, one contiguous range of keys [lo, hi)
// (lo == hi: none). Padding, THD segments, causal masks and sliding windows all
// reduce to that range; the CPU engine, the cuDNN sequence preparation and the
// small-seq kernels ask this header and never restate the rule.
// python/fusedattn/reference.py (segment_mask, block_mask) is the specification.
//
// Inside a segment of q_len queries and kv_len keys, with local (0-based)
// positions li, lj and diag = 0 (top-left) or kv_len - q_len (*_BOTTOM_RIGHT):
//   li + diag - left <= lj <= li + diag + right
// where a negative side (-1) is unbounded and a causal mask sets right = 0.
//
// Sequences of an attention call: seqlens [B, M] and token offsets [B, M + 1]
// int32 (M = max_segments). BSHD layouts have one segment at token 0 whose lengths
// are the descriptor's under padding masks and the full extents otherwise. In THD
// layouts segment s of row b holds, on each side (q and kv) separately, the tokens
//   [off[s], min(off[s] + len[s], off[s + 1], S))   with off clamped to [0, S]
// (len[s] < 0 counts as 0): a segment ends at the next segment's offset at the latest
// (offsets[M] bounds the last one), so segments never overlap, and a segment whose
// offset is below an earlier segment's offset (offsets out of order) is empty (the
// one before it, ending at that lower offset, is empty too). No descriptor leads a
// kernel out of bounds. Tokens of no segment are padding. fused_attn(...,
// check_descriptors=True) reports such descriptors instead (python/fusedattn/sequence.py).
//
// A block of a bigger call (context parallelism: index_base's positions, ffi_decode.h)
// keeps what the whole call keeps there. Its local tokens are some of the whole call's,
// on each side (q from q_pos, kv from kv_pos) by one stripe map: local token t is global
// token  pos + (t / stripe) * stride + t % stripe  (global_token; contiguous blocks have
// stripe == stride, e.g. 1). The sequence descriptor is the whole call's: BSHD, one
// segment (the descriptor's lengths under padding masks, else the extents); THD, the
// segments of the global packed row by the rule above with S = q_extent / kv_extent.
// Global query g keeps segment_keys of its position in the segment that holds it (none:
// padding), as global keys; the block keeps those that are its local keys, which (the map
// being increasing) are one range of local keys, found by first_local (block_keys).
#pragma once

#include <stdint.h>

#include "fusedattn/attention/params.h"
#include "fusedattn/core/host_device.h"

namespace fusedattn {

// Keys [lo, hi); lo == hi when the row keeps none.
struct KeyRange {
  int64_t lo, hi;
};

// The mask type and window of a call: what a row keeps inside its segment.
struct MaskRule {
  bool bottom_right;    // diag = kv_len - q_len, else 0
  int64_t left, right;  // window sides, < 0 unbounded; a causal mask has right = 0
};

// Plain comparisons of the FaMaskType codes: params.h's helpers are host-only.
FA_HOST_DEVICE FA_INLINE MaskRule mask_rule(int32_t mask_type, int64_t window_left,
                                            int64_t window_right) {
  const bool top_left = mask_type == FA_CAUSAL_MASK || mask_type == FA_PADDING_CAUSAL_MASK;
  const bool bottom_right = mask_type == FA_CAUSAL_BOTTOM_RIGHT_MASK ||
                            mask_type == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
  MaskRule r;
  r.bottom_right = bottom_right;
  r.left = window_left < 0 ? -1 : window_left;
  r.right = top_left || bottom_right ? 0 : (window_right < 0 ? -1 : window_right);
  return r;
}

// A window side wider than `reach` means the same as `reach`. With reach = q_len + kv_len
// (no key is that far from any diagonal) the clamp changes nothing, and the sums below
// stay in int64 for any window, INT64_MAX included. The cuDNN graph clamps its band the
// same way before narrowing it to int.
FA_HOST_DEVICE FA_INLINE int64_t clamp_window(int64_t side, int64_t reach) {
  return side < reach ? side : reach;
}

// Local keys [lo, hi) of query li (0 <= li < q_len) of a segment of q_len queries and
// kv_len keys: 0 <= lo <= hi <= kv_len, and lo == hi == 0 when none is kept.
FA_HOST_DEVICE FA_INLINE KeyRange segment_keys(const MaskRule& r, int64_t li, int64_t q_len,
                                               int64_t kv_len) {
  const int64_t pos = li + (r.bottom_right ? kv_len - q_len : 0);  // the diagonal key
  const int64_t reach = q_len + kv_len;
  int64_t lo = 0, hi = kv_len;
  if (r.left >= 0) {
    const int64_t a = pos - clamp_window(r.left, reach);
    if (a > lo) lo = a;
  }
  if (r.right >= 0) {
    const int64_t e = pos + clamp_window(r.right, reach) + 1;
    if (e < hi) hi = e;
  }
  if (hi <= lo) lo = hi = 0;
  return {lo, hi};
}

// One side of a block of a bigger call: local token t is global token
// pos + (t / stripe) * stride + t % stripe (1 <= stripe, stride a multiple of stripe).
struct StripeMap {
  int64_t pos, stripe, stride;
};

FA_HOST_DEVICE FA_INLINE int64_t global_token(const StripeMap& m, int64_t t) {
  if (m.stripe == m.stride) return m.pos + t;  // contiguous
  return m.pos + (t / m.stripe) * m.stride + t % m.stripe;
}

// The first of n local tokens whose global token is >= g, n when none: global_token's
// inverse (it is increasing), O(1).
FA_HOST_DEVICE FA_INLINE int64_t first_local(const StripeMap& m, int64_t g, int64_t n) {
  const int64_t y = g - m.pos;
  if (y <= 0) return 0;
  const int64_t r = y % m.stride;  // in stripe y / stride: its tokens, or past its end
  const int64_t t = (y / m.stride) * m.stripe + (r < m.stripe ? r : m.stripe);
  return t < n ? t : n;
}

// Where a block sits in the whole call of q_extent queries and kv_extent keys.
struct BlockPos {
  StripeMap q, kv;
  int64_t q_extent, kv_extent;
};

// One row of index_base [.., cols], cols 6 (batch_base, head_base, q_pos, kv_pos,
// q_extent, kv_extent: contiguous) or 8 (.., stripe, stride).
FA_HOST_DEVICE FA_INLINE BlockPos block_pos(const int32_t* x, int64_t cols) {
  const int64_t stripe = cols == 8 ? x[6] : 1, stride = cols == 8 ? x[7] : 1;
  return {{x[2], stripe, stride}, {x[3], stripe, stride}, x[4], x[5]};
}

// The sequence descriptors of a call (null: every row is one full sequence).
struct SeqArgs {
  const int32_t* q_lens = nullptr;      // [B, M]; read under padding masks only
  const int32_t* kv_lens = nullptr;
  const int32_t* q_offsets = nullptr;   // [B, M + 1]; read by THD layouts only
  const int32_t* kv_offsets = nullptr;
  // index_base [slices, block_cols] (block_cols 6 or 8: block_pos) of a block of a bigger
  // call (ffi_decode.h); null: the call is no block.
  const int32_t* block = nullptr;
  int64_t block_cols = 0;
};

// Everything a kernel needs to find the kept keys of any query row of a call.
struct AttnMask {
  int64_t seqlen_q, seqlen_kv, segments;  // segments = M
  int64_t slice_batch;                    // batch entries per vmap slice (seq.block's rows)
  bool thd, padding;
  MaskRule rule;
  SeqArgs seq;
};

inline AttnMask attn_mask(const AttnParams& p, const SeqArgs& seq) {
  AttnMask m;
  m.seqlen_q = p.seqlen_q;
  m.seqlen_kv = p.seqlen_kv;
  m.segments = p.max_segments;
  m.slice_batch = seq.block ? slice_batch(p) : p.batch;  // read by blocks only
  m.thd = is_thd(p.layout);
  m.padding = has_padding(p.mask_type);
  m.rule = mask_rule(p.mask_type, p.window_left, p.window_right);
  m.seq = seq;
  return m;
}

// One segment, in tokens of its row: queries [q_begin, q_begin + q_len) and keys
// [kv_begin, kv_begin + kv_len).
struct Segment {
  int64_t q_begin, q_len, kv_begin, kv_len;
};

FA_HOST_DEVICE FA_INLINE int64_t clamp_extent(int64_t x, int64_t hi) {
  return x < 0 ? 0 : (x > hi ? hi : x);
}

// The largest clamped offset of the segments of a row walked so far, per side: a walk
// over segments 0, 1, .. of a row carries it so that each step is O(1).
struct SegmentWalk {
  int64_t q_floor = 0, kv_floor = 0;
};

// One side of segment s of row b: *begin, *len of its tokens by the rule above.
FA_HOST_DEVICE FA_INLINE void segment_side(const int32_t* offsets, const int32_t* lens,
                                           int64_t b, int64_t s, int64_t M, int64_t S,
                                           bool thd, bool padding, int64_t* floor,
                                           int64_t* begin, int64_t* len) {
  int64_t lo = 0, end = S;
  if (thd && offsets) {
    const int32_t* o = offsets + b * (M + 1);
    lo = clamp_extent(o[s], S);
    end = clamp_extent(o[s + 1], S);
    if (lo < *floor) end = lo;  // below an earlier segment's offset: empty
    else *floor = lo;
  }
  if (padding && lens) {
    const int64_t e = lo + clamp_extent(lens[b * M + s], S);
    if (e < end) end = e;
  }
  *begin = lo;
  *len = end > lo ? end - lo : 0;
}

// Segment s of row b of a call of Sq queries and Skv keys, the walk having visited
// segments 0 .. s - 1 of row b before.
FA_HOST_DEVICE FA_INLINE Segment next_segment_in(const AttnMask& m, int64_t b, int64_t s,
                                                 int64_t Sq, int64_t Skv, SegmentWalk* w) {
  Segment g;
  segment_side(m.seq.q_offsets, m.seq.q_lens, b, s, m.segments, Sq, m.thd, m.padding,
               &w->q_floor, &g.q_begin, &g.q_len);
  segment_side(m.seq.kv_offsets, m.seq.kv_lens, b, s, m.segments, Skv, m.thd, m.padding,
               &w->kv_floor, &g.kv_begin, &g.kv_len);
  return g;
}

// Segment s of row b, the walk having visited segments 0 .. s - 1 of row b before.
FA_HOST_DEVICE FA_INLINE Segment next_segment(const AttnMask& m, int64_t b, int64_t s,
                                              SegmentWalk* w) {
  return next_segment_in(m, b, s, m.seqlen_q, m.seqlen_kv, w);
}

// Segment s of row b alone: O(s), it walks the segments before it. Kernels that visit
// every segment of a row walk with next_segment instead.
FA_HOST_DEVICE FA_INLINE Segment segment(const AttnMask& m, int64_t b, int64_t s) {
  SegmentWalk w;
  Segment g{0, 0, 0, 0};
  for (int64_t t = 0; t <= s; ++t) g = next_segment(m, b, t, &w);
  return g;
}

// Kept keys, in tokens of the row, of query i of segment g (g.q_begin <= i < g.q_begin +
// g.q_len); lo == hi == g.kv_begin when none.
FA_HOST_DEVICE FA_INLINE KeyRange row_keys(const AttnMask& m, const Segment& g, int64_t i) {
  const KeyRange k = segment_keys(m.rule, i - g.q_begin, g.q_len, g.kv_len);
  return {g.kv_begin + k.lo, g.kv_begin + k.hi};
}

// Where row b of a block (m.seq.block set) sits in the whole call.
FA_HOST_DEVICE FA_INLINE BlockPos block_of(const AttnMask& m, int64_t b) {
  return block_pos(m.seq.block + m.seq.block_cols * (b / m.slice_batch), m.seq.block_cols);
}

// Segment s of row b of the whole call a block belongs to, in global tokens (a walk as
// next_segment's).
FA_HOST_DEVICE FA_INLINE Segment block_segment(const AttnMask& m, const BlockPos& pos,
                                               int64_t b, int64_t s, SegmentWalk* w) {
  return next_segment_in(m, b, s, pos.q_extent, pos.kv_extent, w);
}

// Local keys [lo, hi) of a block's query whose global token gq lies in global segment g:
// gq's kept global keys (row_keys' rule) that are the block's, among its kv_local keys.
// lo == hi == 0 when none.
FA_HOST_DEVICE FA_INLINE KeyRange block_keys(const MaskRule& r, const BlockPos& pos,
                                             const Segment& g, int64_t gq, int64_t kv_local) {
  const KeyRange k = segment_keys(r, gq - g.q_begin, g.q_len, g.kv_len);
  if (k.hi <= k.lo) return {0, 0};
  const int64_t lo = first_local(pos.kv, g.kv_begin + k.lo, kv_local);
  const int64_t hi = first_local(pos.kv, g.kv_begin + k.hi, kv_local);
  if (hi <= lo) return {0, 0};
  return {lo, hi};
}

// The segment that owns query i of row b (segments never overlap); false when i is
// padding. O(M): kernels that visit every row walk the segments instead.
FA_HOST_DEVICE FA_INLINE bool find_segment(const AttnMask& m, int64_t b, int64_t i, Segment* g) {
  SegmentWalk w;
  for (int64_t s = 0; s < m.segments; ++s) {
    const Segment c = next_segment(m, b, s, &w);
    if (i >= c.q_begin && i < c.q_begin + c.q_len) {
      *g = c;
      return true;
    }
  }
  return false;
}

}  // namespace fusedattn
