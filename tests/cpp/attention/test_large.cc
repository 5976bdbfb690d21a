// Index arithmetic past 2^31 elements, without allocating: the offsets the CPU engine
// and the softmax kernels form for shapes of more than 2^31 elements (q/k/v, scores,
// mask rows), and the limits select_backend() and validate() draw where a kernel counts
// in 32 bits (cuDNN's ragged offsets and batch, the Hopper forward's tile count,
// small-seq's int32 tokens) -- each side of every limit, with its message.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/attention/cpu/row_ranges.h"
#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/attention/validate.h"
#include "fusedattn/small_seq/params.h"
#include "fusedattn/small_seq/validate.h"
#include "fusedattn/softmax/mask_rows.h"
#include "attention/plain_call.h"
#include "fusedattn/softmax/params.h"
#include "fusedattn/softmax/validate.h"

namespace fusedattn {
namespace {

constexpr int64_t k2e31 = int64_t{1} << 31;
constexpr int64_t k2e32 = int64_t{1} << 32;

bool has(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

// q/k/v [B, S, H, D] bf16, BSHD, no mask.
AttnParams bshd(int64_t B, int64_t S, int64_t H, int64_t D) {
  return test::plain_call(B, S, S, H, H, D, D, 0.088f);
}

using test::h100;

// ---- the CPU engine's offsets (attention/cpu/attention.h, row_ranges.h)

TEST(LargeIndex, BshdStridesReachPast2e31) {
  // q [2, 2^20, 16, 128]: 2^32 elements; the last element's offset is 2^32 - 1.
  const int64_t B = 2, S = int64_t{1} << 20, H = 16, D = 128;
  const cpu::Strides s = cpu::Strides::bshd(S, H, D);
  EXPECT_EQ(s.b, S * H * D);
  EXPECT_EQ((B - 1) * s.b + (S - 1) * s.s + (H - 1) * s.h + (D - 1), B * S * H * D - 1);
  EXPECT_GT((B - 1) * s.b + (S - 1) * s.s, k2e31);
}

TEST(LargeIndex, DenseBiasStridesReachPast2e32) {
  // bias [1, 4, 4, 2^15, 2^15] (one slice): 2^34 scores-sized elements.
  AttnParams p = bshd(4, int64_t{1} << 15, 4, 64);
  p.bias_type = FA_POST_SCALE_BIAS;
  p.bias_batch = 4;
  p.bias_heads = 4;
  const cpu::BiasStrides s = cpu::BiasStrides::dense(p);
  EXPECT_EQ(s.s, p.seqlen_kv);
  EXPECT_EQ(s.h, p.seqlen_q * p.seqlen_kv);
  EXPECT_EQ(s.b, 4 * s.h);
  const int64_t last = 3 * s.b + 3 * s.h + (p.seqlen_q - 1) * s.s + p.seqlen_kv - 1;
  EXPECT_EQ(last, (int64_t{1} << 34) - 1);
}

TEST(LargeIndex, LseStridesOfBothLayouts) {
  AttnParams p = bshd(4096, int64_t{1} << 20, 1024, 8);  // lse: 2^42 floats
  const cpu::Strides bshd_lse = cpu::lse_strides(p);
  EXPECT_EQ(4095 * bshd_lse.b + 1023 * bshd_lse.h + ((int64_t{1} << 20) - 1) * bshd_lse.s,
            (int64_t{1} << 42) - 1);
  p.layout = FA_THD_THD_THD;
  const cpu::Strides thd_lse = cpu::lse_strides(p);
  EXPECT_EQ(4095 * thd_lse.b + ((int64_t{1} << 20) - 1) * thd_lse.s + 1023 * thd_lse.h,
            (int64_t{1} << 42) - 1);
}

TEST(LargeIndex, RowRangeIndicesAre64Bit) {
  cpu::RowRanges r;
  r.seqlen_q = int64_t{1} << 20;
  r.n_qt = r.seqlen_q / 64;
  EXPECT_EQ(r.row(4095, r.seqlen_q - 1), 4096 * r.seqlen_q - 1);  // 2^32 - 1
  EXPECT_EQ(r.tile_index(int64_t{1} << 20, 1), (int64_t{1} << 34) + 1);
}

TEST(LargeIndex, MaskKeyRangesAtTheLongestSequences) {
  // A query near the end of the longest sequences, under a window wider than both:
  // every key, no wrap (the window sides are clamped before they are added).
  const int64_t S = kMaxSeqLen;
  const MaskRule rule = mask_rule(FA_CAUSAL_BOTTOM_RIGHT_MASK, INT64_MAX - 1, INT64_MAX - 1);
  const KeyRange k = segment_keys(rule, S - 1, S, S);
  EXPECT_EQ(k.lo, 0);
  EXPECT_EQ(k.hi, S);
}

// ---- validate(): attention serves more than 2^31 elements (its kernels index in int64)

TEST(LargeIndex, AttentionValidatesHugeTensors) {
  EXPECT_TRUE(validate(bshd(1, int64_t{1} << 20, 64, 128)).ok());   // 2^33 elements
  EXPECT_TRUE(validate(bshd(64, int64_t{1} << 20, 64, 256)).ok());  // 2^40
}

// ---- select_backend(): the kernels that count in 32 bits are not chosen past it

TEST(LargeIndex, CudnnServesBshdPast2e31Elements) {
  // q/k/v [1, 2^20, 16, 128] bf16: 2^31 elements each, 2^40 scores; cuDNN's BSHD strides
  // and flash kernels take it (no ragged offsets). The forward is the Hopper kernel's where
  // hopper/measured.h sends a causal call this long (its offsets are int64 too).
  const BackendChoice c = select_backend(bshd(1, int64_t{1} << 20, 16, 128), FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.backend, FA_BACKEND_CUDNN) << c.reason;
  EXPECT_EQ(c.backward, FA_BACKEND_CUDNN) << c.reason;
  EXPECT_EQ(c.forward, hopper_plain_measured(bshd(1, int64_t{1} << 20, 16, 128)).empty()
                           ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDNN) << c.reason;
}

TEST(LargeIndex, CudnnThdRaggedOffsetsStayBelow2e31) {
  // THD_THD_THD q [1, S, 16, 128]: the ragged offsets reach S * 16 * 128 (3x for T3HD
  // under the bound select_backend draws). Just under 2^31 / 3: cuDNN; at 2^31: not.
  AttnParams p = bshd(1, int64_t{1} << 20, 16, 128);
  p.layout = FA_THD_THD_THD;
  p.mask_type = FA_PADDING_MASK;
  p.max_segments = 4;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.forward, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "int32 ragged offsets")) << c.reason;
  p.seqlen_q = p.seqlen_kv = 349525;  // 3 * 16 * 128 * 349525 < 2^31
  c = select_backend(p, FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.backend, FA_BACKEND_CUDNN) << c.reason;  // (the forward: Hopper's by the table)
  EXPECT_EQ(c.forward, hopper_plain_measured(p).empty() ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDNN)
      << c.reason;
}

TEST(LargeIndex, CudnnThdRaggedOffsetsCountEveryVmapSlice) {
  // Four vmap slices of a THD call that fits alone: one cuDNN graph serves every slice
  // (no dropout, sink, score_mod or broadcast bias), so its ragged offsets run over all
  // four; before, the check counted one slice and the offsets wrapped.
  AttnParams p = bshd(4, 349525, 16, 128);
  p.layout = FA_THD_THD_THD;
  p.mask_type = FA_PADDING_MASK;
  p.max_segments = 4;
  p.num_slices = 4;
  const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.forward, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "int32 ragged offsets")) << c.reason;
}

TEST(LargeIndex, CudnnBatchAbove65535GoesElsewhere) {
  BackendChoice c = select_backend(bshd(65535, 4, 1, 64), FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.forward, FA_BACKEND_CUDNN) << c.reason;
  c = select_backend(bshd(65536, 4, 1, 64), FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.forward, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "65535")) << c.reason;
  // THD: every segment is a cuDNN sequence.
  AttnParams p = bshd(2048, 64, 1, 64);
  p.layout = FA_THD_THD_THD;
  p.mask_type = FA_PADDING_MASK;
  p.max_segments = 32;
  c = select_backend(p, FA_PLATFORM_CUDA, h100());
  EXPECT_EQ(c.forward, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "max_segments_per_seq")) << c.reason;
}

TEST(LargeIndex, HopperTileCountStaysInInt) {
  // A softcap causal call: the Hopper forward serves 2^30 tiles of 128 rows, not more
  // (its blocks step t += gridDim.x in int).
  BackendRequest req;
  req.score_mod.kind = ScoreModKind::kSoftcap;
  AttnParams p = bshd(1024, int64_t{1} << 17, 1024, 128);  // 1024 x 1024 x 1024 tiles = 2^30
  p.mask_type = FA_CAUSAL_MASK;
  EXPECT_EQ(hopper_fwd_unsupported_reason(p, req, h100()), "");
  p.batch = 1025;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, req, h100()), "2^30 tiles"));
  // Past 2^31 elements with few tiles: served.
  EXPECT_EQ(hopper_fwd_unsupported_reason(bshd(1, int64_t{1} << 20, 16, 128), req, h100()), "");
}

// ---- softmax: rows past 2^32 locate their mask rows in 64 bits

TEST(LargeIndex, SoftmaxMaskRowsPast2e32Rows) {
  // logits [2^15, 16, 2^14, 8] with a [2^15, 1, 2^14, 8] mask: 2^33 rows. The mask row
  // of logits row (b, h, i) is b * Sq + i.
  SoftmaxParams p{};
  p.rank = 4;
  const int64_t B = int64_t{1} << 15, H = 16, Sq = int64_t{1} << 14, Skv = 8;
  const int64_t dims[4] = {B, H, Sq, Skv}, mdims[4] = {B, 1, Sq, Skv};
  for (int i = 0; i < 4; ++i) p.dims[i] = dims[i], p.mask_dims[i] = mdims[i];
  p.has_mask = 1;
  p.dtype = FA_BFLOAT16;
  p.softmax_type = FA_SOFTMAX_SCALED_MASKED;
  ASSERT_TRUE(softmax::validate(p).ok()) << softmax::validate(p).message;
  const softmax::MaskRows m = softmax::make_mask_rows(p);
  const int64_t b = B - 1, h = H - 1, i = Sq - 3;
  const int64_t row = (b * H + h) * Sq + i;
  ASSERT_GT(row, k2e32);
  EXPECT_EQ(softmax::mask_row_offset<int64_t>(m, row), (b * Sq + i) * Skv);
  // The launch order visits every row once: the last launch index is a real row.
  int64_t r = 0, off = 0;
  softmax::locate_row<int64_t>(m, B * H * Sq - 1, &r, &off);
  EXPECT_LT(r, B * H * Sq);
  EXPECT_EQ(off, softmax::mask_row_offset<int64_t>(m, r));
}

TEST(LargeIndex, SoftmaxRejectsPast2e48Elements) {
  SoftmaxParams p{};
  p.rank = 3;
  const int64_t dims[3] = {int64_t{1} << 20, int64_t{1} << 20, int64_t{1} << 9};  // 2^49
  for (int i = 0; i < 3; ++i) p.dims[i] = dims[i];
  p.dtype = FA_BFLOAT16;
  p.softmax_type = FA_SOFTMAX_SCALED;
  const Status s = softmax::validate(p);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(has(s.message, "2^48")) << s.message;
}

// ---- small-seq: int32 tokens and work items, rejected past them with the limit named

SmallSeqParams small_seq_params(int64_t tokens_kv) {
  SmallSeqParams p{};
  p.packs = 1;
  p.num_segments = 1024;
  p.tokens_q = 1024;
  p.tokens_kv = tokens_kv;
  p.heads_q = p.heads_kv = 1;
  p.head_dim_qk = p.head_dim_v = 64;
  p.max_seqlen_q = 1;
  p.max_seqlen_kv = 64;
  p.window_left = p.window_right = -1;
  p.dtype = FA_BFLOAT16;
  p.layout = FA_THD_THD_THD;
  p.mask_type = FA_PADDING_MASK;
  p.bias_type = FA_NO_BIAS;
  p.softmax_type = FA_VANILLA_SOFTMAX;
  p.has_q_seqlens = p.has_kv_seqlens = p.has_offsets = 1;
  p.scale = 0.125f;
  return p;
}

TEST(LargeIndex, SmallSeqTokensStayInt32) {
  // k/v [1, 2^31 - 2, 1, 64]: 2^37 elements, indexed by int64 row offsets: valid.
  EXPECT_TRUE(small_seq::validate(small_seq_params(small_seq::kMaxTokens)).ok());
  const Status s = small_seq::validate(small_seq_params(small_seq::kMaxTokens + 1));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(has(s.message, "k/v tokens")) << s.message;
}

}  // namespace
}  // namespace fusedattn
