// Forward pass of the CPU flash-attention engine (see attention.h for shapes).
//
// One task = one (batch, q head, 64-row query tile). It streams the key tiles
// its rows can see, keeps the running row max m and row sum l (online
// softmax), and rescales its float32 output accumulator as m grows (A = acc_t<T>:
// float32, or double throughout for float64 storage). Nothing of size Sq x Skv is
// ever stored. The softmax's extra logit (OFF_BY_ONE /
// LEARNABLE) enters as the starting state m = sink, l = 1 of every query row:
// a key whose value is zero. Dropout scales the probabilities after they
// entered l, so l stays the undropped normalizer.
//
// NaN in, NaN out: a NaN among a row's kept scores (from q, k, bias, score_mod)
// or a NaN sink makes the row's m and l NaN for good, so its output, lse and its
// head's max_logit (not for the sink) are NaN; a row that keeps nothing still
// gives 0 and lse -inf (lse NaN under a NaN sink).
// A +inf sink takes all the mass: output 0, lse +inf.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/platform/cpu/dispatch.h"
#include "fusedattn/platform/cpu/fast_math.h"
#include "fusedattn/attention/cpu/gemm.h"
#include "fusedattn/attention/cpu/row_ranges.h"
#include "fusedattn/attention/cpu/score_ops.h"
#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/attention/cpu/tiles.h"

namespace fusedattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <class T>
void forward(const AttnParams& p, const FwdArgs& a) {
  using A = acc_t<T>;
  constexpr bool kScoreMod = std::is_same_v<A, float>;  // the interpreter's type
  const int64_t B = p.batch, Sq = p.seqlen_q, Skv = p.seqlen_kv;
  const int64_t Hq = p.heads_q, group = p.heads_q / p.heads_kv;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v;
  const int64_t Dp = round_up(D, kNr), Dvp = round_up(Dv, kNr);
  const int64_t n_qt = (Sq + kBq - 1) / kBq;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  A* lse_out = static_cast<A*>(a.lse);
  const A bmul = bias_mul<A>(p, a.x);
  RowRanges ranges = build_row_ranges(p, seq_args(a.x), kBq);
  const MaskTiles mask_tiles = narrow_to_mask<T>(ranges, p, a.x);
  std::vector<A> tile_max(B * Hq * n_qt, kNegInf);

  parallel_for(B * Hq * n_qt, [&](int64_t task, int) {
    const int64_t qt = task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
    const int64_t hk = h / group, q0 = qt * kBq, rows = std::min(kBq, Sq - q0);
    const A sink = sink_logit<A>(p, a.x, b / slice_batch(p), h);
    const T* bias = bias_plane<T>(p, a.x, b, h);
    const bool mask_bias = bias && a.x.mask_bias;
    const float mv = mask_bias ? masked_bias<T>() : 0.0f;
    const Dropout<A> dropout(p, a.x, b, h);
    ScoreModRows score_mod(p, a.x, ranges, b, h);

    int64_t lo[kBq], hi[kBq];
    A m[kBq], l[kBq], mx[kBq];  // running max (sink included), sum, max of real keys
    for (int64_t r = 0; r < kBq; ++r) {
      const int64_t row = ranges.row(b, q0 + r);
      const bool real = r < rows && ranges.real[row];
      lo[r] = r < rows ? ranges.lo[row] : 0;
      hi[r] = r < rows ? ranges.hi[row] : 0;
      m[r] = real ? sink : kNegInf;
      // The sink's exp(sink - m) = 1. A NaN sink: m NaN, which poisons the row once
      // it keeps a key; a row that keeps none gives output 0 and lse NaN.
      l[r] = real && sink != kNegInf ? A(1) : A(0);
      mx[r] = kNegInf;
    }
    const int64_t tile_lo = ranges.tile_lo[ranges.tile_index(b, qt)];
    const int64_t tile_hi = ranges.tile_hi[ranges.tile_index(b, qt)];

    Buffer<A> qf(kBq * Dp), kt(Dp * kBk), vf(kBk * Dvp), s(kBq * kBk), acc(kBq * Dvp), z(kBk);
    // The scale is folded into q so the scores come out of the gemm scaled.
    load_rows(q + b * a.sq.b + q0 * a.sq.s + h * a.sq.h, a.sq.s, rows, D, attn_scale<A>(p, a.x),
              qf.data(), kBq, Dp);

    for (int64_t k0 = tile_lo / kBk * kBk; k0 < tile_hi; k0 += kBk) {
      const int64_t cols = std::min(kBk, Skv - k0);
      // A folded mask: a tile whose kept keys it keeps with bias 0 adds no bias (tb null);
      // one that drops every kept key of the tile's rows adds nothing.
      const bool clean = mask_bias && mask_tiles(b, qt, k0 / kBk);
      const T* tb = clean ? nullptr : bias;
      if (mask_bias && !clean &&
          tile_masked(bias + q0 * a.x.sbias.s + k0, a.x.sbias.s, rows, lo, hi, k0, cols, mv))
        continue;
      load_rows_transposed(k + b * a.sk.b + k0 * a.sk.s + hk * a.sk.h, a.sk.s, cols, D, kt.data(), Dp, kBk);
      load_rows(v + b * a.sv.b + k0 * a.sv.s + hk * a.sv.h, a.sv.s, cols, Dv, A(1), vf.data(), kBk, Dvp);
      gemm<false>(kBq, kBk, Dp, qf.data(), Dp, kt.data(), kBk, s.data(), kBk);

      for (int64_t r = 0; r < kBq; ++r) {
        A* sr = s.data() + r * kBk;
        // Kept columns of this row in this tile: [c_lo, c_hi), inside [0, cols).
        const int64_t c_lo = std::clamp<int64_t>(lo[r] - k0, 0, kBk);
        const int64_t c_hi = std::clamp<int64_t>(hi[r] - k0, c_lo, kBk);
        if (tb) add_bias(tb + (q0 + r) * a.x.sbias.s + k0, bmul, sr, c_lo, c_hi);
        if constexpr (kScoreMod)
          if (score_mod.on()) score_mod.forward(q0 + r, k0, sr, c_lo, c_hi);
        if (mask_bias && tb) drop_masked(tb + (q0 + r) * a.x.sbias.s + k0, mv, sr, c_lo, c_hi);
        A row_max = kNegInf;
        bool nan = false;  // an OR of compares, not a branch: the loop stays vectorized
        for (int64_t c = 0; c < kBk; ++c) {
          sr[c] = (c >= c_lo && c < c_hi) ? sr[c] : kNegInf;
          row_max = std::max(row_max, sr[c]);
          nan |= sr[c] != sr[c];
        }
        if (nan) row_max = std::numeric_limits<A>::quiet_NaN();
        mx[r] = nan_max(mx[r], row_max);
        const A m_new = nan_max(m[r], row_max);
        if (!(m_new > kNegInf)) {  // nothing kept in this row so far (-inf), or a NaN
          if (m_new != m_new && c_lo < c_hi) m[r] = l[r] = m_new;  // poisoned for good
          std::fill(sr, sr + kBk, A(0));
          continue;
        }
        // m[r] == m_new: alpha 1, also when both are +inf (a +inf sink).
        const A alpha = m[r] == m_new ? A(1) : m[r] == kNegInf ? A(0) : acc_exp(m[r] - m_new);
        A sum = A(0);
        for (int64_t c = 0; c < kBk; ++c) {
          const A d = sr[c] - m_new;  // -inf for masked keys, and for all under a +inf max
          const A e = acc_exp(d);
          sr[c] = d == kNegInf ? A(0) : e;
          sum += sr[c];
        }
        l[r] = l[r] * alpha + sum;
        m[r] = m_new;
        A* ar = acc.data() + r * Dvp;
        for (int64_t c = 0; c < Dvp; ++c) ar[c] *= alpha;
        if (dropout.on() && c_lo < c_hi) {
          dropout.fill_row(q0 + r, k0, z.data());
          for (int64_t c = c_lo; c < c_hi; ++c) sr[c] *= z.data()[c];
        }
      }
      gemm<true>(kBq, Dvp, kBk, s.data(), kBk, vf.data(), Dvp, acc.data(), Dvp);
    }

    A local_max = kNegInf;
    for (int64_t r = 0; r < rows; ++r) {
      const bool any = l[r] != A(0);  // a NaN l is "any": its NaN reaches out and lse
      // A row that keeps no key is exactly 0 (a sink may hold all its mass): its
      // accumulator may hold 0 * inf = NaN from a value row the tile's gemm met with
      // weight 0.
      store_row(acc.data() + r * Dvp, Dv, any ? A(1) / l[r] : A(0),
                out + b * a.so.b + (q0 + r) * a.so.s + h * a.so.h,
                /*zero=*/!any || hi[r] <= lo[r]);
      lse_out[b * a.slse.b + h * a.slse.h + (q0 + r) * a.slse.s] = any ? m[r] + std::log(l[r]) : kNegInf;
      local_max = nan_max(local_max, mx[r]);
    }
    tile_max[task] = local_max;
  });

  if (a.max_logit) {
    for (int64_t bh = 0; bh < B * Hq; ++bh) {
      A mb = kNegInf;
      for (int64_t t = 0; t < n_qt; ++t) mb = nan_max(mb, tile_max[bh * n_qt + t]);
      static_cast<A*>(a.max_logit)[bh] = mb;
    }
  }
}

}  // namespace

void attention_fwd(const AttnParams& p, const FwdArgs& a) {
  dispatch_dtype_f64(p.dtype, [&](auto t) { forward<decltype(t)>(p, a); });
}

}  // namespace fusedattn::cpu
