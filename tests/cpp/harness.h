// Shared by the engine's GoogleTests: storage in any dtype (with decoders written
// here, not the engine's), NaN poisoning, and the tolerance checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "fusedattn/attention/params.h"

namespace fusedattn::testing {

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- storage -------------------------------------------------------------------

inline int64_t elem_size(int32_t dtype) {
  return dtype == FA_FLOAT64 ? 8 : dtype == FA_FLOAT32 ? 4 : 2;
}

inline const char* short_name(int32_t dtype) {
  return dtype == FA_FLOAT64 ? "f64" : dtype == FA_FLOAT32 ? "f32" : dtype == FA_BFLOAT16 ? "bf16" : "f16";
}

// The attention statistics' dtype (softmax_offset, lse, max_logit and their gradients):
// float64 for float64 calls, else float32.
inline int32_t stat_dtype(int32_t dtype) { return dtype == FA_FLOAT64 ? FA_FLOAT64 : FA_FLOAT32; }

// n elements of one storage dtype. Reads go through decoders written here so the
// test does not trust the engine's own conversions (test_dtypes.cc checks those).
class Tensor {
 public:
  Tensor(int32_t dtype, int64_t n) : dtype_(dtype), n_(n), words_((n * elem_size(dtype) + 3) / 4 + 1) {}

  int64_t size() const { return n_; }
  void* data() { return words_.data(); }
  const void* data() const { return words_.data(); }

  double get(int64_t i) const {
    if (dtype_ == FA_FLOAT64) {
      double f;
      std::memcpy(&f, bytes() + 8 * i, 8);
      return f;
    }
    if (dtype_ == FA_FLOAT32) {
      float f;
      std::memcpy(&f, bytes() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, bytes() + 2 * i, 2);
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

  // Stores x rounded to nearest even in the storage dtype (to float32 first, but float64).
  void set(int64_t i, double x64) {
    const float x = static_cast<float>(x64);
    if (dtype_ == FA_FLOAT64) {
      std::memcpy(bytes() + 8 * i, &x64, 8);
    } else if (dtype_ == FA_FLOAT32) {
      std::memcpy(bytes() + 4 * i, &x, 4);
    } else if (dtype_ == FA_FLOAT16) {
      const _Float16 h = static_cast<_Float16>(x);
      std::memcpy(bytes() + 2 * i, &h, 2);
    } else {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u += 0x7fffu + ((u >> 16) & 1u);  // finite inputs only
      const uint16_t h = uint16_t(u >> 16);
      std::memcpy(bytes() + 2 * i, &h, 2);
    }
  }

  // All-ones bytes: a NaN in float64, float32, bfloat16 and float16 alike.
  void poison() { std::memset(words_.data(), 0xff, words_.size() * 4); }

  // Normal values (float64: not float32-representable, so float32 arithmetic shows).
  void fill_normal(std::mt19937& rng) {
    if (dtype_ == FA_FLOAT64) {
      std::normal_distribution<double> normal;
      for (int64_t i = 0; i < n_; ++i) set(i, normal(rng));
      return;
    }
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < n_; ++i) set(i, normal(rng));
  }

  std::vector<double> values() const {
    std::vector<double> v(n_);
    for (int64_t i = 0; i < n_; ++i) v[i] = get(i);
    return v;
  }

 private:
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(words_.data()); }
  const unsigned char* bytes() const { return reinterpret_cast<const unsigned char*>(words_.data()); }

  int32_t dtype_;
  int64_t n_;
  std::vector<uint32_t> words_;
};

inline std::vector<double> values(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// --- comparison ------------------------------------------------------------------

// ||got - ref|| <= rel_l2 * ||ref|| + floor * ||mag|| and
// max |got - ref| <= max_rel * max |ref| + floor * max |mag|.
// The floor (about 16 float32 roundings of the summed terms) only matters
// where the terms cancel; elsewhere ||mag|| is of the order of ||ref||.
struct Tol {
  double rel_l2;
  double max_rel;
  double floor;
};

inline Tol tol_for(int32_t dtype) {
  switch (dtype) {
    case FA_FLOAT64: return {1e-12, 1e-11, 1e-14};
    case FA_FLOAT32: return {1e-5, 1e-4, 2e-6};
    case FA_BFLOAT16: return {1e-2, 2e-2, 2e-6};
    default: return {1e-2, 1e-2, 2e-6};
  }
}

// NaN or inf in got never passes.
inline ::testing::AssertionResult close(const std::vector<double>& got, const std::vector<double>& ref,
                                 const std::vector<double>& mag, const Tol& tol) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << "size mismatch";
  double err2 = 0.0, ref2 = 0.0, mag2 = 0.0, max_err = 0.0, ref_max = 0.0, mag_max = 0.0;
  int64_t worst = -1, bad = 0, first_bad = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (bad++ == 0) first_bad = int64_t(i);
      continue;
    }
    const double e = std::fabs(got[i] - ref[i]);
    err2 += e * e;
    ref2 += ref[i] * ref[i];
    mag2 += mag[i] * mag[i];
    ref_max = std::max(ref_max, std::fabs(ref[i]));
    mag_max = std::max(mag_max, std::fabs(mag[i]));
    if (e > max_err) max_err = e, worst = int64_t(i);
  }
  if (bad)
    return ::testing::AssertionFailure() << bad << " of " << got.size()
                                         << " elements are NaN/inf (unwritten or overflowed), first at "
                                         << first_bad << " (ref " << ref[first_bad] << ")";
  const double l2 = std::sqrt(err2), ref_l2 = std::sqrt(ref2), mag_l2 = std::sqrt(mag2);
  const double tol_l2 = tol.rel_l2 * ref_l2 + tol.floor * mag_l2;
  const double tol_max = tol.max_rel * ref_max + tol.floor * mag_max;
  std::ostringstream msg;
  msg << "L2 error " << l2 << " = " << (ref_l2 > 0 ? l2 / ref_l2 : 0.0) << " x ||ref|| (allowed "
      << tol_l2 << "), max abs error " << max_err << " at " << worst << " (got "
      << (worst >= 0 ? got[worst] : 0.0) << ", ref " << (worst >= 0 ? ref[worst] : 0.0)
      << "; allowed " << tol_max << ")";
  const bool ok_l2 = l2 <= tol_l2, ok_max = max_err <= tol_max;
  if (ok_l2 && ok_max) return ::testing::AssertionSuccess() << msg.str();
  return ::testing::AssertionFailure() << msg.str();
}

// lse / max_logit: -inf exactly where the reference is -inf, relative rel (1e-5; 1e-12 for
// float64 calls: logit_tol) elsewhere.
inline double logit_tol(int32_t dtype) { return dtype == FA_FLOAT64 ? 1e-12 : 1e-5; }

inline ::testing::AssertionResult close_logits(const std::vector<double>& got, const std::vector<double>& ref,
                                               double rel = 1e-5) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (ref[i] == -kInf) {
      if (got[i] != -kInf)
        return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want -inf";
    } else if (!std::isfinite(got[i]) || std::fabs(got[i] - ref[i]) > rel * std::max(1.0, std::fabs(ref[i]))) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << ref[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fusedattn::testing
