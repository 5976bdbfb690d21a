// The Hopper forward's view of a call's mask (host only): the band of keys each query row
// keeps, in the two edges the kernel takes. mask.h's rule (segment_keys) restated as
// diagonals: query i keeps key j when i + lo_diag <= j (left_bound) and j <= i + diag
// (causal, the kernel's name for a right edge: a causal mask's, or a window's right side).
// select_backend (backend.cc) and the CUDA handler (ffi_cuda.cc) both ask this.
#pragma once

#include <cstdint>

#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"

namespace fusedattn::hopper_rules {

struct Band {
  bool causal = false;  // a right edge
  int64_t diag = 0;
  bool left_bound = false;
  int64_t lo_diag = 0;
};

inline Band band(const AttnParams& p) {
  const MaskRule r = mask_rule(p.mask_type, p.window_left, p.window_right);
  const int64_t base = r.bottom_right ? p.seqlen_kv - p.seqlen_q : 0;
  const int64_t reach = p.seqlen_q + p.seqlen_kv;  // a side this wide bounds nothing
  Band b;
  if (r.right >= 0) b.causal = true, b.diag = base + clamp_window(r.right, reach);
  if (r.left >= 0) b.left_bound = true, b.lo_diag = base - clamp_window(r.left, reach);
  return b;
}

// Why the band leaves some query row with no key (empty when every row keeps one): the
// kernel runs at least one key block a tile and has no rows of nothing.
inline const char* band_empty_rows(const AttnParams& p, const Band& b) {
  if (b.causal && b.diag < 0) return "its mask leaves the first query rows without keys (Sq > Skv)";
  if (b.left_bound && p.seqlen_q - 1 + b.lo_diag >= p.seqlen_kv)
    return "its window leaves the last query rows without keys";
  return "";
}

}  // namespace fusedattn::hopper_rules
