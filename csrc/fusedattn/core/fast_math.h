// float32 math of the engines' inner loops, plain C++ that nvcc compiles for the device
// too (one definition: the CPU engine's softmax and score_mod interpreter and the CUDA
// kernels' score_mod programs compute the same bits on the host). Loops of these
// vectorize on the CPU (std::exp would stay scalar).
#pragma once

#include <stdint.h>
#include <string.h>

#include "fusedattn/core/host_device.h"

namespace fusedattn {

// The float with these bits.
FA_HOST_DEVICE FA_INLINE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// exp(x) with relative error < 2e-7 on [-87, 88]; inputs below -87 give
// ~1e-38 and callers zero masked entries explicitly; NaN gives NaN.
FA_HOST_DEVICE FA_INLINE float fast_exp(float x_in) {
  // The clamp sends a NaN to -87 so that the integer exponent below is always in
  // range (converting NaN to int is undefined); the NaN is given back at the end.
  const float x = x_in > -87.0f ? (x_in < 88.0f ? x_in : 88.0f) : -87.0f;
  // x = n ln2 + r, |r| <= ln2 / 2; the magic constant rounds to nearest.
  const float kRound = 12582912.0f;  // 1.5 * 2^23
  float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;    // ln2 split in two (Cody-Waite)
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;  // n in [-126, 127]
  return x_in != x_in ? x_in : p * bits_to_float(bits);
}

// max(a, b) that keeps a NaN of either argument (std::max and the SIMD max drop
// one of b's or a's); branch-free.
FA_HOST_DEVICE FA_INLINE float nan_max(float a, float b) { return b > a || b != b ? b : a; }

// exp(x) for any x, relative error < 3e-7 where the result is a normal float: fast_exp,
// with x in (88, 88.72] as e * e^(x - 1) (past fast_exp's clamp), +inf above, 0 below
// -87 (exp is under 1.7e-38 there), NaN kept.
FA_HOST_DEVICE FA_INLINE float exact_edges_exp(float x) {
  const float hi = fast_exp(x - 1.0f) * 2.71828183f;
  float r = x > 88.0f ? hi : fast_exp(x);
  r = x < -87.0f ? 0.0f : r;
  r = x > 88.7229f ? bits_to_float(0x7f800000u) : r;
  return x != x ? x : r;
}

// tanh(x), relative error < 5e-7: the Taylor series in x^2 to x^17 for |x| < 0.5
// (truncation < 5e-9), 1 - 2 / (e^{2|x|} + 1) above (tanh >= 0.46 there, so exp's
// relative error carries over), sign restored; NaN kept, +-inf give +-1. Branch-free
// so that loops of it vectorize.
FA_HOST_DEVICE FA_INLINE float fast_tanh(float x) {
  const float a = x < 0.0f ? -x : x;
  const float z = a * a;
  // tanh(a) = a (1 + z (-1/3 + z (2/15 + z (-17/315 + ...)))), coefficients of the series
  float p = 6404582.0f / 10854718875.0f;
  p = p * z - 929569.0f / 638512875.0f;
  p = p * z + 21844.0f / 6081075.0f;
  p = p * z - 1382.0f / 155925.0f;
  p = p * z + 62.0f / 2835.0f;
  p = p * z - 17.0f / 315.0f;
  p = p * z + 2.0f / 15.0f;
  p = p * z - 1.0f / 3.0f;
  const float small = a * (1.0f + z * p);  // a * (...) keeps the sign of -0
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * (a > 44.0f ? 44.0f : a)) + 1.0f);
  const float t = a < 0.5f ? small : big;
  const float r = x < 0.0f ? -t : t;
  return x != x ? x : r;
}

// 1 / (1 + e^-x) with exact_edges_exp.
FA_HOST_DEVICE FA_INLINE float fast_sigmoid(float x) { return 1.0f / (1.0f + exact_edges_exp(-x)); }

}  // namespace fusedattn
