// CPU small-seq attention (see small_seq.h). One task = a few segments of a
// pack; a segment's rows belong to it alone, so tasks write disjoint rows and the
// backward sums dk/dv over its own q rows and q heads without locks.
#include "fusedattn/small_seq/cpu/small_seq.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fusedattn/platform/cpu/dispatch.h"
#include "fusedattn/platform/cpu/thread_pool.h"

namespace fusedattn::small_seq::cpu {
namespace {

using fusedattn::cpu::from_float;
using fusedattn::cpu::to_float;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kSegmentsPerTask = 16;

// Row (pack, token, head) of a [packs, T, H, D] tensor.
struct Layout {
  int64_t tokens, heads, dim;
  int64_t row(int64_t pack, int64_t t, int64_t h) const {
    return ((pack * tokens + t) * heads + h) * dim;
  }
};

template <class T>
void load(const T* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

template <class T>
void store(const float* src, int64_t n, float mul, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i] * mul);
}

template <class T>
void store_zero(int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(0.0f);
}

// Eight partial sums: a fixed summation order the compiler may vectorize (head dims are
// multiples of 64).
template <class T>
float dot(const float* a, const T* b, int64_t n) {
  float s[8] = {};
  for (int64_t i = 0; i < n; i += 8)
    for (int u = 0; u < 8; ++u) s[u] += a[i + u] * to_float(b[i + u]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// Calls fn(t) for the rows of [own_begin, own_end) outside [begin, begin + len).
template <class F>
void for_gap_rows(const Rows& r, F&& fn) {
  for (int64_t t = r.own_begin; t < std::min(r.begin, r.own_end); ++t) fn(t);
  for (int64_t t = std::max(r.begin + r.len, r.own_begin); t < r.own_end; ++t) fn(t);
}

template <class T>
void forward(const SmallSeqParams& p, const FwdArgs& a) {
  const int64_t N = p.num_segments, Hq = p.heads_q, group = p.heads_q / p.heads_kv;
  const int64_t D = p.head_dim_qk, W = p.max_seqlen_kv;
  const Layout lq{p.tokens_q, Hq, D}, lk{p.tokens_kv, p.heads_kv, D};
  const Layout lp{p.tokens_q, Hq, W}, ls{p.tokens_q, Hq, 2};
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  const int64_t tasks = p.packs * ((N + kSegmentsPerTask - 1) / kSegmentsPerTask);

  auto write_empty_row = [&](int64_t pack, int64_t t, int64_t h) {
    store_zero(D, out + lq.row(pack, t, h));
    if (!a.save_aux) return;
    std::fill_n(a.probs + lp.row(pack, t, h), W, 0.0f);
    std::fill_n(a.stats + ls.row(pack, t, h), 2, kNegInf);
  };

  fusedattn::cpu::parallel_for(tasks, [&](int64_t task, int) {
    const int64_t per_pack = tasks / p.packs;
    const int64_t pack = task / per_pack, s0 = (task % per_pack) * kSegmentsPerTask;
    std::vector<float> qf(D), acc(D), sc;
    for (int64_t s = s0; s < std::min(N, s0 + kSegmentsPerTask); ++s) {
      const Rows qr = segment_rows(a.seg.q, pack, N, s);
      const Rows kr = segment_rows(a.seg.kv, pack, N, s);
      sc.resize(std::max<int64_t>(kr.len, 1));
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t hk = h / group;
        for (int64_t r = 0; r < qr.len; ++r) {
          const int64_t t = qr.begin + r;
          const int64_t hi = row_hi(p.mask_type, r, qr.len, kr.len);
          if (hi == 0) {
            write_empty_row(pack, t, h);
            continue;
          }
          load(q + lq.row(pack, t, h), D, qf.data());
          float m = kNegInf;
          for (int64_t j = 0; j < hi; ++j) {
            sc[j] = p.scale * dot(qf.data(), k + lk.row(pack, kr.begin + j, hk), D);
            m = std::max(m, sc[j]);
          }
          float l = 0.0f;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < hi; ++j) {
            sc[j] = std::exp(sc[j] - m);
            l += sc[j];
            const T* vj = v + lk.row(pack, kr.begin + j, hk);
            for (int64_t d = 0; d < D; ++d) acc[d] += sc[j] * to_float(vj[d]);
          }
          store(acc.data(), D, 1.0f / l, out + lq.row(pack, t, h));
          if (!a.save_aux) continue;
          float* pr = a.probs + lp.row(pack, t, h);
          for (int64_t j = 0; j < W; ++j) pr[j] = j < hi ? sc[j] / l : 0.0f;
          float* st = a.stats + ls.row(pack, t, h);
          st[0] = m;
          st[1] = m + std::log(l);
        }
        for_gap_rows(qr, [&](int64_t t) { write_empty_row(pack, t, h); });
      }
    }
  });
}

template <class T>
void backward(const SmallSeqParams& p, const BwdArgs& a) {
  const int64_t N = p.num_segments, Hkv = p.heads_kv, group = p.heads_q / p.heads_kv;
  const int64_t D = p.head_dim_qk, W = p.max_seqlen_kv;
  const Layout lq{p.tokens_q, p.heads_q, D}, lk{p.tokens_kv, Hkv, D};
  const Layout lp{p.tokens_q, p.heads_q, W}, ls{p.tokens_q, p.heads_q, 2};
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* dout = static_cast<const T*>(a.dout);
  T* dq = static_cast<T*>(a.dq);
  T* dk = static_cast<T*>(a.dk);
  T* dv = static_cast<T*>(a.dv);
  const int64_t tasks = p.packs * ((N + kSegmentsPerTask - 1) / kSegmentsPerTask);

  fusedattn::cpu::parallel_for(tasks, [&](int64_t task, int) {
    const int64_t per_pack = tasks / p.packs;
    const int64_t pack = task / per_pack, s0 = (task % per_pack) * kSegmentsPerTask;
    std::vector<float> qf(D), dof(D), dqf(D), pj, dpj, dk_acc, dv_acc;
    for (int64_t s = s0; s < std::min(N, s0 + kSegmentsPerTask); ++s) {
      const Rows qr = segment_rows(a.seg.q, pack, N, s);
      const Rows kr = segment_rows(a.seg.kv, pack, N, s);
      // P holds every weight of the segment only on the fast path; elsewhere the
      // weights come back from the saved log-sum-exp.
      const bool use_probs = fast_segment(qr.len, kr.len, W);
      pj.resize(std::max<int64_t>(kr.len, 1));
      dpj.resize(pj.size());
      for (int64_t hk = 0; hk < Hkv; ++hk) {
        dk_acc.assign(kr.len * D, 0.0f);
        dv_acc.assign(kr.len * D, 0.0f);
        for (int64_t r = 0; r < qr.len; ++r) {
          const int64_t t = qr.begin + r;
          const int64_t hi = row_hi(p.mask_type, r, qr.len, kr.len);
          for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
            if (hi == 0) {
              store_zero(D, dq + lq.row(pack, t, h));
              continue;
            }
            load(q + lq.row(pack, t, h), D, qf.data());
            load(dout + lq.row(pack, t, h), D, dof.data());
            const float* pr = a.probs + lp.row(pack, t, h);
            const float lse = a.stats[ls.row(pack, t, h) + 1];
            // delta = sum_j P_j dP_j in float32 (as the CUDA kernel; dout . out would
            // carry out's rounding to T into every dS_j).
            float delta = 0.0f;
            for (int64_t j = 0; j < hi; ++j) {
              const int64_t row = lk.row(pack, kr.begin + j, hk);
              pj[j] = use_probs ? pr[j] : std::exp(p.scale * dot(qf.data(), k + row, D) - lse);
              dpj[j] = dot(dof.data(), v + row, D);
              delta += pj[j] * dpj[j];
            }
            std::fill(dqf.begin(), dqf.end(), 0.0f);
            for (int64_t j = 0; j < hi; ++j) {
              const float ds = pj[j] * (dpj[j] - delta);
              const T* kj = k + lk.row(pack, kr.begin + j, hk);
              float* dkj = dk_acc.data() + j * D;
              float* dvj = dv_acc.data() + j * D;
              for (int64_t d = 0; d < D; ++d) {
                dqf[d] += ds * to_float(kj[d]);
                dkj[d] += ds * qf[d];
                dvj[d] += pj[j] * dof[d];
              }
            }
            store(dqf.data(), D, p.scale, dq + lq.row(pack, t, h));
          }
        }
        for (int64_t j = 0; j < kr.len; ++j) {
          store(dk_acc.data() + j * D, D, p.scale, dk + lk.row(pack, kr.begin + j, hk));
          store(dv_acc.data() + j * D, D, 1.0f, dv + lk.row(pack, kr.begin + j, hk));
        }
        for_gap_rows(kr, [&](int64_t t) {
          store_zero(D, dk + lk.row(pack, t, hk));
          store_zero(D, dv + lk.row(pack, t, hk));
        });
      }
      for_gap_rows(qr, [&](int64_t t) {
        for (int64_t h = 0; h < p.heads_q; ++h) store_zero(D, dq + lq.row(pack, t, h));
      });
    }
  });
}

}  // namespace

void small_seq_fwd(const SmallSeqParams& p, const FwdArgs& a) {
  fusedattn::cpu::dispatch_dtype(p.dtype, [&](auto t) { forward<decltype(t)>(p, a); });
}

void small_seq_bwd(const SmallSeqParams& p, const BwdArgs& a) {
  fusedattn::cpu::dispatch_dtype(p.dtype, [&](auto t) { backward<decltype(t)>(p, a); });
}

}  // namespace fusedattn::small_seq::cpu
