// What the softmax kernel tests share: storage tensors with their own decoders, a
// naive double-precision reference, and check_case(), which runs a forward and a
// backward on fresh random data and checks every element against the reference.
//
// The reference follows params.h's definition, not the kernels' structure:
// s = scale * x over the elements row i keeps (all; mask false, with the mask
// broadcast by index arithmetic written here; or j <= i), y = exp(s - max) / sum
// there and 0 elsewhere, 0 on a row that keeps nothing; dx = scale * y * (dy - y.dy).
// Inputs are random normals rounded to the storage dtype and read back with
// decoders written here, so the only differences are the kernels' float32
// arithmetic and the rounding of their outputs. Outputs are poisoned with NaN first.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fusedattn/softmax/params.h"
#include "fusedattn/softmax/validate.h"

namespace fusedattn::softmax::check {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// n elements of one storage dtype, read and written by conversions written here.
class Tensor {
 public:
  Tensor(int32_t dtype, int64_t n)
      : dtype_(dtype), n_(n), words_((n * dtype_bytes(dtype) + 31) / 16) {}

  // 16-byte aligned, like XLA's buffers: the CUDA kernels' 16-byte units need it.
  void* data() { return words_.data(); }
  int64_t size() const { return n_; }

  double get(int64_t i) const {
    if (dtype_ == FA_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes()[4 * i], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes()[2 * i], 2);
    if (dtype_ == FA_FLOAT16) {
      _Float16 x;
      std::memcpy(&x, &h, 2);
      return static_cast<double>(x);
    }
    const uint32_t u = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }

  // x rounded to nearest even in the storage dtype (finite x, or +-inf for f32/f16).
  void set(int64_t i, float x) {
    if (dtype_ == FA_FLOAT32) {
      std::memcpy(&bytes()[4 * i], &x, 4);
    } else if (dtype_ == FA_FLOAT16) {
      const _Float16 h = static_cast<_Float16>(x);
      std::memcpy(&bytes()[2 * i], &h, 2);
    } else {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      if ((u & 0x7fffffffu) < 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
      const uint16_t h = uint16_t(u >> 16);
      std::memcpy(&bytes()[2 * i], &h, 2);
    }
  }

  void poison() { std::memset(bytes(), 0xff, words_.size() * 16); }  // NaN in every dtype

  void fill_normal(std::mt19937& rng, float stddev) {
    std::normal_distribution<float> normal(0.0f, stddev);
    for (int64_t i = 0; i < n_; ++i) set(i, normal(rng));
  }

 private:
  struct alignas(16) Word {
    unsigned char b[16];
  };
  unsigned char* bytes() { return words_.data()->b; }
  const unsigned char* bytes() const { return words_.data()->b; }

  int32_t dtype_;
  int64_t n_;
  std::vector<Word> words_;
};

inline const char* short_name(int32_t dtype) {
  return dtype == FA_FLOAT32 ? "f32" : dtype == FA_BFLOAT16 ? "bf16" : "f16";
}

// Relative rounding error bound of the storage dtype (2^-precision), and the
// absolute one in its subnormal range (half the smallest subnormal).
inline double unit_roundoff(int32_t dtype) {
  return dtype == FA_FLOAT32 ? 0x1p-24 : dtype == FA_BFLOAT16 ? 0x1p-8 : 0x1p-11;
}
inline double subnormal_floor(int32_t dtype) {
  return dtype == FA_FLOAT32 ? 0x1p-150 : dtype == FA_BFLOAT16 ? 0x1p-134 : 0x1p-25;
}

struct Case {
  std::vector<int64_t> dims;       // logits [..., Sq, Skv]
  std::vector<int64_t> mask_dims;  // empty: no mask
  int32_t type;
  float scale;
};

inline SoftmaxParams params_of(const Case& c, int32_t dtype) {
  SoftmaxParams p{};
  p.rank = static_cast<int32_t>(c.dims.size());
  for (int i = 0; i < p.rank; ++i) p.dims[i] = c.dims[i];
  p.has_mask = !c.mask_dims.empty();
  for (size_t i = 0; i < c.mask_dims.size(); ++i) p.mask_dims[i] = c.mask_dims[i];
  p.softmax_type = c.type;
  p.dtype = dtype;
  p.scale = c.scale;
  return p;
}

inline std::string describe(const Case& c, int32_t dtype) {
  std::ostringstream os;
  os << short_name(dtype) << " " << softmax_type_name(c.type) << " logits [";
  for (size_t i = 0; i < c.dims.size(); ++i) os << (i ? "," : "") << c.dims[i];
  os << "]";
  if (!c.mask_dims.empty()) {
    os << " mask [";
    for (size_t i = 0; i < c.mask_dims.size(); ++i) os << (i ? "," : "") << c.mask_dims[i];
    os << "]";
  }
  os << " scale " << c.scale;
  return os.str();
}

// The mask element of logits element (row, j), by explicit index arithmetic.
inline int64_t mask_index(const Case& c, int64_t row, int64_t j) {
  const int rank = static_cast<int>(c.dims.size());
  int64_t idx = 0, stride = c.mask_dims[rank - 1];
  idx += j;
  for (int d = rank - 2; d >= 0; --d) {
    const int64_t i = row % c.dims[d];
    row /= c.dims[d];
    if (c.mask_dims[d] != 1) idx += i * stride;
    stride *= c.mask_dims[d];
  }
  return idx;
}

inline std::vector<double> reference_fwd(const Case& c, const Tensor& x,
                                         const std::vector<uint8_t>& mask, int64_t rows, int64_t sq,
                                         int64_t skv) {
  std::vector<double> y(rows * skv, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<bool> keep(skv, true);
    for (int64_t j = 0; j < skv; ++j) {
      if (c.type == FA_SOFTMAX_SCALED_MASKED) keep[j] = mask[mask_index(c, r, j)] == 0;
      if (c.type == FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED) keep[j] = j <= r % sq;
    }
    double m = -kInf;
    for (int64_t j = 0; j < skv; ++j)
      if (keep[j]) m = std::max(m, double(c.scale) * x.get(r * skv + j));
    if (m == -kInf) continue;  // nothing kept: the row stays 0
    double s = 0.0;
    for (int64_t j = 0; j < skv; ++j)
      if (keep[j]) s += std::exp(double(c.scale) * x.get(r * skv + j) - m);
    for (int64_t j = 0; j < skv; ++j)
      if (keep[j]) y[r * skv + j] = std::exp(double(c.scale) * x.get(r * skv + j) - m) / s;
  }
  return y;
}

// The kernels under test: the CPU ones, or the CUDA ones run by the host emulation.
struct Kernels {
  std::function<void(const SoftmaxParams&, const void* x, const uint8_t* mask, void* y)> fwd;
  std::function<void(const SoftmaxParams&, const void* y, const void* dy, void* dx)> bwd;
};

// Runs forward then backward on fresh random data and checks both against the reference.
inline void check_case(const Kernels& k, const Case& c, int32_t dtype, uint32_t seed,
                       float stddev = 2.0f) {
  SCOPED_TRACE(describe(c, dtype));
  const SoftmaxParams p = params_of(c, dtype);
  ASSERT_TRUE(validate(p).ok()) << validate(p).message;
  const int64_t skv = softmax_kv(p), sq = softmax_q(p), rows = softmax_rows(p), n = rows * skv;
  std::mt19937 rng(seed);
  Tensor x(dtype, n), y(dtype, n), dy(dtype, n), dx(dtype, n);
  x.fill_normal(rng, stddev);
  std::vector<uint8_t> mask;
  if (p.has_mask) {
    int64_t mn = 1;
    for (int64_t d : c.mask_dims) mn *= d;
    std::bernoulli_distribution masked(0.3);
    mask.resize(mn);
    for (auto& m : mask) m = masked(rng) ? 1 : 0;
  }
  const std::vector<double> ref = reference_fwd(c, x, mask, rows, sq, skv);

  y.poison();
  k.fwd(p, x.data(), p.has_mask ? mask.data() : nullptr, y.data());
  const double u = unit_roundoff(dtype);
  std::vector<double> row_max(rows, 0.0);
  for (int64_t i = 0; i < n; ++i)
    row_max[i / skv] = std::max(row_max[i / skv], std::abs(double(c.scale) * x.get(i)));
  for (int64_t i = 0; i < n; ++i) {
    const double got = y.get(i), want = ref[i];
    // Output rounding (u) plus float32 arithmetic: exp (~2e-7), the sum, and the
    // rounding of scale * x and of its difference to the max (ulps of their size).
    const double rel = u + 2e-6 + 2.4e-7 * 2 * row_max[i / skv];
    const double tol = rel * want + subnormal_floor(dtype) + 1e-7 * (dtype == FA_FLOAT32);
    ASSERT_FALSE(std::isnan(got)) << "y[" << i << "] is NaN (unwritten?)";
    if (want == 0.0)
      ASSERT_EQ(got, 0.0) << "y[" << i << "] of a dropped element";
    else
      ASSERT_NEAR(got, want, tol) << "y[" << i << "] (row " << i / skv << ")";
  }

  // Backward from the kernel's own (rounded) y, as softmax() runs it.
  dy.fill_normal(rng, 1.0f);
  dx.poison();
  k.bwd(p, y.data(), dy.data(), dx.data());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t kept =
        c.type == FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED ? std::min(r % sq + 1, skv) : skv;
    double d = 0.0, mag = 0.0;
    for (int64_t j = 0; j < kept; ++j) {
      d += y.get(r * skv + j) * dy.get(r * skv + j);
      mag += std::abs(y.get(r * skv + j) * dy.get(r * skv + j));
    }
    for (int64_t j = 0; j < skv; ++j) {
      const int64_t i = r * skv + j;
      const double yi = y.get(i), dyi = dy.get(i);
      const double want = j < kept ? double(c.scale) * yi * (dyi - d) : 0.0;
      const double tol = u * std::abs(want) + subnormal_floor(dtype) +
                         4e-6 * std::abs(c.scale) * (std::abs(yi) * (std::abs(dyi) + mag));
      ASSERT_FALSE(std::isnan(dx.get(i))) << "dx[" << i << "] is NaN (unwritten?)";
      if (j >= kept)
        ASSERT_EQ(dx.get(i), 0.0) << "dx[" << i << "] past the diagonal";
      else
        ASSERT_NEAR(dx.get(i), want, tol) << "dx[" << i << "] (row " << r << ")";
    }
  }
}

}  // namespace fusedattn::softmax::check
