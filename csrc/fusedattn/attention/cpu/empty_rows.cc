// kRequestAverageEmptyRows on the CPU engine (empty_rows.h). Serial: a scan of lse, and
// work only where a row is empty.
#include "fusedattn/attention/cpu/empty_rows.h"

#include <cmath>
#include <limits>

#include "fusedattn/attention/mask.h"
#include "fusedattn/platform/cpu/dispatch.h"

namespace fusedattn::cpu {
namespace {

// Query rows [0, n) of batch entry b are a sequence's (the rest is padding).
int64_t rows_of(const AttnMask& m, int64_t b) { return segment(m, b, 0).q_len; }

template <class T>
void forward(const AttnParams& p, const FwdArgs& a, double threshold) {
  using A = acc_t<T>;
  const AttnMask m = attn_mask(p, a.x.seq);
  const int64_t G = p.heads_q / p.heads_kv, Dv = p.head_dim_v, Skv = p.seqlen_kv;
  const A* lse = static_cast<const A*>(a.lse);
  const T* v = static_cast<const T*>(a.v);
  T* out = static_cast<T*>(a.out);
  std::vector<double> mean(Dv);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = rows_of(m, b);
    for (int64_t kh = 0; kh < p.heads_kv; ++kh) {
      bool have_mean = false;
      for (int64_t h = kh * G; h < (kh + 1) * G; ++h)
        for (int64_t i = 0; i < n; ++i) {
          if (!(lse[b * a.slse.b + h * a.slse.h + i * a.slse.s] <= threshold)) continue;
          if (!have_mean) {
            std::fill(mean.begin(), mean.end(), 0.0);
            for (int64_t j = 0; j < Skv; ++j) {
              const T* row = v + b * a.sv.b + j * a.sv.s + kh * a.sv.h;
              for (int64_t d = 0; d < Dv; ++d) mean[d] += static_cast<double>(widen(row[d]));
            }
            for (double& x : mean) x /= static_cast<double>(Skv);
            have_mean = true;
          }
          T* o = out + b * a.so.b + i * a.so.s + h * a.so.h;
          for (int64_t d = 0; d < Dv; ++d) o[d] = narrow<T>(static_cast<A>(mean[d]));
        }
    }
  }
}

}  // namespace

void average_empty_rows_fwd(const AttnParams& p, const FwdArgs& a, double threshold) {
  dispatch_dtype_f64(p.dtype, [&](auto t) { forward<decltype(t)>(p, a, threshold); });
}

EmptyRowsBwd::EmptyRowsBwd(const AttnParams& p, const BwdArgs& a, double threshold)
    : sq_(p.seqlen_q), hq_(p.heads_q) {
  const AttnMask m = attn_mask(p, a.x.seq);
  const int64_t G = p.heads_q / p.heads_kv, Dv = p.head_dim_v, n_lse = p.batch * hq_ * sq_;
  dsum_.assign(p.batch * p.heads_kv * Dv, 0.0);
  dispatch_dtype_f64(p.dtype, [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    const A* lse = static_cast<const A*>(a.lse);
    std::vector<A>& lse_copy = [&]() -> std::vector<A>& {
      if constexpr (std::is_same_v<A, double>) return lse64_;
      else return lse32_;
    }();
    lse_copy.resize(n_lse);
    A* copy = lse_copy.data();
    const T* dout = static_cast<const T*>(a.dout);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t n = rows_of(m, b);
      for (int64_t h = 0; h < hq_; ++h)
        for (int64_t i = 0; i < sq_; ++i) {
          const A l = lse[b * a.slse.b + h * a.slse.h + i * a.slse.s];
          const bool empty = i < n && l <= threshold;
          copy[(b * hq_ + h) * sq_ + i] = empty ? std::numeric_limits<A>::infinity() : l;
          if (!empty) continue;
          any_ = true;
          const T* row = dout + b * a.sdo.b + i * a.sdo.s + h * a.sdo.h;
          double* sum = dsum_.data() + (b * p.heads_kv + h / G) * Dv;
          for (int64_t d = 0; d < Dv; ++d) sum[d] += static_cast<double>(widen(row[d]));
        }
    }
  });
}

const void* EmptyRowsBwd::lse() const {
  return lse64_.empty() ? static_cast<const void*>(lse32_.data()) : lse64_.data();
}

Strides EmptyRowsBwd::lse_strides() const { return {hq_ * sq_, 1, sq_}; }

void EmptyRowsBwd::finish(const AttnParams& p, const BwdArgs& a) const {
  if (!any_) return;
  const int64_t Dv = p.head_dim_v, Skv = p.seqlen_kv;
  dispatch_dtype_f64(p.dtype, [&](auto t) {
    using T = decltype(t);
    using A = acc_t<T>;
    T* dv = static_cast<T*>(a.dv);
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t kh = 0; kh < p.heads_kv; ++kh) {
        const double* sum = dsum_.data() + (b * p.heads_kv + kh) * Dv;
        for (int64_t j = 0; j < Skv; ++j) {
          T* row = dv + b * a.sdv.b + j * a.sdv.s + kh * a.sdv.h;
          for (int64_t d = 0; d < Dv; ++d)
            row[d] = narrow<T>(static_cast<A>(static_cast<double>(widen(row[d])) +
                                              sum[d] / static_cast<double>(Skv)));
        }
      }
  });
}

}  // namespace fusedattn::cpu
