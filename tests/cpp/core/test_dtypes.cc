// The CPU engine's scalar building blocks: bf16/fp16 storage conversions
// (cpu/dtypes.h), fast_exp (cpu/fast_math.h) and the thread pool
// (cpu/thread_pool.h). Every expectation comes from a reference computed here
// independently: _Float16 (the compiler's IEEE binary16) for fp16, exact
// nearest-value selection in double for bf16, std::exp in double for exp.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "fusedattn/platform/cpu/dtypes.h"
#include "fusedattn/platform/cpu/fast_math.h"
#include "fusedattn/platform/cpu/thread_pool.h"

#if defined(__SSE__)
#include <xmmintrin.h>  // _mm_getcsr / _mm_setcsr
#endif

namespace fusedattn::cpu {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool fp16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

// --- fp16 ------------------------------------------------------------------

float ref_fp16_to_float(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

uint16_t ref_float_to_fp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // IEEE round to nearest even
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// Checks from_float<fp16>(f) against the reference; NaN only has to stay a NaN of the same sign.
::testing::AssertionResult fp16_matches(float f) {
  const uint16_t got = from_float<fp16>(f).bits;
  const uint16_t want = ref_float_to_fp16(f);
  if (std::isnan(f)) {
    if (fp16_is_nan(got) && (got & 0x8000u) == (float_bits(f) >> 16 & 0x8000u))
      return ::testing::AssertionSuccess();
  } else if (got == want) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "from_float<fp16>(" << f << " = 0x" << std::hex
                                       << float_bits(f) << "): got 0x" << got << ", want 0x" << want;
}

TEST(Fp16, EveryBitPatternToFloatMatchesIeee) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float got = to_float(fp16{uint16_t(b)});
    const float want = ref_fp16_to_float(uint16_t(b));
    if (fp16_is_nan(uint16_t(b))) {
      ASSERT_TRUE(std::isnan(got)) << "bits 0x" << std::hex << b;
      ASSERT_EQ(std::signbit(got), (b & 0x8000u) != 0) << "bits 0x" << std::hex << b;
    } else {
      ASSERT_EQ(float_bits(got), float_bits(want)) << "bits 0x" << std::hex << b << ": got " << got
                                                   << ", want " << want;
    }
  }
}

#if defined(__SSE__)
// XLA runs custom calls with MXCSR's flush-to-zero and denormals-are-zero bits set:
// the conversions must not go through float denormals (a half denormal would read as 0).
TEST(Fp16, ConversionsHoldUnderFlushDenormals) {
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
  for (uint32_t b = 0; b < 0x7c00u; ++b) {
    const float got = to_float(fp16{uint16_t(b)});
    const uint16_t back = from_float<fp16>(got).bits;
    _mm_setcsr(saved);
    const float want = ref_fp16_to_float(uint16_t(b));
    ASSERT_EQ(float_bits(got), float_bits(want)) << "bits 0x" << std::hex << b;
    ASSERT_EQ(back, b) << "bits 0x" << std::hex << b;
    _mm_setcsr(saved | 0x8040u);
  }
  _mm_setcsr(saved);
}
#endif

TEST(Fp16, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t back = from_float<fp16>(to_float(fp16{uint16_t(b)})).bits;
    if (fp16_is_nan(uint16_t(b))) {
      ASSERT_TRUE(fp16_is_nan(back)) << "NaN 0x" << std::hex << b << " came back as 0x" << back;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u) << "NaN 0x" << std::hex << b << " lost its sign";
    } else {
      ASSERT_EQ(back, b) << "bits 0x" << std::hex << b << " came back as 0x" << back;
    }
  }
}

// Every rounding decision point: for each pair of adjacent halves, the exact
// midpoint (a tie) and the floats one ulp either side of it.
TEST(Fp16, FromFloatRoundsEveryMidpointToNearestEven) {
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double lo = ref_fp16_to_float(uint16_t(h));
    const double hi = h + 1 < 0x7c00u ? double(ref_fp16_to_float(uint16_t(h + 1))) : 65536.0;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: a half has 11 significant bits
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    for (float sign : {1.0f, -1.0f}) {
      const float m = sign * mid;
      ASSERT_TRUE(fp16_matches(m));
      ASSERT_TRUE(fp16_matches(std::nextafter(m, 0.0f)));
      ASSERT_TRUE(fp16_matches(std::nextafter(m, sign * INFINITY)));
      ASSERT_TRUE(fp16_matches(sign * float(lo)));
    }
  }
}

TEST(Fp16, FromFloatMatchesIeeeOnRandomFloats) {
  std::mt19937 rng(1234);
  // Uniform bit patterns cover every exponent, NaNs and infinities included.
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) ASSERT_TRUE(fp16_matches(bits_float(any_bits(rng))));
  // Values in the half range, normal and denormal.
  std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> exponent(-27.0f, 16.5f);
  for (int i = 0; i < 1'000'000; ++i) {
    ASSERT_TRUE(fp16_matches(in_range(rng)));
    const float mag = std::exp2(exponent(rng));
    ASSERT_TRUE(fp16_matches(i % 2 ? mag : -mag));
  }
}

TEST(Fp16, FromFloatSpecialValues) {
  struct Case {
    float f;
    uint16_t want;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {65504.0f, 0x7bff},                          // largest half
      {65519.996f, 0x7bff},                        // just below the overflow midpoint
      {65520.0f, 0x7c00},                          // the midpoint ties to even: inf
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {3.4e38f, 0x7c00},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
      {std::ldexp(1.0f, -14), 0x0400},             // smallest normal
      {std::ldexp(1.0f, -24), 0x0001},             // smallest denormal
      {std::ldexp(1.0f, -25), 0x0000},             // tie between 0 and 2^-24: even is 0
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},
      {std::ldexp(3.0f, -25), 0x0002},             // tie between 1 and 2 denormal ulps
      {std::ldexp(5.0f, -25), 0x0002},             // tie between 2 and 3: even is 2
      {-std::ldexp(1.0f, -24), 0x8001},
      {std::ldexp(1.0f, -30), 0x0000},             // underflow to zero
      {-std::ldexp(1.0f, -30), 0x8000},
      {1e-45f, 0x0000},                            // float denormal
      {std::ldexp(1023.5f, -24), 0x0400},          // rounds up out of the denormals
      {1.0f + std::ldexp(1.0f, -11), 0x3c00},      // tie: even
      {1.0f + std::ldexp(3.0f, -11), 0x3c02},      // tie: even (up)
  };
  for (const Case& c : cases) {
    EXPECT_EQ(from_float<fp16>(c.f).bits, c.want) << "f = " << c.f;
    EXPECT_EQ(ref_float_to_fp16(c.f), c.want) << "reference disagrees on f = " << c.f;
  }
  EXPECT_TRUE(fp16_is_nan(from_float<fp16>(NAN).bits));
  EXPECT_TRUE(fp16_is_nan(from_float<fp16>(bits_float(0x7f800001u)).bits));  // not inf
  EXPECT_TRUE(fp16_is_nan(from_float<fp16>(bits_float(0xff800001u)).bits));
  EXPECT_TRUE(fp16_is_nan(from_float<fp16>(bits_float(0x7f802000u)).bits));
}

// --- bf16 ------------------------------------------------------------------

// The value of a finite bf16 pattern, with the all-ones exponent read as 2^128
// so that the "next value" after the largest finite one decides overflow the
// way IEEE rounding does (values at or past the midpoint go to inf).
double bf16_value_unbounded(uint16_t bits) {
  const int sign = bits >> 15, e = (bits >> 7) & 0xff, m = bits & 0x7f;
  const double mag = e == 0 ? std::ldexp(double(m), -133) : std::ldexp(1.0 + m / 128.0, e - 127);
  return sign ? -mag : mag;
}

// Round to nearest even by choosing between the two neighbours in double.
uint16_t ref_float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t down = uint16_t(u >> 16);  // toward zero
  if ((u & 0xffffu) == 0 || std::isinf(f)) return down;
  const uint16_t up = uint16_t(down + 1);   // away from zero (may be inf)
  const double d_down = std::fabs(double(f) - bf16_value_unbounded(down));
  const double d_up = std::fabs(double(f) - bf16_value_unbounded(up));
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1u) ? up : down;
}

::testing::AssertionResult bf16_matches(float f) {
  const uint16_t got = from_float<bf16>(f).bits;
  if (std::isnan(f)) {
    if (bf16_is_nan(got) && (got & 0x8000u) == (float_bits(f) >> 16 & 0x8000u))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "NaN 0x" << std::hex << float_bits(f)
                                         << " became 0x" << got;
  }
  const uint16_t want = ref_float_to_bf16(f);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "from_float<bf16>(" << f << " = 0x" << std::hex
                                       << float_bits(f) << "): got 0x" << got << ", want 0x" << want;
}

TEST(Bf16, EveryBitPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = to_float(bf16{uint16_t(b)});
    const uint16_t back = from_float<bf16>(f).bits;
    if (bf16_is_nan(uint16_t(b))) {
      ASSERT_TRUE(std::isnan(f)) << "bits 0x" << std::hex << b;
      ASSERT_TRUE(bf16_is_nan(back)) << "NaN 0x" << std::hex << b << " came back as 0x" << back;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u);
    } else {
      if ((b & 0x7f80u) != 0x7f80u) {
        ASSERT_EQ(double(f), bf16_value_unbounded(uint16_t(b))) << "bits 0x" << std::hex << b;
      }
      ASSERT_EQ(back, b) << "bits 0x" << std::hex << b << " came back as 0x" << back;
    }
  }
}

TEST(Bf16, FromFloatRoundsEveryMidpointToNearestEven) {
  for (uint32_t b = 0; b < 0x7f80u; ++b) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t mid = sign | b << 16 | 0x8000u;  // exactly between b and b + 1
      ASSERT_EQ(from_float<bf16>(bits_float(mid)).bits, (sign >> 16) | (b + (b & 1u)))
          << "tie 0x" << std::hex << mid;
      ASSERT_TRUE(bf16_matches(bits_float(mid - 1)));
      ASSERT_TRUE(bf16_matches(bits_float(mid + 1)));
      ASSERT_TRUE(bf16_matches(bits_float(sign | b << 16)));
    }
  }
}

TEST(Bf16, FromFloatMatchesReferenceOnRandomFloats) {
  std::mt19937 rng(4321);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 2'000'000; ++i) ASSERT_TRUE(bf16_matches(bits_float(any_bits(rng))));
  std::normal_distribution<float> normal;
  for (int i = 0; i < 1'000'000; ++i) ASSERT_TRUE(bf16_matches(normal(rng)));
}

TEST(Bf16, FromFloatSpecialValues) {
  EXPECT_EQ(from_float<bf16>(0.0f).bits, 0x0000);
  EXPECT_EQ(from_float<bf16>(-0.0f).bits, 0x8000);
  EXPECT_EQ(from_float<bf16>(1.0f).bits, 0x3f80);
  EXPECT_EQ(from_float<bf16>(INFINITY).bits, 0x7f80);
  EXPECT_EQ(from_float<bf16>(-INFINITY).bits, 0xff80);
  EXPECT_EQ(from_float<bf16>(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds to inf
  EXPECT_EQ(from_float<bf16>(bits_float(0x7f7f7fffu)).bits, 0x7f7f);           // below the midpoint
  EXPECT_EQ(from_float<bf16>(bits_float(0x00000001u)).bits, 0x0000);           // float denormal
  EXPECT_EQ(from_float<bf16>(bits_float(0x00008000u)).bits, 0x0000);           // tie: even
  EXPECT_EQ(from_float<bf16>(bits_float(0x00018000u)).bits, 0x0002);           // tie: even (up)
  // NaN payloads that only have low bits set must not round into inf.
  for (uint32_t u : {0x7f800001u, 0xff800001u, 0x7f807fffu, 0x7fc00000u, 0xffffffffu, 0x7fffffffu}) {
    const uint16_t got = from_float<bf16>(bits_float(u)).bits;
    EXPECT_TRUE(bf16_is_nan(got)) << "NaN 0x" << std::hex << u << " became 0x" << got;
    EXPECT_EQ(got & 0x8000u, (u >> 16) & 0x8000u) << "NaN 0x" << std::hex << u;
  }
}

// --- fast_exp ----------------------------------------------------------------

TEST(FastExp, RelativeErrorBelow3e7OnTheWholeRange) {
  double worst = 0.0;
  float worst_x = 0.0f;
  auto check = [&](float x) {
    const double want = std::exp(double(x));
    const double err = std::fabs(double(fast_exp(x)) - want) / want;
    if (err > worst) worst = err, worst_x = x;
  };
  constexpr int kGrid = 4'000'000;
  for (int i = 0; i <= kGrid; ++i) check(-87.0f + 175.0f * float(i) / kGrid);
  std::mt19937 rng(99);
  // Tiny arguments (where the reduction does nothing), then every float near the ends.
  std::uniform_real_distribution<float> log2_mag(-40.0f, 0.0f);
  for (int i = 0; i < 200'000; ++i) check((i % 2 ? 1.0f : -1.0f) * std::exp2(log2_mag(rng)));
  for (float x = 87.99f; x <= 88.0f; x = std::nextafter(x, 100.0f)) check(x);
  for (float x = -87.0f; x <= -86.99f; x = std::nextafter(x, 0.0f)) check(x);
  std::uniform_real_distribution<float> uni(-87.0f, 88.0f);
  for (int i = 0; i < 2'000'000; ++i) check(uni(rng));
  EXPECT_LT(worst, 3e-7) << "worst relative error at x = " << worst_x;
  std::cout << "fast_exp worst relative error " << worst << " at x = " << worst_x << "\n";
}

TEST(FastExp, ClampsOutsideTheRange) {
  // Kernels compute fast_exp(-inf - m) for masked entries and zero them
  // afterwards: the value must be finite and tiny, never NaN.
  for (float x : {-87.5f, -100.0f, -1e30f, -INFINITY}) {
    const float y = fast_exp(x);
    EXPECT_TRUE(std::isfinite(y)) << x;
    EXPECT_GE(y, 0.0f) << x;
    EXPECT_LE(y, 2e-38f) << x;
  }
  for (float x : {88.5f, 1e30f, INFINITY}) {
    EXPECT_TRUE(std::isfinite(fast_exp(x))) << x;
    EXPECT_NEAR(fast_exp(x) / std::exp(88.0), 1.0, 3e-7) << x;
  }
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
}

// NaN in, NaN out: every NaN (quiet, negative, signalling bit patterns) gives NaN, in
// a scalar call and in a loop the compiler vectorizes; +-inf clamp as above. The NaN
// path converts no NaN to an integer and shifts no negative value (undefined
// behaviour before, reached from fast_tanh(NaN); the sanitizer job checks it).
TEST(FastExp, NanGivesNanInfinitiesClamp) {
  const uint32_t patterns[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu};
  std::vector<float> xs;
  for (uint32_t u : patterns) {
    float x;
    std::memcpy(&x, &u, 4);
    ASSERT_TRUE(std::isnan(x));
    EXPECT_TRUE(std::isnan(fast_exp(x))) << std::hex << u;
    EXPECT_TRUE(std::isnan(fast_tanh(x))) << std::hex << u;
    EXPECT_TRUE(std::isnan(exact_edges_exp(x))) << std::hex << u;
    xs.push_back(x);
    xs.push_back(1.0f);
  }
  xs.resize(64, -3.0f);
  std::vector<float> ys(xs.size()), ts(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ys[i] = fast_exp(xs[i]);
  for (size_t i = 0; i < xs.size(); ++i) ts[i] = fast_tanh(xs[i]);
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(std::isnan(ys[i]), std::isnan(xs[i])) << i;
    EXPECT_EQ(std::isnan(ts[i]), std::isnan(xs[i])) << i;
    if (!std::isnan(xs[i])) EXPECT_NEAR(ys[i] / std::exp(double(xs[i])), 1.0, 3e-7) << i;
  }
  EXPECT_LE(fast_exp(-INFINITY), 2e-38f);
  EXPECT_GE(fast_exp(-INFINITY), 0.0f);
  EXPECT_NEAR(fast_exp(INFINITY) / std::exp(88.0), 1.0, 3e-7);
  EXPECT_EQ(fast_tanh(INFINITY), 1.0f);
  EXPECT_EQ(fast_tanh(-INFINITY), -1.0f);
}

TEST(NanMax, KeepsANanOfEitherSide) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(nan_max(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(nan_max(1.0f, nan)));
  EXPECT_TRUE(std::isnan(nan_max(-INFINITY, nan)));
  EXPECT_TRUE(std::isnan(nan_max(nan, INFINITY)));
  EXPECT_EQ(nan_max(-INFINITY, 2.0f), 2.0f);
  EXPECT_EQ(nan_max(3.0f, 2.0f), 3.0f);
  EXPECT_EQ(nan_max(-INFINITY, -INFINITY), -INFINITY);
  float m = -INFINITY;  // a fold stays NaN once it met one
  for (float x : {1.0f, nan, 5.0f, INFINITY, -2.0f}) m = nan_max(m, x);
  EXPECT_TRUE(std::isnan(m));
}

// --- exp / tanh / sigmoid of score_mod programs ----------------------------------

// worst relative error of f against the double-precision g over xs (|g| >= floor).
template <class F, class G>
double worst_error(F f, G g, const std::vector<float>& xs, float* at, double floor = 0.0) {
  double worst = 0.0;
  for (float x : xs) {
    const double want = g(double(x));
    const double err = std::fabs(double(f(x)) - want) / std::max(std::fabs(want), floor);
    if (err > worst) worst = err, *at = x;
  }
  return worst;
}

std::vector<float> dense(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * float(i) / float(n));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> log2_mag(-30.0f, 0.0f);  // tiny arguments
  for (int i = 0; i < 20'000; ++i) xs.push_back((i % 2 ? 1.0f : -1.0f) * std::exp2(log2_mag(rng)));
  return xs;
}

TEST(ScoreModMath, TanhSigmoidExpMatchDoublePrecision) {
  float at = 0.0f;
  // tanh: both branches and the switch at |x| = 0.5, the tails to saturation
  const std::vector<float> t = dense(-20.0f, 20.0f, 2'000'000);
  double e = worst_error(fast_tanh, [](double x) { return std::tanh(x); }, t, &at);
  EXPECT_LT(e, 5e-7) << "tanh at " << at;
  for (float x = 0.4999f; x <= 0.5001f; x = std::nextafter(x, 1.0f))
    EXPECT_NEAR(fast_tanh(x) / std::tanh(double(x)), 1.0, 5e-7) << x;
  e = worst_error(fast_sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
                  dense(-80.0f, 80.0f, 1'000'000), &at);
  EXPECT_LT(e, 5e-7) << "sigmoid at " << at;
  e = worst_error(exact_edges_exp, [](double x) { return std::exp(x); },
                  dense(-87.0f, 88.72f, 2'000'000), &at);
  EXPECT_LT(e, 5e-7) << "exp at " << at;
}

TEST(ScoreModMath, EdgeValues) {
  EXPECT_EQ(fast_tanh(INFINITY), 1.0f);
  EXPECT_EQ(fast_tanh(-INFINITY), -1.0f);
  EXPECT_EQ(fast_tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(fast_tanh(-0.0f)));
  EXPECT_TRUE(std::isnan(fast_tanh(NAN)));
  EXPECT_EQ(exact_edges_exp(-INFINITY), 0.0f);
  EXPECT_EQ(exact_edges_exp(-100.0f), 0.0f);
  EXPECT_EQ(exact_edges_exp(INFINITY), INFINITY);
  EXPECT_EQ(exact_edges_exp(89.0f), INFINITY);
  EXPECT_NEAR(exact_edges_exp(88.5f) / std::exp(88.5), 1.0, 5e-7);
  EXPECT_TRUE(std::isnan(exact_edges_exp(NAN)));
  EXPECT_EQ(fast_sigmoid(-INFINITY), 0.0f);
  EXPECT_EQ(fast_sigmoid(INFINITY), 1.0f);
  EXPECT_EQ(fast_sigmoid(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(fast_sigmoid(NAN)));
}

// --- thread pool ---------------------------------------------------------------

// Runs parallel_for(n) and checks the contract: every task once, slots in
// [0, max_slots()), a slot used by one thread at a time and by one thread only
// within the call, slot 0 the calling thread.
void run_and_check(int64_t n, int spin = 0) {
  const int slots = max_slots();
  std::vector<std::atomic<int>> count(n), busy(slots);
  for (auto& c : count) c.store(0);
  for (auto& c : busy) c.store(0);
  std::mutex mu;
  std::map<int, std::thread::id> owner;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> out_of_range{0}, overlaps{0}, owner_changes{0}, slot0_elsewhere{0};

  parallel_for(n, [&](int64_t task, int slot) {
    if (task < 0 || task >= n) {
      out_of_range.fetch_add(1);
      return;
    }
    count[task].fetch_add(1);
    if (slot < 0 || slot >= slots) {
      out_of_range.fetch_add(1);
      return;
    }
    if (busy[slot].fetch_add(1) != 0) overlaps.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = owner.emplace(slot, std::this_thread::get_id()).first;
      if (it->second != std::this_thread::get_id()) owner_changes.fetch_add(1);
    }
    if (slot == 0 && std::this_thread::get_id() != caller) slot0_elsewhere.fetch_add(1);
    volatile int sink = 0;
    for (int i = 0; i < spin; ++i) sink = sink + i;
    busy[slot].fetch_sub(1);
  });

  EXPECT_EQ(out_of_range.load(), 0) << "n = " << n;
  EXPECT_EQ(overlaps.load(), 0) << "two threads used one slot at once, n = " << n;
  EXPECT_EQ(owner_changes.load(), 0) << "a slot moved between threads within one call, n = " << n;
  EXPECT_EQ(slot0_elsewhere.load(), 0) << "slot 0 ran off the calling thread, n = " << n;
  int64_t wrong = 0;
  for (int64_t t = 0; t < n; ++t) wrong += count[t].load() != 1;
  EXPECT_EQ(wrong, 0) << "tasks not run exactly once, n = " << n;
}

TEST(ThreadPool, EveryTaskExactlyOnceWithValidSlots) {
  for (int64_t n : {0, 1, 2, 3, 7, 64, 1000, 10007}) run_and_check(n);
  for (int64_t n : {5, 100}) run_and_check(n, 20000);
}

TEST(ThreadPool, MoreThreadsThanCores) {
  set_num_threads(5);
  EXPECT_GE(max_slots(), 5);
  for (int64_t n : {1, 4, 5, 6, 333}) run_and_check(n, 2000);
  set_num_threads(0);
}

TEST(ThreadPool, OneThreadRunsEverythingOnTheCaller) {
  set_num_threads(1);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> elsewhere{0}, nonzero_slot{0}, ran{0};
  parallel_for(100, [&](int64_t, int slot) {
    elsewhere += std::this_thread::get_id() != caller;
    nonzero_slot += slot != 0;
    ++ran;
  });
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(elsewhere.load(), 0);
  EXPECT_EQ(nonzero_slot.load(), 0);
  set_num_threads(0);
}

TEST(ThreadPool, ConcurrentCallersBothComplete) {
  set_num_threads(4);
  auto caller = [](int rounds, int64_t n, int spin) {
    for (int r = 0; r < rounds; ++r) run_and_check(n + r % 5, spin);
  };
  std::thread a(caller, 150, 257, 200);
  std::thread b(caller, 150, 31, 2000);
  caller(50, 1000, 0);  // the main thread competes too
  a.join();
  b.join();
  set_num_threads(0);
}

}  // namespace
}  // namespace fusedattn::cpu
