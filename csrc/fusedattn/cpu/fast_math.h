// Vectorizable float32 exp for the softmax inner loops (the compiler turns a
// loop of these into SIMD code; std::exp would stay scalar).
#pragma once

#include <cstdint>
#include <cstring>

namespace fusedattn::cpu {

// exp(x) with relative error < 2e-7 on [-87, 88]; inputs below -87 give
// ~1e-38 and callers zero masked entries explicitly.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
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
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

}  // namespace fusedattn::cpu
