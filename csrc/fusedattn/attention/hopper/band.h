// The Hopper forward's view of a call's mask (host only): the band of keys each query row
// keeps, in the two edges the kernel takes. mask.h's rule (segment_keys) restated as
// diagonals from each sequence's base diagonal (kv_len - q_len when bottom-right, else 0):
// query i keeps key j when i + base + lo_diag <= j (left_bound) and j <= i + base + diag
// (causal, the kernel's name for a right edge: a causal mask's, or a window's right side).
// select_backend (backend.cc) and the CUDA handler (ffi_cuda.cc) both ask this.
#pragma once

#include <cstdint>

#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"

namespace fusedattn::hopper_rules {

struct Band {
  bool causal = false;  // a right edge, at base + diag
  int64_t diag = 0;
  bool left_bound = false;  // a left edge, at base + lo_diag
  int64_t lo_diag = 0;
  bool bottom_right = false;  // base = kv_len - q_len of each sequence (else 0)
};

inline Band band(const AttnParams& p) {
  const MaskRule r = mask_rule(p.mask_type, p.window_left, p.window_right);
  const int64_t reach = p.seqlen_q + p.seqlen_kv;  // a side this wide bounds nothing
  Band b;
  b.bottom_right = r.bottom_right;
  if (r.right >= 0) b.causal = true, b.diag = clamp_window(r.right, reach);
  if (r.left >= 0) b.left_bound = true, b.lo_diag = -clamp_window(r.left, reach);
  return b;
}

// Why the band leaves some query row of an unpadded call with no key (empty when every row
// keeps one; padded calls are the kernel's to mask row by row).
inline const char* band_empty_rows(const AttnParams& p, const Band& b) {
  if (has_padding(p.mask_type)) return "";
  const int64_t base = b.bottom_right ? p.seqlen_kv - p.seqlen_q : 0;
  if (b.causal && base + b.diag < 0) return "its mask leaves the first query rows without keys (Sq > Skv)";
  if (b.left_bound && p.seqlen_q - 1 + base + b.lo_diag >= p.seqlen_kv)
    return "its window leaves the last query rows without keys";
  return "";
}

}  // namespace fusedattn::hopper_rules
