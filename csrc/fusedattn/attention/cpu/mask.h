// Every mask of the engine keeps, for query row i, one contiguous range of
// keys [lo, hi). Padding, THD segments, causal masks and sliding windows all
// reduce to that range; kernels read it from a RowRanges table and never see
// mask types. (Bias, softmax offset and dropout act on single elements inside
// the tile loops instead.)
#pragma once

#include <cstdint>
#include <vector>

#include "fusedattn/attention/params.h"

namespace fusedattn::cpu {

// The sequences of the call: seqlens [B, M] and token offsets [B, M + 1] int32
// (M = p.max_segments). Null pointers mean every row is one full sequence.
struct SeqArgs {
  const int32_t* q_lens = nullptr;
  const int32_t* kv_lens = nullptr;
  const int32_t* q_offsets = nullptr;   // read by THD layouts only
  const int32_t* kv_offsets = nullptr;  // read by THD layouts only
};

// One sequence of one row: its queries [q_begin, q_begin + q_len) see keys of
// [kv_begin, kv_begin + kv_len) only, by local (0-based) positions:
//   li + diag - left <= lj <= li + diag + right   (a side of -1 is unbounded;
// a causal mask sets right = 0), diag = 0 or kv_len - q_len (bottom-right).
struct SegmentMask {
  int64_t q_begin, q_len, kv_begin, kv_len;
  int64_t diag, left, right;

  // Kept keys of row i (q_begin <= i < q_begin + q_len); lo == hi when none.
  void range(int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t li = i - q_begin;
    int64_t a = 0, e = kv_len;
    if (left >= 0 && li + diag - left > a) a = li + diag - left;
    if (right >= 0 && li + diag + right + 1 < e) e = li + diag + right + 1;
    if (e <= a) a = e = 0;
    *lo = kv_begin + a;
    *hi = kv_begin + e;
  }
};

// Segment s of batch row b, with every length and offset clamped to the
// tensor's extent: a bad descriptor can never cause an out-of-bounds access.
SegmentMask segment_mask(const AttnParams& p, const SeqArgs& seq, int64_t b, int64_t s);

// The kept-key range of every query row, worked out once per call (the mask
// does not depend on the head).
struct RowRanges {
  int64_t seqlen_q = 0, n_qt = 0, tile = 0;
  std::vector<int32_t> lo, hi;            // [B, Sq]; lo == hi: nothing kept
  std::vector<uint8_t> real;              // [B, Sq]: 1 for a query of a sequence, 0 for padding
  // [B, Sq]: the first query and key token of the row's sequence (0 but in THD
  // layouts), which score_mod's q_idx and kv_idx count from.
  std::vector<int32_t> q_base, kv_base;
  std::vector<int32_t> tile_lo, tile_hi;  // [B, n_qt]: union over the tile's rows (empty: lo >= hi)

  int64_t row(int64_t b, int64_t i) const { return b * seqlen_q + i; }
  int64_t tile_index(int64_t b, int64_t qt) const { return b * n_qt + qt; }
};

// tile: query rows per tile of the kernel that will read the table.
RowRanges build_row_ranges(const AttnParams& p, const SeqArgs& seq, int64_t tile);

}  // namespace fusedattn::cpu
