// select_backend() and the Hopper kernels' rules: which calls the Hopper forward and backward
// take (score_mods, head dims, sinks, dense masks, other biases, deterministic mode, plain
// calls by their checked-in measurements, THD, windows), which they decline and why, and the
// band (hopper/band.h) against mask.h's rule.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <utility>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/hopper/band.h"
#include "fusedattn/attention/hopper/measured.h"
#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/options.h"
#include "fusedattn/attention/params.h"
#include "attention/backend_cases.h"

namespace fusedattn {
namespace {

using test::expect_kernels;
using test::h100;
using test::has;
using test::hopper_params;
using test::with;

TEST(SelectBackend, SoftcapAndAlibiRunTheHopperForwardOnSm90) {
  for (ScoreModKind kind : {ScoreModKind::kSoftcap, ScoreModKind::kAlibi}) {
    for (int32_t mask : {FA_NO_MASK, FA_CAUSAL_MASK, FA_CAUSAL_BOTTOM_RIGHT_MASK}) {
      AttnParams p = hopper_params();
      p.mask_type = mask;
      const BackendChoice c =
          select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind), BackendOptions{});
      // Their backward runs the Hopper kernel too (tanh's derivative, ALiBi's bias in it).
      const bool softcap = kind == ScoreModKind::kSoftcap;
      expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      EXPECT_TRUE(has(c.reason, "forward hopper")) << c.reason;
      EXPECT_TRUE(has(c.reason, "backward hopper")) << c.reason;
      EXPECT_TRUE(has(c.reason, softcap ? "with softcap in the kernel" : "with ALiBi in the kernel")) << c.reason;
      EXPECT_TRUE(has(c.reason, kind == ScoreModKind::kSoftcap ? "softcap" : "ALiBi")) << c.reason;
    }
  }
}

// Head dims 64 and 256 run the same kernel with tiles of their own: score_mods always, plain
// calls by the table's rows of their head dim (never by the head dim 128 ones).
TEST(SelectBackend, HopperForwardTakesHeadDims64And256) {
  for (int64_t d : {64, 256}) {
    AttnParams p = hopper_params();
    p.head_dim_qk = p.head_dim_v = d;
    for (ScoreModKind kind : {ScoreModKind::kSoftcap, ScoreModKind::kAlibi})
      expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind), BackendOptions{}),
                     FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    p.mask_type = FA_CAUSAL_MASK, p.seqlen_q = p.seqlen_kv = 16384;
    const std::string measured = hopper_plain_measured(p);
    const std::string name = "head dim " + std::to_string(d);
    bool has_rows = false;
    for (const auto& row : hopper_rules::kMeasured) has_rows |= row.head_dim == d;
    if (!has_rows) EXPECT_TRUE(has(measured, name)) << measured;
    if (!measured.empty()) EXPECT_TRUE(has(measured, name)) << measured;
    const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), {}, BackendOptions{});
    // The backward by its own table.
    const bool hopper_bwd = hopper_plain_measured(p, /*backward=*/true).empty();
    expect_kernels(c, FA_BACKEND_CUDNN, measured.empty() ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDNN,
                   hopper_bwd ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN);
  }
}

// Sinks (off-by-one, learnable) join the kernel's epilogue: the Hopper forward keeps them
// (cuDNN's backward, 9.13 or newer, reads the lse they are in); older cuDNN sends the call to
// the flash branch, where softcap still runs the Hopper kernels both ways (sinks in its
// backward too) and a plain call the CUDA flash kernels.
TEST(SelectBackend, HopperForwardTakesSinks) {
  for (int32_t type : {FA_OFF_BY_ONE_SOFTMAX, FA_LEARNABLE_SOFTMAX}) {
    AttnParams p = hopper_params();
    p.softmax_type = type;
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap),
                                  BackendOptions{}),
                   FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    PlatformInfo old = h100();
    old.cudnn_version = 91200;
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, old, with(ScoreModKind::kSoftcap), BackendOptions{}),
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, old, BackendRequest{}, BackendOptions{});
    EXPECT_NE(c.forward, FA_BACKEND_HOPPER_FWD) << c.reason;
  }
}

// A dense boolean mask folded into a bias (kRequestMaskBias): the Hopper forward drops its
// keys and skips the tiles it empties, so it takes the forward whatever the table says
// (cuDNN would add the bias over every tile); a real bias, a pre-scale one, a score_mod or
// THD beside the mask, and vmap slices keep cuDNN.
TEST(SelectBackend, HopperForwardTakesDenseMasks) {
  AttnParams p = hopper_params();
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
  BackendRequest req;
  req.mask_bias = true;  // (its dbias wanted: the Hopper backward computes it)
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "dense mask")) << c.reason;
  req = with(ScoreModKind::kSoftcap);
  req.mask_bias = true;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, req, h100()), "as tiles only"));
  req = with(ScoreModKind::kAlibi);
  req.mask_bias = true;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, req, h100()), "as tiles only"));
  req = BackendRequest{};
  req.mask_bias = true;
  AttnParams sliced = p;
  sliced.batch = 4, sliced.num_slices = 2;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(sliced, req, h100()), "one vmap slice"));
}

// Any other bias: the forward adds it, reading its tiles through the copy engine where Skv
// is a multiple of 8 (faster than cuDNN's forward and the flash kernels', bench/RESULTS.md:
// then by default), else a score at a time (slower: only FUSEDATTN_HOPPER_FWD=1 sends it
// there; a post-scale bias then has cuDNN's forward, a pre-scale one the flash kernels'). The
// Hopper backward adds either, and computes dbias: without dbias always (faster than cuDNN's
// and the flash kernels' backward, bench/RESULTS.md), with it a pre-scale bias's always (the
// flash kernels' is the other choice: 1.7-2.0x), a post-scale one's with
// FUSEDATTN_HOPPER_BWD=1 (cuDNN's measured 1.2-2x faster).
TEST(SelectBackend, HopperKernelsAddOtherBiases) {
  AttnParams p = hopper_params();
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 2, p.bias_heads = 8;
  {  // Skv a multiple of 8: the Hopper forward by default (pre-scale: below), and the Hopper
     // backward with dbias where the bias has the call's extents (each element written once,
     // measured faster than cuDNN's); a broadcast one's float32 sums: cuDNN's backward
    BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    EXPECT_TRUE(has(c.reason, "adding the bias's tiles")) << c.reason;
    EXPECT_TRUE(has(c.reason, "adding the bias, with dbias")) << c.reason;
    for (auto [bb, bh] : {std::pair<int64_t, int64_t>{1, 8}, {2, 1}}) {
      AttnParams broadcast = p;
      broadcast.bias_batch = bb, broadcast.bias_heads = bh;
      c = select_backend(broadcast, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
      expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
      EXPECT_TRUE(has(c.reason, "broadcast bias's gradient")) << c.reason;
      BackendRequest none;  // no dbias wanted: the Hopper backward
      none.no_dbias = true;
      expect_kernels(select_backend(broadcast, FA_PLATFORM_CUDA, h100(), none, BackendOptions{}),
                     FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    }
    // Head dim 256: dbias with the causal band measured slower than cuDNN's, without a band
    // faster; no dbias wanted: the Hopper backward either way.
    AttnParams d256 = p;
    d256.head_dim_qk = d256.head_dim_v = 256;
    c = select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
    EXPECT_TRUE(has(c.reason, "head dim 256's dbias")) << c.reason;
    BackendRequest none;
    none.no_dbias = true;
    expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), none, BackendOptions{}),
                   FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    d256.mask_type = FA_NO_MASK;
    expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{}),
                   FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  }
  p.seqlen_kv = 500;  // rows not in 16-byte units
  for (bool no_dbias : {false, true}) {
    BackendRequest req;
    req.no_dbias = no_dbias;
    EXPECT_EQ(hopper_fwd_unsupported_reason(p, req, h100()), "");
    EXPECT_EQ(hopper_bwd_unsupported_reason(p, req, h100()), "");
    BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, no_dbias ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN);
    EXPECT_TRUE(has(c.reason, "read a score at a time")) << c.reason;
    EXPECT_EQ(has(c.reason, "adding the bias (no dbias)"), no_dbias) << c.reason;
    EXPECT_EQ(has(c.reason, "dbias measured slower"), !no_dbias) << c.reason;
    BackendOptions on;
    on.hopper_fwd = on.hopper_bwd = HopperMode::kAlways;
    c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, on);
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    EXPECT_EQ(has(c.reason, "adding the bias, with dbias"), !no_dbias) << c.reason;
    AttnParams pre = p;
    pre.bias_type = FA_PRE_SCALE_BIAS;
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_BWD);
    EXPECT_TRUE(has(c.reason, "backward hopper")) << c.reason;
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), req, on);
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    EXPECT_TRUE(has(c.reason, "PRE_SCALE_BIAS")) << c.reason;
    // Deterministic: the Hopper backward's ordered dQ, and dbias where the bias has the call's
    // extents (each element written once); a broadcast bias's dbias sums with atomics: none.
    BackendRequest det = req;
    det.deterministic = true;
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), det, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_BWD);
    AttnParams pre1h = pre;
    pre1h.bias_batch = 1;
    c = select_backend(pre1h, FA_PLATFORM_CUDA, h100(), det, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH,
                   no_dbias ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_NONE);
    EXPECT_EQ(has(hopper_bwd_unsupported_reason(pre1h, det, h100()), "atomics"), !no_dbias);
    // FUSEDATTN_HOPPER_BWD=0 and devices without wgmma keep the flash kernels' backward.
    BackendOptions off;
    off.hopper_bwd = HopperMode::kOff;
    expect_kernels(select_backend(pre, FA_PLATFORM_CUDA, h100(), req, off), FA_BACKEND_CUDA_FLASH,
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    PlatformInfo ampere = h100();
    ampere.sm = 80;
    expect_kernels(select_backend(pre, FA_PLATFORM_CUDA, ampere, req, BackendOptions{}),
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    // Head dim 256: the Hopper backward too (64-key blocks).
    AttnParams pre256 = pre;
    pre256.head_dim_qk = pre256.head_dim_v = 256;
    EXPECT_EQ(select_backend(pre256, FA_PLATFORM_CUDA, h100(), req, BackendOptions{}).backward,
              FA_BACKEND_HOPPER_BWD);
    // With softcap: the flash kernels (cuDNN would add the bias after the modifier, and
    // the Hopper kernels take softcap's bias as tiles only: Skv a multiple of 8, not here).
    BackendRequest sm = with(ScoreModKind::kSoftcap);
    sm.no_dbias = no_dbias;
    EXPECT_TRUE(has(hopper_fwd_unsupported_reason(pre, sm, h100()), "softcap takes a bias as tiles only"));
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), sm, on);
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    // With ALiBi: the Hopper forward where the bias comes as tiles (Skv a multiple of 8;
    // not here), the flash kernels' backward (the Hopper backward has no such variant).
    BackendRequest alibi = with(ScoreModKind::kAlibi);
    alibi.no_dbias = no_dbias;
    EXPECT_TRUE(has(hopper_fwd_unsupported_reason(pre, alibi, h100()), "as tiles only"));
    expect_kernels(select_backend(pre, FA_PLATFORM_CUDA, h100(), alibi, BackendOptions{}),
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    for (FaBiasType type : {FA_PRE_SCALE_BIAS, FA_POST_SCALE_BIAS}) {
      AttnParams tiles = pre;
      tiles.bias_type = type, tiles.seqlen_kv = 512;
      EXPECT_EQ(hopper_fwd_unsupported_reason(tiles, alibi, h100()), "");
      // The backward: the Hopper kernel's dense variants, with dbias or without.
      EXPECT_EQ(hopper_bwd_unsupported_reason(tiles, alibi, h100()), "");
      c = select_backend(tiles, FA_PLATFORM_CUDA, h100(), alibi, BackendOptions{});
      expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      BackendRequest slopes = alibi;  // the slopes' gradient too: summed in the Hopper backward
      slopes.score_mod_grads = true;
      expect_kernels(select_backend(tiles, FA_PLATFORM_CUDA, h100(), slopes, BackendOptions{}),
                     FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      // deterministic: dbias where the bias has the call's extents (each element written
      // once); a broadcast bias's sums with atomics (none then), as without ALiBi
      BackendRequest det = alibi;
      det.deterministic = true;
      expect_kernels(select_backend(tiles, FA_PLATFORM_CUDA, h100(), det, BackendOptions{}),
                     FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      AttnParams broadcast = tiles;
      broadcast.bias_batch = 1;
      expect_kernels(select_backend(broadcast, FA_PLATFORM_CUDA, h100(), det, BackendOptions{}),
                     FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD,
                     no_dbias ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_NONE);
      EXPECT_TRUE(has(c.reason, "ALiBi in the kernel")) << c.reason;
      BackendOptions no_tiles;  // FUSEDATTN_HOPPER_BIAS_TILE=0: no tiles, no ALiBi with a bias
      no_tiles.hopper_bias_tile = false;
      expect_kernels(select_backend(tiles, FA_PLATFORM_CUDA, h100(), alibi, no_tiles),
                     FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
      // softcap with the bias as tiles: the Hopper forward and its backward's dense variants
      // (dbias too), head dim 256's as well.
      EXPECT_EQ(hopper_fwd_unsupported_reason(tiles, sm, h100()), "");
      EXPECT_EQ(hopper_bwd_unsupported_reason(tiles, sm, h100()), "");
      c = select_backend(tiles, FA_PLATFORM_CUDA, h100(), sm, BackendOptions{});
      expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      EXPECT_TRUE(has(c.reason, "softcap in the kernel")) << c.reason;
      BackendRequest sm_det = sm;
      sm_det.deterministic = true;
      expect_kernels(select_backend(tiles, FA_PLATFORM_CUDA, h100(), sm_det, BackendOptions{}),
                     FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      expect_kernels(select_backend(tiles, FA_PLATFORM_CUDA, h100(), sm, no_tiles),
                     FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
      AttnParams tiles256 = tiles;
      tiles256.head_dim_qk = tiles256.head_dim_v = 256;
      EXPECT_EQ(hopper_bwd_unsupported_reason(tiles256, sm, h100()), "");
      c = select_backend(tiles256, FA_PLATFORM_CUDA, h100(), sm, BackendOptions{});
      expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      // ALiBi with the bias as tiles at head dim 256: the same (its slopes' gradient too).
      EXPECT_EQ(hopper_bwd_unsupported_reason(tiles256, alibi, h100()), "");
      BackendRequest slopes256 = alibi;
      slopes256.score_mod_grads = true;
      c = select_backend(tiles256, FA_PLATFORM_CUDA, h100(), slopes256, BackendOptions{});
      expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
      EXPECT_TRUE(has(c.reason, "slopes' gradient summed in the kernel")) << c.reason;
      tiles.scale = 0.0f;
      EXPECT_EQ(has(hopper_fwd_unsupported_reason(tiles, alibi, h100()), "scale != 0"),
                type == FA_POST_SCALE_BIAS);
      EXPECT_EQ(has(hopper_fwd_unsupported_reason(tiles, sm, h100()), "scale != 0"),
                type == FA_POST_SCALE_BIAS);
    }
  }
  // Head dim 256: the Hopper forward by the measurement (faster than the flash kernels'
  // there), for a pre-scale bias only; its backward the Hopper backward's (64-key blocks),
  // after either forward.
  AttnParams d256 = p;
  d256.head_dim_qk = d256.head_dim_v = 256;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  d256.bias_type = FA_PRE_SCALE_BIAS;
  BackendChoice c = select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "measured faster than the CUDA flash kernels")) << c.reason;
  BackendOptions off;
  off.hopper_fwd = HopperMode::kOff;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, off),
                 FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_BWD);
  off.hopper_bwd = HopperMode::kOff;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, off),
                 FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  // A bias of 2^31 elements or more in one batch entry (cuDNN indexes 32 bits; a broadcast
  // bias cannot be split into batch chunks): the Hopper kernels from the flash branch.
  AttnParams big = hopper_params();
  big.bias_type = FA_POST_SCALE_BIAS, big.bias_batch = 1, big.bias_heads = 32;
  big.heads_q = big.heads_kv = 32, big.head_dim_qk = big.head_dim_v = 64;
  big.seqlen_q = big.seqlen_kv = 8192;  // 32 x 8192^2 = 2^31
  BackendRequest nodb;
  nodb.no_dbias = true;
  c = select_backend(big, FA_PLATFORM_CUDA, h100(), nodb, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "2^31 - 1 elements")) << c.reason;
  big.seqlen_kv = 8184;  // just under: cuDNN's graph, the Hopper forward
  expect_kernels(select_backend(big, FA_PLATFORM_CUDA, h100(), nodb, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  // THD with a bias: the flash kernels.
  AttnParams thd = p;
  thd.bias_type = FA_PRE_SCALE_BIAS;
  thd.layout = FA_THD_THD_THD, thd.max_segments = 3, thd.mask_type = FA_PADDING_CAUSAL_MASK;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(thd, BackendRequest{}, h100()), "THD"));
}

// A dense mask's backward runs the Hopper backward (it skips the tiles the forward skips)
// at head dims 64, 128 and 256. Plain calls keep cuDNN's backward.
TEST(SelectBackend, HopperBackwardTakesDenseMasksWithoutDbias) {
  AttnParams p = hopper_params();
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
  BackendRequest req;
  req.mask_bias = true, req.no_dbias = true;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "backward hopper")) << c.reason;
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_BWD), "hopper");
  req.no_dbias = false;  // the bias carries a gradient: the kernel's dbias
  c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  req.no_dbias = true;
  AttnParams d64 = p;
  d64.head_dim_qk = d64.head_dim_v = 64;
  expect_kernels(select_backend(d64, FA_PLATFORM_CUDA, h100(), req, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  AttnParams d256 = p;
  d256.head_dim_qk = d256.head_dim_v = 256;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), req, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  // Deterministic mode at head dim 256: its ordered dQ (additions in turns) too.
  BackendRequest det256 = req;
  det256.deterministic = true;
  EXPECT_EQ(hopper_bwd_unsupported_reason(d256, det256, h100()), "");
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), det256, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  AttnParams d96 = p;
  d96.head_dim_qk = d96.head_dim_v = 96;
  EXPECT_TRUE(has(hopper_bwd_unsupported_reason(d96, req, h100()), "head dims"));
  // Sinks: the lse holds the extra logit, and a learnable one's gradient comes from the rows'
  // D (FlashBwdParams::dsinks).
  AttnParams sinks = p;
  for (int32_t type : {FA_OFF_BY_ONE_SOFTMAX, FA_LEARNABLE_SOFTMAX}) {
    sinks.softmax_type = type;
    EXPECT_EQ(hopper_bwd_unsupported_reason(sinks, req, h100()), "");
  }
  // Either forward's lse serves it: the forward on cuDNN, the backward still Hopper's;
  // FUSEDATTN_HOPPER_BWD=0 keeps it off.
  BackendOptions off;
  off.hopper_fwd = HopperMode::kOff;
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), req, off), FA_BACKEND_CUDNN,
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_BWD);
  off.hopper_bwd = HopperMode::kOff;
  c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, off);
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(c.reason, "FUSEDATTN_HOPPER_BWD=0")) << c.reason;
}

// A deterministic call (kRequestDeterministic): the Hopper backward wherever it can run,
// whatever the measurement says (its ordered dQ, O(S) memory); else cuDNN's deterministic
// backward; the CUDA flash kernels' backward (float32 atomics) is no backward for it.
TEST(SelectBackend, DeterministicCallsTakeAnOrderedBackward) {
  const BackendRequest det = request_from_flags(kRequestDeterministic);
  EXPECT_TRUE(det.deterministic);
  EXPECT_FALSE(request_from_flags(kRequestMaskBias).deterministic);
  for (int64_t d : {64, 128}) {
    AttnParams p = hopper_params();
    p.head_dim_qk = p.head_dim_v = d;
    for (int32_t mask : {FA_NO_MASK, FA_CAUSAL_MASK}) {
      p.mask_type = mask;
      BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), det, BackendOptions{});
      EXPECT_EQ(c.backend, FA_BACKEND_CUDNN) << c.reason;
      EXPECT_EQ(c.backward, FA_BACKEND_HOPPER_BWD) << c.reason;
      EXPECT_TRUE(has(c.reason, "deterministic dQ")) << c.reason;
      // The same call not deterministic: the measurement's verdict (cuDNN or Hopper).
      const std::string measured = hopper_plain_measured(p, /*backward=*/true);
      c = select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
      EXPECT_EQ(c.backward, measured.empty() ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN) << c.reason;
      EXPECT_FALSE(has(c.reason, "deterministic")) << c.reason;
    }
  }
  // softcap and ALiBi: their Hopper backward, deterministic too; another program: cuDNN's
  // deterministic algorithm.
  for (ScoreModKind kind : {ScoreModKind::kSoftcap, ScoreModKind::kAlibi, ScoreModKind::kOther}) {
    BackendRequest req = det;
    req.score_mod.kind = kind;
    const BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
    if (kind == ScoreModKind::kOther) {
      EXPECT_EQ(c.backward, FA_BACKEND_CUDNN) << c.reason;
    } else {
      EXPECT_EQ(c.backward, FA_BACKEND_HOPPER_BWD) << c.reason;
      EXPECT_TRUE(has(c.reason, "deterministic dQ")) << c.reason;
    }
  }
  // A dense mask (no dbias): the Hopper backward, deterministic.
  AttnParams masked = hopper_params();
  masked.bias_type = FA_POST_SCALE_BIAS, masked.bias_batch = masked.bias_heads = 1;
  BackendChoice c = select_backend(masked, FA_PLATFORM_CUDA, h100(),
                                   request_from_flags(kRequestDeterministic | kRequestMaskBias | kRequestNoDbias),
                                   BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "deterministic dQ")) << c.reason;
  // Head dim 256: the Hopper backward's ordered dQ too (ALiBi's as well); with
  // FUSEDATTN_HOPPER_BWD=0 cuDNN's deterministic algorithm.
  AttnParams d256 = hopper_params();
  d256.head_dim_qk = d256.head_dim_v = 256;
  c = select_backend(d256, FA_PLATFORM_CUDA, h100(), det, BackendOptions{});
  EXPECT_EQ(c.backward, FA_BACKEND_HOPPER_BWD) << c.reason;
  EXPECT_TRUE(has(c.reason, "deterministic dQ")) << c.reason;
  BackendRequest det_alibi = det;
  det_alibi.score_mod.kind = ScoreModKind::kAlibi;
  c = select_backend(d256, FA_PLATFORM_CUDA, h100(), det_alibi, BackendOptions{});
  EXPECT_EQ(c.backward, FA_BACKEND_HOPPER_BWD) << c.reason;
  EXPECT_TRUE(has(c.reason, "deterministic dQ")) << c.reason;
  BackendOptions off;
  off.hopper_bwd = HopperMode::kOff;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), det, off);
  EXPECT_EQ(c.backward, FA_BACKEND_CUDNN) << c.reason;
  EXPECT_TRUE(has(c.reason, "deterministic algorithm")) << c.reason;
  // float32 (the CUDA flash kernels): the forward runs, no deterministic backward.
  AttnParams f32 = hopper_params();
  f32.dtype = FA_FLOAT32;
  c = select_backend(f32, FA_PLATFORM_CUDA, h100(), det, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_NONE);
  EXPECT_TRUE(c.status.ok()) << c.status.message;
  EXPECT_TRUE(has(c.reason, "no deterministic backward")) << c.reason;
  c = select_backend(f32, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  // The CPU engine sums in order always: the flag changes nothing there.
  c = select_backend(f32, FA_PLATFORM_CPU, PlatformInfo{}, det, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH);
}

// Plain calls: the Hopper backward can run them (no THD; head dims 64, 128 and 256); the
// measurement (hopper/measured_bwd.h) decides, FUSEDATTN_HOPPER_BWD=1 forces it. softcap and
// ALiBi take it always, other score_mods never.
TEST(SelectBackend, HopperBackwardTakesPlainCallsByTheMeasurement) {
  const AttnParams plain = hopper_params();
  EXPECT_EQ(hopper_bwd_unsupported_reason(plain, BackendRequest{}, h100()), "");
  BackendOptions always;
  always.hopper_bwd = HopperMode::kAlways;
  BackendChoice c = select_backend(plain, FA_PLATFORM_CUDA, h100(), BackendRequest{}, always);
  EXPECT_EQ(c.backward, FA_BACKEND_HOPPER_BWD) << c.reason;
  EXPECT_TRUE(has(c.reason, "FUSEDATTN_HOPPER_BWD=1")) << c.reason;
  // By the measurement: the table's verdict, named in the reason either way.
  c = select_backend(plain, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
  const std::string measured = hopper_plain_measured(plain, /*backward=*/true);
  EXPECT_EQ(c.backward, measured.empty() ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN) << c.reason;
  EXPECT_TRUE(has(c.reason, measured.empty() ? "measured_bwd.h" : measured.c_str())) << c.reason;
  AttnParams thd = plain;
  thd.layout = FA_THD_THD_THD;
  thd.max_segments = 2;
  EXPECT_TRUE(has(hopper_bwd_unsupported_reason(thd, BackendRequest{}, h100()), "THD")) << thd.layout;
  // softcap and ALiBi: always the Hopper backward (no table); other programs: cuDNN's.
  EXPECT_EQ(hopper_bwd_unsupported_reason(plain, with(ScoreModKind::kSoftcap), h100()), "");
  BackendOptions off;
  off.hopper_bwd = HopperMode::kOff;
  c = select_backend(plain, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap), BackendOptions{});
  EXPECT_EQ(c.backward, FA_BACKEND_HOPPER_BWD) << c.reason;
  c = select_backend(plain, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap), off);
  EXPECT_EQ(c.backward, FA_BACKEND_CUDNN) << c.reason;
  EXPECT_EQ(hopper_bwd_unsupported_reason(plain, with(ScoreModKind::kAlibi), h100()), "");
  EXPECT_EQ(select_backend(plain, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kAlibi), BackendOptions{}).backward,
            FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(hopper_bwd_unsupported_reason(plain, with(ScoreModKind::kOther), h100()), "score_mod"));
  c = select_backend(plain, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kOther), always);
  EXPECT_EQ(c.backward, FA_BACKEND_CUDNN) << c.reason;
  AttnParams d256 = plain;
  d256.head_dim_qk = d256.head_dim_v = 256;
  EXPECT_EQ(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, always).backward, FA_BACKEND_HOPPER_BWD);
  // ALiBi at head dim 256 too (its variants since session 45), without the table.
  EXPECT_EQ(select_backend(d256, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kAlibi), BackendOptions{}).backward,
            FA_BACKEND_HOPPER_BWD);
  // A bias that is no dense mask: the kernel runs it (dbias too), the table does not decide it.
  AttnParams bias = plain;
  bias.bias_type = FA_POST_SCALE_BIAS, bias.bias_batch = 1, bias.bias_heads = 1;
  EXPECT_EQ(hopper_bwd_unsupported_reason(bias, BackendRequest{}, h100()), "");
}

// Without a score_mod the kernel's running max is q.k's, the scores' order only for a
// positive scale: scale <= 0 keeps cuDNN (a score_mod maps the scores itself).
TEST(SelectBackend, HopperForwardNeedsAPositiveScaleWithoutScoreMod) {
  for (float scale : {0.0f, -0.088f}) {
    AttnParams p = hopper_params();
    p.scale = scale;
    EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, BackendRequest{}, h100()), "scale > 0"));
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{}),
                   FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
    EXPECT_EQ(hopper_fwd_unsupported_reason(p, with(ScoreModKind::kSoftcap), h100()), "");
  }
}

// The kernel writes max_logit itself: asking for it keeps the Hopper forward.
TEST(SelectBackend, HopperForwardReturnsMaxLogit) {
  BackendRequest req = with(ScoreModKind::kSoftcap);
  req.want_max_logit = true;
  AttnParams p = hopper_params();
  EXPECT_EQ(hopper_fwd_unsupported_reason(p, req, h100()), "");
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
}

TEST(SelectBackend, HopperForwardServesPackedLayoutsAndFloat16) {
  AttnParams p = hopper_params();
  p.layout = FA_BS3HD, p.heads_kv = p.heads_q, p.dtype = FA_FLOAT16;
  const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(),
                                         with(ScoreModKind::kSoftcap), BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
}

TEST(SelectBackend, OptionsForceCudnnOverHopper) {
  BackendOptions off;
  off.hopper_fwd = HopperMode::kOff;
  BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(),
                                   with(ScoreModKind::kSoftcap), off);
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_BWD);  // each its own switch
  EXPECT_TRUE(has(c.reason, "FUSEDATTN_HOPPER_FWD=0")) << c.reason;
  off.hopper_bwd = HopperMode::kOff;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap), off);
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(c.reason, "FUSEDATTN_HOPPER_BWD=0")) << c.reason;
}

// Each call the Hopper forward does not take runs cuDNN both ways, and the reason says why.
struct HopperCase {
  const char* name;
  std::function<void(AttnParams&, BackendRequest&, PlatformInfo&)> edit;
  const char* why;
};

void PrintTo(const HopperCase& c, std::ostream* os) { *os << c.name; }

class HopperDeclines : public ::testing::TestWithParam<HopperCase> {};

TEST_P(HopperDeclines, CudnnRunsBothWays) {
  AttnParams p = hopper_params();
  BackendRequest req = with(ScoreModKind::kSoftcap);
  PlatformInfo info = h100();
  GetParam().edit(p, req, info);
  EXPECT_FALSE(hopper_fwd_unsupported_reason(p, req, info).empty());
  const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, info, req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(c.reason, "not the Hopper flash forward")) << c.reason;
  EXPECT_TRUE(has(c.reason, GetParam().why)) << c.reason;
}

const HopperCase kHopperDeclines[] = {
    {"sm80", [](AttnParams&, BackendRequest&, PlatformInfo& i) { i.sm = 80; },
     "compute capability 9.0"},
    {"sm100", [](AttnParams&, BackendRequest&, PlatformInfo& i) { i.sm = 100; },
     "the device has 10.0"},
    {"head_dim_192", [](AttnParams& p, BackendRequest&, PlatformInfo&) {
       p.head_dim_qk = p.head_dim_v = 192; }, "head dims 64, 128 and 256"},
    {"head_dim_v_64", [](AttnParams& p, BackendRequest&, PlatformInfo&) { p.head_dim_v = 64; },
     "head dims 64, 128 and 256"},
    {"dropout", [](AttnParams& p, BackendRequest&, PlatformInfo&) { p.dropout = 0.1f; },
     "dropout"},
    {"alibi_under_vmap", [](AttnParams& p, BackendRequest& r, PlatformInfo&) {
       r.score_mod.kind = ScoreModKind::kAlibi, p.batch = 4, p.num_slices = 2; },
     "one vmap slice"},
};

INSTANTIATE_TEST_SUITE_P(Calls, HopperDeclines, ::testing::ValuesIn(kHopperDeclines),
                         [](const ::testing::TestParamInfo<HopperCase>& c) {
                           return std::string(c.param.name);
                         });

// cuDNN declines these too (so select_backend answers xla_reference), but the rule is the
// kernel's own.
TEST(HopperFwdUnsupported, BottomRightCausalNeedsSqAtMostSkv) {
  AttnParams p = hopper_params();
  p.mask_type = FA_CAUSAL_BOTTOM_RIGHT_MASK, p.seqlen_q = 1024;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, with(ScoreModKind::kSoftcap), h100()),
                  "without keys (Sq > Skv)"));
  p.seqlen_q = 256;
  EXPECT_EQ(hopper_fwd_unsupported_reason(p, with(ScoreModKind::kSoftcap), h100()), "");
  p.mask_type = FA_NO_MASK, p.seqlen_q = 512, p.seqlen_kv = 256, p.window_left = 64;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, {}, h100()), "without keys")) << p.window_left;
  p.window_left = 256;  // row 511 keeps keys from 255
  EXPECT_EQ(hopper_fwd_unsupported_reason(p, {}, h100()), "");
}

// Plain calls (no score_mod): the Hopper forward where the measurement says so (kMeasured,
// the default), wherever it can run (kAlways), never (kOff); a general score_mod: cuDNN.
TEST(SelectBackend, HopperForwardTakesPlainCallsByTheMeasurement) {
  const AttnParams p = hopper_params();
  const std::string measured = hopper_plain_measured(p);
  const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), {}, BackendOptions{});
  if (measured.empty()) {
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
    EXPECT_TRUE(has(c.reason, "measured faster than cuDNN")) << c.reason;
  } else {
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
    EXPECT_TRUE(has(c.reason, measured)) << c.reason;
  }
  BackendOptions always;
  always.hopper_fwd = HopperMode::kAlways;
  const BackendChoice a = select_backend(p, FA_PLATFORM_CUDA, h100(), {}, always);
  expect_kernels(a, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(a.reason, "plain call")) << a.reason;
  BackendOptions off;
  off.hopper_fwd = HopperMode::kOff;
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), {}, off), FA_BACKEND_CUDNN,
                 FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kOther), always),
                 FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, with(ScoreModKind::kOther), h100()),
                  "softcap and ALiBi only"));
}

// THD: softcap / ALiBi calls run the Hopper forward; plain ones by the table's THD rows
// (hopper/measured.h), or forced.
TEST(SelectBackend, HopperForwardTakesThd) {
  AttnParams p = hopper_params();
  p.layout = FA_THD_THD_THD, p.mask_type = FA_PADDING_CAUSAL_MASK, p.max_segments = 8;
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap), BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
  const std::string measured = hopper_plain_measured(p);  // the THD rows of the table
  const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), {}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, measured.empty() ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDNN,
                 FA_BACKEND_CUDNN);
  if (!measured.empty()) EXPECT_TRUE(has(measured, "THD calls")) << measured;
  BackendOptions always;
  always.hopper_fwd = HopperMode::kAlways;
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), {}, always), FA_BACKEND_CUDNN,
                 FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
  p.max_segments = int64_t{1} << 26;  // 2 rows x 2^26 segments x 8 heads x 4 blocks: past 2^30 tiles
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, {}, h100()), "2^30 tiles"));
  p.max_segments = 1, p.batch = (int64_t{1} << 31) / p.seqlen_q;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, {}, h100()), "THD token indices are int32"));
}

TEST(SelectBackend, HopperForwardTakesSlidingWindows) {
  BackendOptions always;
  always.hopper_fwd = HopperMode::kAlways;
  for (auto [mask, left, right] : {std::tuple{FA_CAUSAL_MASK, 64, 0},
                                   std::tuple{FA_NO_MASK, -1, 4},
                                   std::tuple{FA_NO_MASK, 100, 7},
                                   std::tuple{FA_CAUSAL_BOTTOM_RIGHT_MASK, 300, -1}}) {
    AttnParams p = hopper_params();
    p.mask_type = mask, p.window_left = left, p.window_right = right;
    for (ScoreModKind kind : {ScoreModKind::kNone, ScoreModKind::kSoftcap}) {
      const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind), always);
      expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD,
                     kind == ScoreModKind::kSoftcap ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN);
    }
  }
}

// The band (hopper/band.h) restates mask.h's rule as the kernel's two diagonals.
TEST(HopperBand, AgreesWithSegmentKeys) {
  for (int32_t mask : {FA_NO_MASK, FA_CAUSAL_MASK, FA_CAUSAL_BOTTOM_RIGHT_MASK})
    for (auto [left, right] : {std::pair{-1, -1}, std::pair{0, 0}, std::pair{5, -1},
                               std::pair{-1, 3}, std::pair{17, 2}, std::pair{1000, 1000}})
      for (auto [sq, skv] : {std::pair{40, 40}, std::pair{13, 50}, std::pair{50, 13}}) {
        AttnParams p = test::plain_call(1, sq, skv, 1, 1, 128, 128, 1.0f);
        p.mask_type = mask, p.window_left = left, p.window_right = right;
        const hopper_rules::Band b = hopper_rules::band(p);
        const MaskRule r = mask_rule(mask, left, right);
        const bool empty_rows = *hopper_rules::band_empty_rows(p, b) != 0;
        bool any_empty = false;
        for (int64_t i = 0; i < sq; ++i) {
          const KeyRange k = segment_keys(r, i, sq, skv);
          any_empty |= k.lo == k.hi;
          for (int64_t j = 0; j < skv; ++j) {
            const int64_t base = b.bottom_right ? skv - sq : 0;
            const bool kept = (!b.causal || j <= i + base + b.diag) &&
                              (!b.left_bound || j >= i + base + b.lo_diag);
            ASSERT_EQ(kept, j >= k.lo && j < k.hi)
                << "mask " << mask << " window " << left << "," << right << " S " << sq << "/"
                << skv << " i " << i << " j " << j;
          }
        }
        EXPECT_EQ(empty_rows, any_empty) << "mask " << mask << " window " << left << "," << right
                                         << " S " << sq << "/" << skv;
      }
}

}  // namespace
}  // namespace fusedattn
