// Philox4x32-10 (philox.h) for kLanes counters at once: the dropout masks of the
// CPU engine draw one row of a 64-key tile (16 counters) per call. With AVX2 the
// 32x32 -> 64-bit products of 8 counters go through _mm256_mul_epu32 (even and
// odd lanes separately); elsewhere the plain loop, which the compiler may vectorize.
#pragma once

#include <cstdint>

#include "fusedattn/core/philox.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace fusedattn::cpu {

constexpr int kPhiloxLanes = 16;

// c0..c3[l] -> Philox4x32-10 of counter (c0[l], c1[l], c2[l], c3[l]) under (key0, key1).
inline void philox_lanes(uint32_t* c0, uint32_t* c1, uint32_t* c2, uint32_t* c3, uint32_t key0,
                         uint32_t key1) {
#if defined(__AVX2__)
  const __m256i m0 = _mm256_set1_epi64x(kPhiloxMul0), m1 = _mm256_set1_epi64x(kPhiloxMul1);
  for (int l = 0; l < kPhiloxLanes; l += 8) {
    __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + l));
    __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + l));
    __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c2 + l));
    __m256i x3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c3 + l));
    uint32_t k0 = key0, k1 = key1;
    for (int round = 0; round < 10; ++round) {
      // 64-bit products of the even lanes, and of the odd lanes shifted down.
      const __m256i e0 = _mm256_mul_epu32(x0, m0), o0 = _mm256_mul_epu32(_mm256_srli_epi64(x0, 32), m0);
      const __m256i e2 = _mm256_mul_epu32(x2, m1), o2 = _mm256_mul_epu32(_mm256_srli_epi64(x2, 32), m1);
      const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
      const __m256i lo2 = _mm256_blend_epi32(e2, _mm256_slli_epi64(o2, 32), 0xAA);
      const __m256i hi2 = _mm256_blend_epi32(_mm256_srli_epi64(e2, 32), o2, 0xAA);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi2, x1), _mm256_set1_epi32(int(k0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, x3), _mm256_set1_epi32(int(k1)));
      x0 = n0;
      x1 = lo2;
      x2 = n2;
      x3 = lo0;
      k0 += kPhiloxWeyl0;
      k1 += kPhiloxWeyl1;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c0 + l), x0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c1 + l), x1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c2 + l), x2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c3 + l), x3);
  }
#else
  for (int round = 0; round < 10; ++round) {
    for (int l = 0; l < kPhiloxLanes; ++l) philox_round(c0[l], c1[l], c2[l], c3[l], key0, key1);
    key0 += kPhiloxWeyl0;
    key1 += kPhiloxWeyl1;
  }
#endif
}

}  // namespace fusedattn::cpu
