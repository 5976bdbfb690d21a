// Storage types of the CPU engine and their conversions to and from its arithmetic
// type: float32 for float32, bf16 and fp16 storage (bf16/fp16 only live in memory),
// double for float64 storage (the float64 engine computes in double throughout).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusedattn::cpu {

struct bf16 { uint16_t bits; };
struct fp16 { uint16_t bits; };

inline float to_float(float x) { return x; }
// float64 storage never narrows to float32: widen() keeps it double.
float to_float(double x) = delete;

inline float to_float(bf16 x) {
  uint32_t u = uint32_t{x.bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float to_float(fp16 x) {
  // Branch-free half -> float (IEEE 754 binary16), denormals and inf/NaN included,
  // without any arithmetic on float denormals: XLA runs custom calls on threads
  // that flush denormal operands to zero (MXCSR DAZ), which would turn every half
  // denormal into 0 if it went through one. Normal halves only rebias the exponent
  // (integer add); denormal halves are mant * 2^-24, an exact int -> float and a
  // multiply whose operands and result are normal floats.
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp_mant = h & 0x7fffu;
  uint32_t normal = (exp_mant << 13) + ((127u - 15u) << 23);
  if (exp_mant >= 0x7c00u) normal = (exp_mant << 13) | 0x7f800000u;  // inf / NaN
  const float denormal = static_cast<float>(static_cast<int32_t>(exp_mant)) * 0x1p-24f;
  uint32_t denormal_bits;
  std::memcpy(&denormal_bits, &denormal, 4);
  const uint32_t u = (exp_mant < 0x400u ? denormal_bits : normal) | sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T>
T from_float(float f);

template <>
inline float from_float<float>(float f) { return f; }

template <>
inline bf16 from_float<bf16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16{uint16_t(u >> 16)};
}

template <>
inline fp16 from_float<fp16>(float f) {
  // float -> half, round to nearest even, overflow to inf, NaN kept.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return fp16{uint16_t(sign | 0x7e00u)};
  if (u >= 0x477ff000u) return fp16{uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to inf
  if (u < 0x38800000u) {                                         // result is a half denormal
    float a;
    std::memcpy(&a, &u, 4);
    a += 0.5f;  // the float add rounds to the 2^-24 grid (round to nearest even)
    uint32_t r;
    std::memcpy(&r, &a, 4);
    return fp16{uint16_t(sign | (r - 0x3f000000u))};
  }
  uint32_t mant_odd = (u >> 13) & 1u;
  u += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return fp16{uint16_t(sign | (u >> 13))};
}

// The engine's arithmetic type for storage type T: double for float64, else float.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Storage -> arithmetic type (acc_t<T>).
template <class T>
inline acc_t<T> widen(T x) {
  if constexpr (std::is_same_v<T, double>) return x;
  else return to_float(x);
}

// Arithmetic type -> storage (float32 values round to bf16 / fp16 as from_float does).
template <class T, class A>
inline T narrow(A x) {
  static_assert(std::is_same_v<A, acc_t<T>>, "store the arithmetic type of T");
  if constexpr (std::is_same_v<T, double>) return x;
  else return from_float<T>(x);
}

}  // namespace fusedattn::cpu
