// The softmax engine's decisions: validate() messages (each names the argument),
// choose_kernel() (which calls our kernels serve on each platform), and the
// broadcast-mask row mapping (MaskRows) against explicit index arithmetic.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/softmax/mask_rows.h"
#include "fusedattn/softmax/validate.h"

namespace fusedattn::softmax {
namespace {

SoftmaxParams make(std::vector<int64_t> dims, int32_t type = FA_SOFTMAX_SCALED,
                   int32_t dtype = FA_BFLOAT16, std::vector<int64_t> mask_dims = {}) {
  SoftmaxParams p{};
  p.rank = static_cast<int32_t>(dims.size());
  for (size_t i = 0; i < dims.size() && i < FA_SOFTMAX_MAX_RANK; ++i) p.dims[i] = dims[i];
  p.has_mask = !mask_dims.empty();
  for (size_t i = 0; i < mask_dims.size() && i < FA_SOFTMAX_MAX_RANK; ++i)
    p.mask_dims[i] = mask_dims[i];
  p.softmax_type = type;
  p.dtype = dtype;
  p.scale = 0.125f;
  return p;
}

void expect_invalid(const SoftmaxParams& p, const std::string& needle) {
  const Status s = validate(p);
  EXPECT_EQ(s.code, FA_INVALID_ARGUMENT) << needle;
  EXPECT_NE(s.message.find(needle), std::string::npos) << "message: " << s.message;
}

TEST(SoftmaxValidate, GoodCalls) {
  EXPECT_TRUE(validate(make({2, 3, 5, 7})).ok());
  EXPECT_TRUE(validate(make({6, 5, 5}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED)).ok());
  EXPECT_TRUE(
      validate(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED_MASKED, FA_FLOAT32, {2, 1, 5, 7})).ok());
  EXPECT_TRUE(
      validate(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED_MASKED, FA_FLOAT16, {1, 3, 1, 7})).ok());
}

TEST(SoftmaxValidate, EachArgumentIsNamed) {
  expect_invalid(make({2, 3, 5, 7}, 3), "softmax_type: got code 3, not a SoftmaxFusionType");
  expect_invalid(make({2, 3, 5, 7}, -1), "softmax_type: got code -1");
  expect_invalid(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED, 3), "dtype: got code 3");
  expect_invalid(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED, -1), "float32, bfloat16 or float16");
  expect_invalid(make({7}), "logits: got rank 1");
  expect_invalid(make({1, 1, 1, 1, 1, 1, 1, 1, 1}), "logits: got rank 9");
  expect_invalid(make({2, 0, 5, 7}), "logits: got shape [2, 0, 5, 7]");
  expect_invalid(make({2, 3, 5, (int64_t{1} << 20) + 1}), "kv_seqlen");
  expect_invalid(make({1 << 20, 1 << 20, 1 << 10, 1 << 10}), "2^48");
  SoftmaxParams p = make({2, 3, 5, 7});
  p.scale = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(p, "scale_factor: got nan");
  expect_invalid(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED_MASKED),
                 "mask: softmax_type=SCALED_MASKED needs a mask");
  expect_invalid(
      make({2, 3, 5, 7}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED, FA_BFLOAT16, {2, 1, 5, 7}),
      "mask: softmax_type=SCALED_UPPER_TRIANG_MASKED takes no mask");
  for (auto md :
       std::vector<std::vector<int64_t>>{{2, 3, 5, 1}, {2, 2, 5, 7}, {3, 1, 5, 7}, {2, 1, 4, 7}})
    expect_invalid(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED_MASKED, FA_BFLOAT16, md),
                   "does not broadcast to logits [2, 3, 5, 7]");
}

TEST(SoftmaxChooseKernel, Cpu) {
  const KernelChoice c = choose_kernel(make({2, 3, 5, 100000}), FA_PLATFORM_CPU, false);
  EXPECT_TRUE(c.status.ok());
  EXPECT_TRUE(c.available) << c.reason;
  // A float dtype the kernels do not take: valid, but the fallback runs.
  const KernelChoice f =
      choose_kernel(make({2, 3, 5, 7}, FA_SOFTMAX_SCALED, -1), FA_PLATFORM_CPU, true);
  EXPECT_TRUE(f.status.ok());
  EXPECT_FALSE(f.available);
  EXPECT_NE(f.reason.find("fallback"), std::string::npos) << f.reason;
}

TEST(SoftmaxChooseKernel, CudaRowLimits) {
  auto cuda = [](int64_t skv, int32_t dtype) {
    const KernelChoice c = choose_kernel(
        make({1, 2, 3, skv}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED, dtype), FA_PLATFORM_CUDA, true);
    EXPECT_TRUE(c.status.ok()) << c.status.message;
    return c.available;
  };
  for (int32_t dt : {FA_FLOAT32, FA_BFLOAT16, FA_FLOAT16})
    for (int64_t skv : {1, 3, 7, 1000, 4097, 16383, 16384})
      EXPECT_TRUE(cuda(skv, dt)) << dt << " " << skv;
  EXPECT_FALSE(cuda(16385, FA_FLOAT32));
  EXPECT_FALSE(cuda(16388, FA_FLOAT32));
  for (int32_t dt : {FA_BFLOAT16, FA_FLOAT16}) {
    EXPECT_TRUE(cuda(16392, dt));
    EXPECT_TRUE(cuda(32768, dt));
    EXPECT_FALSE(cuda(16385, dt));  // past 16384 only multiples of 8 (16-byte units)
    EXPECT_FALSE(cuda(32767, dt));
    EXPECT_FALSE(cuda(32776, dt));
  }
  const KernelChoice nb = choose_kernel(make({1, 2, 3, 64}), FA_PLATFORM_CUDA, false);
  EXPECT_TRUE(nb.status.ok());
  EXPECT_FALSE(nb.available);
  EXPECT_NE(nb.reason.find("no CUDA kernels"), std::string::npos) << nb.reason;
  const KernelChoice bad = choose_kernel(make({1, 2, 3, 64}), 2, true);
  EXPECT_EQ(bad.status.code, FA_INVALID_ARGUMENT);
  const KernelChoice inval = choose_kernel(make({1, 0, 3, 64}), FA_PLATFORM_CUDA, true);
  EXPECT_EQ(inval.status.code, FA_INVALID_ARGUMENT);
  EXPECT_FALSE(inval.available);
}

// mask_row_offset(make_mask_rows(p), row) == the mask row of `row` by explicit
// index arithmetic, for every broadcast pattern of a rank-5 call, in 64 and 32 bits.
TEST(SoftmaxMaskRows, EveryBroadcastPattern) {
  const std::vector<int64_t> dims = {2, 3, 1, 4, 5, 6};  // a size-1 dim in the middle too
  const int rank = static_cast<int>(dims.size());
  for (int pattern = 0; pattern < (1 << (rank - 1)); ++pattern) {
    std::vector<int64_t> md(dims);
    for (int d = 0; d < rank - 1; ++d)
      if (pattern >> d & 1) md[d] = 1;
    const SoftmaxParams p = make(dims, FA_SOFTMAX_SCALED_MASKED, FA_FLOAT32, md);
    ASSERT_TRUE(validate(p).ok());
    const MaskRows m = make_mask_rows(p);
    EXPECT_LE(m.n, rank - 1);
    const int64_t rows = 2 * 3 * 1 * 4 * 5;
    for (int64_t row = 0; row < rows; ++row) {
      int64_t rest = row, idx = 0, stride = md[rank - 1];
      for (int d = rank - 2; d >= 0; --d) {
        const int64_t i = rest % dims[d];
        rest /= dims[d];
        if (md[d] != 1) idx += i * stride;
        stride *= md[d];
      }
      ASSERT_EQ(mask_row_offset(m, row), idx) << "pattern " << pattern << " row " << row;
      ASSERT_EQ(mask_row_offset(m, static_cast<uint32_t>(row)), idx);
    }
    // The launch order visits every row once, with its own mask row.
    std::vector<int> seen(rows, 0);
    for (int64_t t = 0; t < rows; ++t) {
      int64_t row, off;
      locate_row(m, t, &row, &off);
      ASSERT_TRUE(row >= 0 && row < rows) << "pattern " << pattern << " t " << t;
      ++seen[row];
      ASSERT_EQ(off, mask_row_offset(m, row)) << "pattern " << pattern << " t " << t;
    }
    for (int64_t row = 0; row < rows; ++row) ASSERT_EQ(seen[row], 1) << "pattern " << pattern;
  }
}

TEST(SoftmaxMaskRows, RowsSharingAMaskRowLaunchTogether) {
  // [2, 1, 4, 8] mask over [2, 3, 4, 8] logits: the 3 heads of a (b, i) are consecutive.
  const MaskRows m = make_mask_rows(make({2, 3, 4, 8}, FA_SOFTMAX_SCALED_MASKED, 1, {2, 1, 4, 8}));
  for (int64_t t = 0; t < 24; t += 3) {
    int64_t row0, off0;
    locate_row(m, t, &row0, &off0);
    for (int64_t j = 1; j < 3; ++j) {
      int64_t row, off;
      locate_row(m, t + j, &row, &off);
      EXPECT_EQ(off, off0) << t + j;
      EXPECT_NE(row, row0) << t + j;
    }
  }
}

TEST(SoftmaxMaskRows, CommonMasksFoldToFewSteps) {
  // [B, 1, Sq, Skv] over [B, H, Sq, Skv]: (Sq), (H broadcast), (B).
  EXPECT_EQ(make_mask_rows(make({4, 8, 16, 32}, FA_SOFTMAX_SCALED_MASKED, 1, {4, 1, 16, 32})).n, 3);
  // The logits' own shape: one step.
  EXPECT_EQ(make_mask_rows(make({4, 8, 16, 32}, FA_SOFTMAX_SCALED_MASKED, 1, {4, 8, 16, 32})).n, 1);
  // One mask row for everything: one broadcast step.
  const MaskRows all =
      make_mask_rows(make({4, 8, 16, 32}, FA_SOFTMAX_SCALED_MASKED, 1, {1, 1, 1, 32}));
  EXPECT_EQ(all.n, 1);
  EXPECT_EQ(all.stride[0], 0);
}

}  // namespace
}  // namespace fusedattn::softmax
