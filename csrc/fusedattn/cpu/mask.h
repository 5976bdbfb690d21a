// Every mask of the engine keeps, for query row i, one contiguous range of
// keys [lo, hi). Kernels ask RowMask for that range and never see mask types.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../params.h"

namespace fusedattn::cpu {

struct RowMask {
  int64_t q_len;     // rows at or past q_len are padding: nothing kept
  int64_t kv_len;    // keys at or past kv_len are padding
  bool causal;
  int64_t diag;      // causal: key j is kept when j <= i + diag

  void range(int64_t i, int64_t* lo, int64_t* hi) const {
    *lo = 0;
    *hi = i < q_len ? kv_len : 0;
    if (causal) *hi = std::min(*hi, std::max<int64_t>(i + diag + 1, 0));
  }
};

// q_len / kv_len are the runtime lengths of this batch entry (used by the
// padding masks, clamped to the tensor's extent so a bad length can never
// cause an out-of-bounds access).
inline RowMask make_row_mask(const AttnParams& p, int64_t q_len, int64_t kv_len) {
  RowMask m;
  if (has_padding(p.mask_type)) {
    m.q_len = std::clamp<int64_t>(q_len, 0, p.seqlen_q);
    m.kv_len = std::clamp<int64_t>(kv_len, 0, p.seqlen_kv);
  } else {
    m.q_len = p.seqlen_q;
    m.kv_len = p.seqlen_kv;
  }
  m.causal = is_causal_top_left(p.mask_type) || is_causal_bottom_right(p.mask_type);
  m.diag = is_causal_bottom_right(p.mask_type) ? m.kv_len - m.q_len : 0;
  return m;
}

}  // namespace fusedattn::cpu
