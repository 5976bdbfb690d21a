// The per-element steps of the tile loops, on one row of one score tile:
// bias, the extra softmax logit ("sink") and dropout. The kept-key range of a
// row comes from row_ranges.h (the rule of attention/mask.h); these never
// change which keys are kept.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "fusedattn/attention/params.h"
#include "fusedattn/core/philox.h"
#include "fusedattn/score_mod/program.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/platform/cpu/dtypes.h"
#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/attention/cpu/row_ranges.h"
#include "fusedattn/attention/cpu/philox_lanes.h"
#include "fusedattn/attention/cpu/tiles.h"

namespace fusedattn::cpu {

// The extra logit of OFF_BY_ONE (0) and LEARNABLE (softmax_offset[slice, h])
// softmax; -inf (no extra term) for VANILLA. A: the arithmetic type (the offset's).
template <class A>
inline A sink_logit(const AttnParams& p, const Extras& x, int64_t slice, int64_t h) {
  switch (p.softmax_type) {
    case FA_OFF_BY_ONE_SOFTMAX: return A(0);
    case FA_LEARNABLE_SOFTMAX: return static_cast<const A*>(x.softmax_offset)[slice * p.heads_q + h];
  }
  return -std::numeric_limits<A>::infinity();
}

// The scale in the arithmetic type: p's float32, or a float64 call's double.
template <class A>
inline A attn_scale(const AttnParams& p, const Extras& x) {
  if constexpr (std::is_same_v<A, double>) return x.scale64;
  else return p.scale;
}

// s = scale * q.k + bias_mul * bias:  POST_SCALE_BIAS adds the bias as is,
// PRE_SCALE_BIAS (s = scale * (q.k + bias)) adds it scaled. Also the factor
// of dS in dbias.
template <class A>
inline A bias_mul(const AttnParams& p, const Extras& x) {
  return p.bias_type == FA_PRE_SCALE_BIAS ? attn_scale<A>(p, x) : A(1);
}

// The bias plane [Sq, Skv] of folded batch entry b and q head h (null without bias).
template <class T>
inline const T* bias_plane(const AttnParams& p, const Extras& x, int64_t b, int64_t h) {
  if (!x.bias) return nullptr;
  const int64_t bs = slice_batch(p);
  return static_cast<const T*>(x.bias) + (b / bs) * x.sbias.slice + (b % bs) * x.sbias.b +
         h * x.sbias.h;
}

// The bias a folded boolean mask puts at the keys it drops (kRequestMaskBias), as a
// float: the larger of jax's masked logit (-0.7 x float32's max, in float32) and -0.7 x
// T's largest finite value, rounded to T (bf16 -2.37e38, fp16 -45856; never -inf, so that
// jax.debug_infs stays quiet). fusedattn.dot_product_attention takes it from here
// (fa_masked_bias_value). float64: the float32 value (exact in double).
template <class T>
inline float masked_bias() {
  constexpr float kF32Max = std::numeric_limits<float>::max();
  float t_max = kF32Max;
  if constexpr (std::is_same_v<T, bf16>) t_max = to_float(bf16{0x7f7f});
  if constexpr (std::is_same_v<T, fp16>) t_max = to_float(fp16{0x7bff});
  if constexpr (std::is_same_v<T, double>) return -0.7f * kF32Max;
  else return to_float(from_float<T>(std::max(-0.7f * kF32Max, -0.7f * t_max)));
}

// Whether every kept key of rows [0, rows) of a query tile at q0 in the key tile at k0
// carries the masked bias mv (row r keeps [lo[r], hi[r]); brow0: the bias row of q0 at
// k0, rows sb elements apart): such a tile adds nothing to any of them.
template <class T>
inline bool tile_masked(const T* brow0, int64_t sb, int64_t rows, const int64_t* lo, const int64_t* hi,
                        int64_t k0, int64_t cols, float mv) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c_lo = std::clamp<int64_t>(lo[r] - k0, 0, cols), c_hi = std::clamp<int64_t>(hi[r] - k0, c_lo, cols);
    const T* brow = brow0 + r * sb;
    bool all = true;  // an AND of compares, not a branch: the loop stays vectorized
    for (int64_t c = c_lo; c < c_hi; ++c) all &= widen(brow[c]) == mv;
    if (!all) return false;
  }
  return true;
}

// The key tiles (kBq x kBk) of a folded mask's planes whose kept elements add nothing: every
// element in its rows' kept keys is 0 (a pure mask; a bias folded with the mask is not).
// The tile loops treat such a tile as one without bias: no bias read, no masked-key test.
struct MaskTiles {
  int64_t n_qt = 0, n_kt = 0;
  std::vector<int64_t> plane_of;  // [B]: the batch entry's plane
  std::vector<uint8_t> clean;     // [planes, n_qt, n_kt]; empty: none
  bool operator()(int64_t b, int64_t qt, int64_t kt) const {
    return !clean.empty() && clean[(plane_of[b] * n_qt + qt) * n_kt + kt] != 0;
  }
};

// A folded mask the same for every head (bias_heads == 1): each row's kept range narrowed
// to the first and the last key the mask keeps in it (the keys between stay, dropped one by
// one by drop_masked; a row the mask empties keeps nothing), the tiles' unions recomputed,
// and the clean tiles (MaskTiles) found. Then the tile loops never reach the key tiles a
// causal, window or padding mask passed densely empties, and add no bias in the tiles it
// keeps whole, as with the mask types; each distinct bias plane is read once, by query tiles
// in parallel.
template <class T>
MaskTiles narrow_to_mask(RowRanges& r, const AttnParams& p, const Extras& x) {
  MaskTiles mt;
  if (!x.bias || !x.mask_bias || p.bias_heads != 1) return mt;
  const int64_t B = p.batch, Sq = p.seqlen_q, Skv = p.seqlen_kv, sb = x.sbias.s;
  const float mv = masked_bias<T>();
  std::vector<const T*> planes;  // distinct planes, in order of first use
  mt.plane_of.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    const T* pl = bias_plane<T>(p, x, b, 0);
    const auto it = std::find(planes.begin(), planes.end(), pl);
    mt.plane_of[b] = it - planes.begin();
    if (it == planes.end()) planes.push_back(pl);
  }
  const int64_t n_qt = (Sq + kBq - 1) / kBq, n_kt = (Skv + kBk - 1) / kBk;
  mt.n_qt = n_qt, mt.n_kt = n_kt;
  mt.clean.assign(planes.size() * n_qt * n_kt, 1);
  // first[plane * Sq + i], last: the first key row i keeps and one past its last (first ==
  // last: none).
  std::vector<int32_t> first(planes.size() * Sq), last(planes.size() * Sq);
  parallel_for(int64_t(planes.size()) * n_qt, [&](int64_t task, int) {
    const int64_t pl = task / n_qt, qt = task % n_qt;
    uint8_t* clean = mt.clean.data() + task * n_kt;
    for (int64_t i = qt * kBq; i < std::min(Sq, (qt + 1) * kBq); ++i) {
      const T* row = planes[pl] + i * sb;
      int64_t lo = 0, hi = Skv;
      while (lo < hi && widen(row[lo]) == mv) ++lo;
      while (hi > lo && widen(row[hi - 1]) == mv) --hi;
      first[pl * Sq + i] = int32_t(lo), last[pl * Sq + i] = int32_t(hi);
      for (int64_t k0 = lo / kBk * kBk; k0 < hi; k0 += kBk) {
        bool zero = true;  // an AND of compares: the loop stays vectorized
        for (int64_t j = std::max(lo, k0); j < std::min(hi, k0 + kBk); ++j) zero &= widen(row[j]) == 0.0f;
        if (!zero) clean[k0 / kBk] = 0;
      }
    }
  });
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < Sq; ++i) {
      const int64_t t = mt.plane_of[b] * Sq + i, row = r.row(b, i);
      const int32_t lo = std::max(r.lo[row], first[t]), hi = std::min(r.hi[row], last[t]);
      r.lo[row] = lo;
      r.hi[row] = std::max(lo, hi);
    }
    set_tile_unions(r, b, Skv);
  }
  return mt;
}

// sr[c] = -inf where the bias is the masked bias mv, for c in [c_lo, c_hi).
template <class T, class A>
inline void drop_masked(const T* brow, float mv, A* sr, int64_t c_lo, int64_t c_hi) {
  for (int64_t c = c_lo; c < c_hi; ++c) sr[c] = widen(brow[c]) == mv ? -std::numeric_limits<A>::infinity() : sr[c];
}

// sr[c] += mul * brow[c] for c in [c_lo, c_hi).
template <class T, class A>
inline void add_bias(const T* brow, A mul, A* sr, int64_t c_lo, int64_t c_hi) {
  for (int64_t c = c_lo; c < c_hi; ++c) sr[c] += mul * widen(brow[c]);
}

// The global index of vmap slice `slice`'s batch entry 0 and q head 0, and where its
// tokens are in the whole call (Extras::index_base; 0 and the identity without it or
// with 2 columns).
struct IndexBase {
  int64_t b = 0, h = 0;
  bool block = false;
  BlockPos pos{{0, 1, 1}, {0, 1, 1}, 0, 0};
};
inline IndexBase index_base(const Extras& x, int64_t slice) {
  if (!x.index_base) return {};
  const int32_t* r = x.index_base + x.index_cols * slice;
  IndexBase g;
  g.b = r[0], g.h = r[1];
  if (is_block(x)) g.block = true, g.pos = block_pos(r, x.index_cols);
  return g;
}

// Dropout of one (batch entry, head): z(i, j) = 1 / (1 - p) when key j of
// query i is kept, else 0; the rule is philox.h's, on the global batch, head, query and
// key index (index_base added; in a block the global query and key tokens, of which
// 4 local keys from a multiple of 4 are 4 global ones from a multiple of 4:
// check_index_base). A: the arithmetic type of z (1 / (1 - p) in it: a float64 call's
// exact p in double).
template <class A>
class Dropout {
 public:
  Dropout(const AttnParams& p, const Extras& x, int64_t b, int64_t h) {
    on_ = has_dropout(p);
    if (!on_) return;
    const int64_t bs = slice_batch(p);
    const IndexBase base = index_base(x, b / bs);
    seed_[0] = x.seed[2 * (b / bs)];
    seed_[1] = x.seed[2 * (b / bs) + 1];
    b_ = b % bs + base.b;
    h_ = h + base.h;
    if (x.dropout_broadcast) b_ = h_ = 0;  // one mask for every batch entry and head
    q_ = base.pos.q;
    kv_ = base.pos.kv;
    threshold_ = dropout_threshold(p.dropout);
    if constexpr (std::is_same_v<A, double>) inv_keep_ = 1.0 / (1.0 - x.dropout64);
    else inv_keep_ = 1.0f / (1.0f - p.dropout);
  }
  bool on() const { return on_; }

  // z[c] = z(i, k0 + c) for the 64 keys c of the tile at k0 (a multiple of 4): one
  // row of a tile is 16 key groups, whose Philox calls run side by side (philox_lanes.h).
  void fill_row(int64_t i, int64_t k0, A* z) const {
    static_assert(kPhiloxLanes * 4 == kBk, "one Philox batch covers one tile row of keys");
    alignas(32) uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
    const uint32_t qi = uint32_t(global_token(q_, i));
    for (int l = 0; l < kPhiloxLanes; ++l)
      c0[l] = uint32_t(global_token(kv_, k0 + 4 * l) / 4), c1[l] = qi, c2[l] = uint32_t(h_),
      c3[l] = uint32_t(b_);
    philox_lanes(c0, c1, c2, c3, seed_[0], seed_[1]);
    for (int l = 0; l < kPhiloxLanes; ++l) {
      z[4 * l + 0] = c0[l] >= threshold_ ? inv_keep_ : A(0);
      z[4 * l + 1] = c1[l] >= threshold_ ? inv_keep_ : A(0);
      z[4 * l + 2] = c2[l] >= threshold_ ? inv_keep_ : A(0);
      z[4 * l + 3] = c3[l] >= threshold_ ? inv_keep_ : A(0);
    }
  }

 private:
  bool on_ = false;
  uint32_t seed_[2] = {0, 0};
  int64_t b_ = 0, h_ = 0;
  StripeMap q_{0, 1, 1}, kv_{0, 1, 1};  // local -> global tokens
  uint32_t threshold_ = 0;
  A inv_keep_ = A(1);
};

// score_mod on the rows of one (folded batch entry b, q head h): the forward program
// on scores, and in the backward the score's and the operands' gradient programs.
// Inputs of the programs, per row: score, batch, head, q, kv, the array operands read
// at their broadcast position, then dscore (the gradient of the modified score).
// batch and head are global (index_base added); the operands are this shard's own
// slices (Python slices them), so they are read at the local batch and head.
// q and kv are positions in the row's sequence (ranges' q_base / kv_base: a THD
// segment counts from its first token), and so are the operands' indices. A block of a
// bigger call (index_base's positions) gives the program the whole call's positions
// (its tokens mapped by the stripe map, counted from the global segment's first token);
// a BSHD block reads its own operand slices at the local positions, as for batch /
// head, a THD block at the positions in the segment (it has operands without a
// sequence dim only: check_index_base).
class ScoreModRows {
 public:
  ScoreModRows(const AttnParams& p, const Extras& x, const RowRanges& ranges, int64_t b,
               int64_t h)
      : sm_(x.score_mod), ranges_(&ranges), b_fold_(b) {
    if (!sm_) return;
    const int64_t bs = slice_batch(p);
    b_ = b % bs;
    h_ = h;
    slice_ = b / bs;
    base_ = x.score_mod_operands + slice_ * sm_->total_size();
    const int n_in = kScoreModIndexInputs + sm_->n_operands + 1;
    int32_t regs = sm_->fwd.n_regs();
    regs = std::max(regs, sm_->bwd.n_regs());
    for (int32_t i = 0; i < sm_->n_operands; ++i) regs = std::max(regs, sm_->grad[i].n_regs());
    in_store_.assign(static_cast<size_t>(n_in) * kMaxLanes, 0.0f);
    scratch_.assign(static_cast<size_t>(regs) * kMaxLanes, 0.0f);
    for (int r = 0; r < n_in; ++r) in_[r] = in_store_.data() + r * kMaxLanes;
    const IndexBase g = index_base(x, slice_);
    for (int64_t c = 0; c < kMaxLanes; ++c) in_[1][c] = float(b_ + g.b), in_[2][c] = float(h_ + g.h);
    q_map_ = g.pos.q;
    kv_map_ = g.pos.kv;
    local_operands_ = g.block && !is_thd(p.layout);
  }
  bool on() const { return sm_ != nullptr; }
  int64_t slice() const { return slice_; }

  // sr[c] = fn(sr[c], ...) for the keys k0 + c, c in [lo, hi), of query row i.
  void forward(int64_t i, int64_t k0, float* sr, int64_t lo, int64_t hi) {
    if (lo >= hi) return;
    fill(i, k0, sr, nullptr, lo, hi);
    const float* o = eval_score_mod(sm_->fwd, in_, scratch_.data(), lo, hi);
    std::copy(o + lo, o + hi, sr + lo);
  }

  // ds[c]: in, the gradient of the modified score; out, of the raw score s_raw[c].
  // dop (null: not wanted) accumulates each array operand's gradient, laid out as the
  // concatenated operands of this slice.
  void backward(int64_t i, int64_t k0, const float* s_raw, float* ds, int64_t lo, int64_t hi,
                float* dop) {
    if (lo >= hi) return;
    fill(i, k0, s_raw, ds, lo, hi);
    if (dop) {
      for (int32_t k = 0; k < sm_->n_operands; ++k) {
        const float* g = eval_score_mod(sm_->grad[k], in_, scratch_.data(), lo, hi);
        float* d = dop + sm_->offset(k);
        for (int64_t c = lo; c < hi; ++c)
          if (ds[c] != 0.0f) d[operand_index(k, i, k0 + c)] += g[c];
      }
    }
    const float* o = eval_score_mod(sm_->bwd, in_, scratch_.data(), lo, hi);
    for (int64_t c = lo; c < hi; ++c) ds[c] = ds[c] != 0.0f ? o[c] : 0.0f;  // 0 * NaN stays 0
  }

 private:
  // The operand element of query row i and key j (local tokens) of operand k.
  int64_t operand_index(int32_t k, int64_t i, int64_t j) const {
    const int64_t* s = sm_->shape[k];
    const int64_t bb = s[0] == 1 ? 0 : b_, hh = s[1] == 1 ? 0 : h_;
    const int64_t ii = s[2] == 1 ? 0 : (local_operands_ ? i : q_index(i));
    const int64_t jj = s[3] == 1 ? 0 : (local_operands_ ? j : kv_index(i, j));
    return ((bb * s[1] + hh) * s[2] + ii) * s[3] + jj;
  }
  // The q and kv inputs of query row i and key j: positions in the row's sequence.
  int64_t q_index(int64_t i) const {
    return global_token(q_map_, i) - ranges_->q_base[ranges_->row(b_fold_, i)];
  }
  int64_t kv_index(int64_t i, int64_t j) const {
    return global_token(kv_map_, j) - ranges_->kv_base[ranges_->row(b_fold_, i)];
  }
  void fill(int64_t i, int64_t k0, const float* score, const float* ds, int64_t lo, int64_t hi) {
    const int n_ops = sm_->n_operands;
    const float qi = float(q_index(i));
    for (int64_t c = lo; c < hi; ++c) {
      in_[0][c] = score[c];
      in_[3][c] = qi;
      in_[4][c] = float(kv_index(i, k0 + c));
    }
    for (int32_t k = 0; k < n_ops; ++k) {
      const float* op = base_ + sm_->offset(k);
      for (int64_t c = lo; c < hi; ++c)
        in_[kScoreModIndexInputs + k][c] = op[operand_index(k, i, k0 + c)];
    }
    if (ds)
      for (int64_t c = lo; c < hi; ++c) in_[kScoreModIndexInputs + n_ops][c] = ds[c];
  }

  const ScoreMod* sm_;
  const RowRanges* ranges_;
  int64_t b_fold_;  // the folded batch entry (rows of ranges_)
  int64_t b_ = 0, h_ = 0, slice_ = 0;  // local: the operands' indices
  StripeMap q_map_{0, 1, 1}, kv_map_{0, 1, 1};  // local -> global tokens (a block's)
  bool local_operands_ = false;                 // a BSHD block: operands at local tokens
  const float* base_ = nullptr;
  std::vector<float> in_store_, scratch_;
  float* in_[kScoreModIndexInputs + kMaxScoreModOperands + 1] = {};
};

}  // namespace fusedattn::cpu
