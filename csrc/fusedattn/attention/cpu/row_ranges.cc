#include "fusedattn/attention/cpu/row_ranges.h"

#include <algorithm>

#include "fusedattn/platform/cpu/thread_pool.h"

namespace fusedattn::cpu {

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
  const AttnMask mask = attn_mask(p, seq);
  parallel_for(B, [&](int64_t b, int) {
    if (mask.seq.block) {  // the whole call's segments, of which the block holds tokens
      const BlockPos pos = block_of(mask, b);
      SegmentWalk walk;
      for (int64_t s = 0; s < mask.segments; ++s) {
        const Segment g = block_segment(mask, pos, b, s, &walk);
        const int64_t end = first_local(pos.q, g.q_begin + g.q_len, Sq);
        for (int64_t i = first_local(pos.q, g.q_begin, Sq); i < end; ++i) {
          const KeyRange k = block_keys(mask.rule, pos, g, global_token(pos.q, i), p.seqlen_kv);
          r.lo[r.row(b, i)] = int32_t(k.lo);
          r.hi[r.row(b, i)] = int32_t(k.hi);
          r.real[r.row(b, i)] = 1;
          r.q_base[r.row(b, i)] = int32_t(g.q_begin);
          r.kv_base[r.row(b, i)] = int32_t(g.kv_begin);
        }
      }
    } else {
      SegmentWalk walk;  // segments in order; mask.h keeps them disjoint
      for (int64_t s = 0; s < mask.segments; ++s) {
        const Segment g = next_segment(mask, b, s, &walk);
        for (int64_t i = g.q_begin; i < g.q_begin + g.q_len; ++i) {
          const KeyRange k = row_keys(mask, g, i);
          r.lo[r.row(b, i)] = int32_t(k.lo);
          r.hi[r.row(b, i)] = int32_t(k.hi);
          r.real[r.row(b, i)] = 1;
          r.q_base[r.row(b, i)] = int32_t(g.q_begin);
          r.kv_base[r.row(b, i)] = int32_t(g.kv_begin);
        }
      }
    }
    set_tile_unions(r, b, p.seqlen_kv);
  });
  return r;
}

void set_tile_unions(RowRanges& r, int64_t b, int64_t seqlen_kv) {
  for (int64_t qt = 0; qt < r.n_qt; ++qt) {
    int32_t lo = int32_t(seqlen_kv), hi = 0;
    for (int64_t i = qt * r.tile; i < std::min(r.seqlen_q, (qt + 1) * r.tile); ++i) {
      if (r.lo[r.row(b, i)] >= r.hi[r.row(b, i)]) continue;
      lo = std::min(lo, r.lo[r.row(b, i)]);
      hi = std::max(hi, r.hi[r.row(b, i)]);
    }
    r.tile_lo[r.tile_index(b, qt)] = lo;
    r.tile_hi[r.tile_index(b, qt)] = hi;
  }
}

}  // namespace fusedattn::cpu
