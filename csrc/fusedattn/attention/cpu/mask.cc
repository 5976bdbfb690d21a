#include "fusedattn/attention/cpu/mask.h"

#include <algorithm>

#include "fusedattn/platform/cpu/thread_pool.h"

namespace fusedattn::cpu {

SegmentMask segment_mask(const AttnParams& p, const SeqArgs& seq, int64_t b, int64_t s) {
  const int64_t M = p.max_segments, Sq = p.seqlen_q, Skv = p.seqlen_kv;
  SegmentMask m{0, Sq, 0, Skv, 0, p.window_left, p.window_right};
  if (is_thd(p.layout)) {
    // validate() guarantees a padding mask for THD layouts.
    m.q_begin = seq.q_offsets ? std::clamp<int64_t>(seq.q_offsets[b * (M + 1) + s], 0, Sq) : 0;
    m.kv_begin = seq.kv_offsets ? std::clamp<int64_t>(seq.kv_offsets[b * (M + 1) + s], 0, Skv) : 0;
    m.q_len = Sq - m.q_begin;
    m.kv_len = Skv - m.kv_begin;
  }
  if (has_padding(p.mask_type)) {
    if (seq.q_lens) m.q_len = std::clamp<int64_t>(seq.q_lens[b * M + s], 0, m.q_len);
    if (seq.kv_lens) m.kv_len = std::clamp<int64_t>(seq.kv_lens[b * M + s], 0, m.kv_len);
  }
  if (is_causal_bottom_right(p.mask_type)) m.diag = m.kv_len - m.q_len;
  if (is_causal(p.mask_type)) m.right = 0;  // a causal mask within any window is right = 0
  return m;
}

RowRanges build_row_ranges(const AttnParams& p, const SeqArgs& seq, int64_t tile) {
  RowRanges r;
  const int64_t B = p.batch, Sq = p.seqlen_q;
  r.seqlen_q = Sq;
  r.tile = tile;
  r.n_qt = (Sq + tile - 1) / tile;
  r.lo.assign(B * Sq, 0);
  r.hi.assign(B * Sq, 0);
  r.real.assign(B * Sq, 0);
  r.q_base.assign(B * Sq, 0);
  r.kv_base.assign(B * Sq, 0);
  r.tile_lo.assign(B * r.n_qt, 0);
  r.tile_hi.assign(B * r.n_qt, 0);
  parallel_for(B, [&](int64_t b, int) {
    // Segments in order; where descriptors overlap, the later segment wins.
    for (int64_t s = 0; s < p.max_segments; ++s) {
      const SegmentMask m = segment_mask(p, seq, b, s);
      for (int64_t i = m.q_begin; i < m.q_begin + m.q_len; ++i) {
        int64_t lo, hi;
        m.range(i, &lo, &hi);
        r.lo[r.row(b, i)] = int32_t(lo);
        r.hi[r.row(b, i)] = int32_t(hi);
        r.real[r.row(b, i)] = 1;
        r.q_base[r.row(b, i)] = int32_t(m.q_begin);
        r.kv_base[r.row(b, i)] = int32_t(m.kv_begin);
      }
    }
    for (int64_t qt = 0; qt < r.n_qt; ++qt) {
      int32_t lo = int32_t(p.seqlen_kv), hi = 0;
      for (int64_t i = qt * tile; i < std::min(Sq, (qt + 1) * tile); ++i) {
        if (r.lo[r.row(b, i)] >= r.hi[r.row(b, i)]) continue;
        lo = std::min(lo, r.lo[r.row(b, i)]);
        hi = std::max(hi, r.hi[r.row(b, i)]);
      }
      r.tile_lo[r.tile_index(b, qt)] = lo;
      r.tile_hi[r.tile_index(b, qt)] = hi;
    }
  });
  return r;
}

}  // namespace fusedattn::cpu
