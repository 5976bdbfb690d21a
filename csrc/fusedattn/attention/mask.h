// The one mask rule of fusedattn (host and device): which keys a query row keeps.
//
// Every mask keeps, for each query row, one contiguous range of keys [lo, hi)
// (lo == hi: none). Padding, THD segments, causal masks and sliding windows all
// reduce to that range; the CPU engine, the cuDNN sequence preparation and the
// small-seq kernels ask this header and never restate the rule.
// python/fusedattn/reference.py (segment_mask) is the specification.
//
// Inside a segment of q_len queries and kv_len keys, with local (0-based)
// positions li, lj and diag = 0 (top-left) or kv_len - q_len (*_BOTTOM_RIGHT):
//   li + diag - left <= lj <= li + diag + right
// where a negative side (-1) is unbounded and a causal mask sets right = 0.
//
// Sequences of an attention call: seqlens [B, M] and token offsets [B, M + 1]
// int32 (M = max_segments). Segment s of row b has queries
// [q_off[b, s], + q_len[b, s]) and keys [kv_off[b, s], + kv_len[b, s]); BSHD
// layouts have one segment at token 0 whose lengths are the descriptor's under
// padding masks and the full extents otherwise. Offsets and lengths are clamped
// to the tensor's extent, so no descriptor leads a kernel out of bounds; where
// segments overlap, the later one owns the query. Tokens of no segment are padding.
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

// The sequence descriptors of a call (null: every row is one full sequence).
struct SeqArgs {
  const int32_t* q_lens = nullptr;      // [B, M]; read under padding masks only
  const int32_t* kv_lens = nullptr;
  const int32_t* q_offsets = nullptr;   // [B, M + 1]; read by THD layouts only
  const int32_t* kv_offsets = nullptr;
};

// Everything a kernel needs to find the kept keys of any query row of a call.
struct AttnMask {
  int64_t seqlen_q, seqlen_kv, segments;  // segments = M
  bool thd, padding;
  MaskRule rule;
  SeqArgs seq;
};

inline AttnMask attn_mask(const AttnParams& p, const SeqArgs& seq) {
  AttnMask m;
  m.seqlen_q = p.seqlen_q;
  m.seqlen_kv = p.seqlen_kv;
  m.segments = p.max_segments;
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

// Segment s of row b, every offset and length clamped to the tensor's extent.
FA_HOST_DEVICE FA_INLINE Segment segment(const AttnMask& m, int64_t b, int64_t s) {
  const int64_t M = m.segments;
  Segment g{0, m.seqlen_q, 0, m.seqlen_kv};
  if (m.thd) {
    if (m.seq.q_offsets) g.q_begin = clamp_extent(m.seq.q_offsets[b * (M + 1) + s], m.seqlen_q);
    if (m.seq.kv_offsets)
      g.kv_begin = clamp_extent(m.seq.kv_offsets[b * (M + 1) + s], m.seqlen_kv);
    g.q_len = m.seqlen_q - g.q_begin;
    g.kv_len = m.seqlen_kv - g.kv_begin;
  }
  if (m.padding) {
    if (m.seq.q_lens) g.q_len = clamp_extent(m.seq.q_lens[b * M + s], g.q_len);
    if (m.seq.kv_lens) g.kv_len = clamp_extent(m.seq.kv_lens[b * M + s], g.kv_len);
  }
  return g;
}

// Kept keys, in tokens of the row, of query i of segment g (g.q_begin <= i < g.q_begin +
// g.q_len); lo == hi == g.kv_begin when none.
FA_HOST_DEVICE FA_INLINE KeyRange row_keys(const AttnMask& m, const Segment& g, int64_t i) {
  const KeyRange k = segment_keys(m.rule, i - g.q_begin, g.q_len, g.kv_len);
  return {g.kv_begin + k.lo, g.kv_begin + k.hi};
}

// The segment that owns query i of row b (the last one containing it); false when i is
// padding. O(M): kernels that visit every row walk the segments instead.
FA_HOST_DEVICE FA_INLINE bool find_segment(const AttnMask& m, int64_t b, int64_t i, Segment* g) {
  bool found = false;
  for (int64_t s = 0; s < m.segments; ++s) {
    const Segment c = segment(m, b, s);
    if (i >= c.q_begin && i < c.q_begin + c.q_len) *g = c, found = true;
  }
  return found;
}

}  // namespace fusedattn
