// Backward pass of the CPU flash-attention engine (see attention.h for shapes).
//
//   P  = exp(scale * Q K^T - lse)        recomputed per tile from the saved lse
//   dV = P^T dO                           dP = dO V^T
//   dS = P * (dP - delta),  delta_i = sum_d dO_i O_i
//   dQ = scale * dS K                     dK = scale * dS^T Q
//
// One task = one (batch, kv head, 64-key tile): it owns its rows of dK and dV
// (summed over the q heads of its GQA group) and adds its share of dQ into a
// float32 accumulator. Tasks are dealt to chunks by a fixed rule (task % chunks),
// each chunk has its own accumulator, and the chunks are summed in order at the
// end: five tile products per (q tile, kv tile), no atomics, and bitwise
// deterministic for a fixed thread count.
#include <algorithm>
#include <memory>
#include <vector>

#include "attention.h"
#include "dispatch.h"
#include "gemm.h"
#include "mask.h"
#include "thread_pool.h"
#include "tiles.h"

namespace fusedattn::cpu {
namespace {

template <class T>
void backward(const AttnParams& p, const BwdArgs& a) {
  const int64_t B = p.batch, Sq = p.seqlen_q, Skv = p.seqlen_kv;
  const int64_t Hq = p.heads_q, Hkv = p.heads_kv, group = p.heads_q / p.heads_kv;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v;
  const int64_t Dp = round_up(D, kNr), Dvp = round_up(Dv, kNr);
  const int64_t n_qt = (Sq + kBq - 1) / kBq, n_kt = (Skv + kBk - 1) / kBk;
  const int64_t Sqp = n_qt * kBq;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* o = static_cast<const T*>(a.out);
  const T* dout = static_cast<const T*>(a.dout);
  auto q_len = [&](int64_t b) { return a.q_lens ? a.q_lens[b] : Sq; };
  auto kv_len = [&](int64_t b) { return a.kv_lens ? a.kv_lens[b] : Skv; };

  // delta [B, Hq, Sq] = rowsum(dO * O)
  std::vector<float> delta(B * Hq * Sq);
  parallel_for(B * Hq * n_qt, [&](int64_t task, int) {
    const int64_t qt = task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
    for (int64_t i = qt * kBq; i < std::min(Sq, (qt + 1) * kBq); ++i) {
      const T* orow = o + b * a.so.b + i * a.so.s + h * a.so.h;
      const T* drow = dout + b * a.sdo.b + i * a.sdo.s + h * a.sdo.h;
      float sum = 0.0f;
      for (int64_t c = 0; c < Dv; ++c) sum += to_float(orow[c]) * to_float(drow[c]);
      delta[(b * Hq + h) * Sq + i] = sum;
    }
  });

  // dq_acc[chunk] is [B, Hq, Sqp, Dp] float32.
  const int64_t n_tasks = B * Hkv * n_kt, n_chunks = std::min<int64_t>(max_slots(), n_tasks);
  std::vector<std::unique_ptr<Buffer>> dq_acc(n_chunks);

  auto kv_tile_task = [&](int64_t task, float* dq_chunk) {
    const int64_t kt_i = task % n_kt, hk = (task / n_kt) % Hkv, b = task / (n_kt * Hkv);
    const int64_t k0 = kt_i * kBk, cols = std::min(kBk, Skv - k0);
    const RowMask mask = make_row_mask(p, q_len(b), kv_len(b));

    Buffer kf(kBk * Dp), kt(Dp * kBk), vt(Dvp * kBk), qf(kBq * Dp), dof(kBq * Dvp);
    Buffer s(kBq * kBk), dp(kBq * kBk), pt(kBk * kBq), dst(kBk * kBq);
    Buffer dk_acc(kBk * Dp), dv_acc(kBk * Dvp);
    const T* kbase = k + b * a.sk.b + k0 * a.sk.s + hk * a.sk.h;
    load_rows(kbase, a.sk.s, cols, D, 1.0f, kf.data(), kBk, Dp);
    load_rows_transposed(kbase, a.sk.s, cols, D, kt.data(), Dp, kBk);
    load_rows_transposed(v + b * a.sv.b + k0 * a.sv.s + hk * a.sv.h, a.sv.s, cols, Dv, vt.data(), Dvp, kBk);

    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      const float* lse = a.lse + (b * Hq + h) * Sq;
      const float* dl = delta.data() + (b * Hq + h) * Sq;
      for (int64_t qt = 0; qt < n_qt; ++qt) {
        const int64_t q0 = qt * kBq, rows = std::min(kBq, Sq - q0);
        int64_t lo[kBq], hi[kBq];
        bool any = false;
        for (int64_t r = 0; r < kBq; ++r) {
          if (r < rows) mask.range(q0 + r, &lo[r], &hi[r]);
          else lo[r] = hi[r] = 0;
          any |= std::max(lo[r], k0) < std::min(hi[r], k0 + cols);
        }
        if (!any) continue;

        load_rows(q + b * a.sq.b + q0 * a.sq.s + h * a.sq.h, a.sq.s, rows, D, 1.0f, qf.data(), kBq, Dp);
        load_rows(dout + b * a.sdo.b + q0 * a.sdo.s + h * a.sdo.h, a.sdo.s, rows, Dv, 1.0f, dof.data(), kBq, Dvp);
        gemm<false>(kBq, kBk, Dp, qf.data(), Dp, kt.data(), kBk, s.data(), kBk);
        gemm<false>(kBq, kBk, Dvp, dof.data(), Dvp, vt.data(), kBk, dp.data(), kBk);

        for (int64_t r = 0; r < kBq; ++r) {
          float* sr = s.data() + r * kBk;  // becomes P
          float* dr = dp.data() + r * kBk;  // becomes dS
          const int64_t c_lo = lo[r] - k0, c_hi = hi[r] - k0;
          const float row_lse = r < rows ? lse[q0 + r] : 0.0f;
          const float row_delta = r < rows ? dl[q0 + r] : 0.0f;
          for (int64_t c = 0; c < kBk; ++c) {
            const bool keep = c >= c_lo && c < c_hi;
            const float pr = keep ? fast_exp(sr[c] * p.scale - row_lse) : 0.0f;
            sr[c] = pr;
            dr[c] = pr * (dr[c] - row_delta);
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
      store_row(dk_acc.data() + c * Dp, D, p.scale, dk + b * a.sdk.b + (k0 + c) * a.sdk.s + hk * a.sdk.h);
      store_row(dv_acc.data() + c * Dvp, Dv, 1.0f, dv + b * a.sdv.b + (k0 + c) * a.sdv.s + hk * a.sdv.h);
    }
  };
  parallel_for(n_chunks, [&](int64_t chunk, int) {
    dq_acc[chunk] = std::make_unique<Buffer>(B * Hq * Sqp * Dp);
    for (int64_t task = chunk; task < n_tasks; task += n_chunks) kv_tile_task(task, dq_acc[chunk]->data());
  });

  // dq = scale * sum over chunks of dq_acc, in chunk order
  T* dq = static_cast<T*>(a.dq);
  parallel_for(B * Hq * n_qt, [&](int64_t task, int) {
    const int64_t qt = task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
    std::vector<float> row(Dp);
    for (int64_t i = qt * kBq; i < std::min(Sq, (qt + 1) * kBq); ++i) {
      std::fill(row.begin(), row.end(), 0.0f);
      for (auto& acc : dq_acc) {
        const float* src = acc->data() + ((b * Hq + h) * Sqp + i) * Dp;
        for (int64_t c = 0; c < Dp; ++c) row[c] += src[c];
      }
      store_row(row.data(), D, p.scale, dq + b * a.sdq.b + i * a.sdq.s + h * a.sdq.h);
    }
  });
}

}  // namespace

void attention_bwd(const AttnParams& p, const BwdArgs& a) {
  dispatch_dtype(p.dtype, [&](auto t) { backward<decltype(t)>(p, a); });
}

}  // namespace fusedattn::cpu
