// validate() and select_backend(): every check gives its documented status
// code (FA_INVALID_ARGUMENT for a malformed call, FA_UNIMPLEMENTED for a valid
// one this engine does not serve yet) and a message that names the argument
// and the offending value.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/attention/validate.h"
#include "attention/plain_call.h"

namespace fusedattn {
namespace {

AttnParams valid_params() {
  AttnParams p = test::plain_call(2, 128, 96, 8, 2, 64, 32, 0.125f);
  p.mask_type = FA_CAUSAL_MASK;
  p.is_training = 1;
  return p;
}

struct Case {
  const char* name;
  std::function<void(AttnParams&)> edit;
  int32_t code;                    // FaStatus
  std::vector<std::string> words;  // each must appear in the message
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ValidateRejects : public ::testing::TestWithParam<Case> {};

TEST_P(ValidateRejects, CodeAndMessage) {
  const Case& c = GetParam();
  AttnParams p = valid_params();
  c.edit(p);
  const Status s = validate(p);
  EXPECT_EQ(s.code, c.code) << "message: " << s.message;
  EXPECT_FALSE(s.ok());
  for (const std::string& w : c.words)
    EXPECT_NE(s.message.find(w), std::string::npos) << "'" << w << "' missing from: " << s.message;

  // select_backend asks validate() and reports the same status on every platform.
  for (int32_t platform : {FA_PLATFORM_CPU, FA_PLATFORM_CUDA}) {
    const BackendChoice choice = select_backend(p, platform);
    EXPECT_EQ(choice.backend, FA_BACKEND_NONE) << "platform " << platform;
    EXPECT_EQ(choice.status.code, c.code) << "platform " << platform;
    EXPECT_EQ(choice.status.message, s.message) << "platform " << platform;
    EXPECT_NE(choice.reason.find(s.message), std::string::npos)
        << "the reason should say why: " << choice.reason;
  }
}

constexpr int32_t kInvalid = FA_INVALID_ARGUMENT;

const Case kCases[] = {
    // Malformed calls.
    {"dtype_unknown", [](AttnParams& p) { p.dtype = 4; }, kInvalid, {"dtype", "4"}},
    {"dtype_negative", [](AttnParams& p) { p.dtype = -1; }, kInvalid, {"dtype", "-1"}},
    {"layout_unknown", [](AttnParams& p) { p.layout = 6; }, kInvalid, {"qkv_layout", "6"}},
    {"layout_negative", [](AttnParams& p) { p.layout = -1; }, kInvalid, {"qkv_layout", "-1"}},
    {"mask_unknown", [](AttnParams& p) { p.mask_type = 6; }, kInvalid, {"attn_mask_type", "6"}},
    {"mask_negative", [](AttnParams& p) { p.mask_type = -2; }, kInvalid, {"attn_mask_type", "-2"}},
    {"bias_unknown", [](AttnParams& p) { p.bias_type = 3; }, kInvalid, {"attn_bias_type", "3"}},
    {"bias_negative", [](AttnParams& p) { p.bias_type = -1; }, kInvalid, {"attn_bias_type", "-1"}},
    {"softmax_unknown", [](AttnParams& p) { p.softmax_type = 3; }, kInvalid, {"softmax_type", "3"}},
    {"softmax_negative", [](AttnParams& p) { p.softmax_type = -1; }, kInvalid, {"softmax_type"}},
    {"batch_zero", [](AttnParams& p) { p.batch = 0; }, kInvalid, {"batch", "0"}},
    {"batch_negative", [](AttnParams& p) { p.batch = -4; }, kInvalid, {"batch", "-4"}},
    {"seqlen_q_zero", [](AttnParams& p) { p.seqlen_q = 0; }, kInvalid,
     {"query sequence length", "0"}},
    {"seqlen_q_too_long", [](AttnParams& p) { p.seqlen_q = kMaxSeqLen + 1; }, kInvalid,
     {"query sequence length", std::to_string(kMaxSeqLen + 1)}},
    {"seqlen_kv_zero", [](AttnParams& p) { p.seqlen_kv = 0; }, kInvalid,
     {"key/value sequence length", "0"}},
    {"seqlen_kv_too_long", [](AttnParams& p) { p.seqlen_kv = int64_t{1} << 40; }, kInvalid,
     {"key/value sequence length", std::to_string(int64_t{1} << 40)}},
    {"heads_q_zero", [](AttnParams& p) { p.heads_q = 0; }, kInvalid, {"heads", "0"}},
    {"heads_kv_zero", [](AttnParams& p) { p.heads_kv = 0; }, kInvalid, {"heads", "0"}},
    {"heads_kv_negative", [](AttnParams& p) { p.heads_kv = -2; }, kInvalid, {"heads", "-2"}},
    {"heads_not_a_multiple", [](AttnParams& p) { p.heads_q = 6, p.heads_kv = 4; }, kInvalid,
     {"heads", "6", "4", "multiple"}},
    {"heads_kv_more_than_q", [](AttnParams& p) { p.heads_q = 2, p.heads_kv = 4; }, kInvalid,
     {"heads", "multiple"}},
    {"head_dim_qk_zero", [](AttnParams& p) { p.head_dim_qk = 0; }, kInvalid,
     {"head dim", "q and k", "0"}},
    {"head_dim_qk_too_big", [](AttnParams& p) { p.head_dim_qk = kMaxHeadDim + 1; }, kInvalid,
     {"head dim", "q and k", "513", "512"}},
    {"head_dim_v_zero", [](AttnParams& p) { p.head_dim_v = 0; }, kInvalid,
     {"head dim", "of v", "0"}},
    {"head_dim_v_too_big", [](AttnParams& p) { p.head_dim_v = 1024; }, kInvalid,
     {"head dim", "of v", "1024"}},
    {"scale_inf", [](AttnParams& p) { p.scale = INFINITY; }, kInvalid, {"scaling_factor", "inf"}},
    {"scale_minus_inf", [](AttnParams& p) { p.scale = -INFINITY; }, kInvalid, {"scaling_factor"}},
    {"scale_nan", [](AttnParams& p) { p.scale = NAN; }, kInvalid, {"scaling_factor", "nan"}},
    {"dropout_negative", [](AttnParams& p) { p.dropout = -0.1f; }, kInvalid,
     {"dropout_probability", "-0.1"}},
    {"dropout_one", [](AttnParams& p) { p.dropout = 1.0f; }, kInvalid, {"dropout_probability", "1"}},
    {"dropout_nan", [](AttnParams& p) { p.dropout = NAN; }, kInvalid, {"dropout_probability"}},
    {"dropout_one_not_training", [](AttnParams& p) { p.dropout = 1.0f, p.is_training = 0; },
     kInvalid, {"dropout_probability"}},
    {"window_left_below_minus_one", [](AttnParams& p) { p.window_left = -2; }, kInvalid,
     {"window_size", "-2"}},
    {"window_right_below_minus_one", [](AttnParams& p) { p.window_right = -5; }, kInvalid,
     {"window_size", "-5"}},
    // A malformed argument wins over an unimplemented one.
    {"invalid_before_unimplemented", [](AttnParams& p) { p.layout = FA_BS3HD, p.batch = 0; },
     kInvalid, {"batch"}},
    {"num_slices_zero", [](AttnParams& p) { p.num_slices = 0; }, kInvalid, {"num_slices", "0"}},
    {"num_slices_not_dividing_batch", [](AttnParams& p) { p.num_slices = 3; }, kInvalid,
     {"num_slices", "3", "divide"}},
    // Layouts.
    {"bs3hd_lengths_differ", [](AttnParams& p) { p.layout = FA_BS3HD; }, kInvalid,
     {"qkv_layout=BS3HD", "equal", "Sq 128", "Skv 96"}},
    {"t3hd_heads_differ",
     [](AttnParams& p) {
       p.layout = FA_T3HD, p.mask_type = FA_PADDING_MASK;
       p.seqlen_kv = p.seqlen_q, p.head_dim_v = p.head_dim_qk;
     },
     kInvalid, {"qkv_layout=T3HD", "Hq 8", "Hkv 2"}},
    {"bs2hd_head_dims_differ", [](AttnParams& p) { p.layout = FA_BSHD_BS2HD; }, kInvalid,
     {"qkv_layout=BSHD_BS2HD", "head dims", "64", "32"}},
    {"max_segments_zero", [](AttnParams& p) { p.max_segments = 0; }, kInvalid,
     {"max_segments_per_seq", "0"}},
    {"max_segments_with_bshd", [](AttnParams& p) { p.max_segments = 3; }, kInvalid,
     {"max_segments_per_seq=3", "THD_THD_THD, T3HD or THD_T2HD", "BSHD_BSHD_BSHD"}},
    {"thd_needs_a_padding_mask", [](AttnParams& p) { p.layout = FA_THD_THD_THD; }, kInvalid,
     {"qkv_layout=THD_THD_THD", "attn_mask_type=CAUSAL_MASK", "allowed: PADDING_MASK",
      "PADDING_CAUSAL_MASK", "PADDING_CAUSAL_BOTTOM_RIGHT_MASK"}},
    // Bias extents.
    {"bias_tensor_with_no_bias", [](AttnParams& p) { p.bias_batch = p.bias_heads = 1; }, kInvalid,
     {"bias", "NO_BIAS"}},
    {"bias_type_without_tensor", [](AttnParams& p) { p.bias_type = FA_POST_SCALE_BIAS; },
     kInvalid, {"attn_bias_type=POST_SCALE_BIAS", "allowed shapes", "[1 or 2, 1 or 8, 128, 96]"}},
    {"bias_batch_extent",
     [](AttnParams& p) { p.bias_type = FA_PRE_SCALE_BIAS, p.bias_batch = 3, p.bias_heads = 1; },
     kInvalid, {"batch extent 3", "1 or 2"}},
    {"bias_head_extent",
     [](AttnParams& p) { p.bias_type = FA_PRE_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 2; },
     kInvalid, {"head extent 2", "1 or 8"}},
    {"bias_batch_is_per_slice",  // vmap: the bias batch is the batch of one slice
     [](AttnParams& p) {
       p.batch = 4, p.num_slices = 2;
       p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 4, p.bias_heads = 8;
     },
     kInvalid, {"batch extent 4", "1 or 2"}},
};

INSTANTIATE_TEST_SUITE_P(Checks, ValidateRejects, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& c) { return std::string(c.param.name); });

// Calls at the edges of every allowed range pass, on both platforms.
class ValidateAccepts : public ::testing::TestWithParam<Case> {};

TEST_P(ValidateAccepts, OkAndBackend) {
  AttnParams p = valid_params();
  GetParam().edit(p);
  const Status s = validate(p);
  EXPECT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(s.code, FA_OK);
  EXPECT_TRUE(s.message.empty()) << s.message;

  const BackendChoice cpu = select_backend(p, FA_PLATFORM_CPU);
  EXPECT_EQ(cpu.backend, FA_BACKEND_CPU_FLASH);
  EXPECT_TRUE(cpu.status.ok()) << cpu.status.message;
  EXPECT_NE(cpu.reason.find(backend_name(FA_BACKEND_CPU_FLASH)), std::string::npos) << cpu.reason;

  const BackendChoice cuda = select_backend(p, FA_PLATFORM_CUDA);
  EXPECT_EQ(cuda.backend, FA_BACKEND_XLA_REFERENCE);
  EXPECT_TRUE(cuda.status.ok()) << cuda.status.message;
  EXPECT_NE(cuda.reason.find(backend_name(FA_BACKEND_XLA_REFERENCE)), std::string::npos)
      << cuda.reason;
}

const Case kValid[] = {
    {"defaults", [](AttnParams&) {}, FA_OK, {}},
    {"float32", [](AttnParams& p) { p.dtype = FA_FLOAT32; }, FA_OK, {}},
    {"float16", [](AttnParams& p) { p.dtype = FA_FLOAT16; }, FA_OK, {}},
    {"no_mask", [](AttnParams& p) { p.mask_type = FA_NO_MASK; }, FA_OK, {}},
    {"padding", [](AttnParams& p) { p.mask_type = FA_PADDING_MASK; }, FA_OK, {}},
    {"padding_causal", [](AttnParams& p) { p.mask_type = FA_PADDING_CAUSAL_MASK; }, FA_OK, {}},
    {"causal_bottom_right", [](AttnParams& p) { p.mask_type = FA_CAUSAL_BOTTOM_RIGHT_MASK; },
     FA_OK, {}},
    {"padding_causal_bottom_right",
     [](AttnParams& p) { p.mask_type = FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK; }, FA_OK, {}},
    {"smallest_shapes",
     [](AttnParams& p) {
       p.batch = p.seqlen_q = p.seqlen_kv = p.heads_q = p.heads_kv = 1;
       p.head_dim_qk = p.head_dim_v = 1;
     },
     FA_OK, {}},
    {"largest_shapes",
     [](AttnParams& p) {
       p.seqlen_q = p.seqlen_kv = kMaxSeqLen;
       p.head_dim_qk = p.head_dim_v = kMaxHeadDim;
     },
     FA_OK, {}},
    {"mqa", [](AttnParams& p) { p.heads_q = 16, p.heads_kv = 1; }, FA_OK, {}},
    {"scale_zero", [](AttnParams& p) { p.scale = 0.0f; }, FA_OK, {}},
    {"scale_negative", [](AttnParams& p) { p.scale = -3.0f; }, FA_OK, {}},
    {"scale_huge", [](AttnParams& p) { p.scale = 3e38f; }, FA_OK, {}},
    {"dropout_not_training", [](AttnParams& p) { p.dropout = 0.5f, p.is_training = 0; }, FA_OK, {}},
    {"dropout_below_one_not_training",
     [](AttnParams& p) { p.dropout = std::nextafter(1.0f, 0.0f), p.is_training = 0; }, FA_OK, {}},
    {"dropout_in_training", [](AttnParams& p) { p.dropout = 0.1f; }, FA_OK, {}},
    {"bs3hd",
     [](AttnParams& p) {
       p.layout = FA_BS3HD, p.seqlen_kv = p.seqlen_q, p.heads_kv = p.heads_q;
       p.head_dim_v = p.head_dim_qk;
     },
     FA_OK, {}},
    {"bshd_bs2hd", [](AttnParams& p) { p.layout = FA_BSHD_BS2HD, p.head_dim_v = p.head_dim_qk; },
     FA_OK, {}},
    {"thd_thd_thd_segments",
     [](AttnParams& p) { p.layout = FA_THD_THD_THD, p.mask_type = FA_PADDING_CAUSAL_MASK, p.max_segments = 9; },
     FA_OK, {}},
    {"t3hd",
     [](AttnParams& p) {
       p.layout = FA_T3HD, p.mask_type = FA_PADDING_MASK, p.seqlen_kv = p.seqlen_q;
       p.heads_kv = p.heads_q, p.head_dim_v = p.head_dim_qk;
     },
     FA_OK, {}},
    {"thd_t2hd",
     [](AttnParams& p) {
       p.layout = FA_THD_T2HD, p.mask_type = FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
       p.head_dim_v = p.head_dim_qk;
     },
     FA_OK, {}},
    {"post_scale_bias_full",
     [](AttnParams& p) { p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 2, p.bias_heads = 8; },
     FA_OK, {}},
    {"pre_scale_bias_broadcast",
     [](AttnParams& p) { p.bias_type = FA_PRE_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1; },
     FA_OK, {}},
    {"bias_per_slice",
     [](AttnParams& p) {
       p.batch = 6, p.num_slices = 3;
       p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 2, p.bias_heads = 1;
     },
     FA_OK, {}},
    {"off_by_one_softmax", [](AttnParams& p) { p.softmax_type = FA_OFF_BY_ONE_SOFTMAX; }, FA_OK, {}},
    {"learnable_softmax", [](AttnParams& p) { p.softmax_type = FA_LEARNABLE_SOFTMAX; }, FA_OK, {}},
    {"sliding_window", [](AttnParams& p) { p.window_left = 16, p.window_right = 0; }, FA_OK, {}},
    {"window_both_sides_no_mask",
     [](AttnParams& p) { p.window_left = 3, p.window_right = 4, p.mask_type = FA_NO_MASK; }, FA_OK, {}},
};

INSTANTIATE_TEST_SUITE_P(Edges, ValidateAccepts, ::testing::ValuesIn(kValid),
                         [](const ::testing::TestParamInfo<Case>& c) { return std::string(c.param.name); });

TEST(SelectBackend, UnknownPlatformIsInvalid) {
  for (int32_t platform : {-1, 2, 7}) {
    const BackendChoice c = select_backend(valid_params(), platform);
    EXPECT_EQ(c.backend, FA_BACKEND_NONE);
    EXPECT_EQ(c.status.code, FA_INVALID_ARGUMENT);
    EXPECT_NE(c.status.message.find("platform"), std::string::npos) << c.status.message;
    EXPECT_NE(c.status.message.find(std::to_string(platform)), std::string::npos)
        << c.status.message;
    EXPECT_FALSE(c.reason.empty());
  }
}

TEST(SelectBackend, InvalidCallHasNoBackendAndAReason) {
  AttnParams p = valid_params();
  p.heads_q = 3;
  const BackendChoice c = select_backend(p, FA_PLATFORM_CPU);
  EXPECT_EQ(c.backend, FA_BACKEND_NONE);
  EXPECT_EQ(c.status.code, FA_INVALID_ARGUMENT);
  EXPECT_NE(c.reason.find("heads"), std::string::npos) << c.reason;
}

TEST(Names, EveryEnumValueHasAName) {
  EXPECT_STREQ(dtype_name(FA_FLOAT32), "float32");
  EXPECT_STREQ(dtype_name(FA_BFLOAT16), "bfloat16");
  EXPECT_STREQ(dtype_name(FA_FLOAT16), "float16");
  EXPECT_STREQ(dtype_name(9), "unknown");
  for (int32_t v = FA_BS3HD; v <= FA_THD_THD_THD; ++v) EXPECT_STRNE(layout_name(v), "unknown");
  for (int32_t v = FA_NO_MASK; v <= FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK; ++v)
    EXPECT_STRNE(mask_name(v), "unknown");
  for (int32_t v = FA_NO_BIAS; v <= FA_POST_SCALE_BIAS; ++v) EXPECT_STRNE(bias_name(v), "unknown");
  for (int32_t v = FA_VANILLA_SOFTMAX; v <= FA_LEARNABLE_SOFTMAX; ++v)
    EXPECT_STRNE(softmax_name(v), "unknown");
  EXPECT_STREQ(backend_name(FA_BACKEND_NONE), "none");
  EXPECT_STREQ(backend_name(FA_BACKEND_CPU_FLASH), "cpu_flash");
  EXPECT_STREQ(backend_name(FA_BACKEND_XLA_REFERENCE), "xla_reference");
  EXPECT_STREQ(backend_name(FA_BACKEND_CUDNN), "cudnn");
  EXPECT_STREQ(layout_name(-1), "unknown");
  EXPECT_STREQ(mask_name(6), "unknown");
  EXPECT_STREQ(bias_name(3), "unknown");
  EXPECT_STREQ(softmax_name(3), "unknown");
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_FWD), "hopper");
  EXPECT_STREQ(backend_name(FA_BACKEND_CUDA_FLASH), "cuda_flash");
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_BWD), "hopper");
  EXPECT_STREQ(backend_name(7), "unknown");
}

}  // namespace
}  // namespace fusedattn
