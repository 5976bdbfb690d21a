// Backward pass of the CPU flash-attention engine (see attention.h for shapes).
//
//   s  = scale * Q K^T + bias_mul * bias   P = exp(s - lse), recomputed per tile
//   Z  = dropout's keep / (1 - p) (1 without dropout), from the same Philox words
//   dV = (Z * P)^T dO                       dP = dO V^T
//   dS = P * (Z * dP - delta),  delta_i = sum_d dO_i O_i
//   dQ = scale * dS K    dK = scale * dS^T Q    dbias = bias_mul * dS (summed over
//   broadcast dims)      dsink = -sum_i exp(sink - lse_i) delta_i (LEARNABLE)
//
// One task = one (batch, kv head, 64-key tile): it owns its rows of dK and dV
// (summed over the q heads of its GQA group) and adds its share of dQ into a
// float32 accumulator (A = acc_t<T>: every accumulator is double for float64 storage).
// When dbias is reduced over a broadcast batch or head
// dimension, one task takes every (batch, kv head) sharing its bias plane, so
// it owns that part of dbias too. Tasks are dealt to chunks by a fixed rule
// (task % chunks), each chunk has its own dQ accumulator, and the chunks are
// summed in order at the end: no atomics, and bitwise deterministic for a
// fixed thread count.
//
// A row whose forward met a NaN has lse NaN: P = exp(s - NaN) is NaN on its kept
// keys, so its dq, the dk and dv of the keys it keeps, its dbias row and dsink
// are NaN (none of the -inf / dropout zero fix-ups hide it). A row of a +inf
// sink (lse +inf) gave all its mass to the sink: P = 0, no gradient.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/platform/cpu/dispatch.h"
#include "fusedattn/attention/cpu/gemm.h"
#include "fusedattn/attention/cpu/row_ranges.h"
#include "fusedattn/attention/cpu/score_ops.h"
#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/attention/cpu/tiles.h"

namespace fusedattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// delta [B, Hq, Sq] = rowsum(dO * O), and d softmax_offset [B, Hq] when asked.
template <class T, class A = acc_t<T>>
std::vector<A> row_deltas(const AttnParams& p, const BwdArgs& a) {
  const int64_t B = p.batch, Sq = p.seqlen_q, Hq = p.heads_q, Dv = p.head_dim_v;
  const int64_t n_qt = (Sq + kBq - 1) / kBq;
  const T* o = static_cast<const T*>(a.out);
  const T* dout = static_cast<const T*>(a.dout);
  const bool dsink = a.dsoftmax_offset && p.softmax_type == FA_LEARNABLE_SOFTMAX;
  const A* lse_in = static_cast<const A*>(a.lse);
  std::vector<A> delta(B * Hq * Sq);
  std::vector<double> sink_part(dsink ? B * Hq * n_qt : 0);
  parallel_for(B * Hq * n_qt, [&](int64_t task, int) {
    const int64_t qt = task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
    const A sink = dsink ? sink_logit<A>(p, a.x, b / slice_batch(p), h) : A(0);
    double part = 0.0;
    for (int64_t i = qt * kBq; i < std::min(Sq, (qt + 1) * kBq); ++i) {
      const T* orow = o + b * a.so.b + i * a.so.s + h * a.so.h;
      const T* drow = dout + b * a.sdo.b + i * a.sdo.s + h * a.sdo.h;
      A sum = A(0);
      for (int64_t c = 0; c < Dv; ++c) sum += widen(orow[c]) * widen(drow[c]);
      delta[(b * Hq + h) * Sq + i] = sum;
      const A lse = lse_in[b * a.slse.b + h * a.slse.h + i * a.slse.s];
      // Padding rows (lse -inf): none; a +inf sink has probability 1 (delta is 0 there).
      if (dsink && lse != kNegInf) part += (sink == lse ? 1.0 : std::exp(double(sink) - lse)) * sum;
    }
    if (dsink) sink_part[task] = part;
  });
  if (dsink) {
    for (int64_t bh = 0; bh < B * Hq; ++bh) {
      double sum = 0.0;
      for (int64_t qt = 0; qt < n_qt; ++qt) sum += sink_part[bh * n_qt + qt];
      static_cast<A*>(a.dsoftmax_offset)[bh] = A(-sum);
    }
  }
  return delta;
}

template <class T>
void backward(const AttnParams& p, const BwdArgs& a) {
  using A = acc_t<T>;
  constexpr bool kScoreMod = std::is_same_v<A, float>;  // the interpreter's type
  const int64_t B = p.batch, Sq = p.seqlen_q, Skv = p.seqlen_kv;
  const int64_t Hq = p.heads_q, Hkv = p.heads_kv, group = p.heads_q / p.heads_kv;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v;
  const int64_t Dp = round_up(D, kNr), Dvp = round_up(Dv, kNr);
  const int64_t n_qt = (Sq + kBq - 1) / kBq, n_kt = (Skv + kBk - 1) / kBk;
  const int64_t Sqp = n_qt * kBq, bs = slice_batch(p);
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* dout = static_cast<const T*>(a.dout);
  const A* lse_in = static_cast<const A*>(a.lse);
  const A scale = attn_scale<A>(p, a.x), bmul = bias_mul<A>(p, a.x);
  RowRanges ranges = build_row_ranges(p, seq_args(a.x), kBq);
  const MaskTiles mask_tiles = narrow_to_mask<T>(ranges, p, a.x);
  const std::vector<A> delta = row_deltas<T>(p, a);

  // dbias [slices, bias_batch, bias_heads, Sq, Skv], accumulated in A (in place when
  // that is the storage type).
  const bool want_dbias = a.dbias && a.x.bias;
  const BiasStrides sdb = BiasStrides::dense(p);
  const int64_t n_dbias = want_dbias ? p.num_slices * sdb.slice : 0;
  constexpr bool kInPlace = std::is_same_v<T, A>;
  std::vector<A> dbias_buf(kInPlace ? 0 : n_dbias);
  A* dbias_acc = !want_dbias ? nullptr : kInPlace ? static_cast<A*>(a.dbias) : dbias_buf.data();
  if (dbias_acc && kInPlace) std::memset(dbias_acc, 0, n_dbias * sizeof(A));
  const bool merge_b = want_dbias && p.bias_batch == 1 && bs > 1;
  const bool merge_h = want_dbias && p.bias_heads == 1 && Hkv > 1;
  const int64_t b_owners = merge_b ? p.num_slices : B, b_members = merge_b ? bs : 1;
  const int64_t h_owners = merge_h ? 1 : Hkv, h_members = merge_h ? Hkv : 1;

  // dq_acc[chunk] is [B, Hq, Sqp, Dp] in A.
  const int64_t n_tasks = b_owners * h_owners * n_kt, n_chunks = std::min<int64_t>(max_slots(), n_tasks);
  std::vector<std::unique_ptr<Buffer<A>>> dq_acc(n_chunks);
  // Per-chunk float32 accumulators of the score_mod operands' gradients [slices, total].
  const ScoreMod* sm = a.x.score_mod;
  const int64_t n_dop = sm && a.dscore_mod_operands ? p.num_slices * sm->total_size() : 0;
  std::vector<std::vector<float>> dop_acc(n_dop ? n_chunks : 0);

  auto kv_tile = [&](int64_t b, int64_t hk, int64_t kt_i, A* dq_chunk, float* dop_chunk) {
    const int64_t k0 = kt_i * kBk, cols = std::min(kBk, Skv - k0);
    Buffer<A> kf(kBk * Dp), kt(Dp * kBk), vt(Dvp * kBk), qf(kBq * Dp), dof(kBq * Dvp), z(kBk);
    Buffer<A> s(kBq * kBk), dp(kBq * kBk), pt(kBk * kBq), dst(kBk * kBq);
    Buffer<A> raw(kBk), smod(kBk);  // score_mod: the raw and the modified scores of a row
    Buffer<A> dk_acc(kBk * Dp), dv_acc(kBk * Dvp);
    const T* kbase = k + b * a.sk.b + k0 * a.sk.s + hk * a.sk.h;
    load_rows(kbase, a.sk.s, cols, D, A(1), kf.data(), kBk, Dp);
    load_rows_transposed(kbase, a.sk.s, cols, D, kt.data(), Dp, kBk);
    load_rows_transposed(v + b * a.sv.b + k0 * a.sv.s + hk * a.sv.h, a.sv.s, cols, Dv, vt.data(), Dvp, kBk);

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const A* dl = delta.data() + (b * Hq + h) * Sq;
      const T* bias = bias_plane<T>(p, a.x, b, h);
      const bool mask_bias = bias && a.x.mask_bias;
      const float mv = mask_bias ? masked_bias<T>() : 0.0f;
      A* dbias = dbias_acc ? dbias_acc + (b / bs) * sdb.slice + (b % bs) * sdb.b + h * sdb.h : nullptr;
      const Dropout<A> dropout(p, a.x, b, h);
      ScoreModRows score_mod(p, a.x, ranges, b, h);
      float* dop = dop_chunk ? dop_chunk + score_mod.slice() * sm->total_size() : nullptr;
      for (int64_t qt = 0; qt < n_qt; ++qt) {
        const int64_t t = ranges.tile_index(b, qt);
        if (std::max<int64_t>(ranges.tile_lo[t], k0) >= std::min<int64_t>(ranges.tile_hi[t], k0 + cols)) continue;
        const int64_t q0 = qt * kBq, rows = std::min(kBq, Sq - q0);
        // A folded mask: a tile whose kept keys it keeps with bias 0 adds no bias (tb null);
        // one that drops every kept key of the tile's rows has no share.
        const bool clean = mask_bias && mask_tiles(b, qt, kt_i);
        const T* tb = clean ? nullptr : bias;
        if (mask_bias && !clean) {
          int64_t lo[kBq], hi[kBq];
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t row = ranges.row(b, q0 + r);
            lo[r] = ranges.lo[row], hi[r] = ranges.hi[row];
          }
          if (tile_masked(bias + q0 * a.x.sbias.s + k0, a.x.sbias.s, rows, lo, hi, k0, cols, mv)) continue;
        }

        load_rows(q + b * a.sq.b + q0 * a.sq.s + h * a.sq.h, a.sq.s, rows, D, A(1), qf.data(), kBq, Dp);
        load_rows(dout + b * a.sdo.b + q0 * a.sdo.s + h * a.sdo.h, a.sdo.s, rows, Dv, A(1), dof.data(), kBq, Dvp);
        gemm<false>(kBq, kBk, Dp, qf.data(), Dp, kt.data(), kBk, s.data(), kBk);
        gemm<false>(kBq, kBk, Dvp, dof.data(), Dvp, vt.data(), kBk, dp.data(), kBk);

        for (int64_t r = 0; r < kBq; ++r) {
          A* sr = s.data() + r * kBk;   // becomes Z * P
          A* dr = dp.data() + r * kBk;  // becomes dS
          const int64_t row = ranges.row(b, q0 + r);
          const A row_lse = r < rows ? lse_in[b * a.slse.b + h * a.slse.h + (q0 + r) * a.slse.s] : kNegInf;
          // A row with lse -inf kept nothing (padding, or every kept score -inf), one
          // with lse +inf gave everything to a +inf sink; a NaN lse is live (NaN out).
          const bool live = r < rows && row_lse != kNegInf && row_lse != -kNegInf;
          const bool nan_row = row_lse != row_lse;
          const int64_t c_lo = live ? std::clamp<int64_t>(ranges.lo[row] - k0, 0, kBk) : 0;
          const int64_t c_hi = live ? std::clamp<int64_t>(ranges.hi[row] - k0, c_lo, kBk) : 0;
          const A row_delta = r < rows ? dl[q0 + r] : A(0);
          A sc = scale;
          if (tb && c_lo < c_hi) {  // full logits in sr, so the exp below takes scale 1
            const T* brow = tb + (q0 + r) * a.x.sbias.s + k0;
            for (int64_t c = c_lo; c < c_hi; ++c) sr[c] = sr[c] * scale + bmul * widen(brow[c]);
            sc = A(1);
          }
          const bool modded = kScoreMod && score_mod.on() && c_lo < c_hi;
          if constexpr (kScoreMod)
            if (modded) {  // sr: the raw logits (kept in raw), then fn of them
              for (int64_t c = c_lo; c < c_hi; ++c) sr[c] *= sc;
              sc = 1.0f;
              std::copy(sr + c_lo, sr + c_hi, raw.data() + c_lo);
              score_mod.forward(q0 + r, k0, sr, c_lo, c_hi);
              std::copy(sr + c_lo, sr + c_hi, smod.data() + c_lo);
            }
          const bool drop = dropout.on() && c_lo < c_hi;
          if (!drop) {
            for (int64_t c = 0; c < kBk; ++c) {
              const bool keep = c >= c_lo && c < c_hi;
              const A pr = keep ? acc_exp(sr[c] * sc - row_lse) : A(0);
              sr[c] = pr;
              dr[c] = keep ? pr * (dr[c] - row_delta) : A(0);  // a NaN delta or dP stays out
            }
          } else {
            dropout.fill_row(q0 + r, k0, z.data());
            for (int64_t c = 0; c < kBk; ++c) {
              const bool keep = c >= c_lo && c < c_hi;
              const A pr = keep ? acc_exp(sr[c] * sc - row_lse) : A(0);
              const A zc = keep ? z.data()[c] : A(0);
              sr[c] = zc != A(0) ? zc * pr : A(0);  // a dropped NaN stays dropped
              dr[c] = keep ? pr * (zc * dr[c] - row_delta) : A(0);
            }
          }
          if (tb && c_lo < c_hi && !nan_row) {  // a -inf bias keeps nothing; fast_exp would give ~1e-38
            const T* brow = tb + (q0 + r) * a.x.sbias.s + k0;
            for (int64_t c = c_lo; c < c_hi; ++c)
              if (widen(brow[c]) == kNegInf || (mask_bias && widen(brow[c]) == mv)) sr[c] = dr[c] = A(0);
          }
          if constexpr (kScoreMod)
            if (modded) {  // a score fn set to -inf keeps nothing; dS of the raw logits
              if (!nan_row)
                for (int64_t c = c_lo; c < c_hi; ++c)
                  if (smod.data()[c] == kNegInf) sr[c] = dr[c] = 0.0f;
              score_mod.backward(q0 + r, k0, raw.data(), dr, c_lo, c_hi, dop);
            }
          if (dbias && c_lo < c_hi) {
            A* dbr = dbias + (q0 + r) * sdb.s + k0;
            for (int64_t c = c_lo; c < c_hi; ++c) dbr[c] += bmul * dr[c];
          }
        }
        transpose(s.data(), kBq, kBk, kBk, pt.data(), kBq);
        transpose(dp.data(), kBq, kBk, kBk, dst.data(), kBq);
        gemm<true>(kBk, Dvp, kBq, pt.data(), kBq, dof.data(), Dvp, dv_acc.data(), Dvp);
        gemm<true>(kBk, Dp, kBq, dst.data(), kBq, qf.data(), Dp, dk_acc.data(), Dp);
        gemm<true>(kBq, Dp, kBk, dp.data(), kBk, kf.data(), Dp,
                   dq_chunk + ((b * Hq + h) * Sqp + q0) * Dp, Dp);
      }
    }

    T* dk = static_cast<T*>(a.dk);
    T* dv = static_cast<T*>(a.dv);
    for (int64_t c = 0; c < cols; ++c) {
      store_row(dk_acc.data() + c * Dp, D, scale, dk + b * a.sdk.b + (k0 + c) * a.sdk.s + hk * a.sdk.h);
      store_row(dv_acc.data() + c * Dvp, Dv, A(1), dv + b * a.sdv.b + (k0 + c) * a.sdv.s + hk * a.sdv.h);
    }
  };
  auto task_fn = [&](int64_t task, A* dq_chunk, float* dop_chunk) {
    const int64_t kt_i = task % n_kt, oh = (task / n_kt) % h_owners, ob = task / (n_kt * h_owners);
    for (int64_t b = ob * b_members; b < (ob + 1) * b_members; ++b)
      for (int64_t hk = oh * h_members; hk < (oh + 1) * h_members; ++hk) kv_tile(b, hk, kt_i, dq_chunk, dop_chunk);
  };
  parallel_for(n_chunks, [&](int64_t chunk, int) {
    dq_acc[chunk] = std::make_unique<Buffer<A>>(B * Hq * Sqp * Dp);
    if (n_dop) dop_acc[chunk].assign(n_dop, 0.0f);
    float* dop_chunk = n_dop ? dop_acc[chunk].data() : nullptr;
    for (int64_t task = chunk; task < n_tasks; task += n_chunks)
      task_fn(task, dq_acc[chunk]->data(), dop_chunk);
  });
  if (n_dop) {  // in chunk order: the same sums on every run
    for (int64_t i = 0; i < n_dop; ++i) {
      float sum = 0.0f;
      for (const auto& acc : dop_acc) sum += acc[i];
      a.dscore_mod_operands[i] = sum;
    }
  }

  // dq = scale * sum over chunks of dq_acc, in chunk order
  T* dq = static_cast<T*>(a.dq);
  parallel_for(B * Hq * n_qt, [&](int64_t task, int) {
    const int64_t qt = task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
    std::vector<A> row(Dp);
    for (int64_t i = qt * kBq; i < std::min(Sq, (qt + 1) * kBq); ++i) {
      std::fill(row.begin(), row.end(), A(0));
      for (auto& acc : dq_acc) {
        const A* src = acc->data() + ((b * Hq + h) * Sqp + i) * Dp;
        for (int64_t c = 0; c < Dp; ++c) row[c] += src[c];
      }
      store_row(row.data(), D, scale, dq + b * a.sdq.b + i * a.sdq.s + h * a.sdq.h);
    }
  });

  if (!dbias_buf.empty()) {
    const int64_t n_rows = n_dbias / Skv;
    T* dbias = static_cast<T*>(a.dbias);
    parallel_for((n_rows + 255) / 256, [&](int64_t chunk, int) {
      for (int64_t r = chunk * 256; r < std::min(n_rows, (chunk + 1) * 256); ++r)
        store_row(dbias_buf.data() + r * Skv, Skv, A(1), dbias + r * Skv);
    });
  }
}

}  // namespace

void attention_bwd(const AttnParams& p, const BwdArgs& a) {
  dispatch_dtype_f64(p.dtype, [&](auto t) { backward<decltype(t)>(p, a); });
}

}  // namespace fusedattn::cpu
