// The per-element steps of the tile loops, on one row of one score tile:
// bias, the extra softmax logit ("sink") and dropout. The kept-key range of a
// row comes from mask.h; these never change which keys are kept.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "../params.h"
#include "../philox.h"
#include "attention.h"
#include "dtypes.h"
#include "philox_lanes.h"
#include "tiles.h"

namespace fusedattn::cpu {

// The extra logit of OFF_BY_ONE (0) and LEARNABLE (softmax_offset[slice, h])
// softmax; -inf (no extra term) for VANILLA.
inline float sink_logit(const AttnParams& p, const Extras& x, int64_t slice, int64_t h) {
  switch (p.softmax_type) {
    case FA_OFF_BY_ONE_SOFTMAX: return 0.0f;
    case FA_LEARNABLE_SOFTMAX: return x.softmax_offset[slice * p.heads_q + h];
  }
  return -std::numeric_limits<float>::infinity();
}

// s = scale * q.k + bias_mul * bias:  POST_SCALE_BIAS adds the bias as is,
// PRE_SCALE_BIAS (s = scale * (q.k + bias)) adds it scaled. Also the factor
// of dS in dbias.
inline float bias_mul(const AttnParams& p) {
  return p.bias_type == FA_PRE_SCALE_BIAS ? p.scale : 1.0f;
}

// The bias plane [Sq, Skv] of folded batch entry b and q head h (null without bias).
template <class T>
inline const T* bias_plane(const AttnParams& p, const Extras& x, int64_t b, int64_t h) {
  if (!x.bias) return nullptr;
  const int64_t bs = slice_batch(p);
  return static_cast<const T*>(x.bias) + (b / bs) * x.sbias.slice + (b % bs) * x.sbias.b +
         h * x.sbias.h;
}

// sr[c] += mul * brow[c] for c in [c_lo, c_hi).
template <class T>
inline void add_bias(const T* brow, float mul, float* sr, int64_t c_lo, int64_t c_hi) {
  for (int64_t c = c_lo; c < c_hi; ++c) sr[c] += mul * to_float(brow[c]);
}

// Dropout of one (batch entry, head): z(i, j) = 1 / (1 - p) when key j of
// query i is kept, else 0; the rule is philox.h's.
class Dropout {
 public:
  Dropout(const AttnParams& p, const Extras& x, int64_t b, int64_t h) : h_(h) {
    on_ = has_dropout(p);
    if (!on_) return;
    const int64_t bs = slice_batch(p);
    seed_[0] = x.seed[2 * (b / bs)];
    seed_[1] = x.seed[2 * (b / bs) + 1];
    b_ = b % bs;
    threshold_ = dropout_threshold(p.dropout);
    inv_keep_ = 1.0f / (1.0f - p.dropout);
  }
  bool on() const { return on_; }

  // z[c] = z(i, k0 + c) for the 64 keys c of the tile at k0 (a multiple of 4): one
  // row of a tile is 16 key groups, whose Philox calls run side by side (philox_lanes.h).
  void fill_row(int64_t i, int64_t k0, float* z) const {
    static_assert(kPhiloxLanes * 4 == kBk, "one Philox batch covers one tile row of keys");
    alignas(32) uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
    for (int l = 0; l < kPhiloxLanes; ++l)
      c0[l] = uint32_t(k0 / 4 + l), c1[l] = uint32_t(i), c2[l] = uint32_t(h_), c3[l] = uint32_t(b_);
    philox_lanes(c0, c1, c2, c3, seed_[0], seed_[1]);
    for (int l = 0; l < kPhiloxLanes; ++l) {
      z[4 * l + 0] = c0[l] >= threshold_ ? inv_keep_ : 0.0f;
      z[4 * l + 1] = c1[l] >= threshold_ ? inv_keep_ : 0.0f;
      z[4 * l + 2] = c2[l] >= threshold_ ? inv_keep_ : 0.0f;
      z[4 * l + 3] = c3[l] >= threshold_ ? inv_keep_ : 0.0f;
    }
  }

 private:
  bool on_ = false;
  uint32_t seed_[2] = {0, 0};
  int64_t b_ = 0, h_;
  uint32_t threshold_ = 0;
  float inv_keep_ = 1.0f;
};

}  // namespace fusedattn::cpu
