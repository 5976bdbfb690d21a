// CPU softmax forward and backward: x [..., Sq, Skv] -> y, and (y, dy) -> dx,
// all p.dtype, float32 arithmetic; mask [..., Sq|1, Skv] bool broadcast by MaskRows.
//
// One task = a run of consecutive rows (about kTaskElements elements), so short
// rows still make tasks worth a thread. A row is converted once into a float32
// scratch row (scaled, -inf where not kept; per thread, kept between calls), then
// max, exp with the sum, and the normalized store: the sweeps after the first
// read data that stays in L1/L2, so memory sees one pass.
// Causal rows touch only their first min(i + 1, Skv) elements and write zeros
// after them.
#include "fusedattn/softmax/cpu/softmax.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "fusedattn/platform/cpu/dispatch.h"
#include "fusedattn/platform/cpu/fast_math.h"
#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/softmax/mask_rows.h"

namespace fusedattn::softmax {
namespace {

using cpu::from_float;
using cpu::to_float;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kLanes = 16;  // two AVX2 registers of partial results per reduction
constexpr int64_t kTaskElements = 1 << 15;

struct Rows {
  int64_t rows, sq, skv, per_task;
  bool causal;
  // Elements of row r that may be kept: Skv, or min(i + 1, Skv) when causal.
  int64_t kept_len(int64_t r) const { return causal ? std::min(r % sq + 1, skv) : skv; }
};

Rows make_rows(const SoftmaxParams& p) {
  Rows r;
  r.rows = softmax_rows(p);
  r.sq = softmax_q(p);
  r.skv = softmax_kv(p);
  r.per_task = std::max<int64_t>(1, kTaskElements / r.skv);
  r.causal = p.softmax_type == FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED;
  return r;
}

template <class F>
void for_rows(const Rows& r, F&& row_fn) {
  const int64_t tasks = (r.rows + r.per_task - 1) / r.per_task;
  cpu::parallel_for(tasks, [&](int64_t task, int) {
    const int64_t end = std::min(r.rows, (task + 1) * r.per_task);
    for (int64_t row = task * r.per_task; row < end; ++row) row_fn(row);
  });
}

// t[j] = x[j] * scale, -inf where mask[j] (when masked). Plain map loops: the
// vectorizer handles them for every dtype, which it does not for a loop that
// also carries the max.
template <class T>
void load_scaled(const T* __restrict x, int64_t n, float scale, float* __restrict t) {
  for (int64_t j = 0; j < n; ++j) t[j] = to_float(x[j]) * scale;
}

template <class T>
void load_scaled_masked(const T* __restrict x, const uint8_t* __restrict mask, int64_t n,
                        float scale, float* __restrict t) {
  for (int64_t j = 0; j < n; ++j) {
    const float v = to_float(x[j]) * scale;
    t[j] = mask[j] ? kNegInf : v;
  }
}

// GCC does not turn a scalar `a > b ? a : b` reduction into SIMD max (NaN
// rules), so the max is written on vector types.
typedef float f32x8 __attribute__((vector_size(32)));

float row_max(const float* __restrict t, int64_t n) {
  const f32x8 neg_inf = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  f32x8 m0 = neg_inf, m1 = neg_inf;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    f32x8 a, b;
    std::memcpy(&a, t + j, sizeof(a));
    std::memcpy(&b, t + j + 8, sizeof(b));
    m0 = m0 > a ? m0 : a;
    m1 = m1 > b ? m1 : b;
  }
  m0 = m0 > m1 ? m0 : m1;
  float m = kNegInf;
  for (int l = 0; l < 8; ++l) m = m > m0[l] ? m : m0[l];
  for (; j < n; ++j) m = m > t[j] ? m : t[j];
  return m;
}

// t[j] = exp(t[j] - m) (0 where t[j] is -inf); returns the sum.
float exp_and_sum(float* __restrict t, int64_t n, float m) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = t[j + l];
      const float e = cpu::fast_exp(v - m);  // computed always: no branch in the loop
      t[j + l] = v == kNegInf ? 0.0f : e;
      acc[l] += t[j + l];
    }
  }
  for (; j < n; ++j) {
    const float e = t[j] == kNegInf ? 0.0f : cpu::fast_exp(t[j] - m);
    t[j] = e;
    acc[0] += e;
  }
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

template <class T>
void store_normalized(const float* __restrict t, int64_t n, float inv, T* __restrict y) {
  for (int64_t j = 0; j < n; ++j) y[j] = from_float<T>(t[j] * inv);
}

template <class T>
float dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += to_float(a[j + l]) * to_float(b[j + l]);
  for (; j < n; ++j) acc[0] += to_float(a[j]) * to_float(b[j]);
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// dx = scale * y * (dy - dot)
template <class T>
void softmax_grad(const T* __restrict y, const T* __restrict dy, int64_t n, float dot, float scale,
                  T* __restrict dx) {
  for (int64_t j = 0; j < n; ++j)
    dx[j] = from_float<T>(scale * to_float(y[j]) * (to_float(dy[j]) - dot));
}

template <class T>
void forward(const SoftmaxParams& p, const void* xv, const uint8_t* mask, void* yv) {
  const Rows r = make_rows(p);
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const MaskRows mrows = mask ? make_mask_rows(p) : MaskRows{};
  const float scale = p.scale;
  for_rows(r, [&](int64_t row) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < r.skv) scratch.resize(r.skv);
    float* t = scratch.data();
    const int64_t n = r.kept_len(row);
    const T* xr = x + row * r.skv;
    T* yr = y + row * r.skv;
    const uint8_t* mr = mask ? mask + mask_row_offset(mrows, row) : nullptr;
    if (mr)
      load_scaled_masked(xr, mr, n, scale, t);
    else
      load_scaled(xr, n, scale, t);
    float m = row_max(t, n);
    // A row with nothing kept (all masked, or all -inf) keeps m finite so that
    // every exp is 0 and the row comes out 0, not NaN.
    if (m == kNegInf) m = 0.0f;
    const float s = exp_and_sum(t, n, m);
    // s is NaN when the row has NaN (or +inf) logits: then the whole row is NaN.
    const float inv = s == 0.0f ? 0.0f : 1.0f / s;
    store_normalized(t, n, inv, yr);
    std::memset(static_cast<void*>(yr + n), 0, (r.skv - n) * sizeof(T));  // zero bits are 0.0
  });
}

template <class T>
void backward(const SoftmaxParams& p, const void* yv, const void* dyv, void* dxv) {
  const Rows r = make_rows(p);
  const T* y = static_cast<const T*>(yv);
  const T* dy = static_cast<const T*>(dyv);
  T* dx = static_cast<T*>(dxv);
  const float scale = p.scale;
  for_rows(r, [&](int64_t row) {
    const int64_t n = r.kept_len(row);
    const T* yr = y + row * r.skv;
    const T* dyr = dy + row * r.skv;
    T* dxr = dx + row * r.skv;
    softmax_grad(yr, dyr, n, dot(yr, dyr, n), scale, dxr);
    std::memset(static_cast<void*>(dxr + n), 0, (r.skv - n) * sizeof(T));
  });
}

}  // namespace

void cpu_softmax_fwd(const SoftmaxParams& p, const void* x, const uint8_t* mask, void* y) {
  cpu::dispatch_dtype(p.dtype, [&](auto t) { forward<decltype(t)>(p, x, mask, y); });
}

void cpu_softmax_bwd(const SoftmaxParams& p, const void* y, const void* dy, void* dx) {
  cpu::dispatch_dtype(p.dtype, [&](auto t) { backward<decltype(t)>(p, y, dy, dx); });
}

}  // namespace fusedattn::softmax
