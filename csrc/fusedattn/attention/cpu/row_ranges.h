// The CPU engine's table of kept keys: for every query row, the range [lo, hi)
// of attention/mask.h, worked out once per call (the mask does not depend on the
// head), plus the union over each tile of rows. Kernels read the table and never
// see mask types. (Bias, softmax offset and dropout act on single elements
// inside the tile loops instead.)
#pragma once

#include <cstdint>
#include <vector>

#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"

namespace fusedattn::cpu {

struct RowRanges {
  int64_t seqlen_q = 0, n_qt = 0, tile = 0;
  std::vector<int32_t> lo, hi;            // [B, Sq]; lo == hi: nothing kept
  std::vector<uint8_t> real;              // [B, Sq]: 1 for a query of a sequence, 0 for padding
  // [B, Sq]: the first query and key token of the row's sequence (0 but in THD
  // layouts), which score_mod's q_idx and kv_idx count from; in a block, global tokens
  // of the whole call (score_ops.h maps the block's tokens there).
  std::vector<int32_t> q_base, kv_base;
  std::vector<int32_t> tile_lo, tile_hi;  // [B, n_qt]: union over the tile's rows (empty: lo >= hi)

  int64_t row(int64_t b, int64_t i) const { return b * seqlen_q + i; }
  int64_t tile_index(int64_t b, int64_t qt) const { return b * n_qt + qt; }
};

// seq: seqlens [B, M] and offsets [B, M + 1] int32, and the block of a bigger call
// (mask.h); tile: query rows per tile of the kernel that will read the table.
RowRanges build_row_ranges(const AttnParams& p, const SeqArgs& seq, int64_t tile);

// Batch entry b's tile unions (tile_lo, tile_hi) from its rows' lo, hi.
void set_tile_unions(RowRanges& r, int64_t b, int64_t seqlen_kv);

}  // namespace fusedattn::cpu
