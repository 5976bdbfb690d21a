// The CPU softmax kernels against a naive double-precision reference
// (softmax_check.h), plus what only the CPU kernels promise (thread counts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/softmax/cpu/softmax.h"
#include "fusedattn/softmax/validate.h"
#include "softmax_check.h"

namespace fusedattn::softmax {
namespace {

using namespace check;  // NOLINT: the shared checks of softmax_check.h

const Kernels kCpu{cpu_softmax_fwd, cpu_softmax_bwd};

const int32_t kDtypes[] = {FA_FLOAT32, FA_BFLOAT16, FA_FLOAT16};

TEST(CpuSoftmax, ScaledShapes) {
  uint32_t seed = 1;
  for (int32_t dt : kDtypes)
    for (const auto& dims : std::vector<std::vector<int64_t>>{{2, 3, 5, 7},
                                                              {1, 2, 4, 1},
                                                              {1, 1, 3, 16},
                                                              {2, 2, 9, 33},
                                                              {1, 2, 3, 1000},
                                                              {1, 1, 2, 4099},
                                                              {6, 17, 129}})
      check_case(kCpu, {dims, {}, FA_SOFTMAX_SCALED, 0.7f}, dt, seed++);
}

TEST(CpuSoftmax, MaskedBroadcasts) {
  uint32_t seed = 100;
  const std::vector<int64_t> dims = {3, 4, 6, 37};
  for (int32_t dt : kDtypes)
    for (const auto& md : std::vector<std::vector<int64_t>>{{3, 4, 6, 37},
                                                            {3, 1, 6, 37},
                                                            {1, 4, 6, 37},
                                                            {1, 1, 6, 37},
                                                            {3, 1, 1, 37},
                                                            {1, 4, 1, 37},
                                                            {1, 1, 1, 37}})
      check_case(kCpu, {dims, md, FA_SOFTMAX_SCALED_MASKED, 0.5f}, dt, seed++);
  // Five dims as vmap makes them (a leading batch of 2): broadcast in the middle.
  check_case(kCpu, {{2, 3, 4, 6, 40}, {2, 1, 4, 1, 40}, FA_SOFTMAX_SCALED_MASKED, 1.0f}, FA_FLOAT32,
             seed++);
  check_case(kCpu, {{2, 3, 4, 6, 40}, {1, 3, 1, 6, 40}, FA_SOFTMAX_SCALED_MASKED, 1.0f},
             FA_BFLOAT16, seed++);
}

TEST(CpuSoftmax, Causal) {
  uint32_t seed = 200;
  for (int32_t dt : kDtypes)
    for (const auto& dims : std::vector<std::vector<int64_t>>{
             {2, 3, 17, 17}, {6, 40, 40}, {1, 2, 9, 5}, {1, 2, 5, 9}, {1, 1, 1, 1}, {2, 130, 130}})
      check_case(kCpu, {dims, {}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED, 0.9f}, dt, seed++);
}

TEST(CpuSoftmax, LongRowsAndScales) {
  check_case(kCpu, {{1, 1, 2, 20001}, {}, FA_SOFTMAX_SCALED, 1.0f}, FA_BFLOAT16, 300);
  check_case(kCpu, {{1, 1, 3, 16384}, {1, 1, 1, 16384}, FA_SOFTMAX_SCALED_MASKED, 0.25f},
             FA_FLOAT16, 301);
  check_case(kCpu, {{1, 2, 3, 50}, {}, FA_SOFTMAX_SCALED, -1.5f}, FA_FLOAT32,
             302);  // negative scale
  check_case(kCpu, {{1, 2, 3, 50}, {}, FA_SOFTMAX_SCALED, 0.0f}, FA_FLOAT32, 303);  // uniform rows
  check_case(kCpu, {{1, 2, 3, 50}, {}, FA_SOFTMAX_SCALED, 1.0f}, FA_FLOAT32, 304,
             30.0f);  // wide logits
}

// Rows that keep nothing come out 0 (y and dx), in every dtype; the others are right.
TEST(CpuSoftmax, FullyMaskedRowsAreZero) {
  for (int32_t dt : kDtypes) {
    const Case c{{2, 2, 3, 19}, {2, 1, 3, 19}, FA_SOFTMAX_SCALED_MASKED, 1.0f};
    const SoftmaxParams p = params_of(c, dt);
    const int64_t n = 2 * 2 * 3 * 19;
    std::mt19937 rng(7);
    Tensor x(dt, n), y(dt, n), dy(dt, n), dx(dt, n);
    x.fill_normal(rng, 1.0f);
    dy.fill_normal(rng, 1.0f);
    std::vector<uint8_t> mask(2 * 3 * 19, 0);
    for (int j = 0; j < 19; ++j) mask[1 * 19 + j] = 1;  // batch 0, query 1: all masked
    mask[2 * 19 + 5] = 1;
    y.poison();
    cpu_softmax_fwd(p, x.data(), mask.data(), y.data());
    dx.poison();
    cpu_softmax_bwd(p, y.data(), dy.data(), dx.data());
    for (int64_t r = 0; r < 12; ++r) {
      double sum = 0.0;
      for (int j = 0; j < 19; ++j) sum += y.get(r * 19 + j);
      const bool dead = r / 6 == 0 && r % 3 == 1;  // batch 0 (both heads), query 1
      EXPECT_NEAR(sum, dead ? 0.0 : 1.0, 1e-2) << short_name(dt) << " row " << r;
      if (dead)
        for (int j = 0; j < 19; ++j) {
          EXPECT_EQ(y.get(r * 19 + j), 0.0);
          EXPECT_EQ(dx.get(r * 19 + j), 0.0);
        }
    }
  }
}

// -inf logits are dropped like masked ones (an all -inf row is 0); NaN poisons its row only.
TEST(CpuSoftmax, InfAndNanLogits) {
  const Case c{{3, 8}, {}, FA_SOFTMAX_SCALED, 1.0f};
  const SoftmaxParams p = params_of(c, FA_FLOAT32);
  Tensor x(FA_FLOAT32, 24), y(FA_FLOAT32, 24);
  for (int j = 0; j < 24; ++j) x.set(j, 0.1f * j);
  for (int j = 0; j < 8; ++j) x.set(j, -std::numeric_limits<float>::infinity());
  x.set(9, -std::numeric_limits<float>::infinity());
  x.set(20, std::numeric_limits<float>::quiet_NaN());
  y.poison();
  cpu_softmax_fwd(p, x.data(), nullptr, y.data());
  for (int j = 0; j < 8; ++j) EXPECT_EQ(y.get(j), 0.0) << j;
  EXPECT_EQ(y.get(9), 0.0);
  double s = 0.0;
  for (int j = 8; j < 16; ++j) s += y.get(j);
  EXPECT_NEAR(s, 1.0, 1e-6);
  for (int j = 16; j < 24; ++j) EXPECT_TRUE(std::isnan(y.get(j))) << j;
}

// The result does not depend on how rows are spread over threads.
TEST(CpuSoftmax, SameBitsForAnyThreadCount) {
  const Case c{{4, 3, 33, 300}, {4, 1, 33, 300}, FA_SOFTMAX_SCALED_MASKED, 0.3f};
  const SoftmaxParams p = params_of(c, FA_BFLOAT16);
  const int64_t n = 4 * 3 * 33 * 300;
  std::mt19937 rng(11);
  Tensor x(FA_BFLOAT16, n), y1(FA_BFLOAT16, n), y4(FA_BFLOAT16, n);
  x.fill_normal(rng, 1.0f);
  std::vector<uint8_t> mask(4 * 33 * 300);
  for (auto& m : mask) m = rng() % 3 == 0;
  cpu::set_num_threads(1);
  cpu_softmax_fwd(p, x.data(), mask.data(), y1.data());
  cpu::set_num_threads(4);
  cpu_softmax_fwd(p, x.data(), mask.data(), y4.data());
  cpu::set_num_threads(0);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y1.get(i), y4.get(i)) << i;
}

}  // namespace
}  // namespace fusedattn::softmax
