// select_backend(): the forward and backward kernels each platform gets, and why (the
// Hopper forward's conditions given as request fields and PlatformInfo, its knob as
// BackendOptions); recognize_score_mod() on the programs the Hopper forward takes; and
// parse_backend_options() on every knob of options.h.
#include <gtest/gtest.h>

#include <functional>
#include <tuple>
#include <map>
#include <string>
#include <vector>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/hopper/band.h"
#include "fusedattn/attention/hopper/measured.h"
#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/options.h"
#include "fusedattn/attention/params.h"
#include "attention/plain_call.h"
#include "score_mod/programs.h"

namespace fusedattn {
namespace {

using test::h100;
using test::program;

// A bf16 causal call the Hopper forward can take when its score_mod is softcap or ALiBi:
// q [2, 512, 8, 128], k/v [2, 512, 2, 128].
AttnParams hopper_params() {
  AttnParams p = test::plain_call(2, 512, 512, 8, 2, 128, 128, 0.088f);
  p.mask_type = FA_CAUSAL_MASK;
  p.is_training = 1;
  return p;
}

BackendRequest with(ScoreModKind kind) {
  BackendRequest r;
  r.score_mod.kind = kind;
  return r;
}

bool has(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

void expect_kernels(const BackendChoice& c, int32_t backend, int32_t forward, int32_t backward) {
  EXPECT_TRUE(c.status.ok()) << c.status.message;
  EXPECT_STREQ(backend_name(c.backend), backend_name(backend)) << c.reason;
  EXPECT_STREQ(backend_name(c.forward), backend_name(forward)) << c.reason;
  EXPECT_STREQ(backend_name(c.backward), backend_name(backward)) << c.reason;
}

TEST(SelectBackend, CpuRunsTheCpuEngineBothWays) {
  for (ScoreModKind kind : {ScoreModKind::kNone, ScoreModKind::kSoftcap, ScoreModKind::kOther}) {
    const BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CPU, h100(), with(kind),
                                           BackendOptions{});
    expect_kernels(c, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH);
    EXPECT_TRUE(has(c.reason, "cpu_flash")) << c.reason;
  }
}

TEST(SelectBackend, CudaWithoutCudnnRunsTheReferenceBothWays) {
  const BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, PlatformInfo{},
                                         with(ScoreModKind::kSoftcap), BackendOptions{});
  expect_kernels(c, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE);
  EXPECT_TRUE(has(c.reason, "xla_reference")) << c.reason;
  EXPECT_TRUE(has(c.reason, "no CUDA kernels")) << c.reason;
}

TEST(SelectBackend, OtherScoreModsRunCudnn) {
  const BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(),
                                         with(ScoreModKind::kOther), BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  EXPECT_FALSE(has(c.reason, "Hopper")) << c.reason;
}

BackendOptions flash_score_mod(bool on = true) {
  BackendOptions o;
  o.flash_score_mod = on;
  return o;
}

TEST(SelectBackend, ScoreModWithABiasRunsTheCudaFlashKernels) {
  // cuDNN would add the bias after the score_mod; the CPU engine (and the CUDA flash
  // kernels) apply it before.
  for (ScoreModKind kind : {ScoreModKind::kSoftcap, ScoreModKind::kOther}) {
    AttnParams p = hopper_params();
    p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
    const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind),
                                           flash_score_mod());
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    EXPECT_TRUE(has(c.reason, "bias after the score_mod")) << c.reason;
    // The default is on; turned off, XLA's reference, saying why.
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind), BackendOptions{}),
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    const BackendChoice off = select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind),
                                             flash_score_mod(false));
    expect_kernels(off, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE,
                   FA_BACKEND_XLA_REFERENCE);
    EXPECT_TRUE(has(off.reason, "FUSEDATTN_FLASH_SCORE_MOD=0")) << off.reason;
    expect_kernels(select_backend(p, FA_PLATFORM_CPU, h100(), with(kind), BackendOptions{}),
                   FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH);
  }
  AttnParams p = hopper_params();  // without a score_mod the bias goes to cuDNN
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
}

// A score_mod whose array operands' gradient the caller takes: cuDNN's backward computes
// none, so the CUDA flash kernels take the call while their score_mod path is on (the
// default).
TEST(SelectBackend, ScoreModOperandGradientsRunTheCudaFlashKernelsWhenOn) {
  BackendRequest req = with(ScoreModKind::kOther);
  req.score_mod_grads = true;
  BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, flash_score_mod());
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "gradient of the score_mod's operands")) << c.reason;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, flash_score_mod(false));
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  req.score_mod_grads = false;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, flash_score_mod());
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
}

// Where the CUDA flash kernels cannot run a score_mod (the wmma kernels' head dims, a
// program past the device limits), XLA's reference does.
TEST(SelectBackend, ScoreModsTheFlashKernelsCannotRunGoToTheReference) {
  AttnParams p = hopper_params();
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
  p.head_dim_qk = p.head_dim_v = 100;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kOther),
                                   flash_score_mod());
  expect_kernels(c, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE);
  EXPECT_TRUE(has(c.reason, "multiples of 8")) << c.reason;
  p.head_dim_qk = p.head_dim_v = 128;
  BackendRequest req = with(ScoreModKind::kOther);
  req.score_mod.device_limit = "the programs hold 2000 instructions; the limit is 1024";
  c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, flash_score_mod());
  expect_kernels(c, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE);
  EXPECT_TRUE(has(c.reason, "1024")) << c.reason;
}

// Every call cuDNN declines runs the CUDA flash kernels, forward and backward.
TEST(SelectBackend, CallsCudnnDeclinesRunTheCudaFlashKernels) {
  std::vector<std::pair<std::string, AttnParams>> cases;
  AttnParams p = hopper_params();
  p.dtype = FA_FLOAT32;
  cases.push_back({"float32", p});
  p = hopper_params();
  p.bias_type = FA_PRE_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 8;
  cases.push_back({"PRE_SCALE_BIAS", p});
  p = hopper_params();
  p.head_dim_qk = p.head_dim_v = 100;
  cases.push_back({"multiples of 8", p});
  p = hopper_params();
  p.layout = FA_THD_THD_THD, p.max_segments = 3, p.mask_type = FA_PADDING_CAUSAL_MASK;
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 2, p.bias_heads = 8;
  cases.push_back({"THD", p});
  p = hopper_params();
  p.seqlen_q = 600, p.mask_type = FA_CAUSAL_BOTTOM_RIGHT_MASK;
  cases.push_back({"Sq <= Skv", p});
  for (const auto& [why, call] : cases) {
    BackendChoice c = select_backend(call, FA_PLATFORM_CUDA, h100(), BackendRequest{},
                                     BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    EXPECT_TRUE(has(c.reason, "cuda_flash")) << c.reason;
    EXPECT_TRUE(has(c.reason, why)) << why << ": " << c.reason;
    // FUSEDATTN_HOPPER_FWD=1: the Hopper forward takes the forward of those it can (a
    // pre-scale bias), the flash kernels the backward from its lse; not on a device
    // without wgmma.
    const bool hopper = why == "PRE_SCALE_BIAS";
    BackendOptions always;
    always.hopper_fwd = HopperMode::kAlways;
    c = select_backend(call, FA_PLATFORM_CUDA, h100(), BackendRequest{}, always);
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, hopper ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDA_FLASH,
                   FA_BACKEND_CUDA_FLASH);
    EXPECT_EQ(has(c.reason, "forward hopper"), hopper) << c.reason;
    PlatformInfo ampere = h100();
    ampere.sm = 80;
    expect_kernels(select_backend(call, FA_PLATFORM_CUDA, ampere, BackendRequest{}, always),
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  }
}

TEST(SelectBackend, IndexBaseAndRejectedGraphsRunTheCudaFlashKernels) {
  BackendRequest req;
  req.index_base = true;
  BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "index_base")) << c.reason;
  req = BackendRequest{};
  req.cudnn_rejected = true;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "rejected")) << c.reason;
  // FUSEDATTN_HOPPER_FWD=1: the Hopper forward takes the forward it can run (not with an
  // index_base, nor at head dims it lacks).
  BackendOptions always;
  always.hopper_fwd = HopperMode::kAlways;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, always);
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDA_FLASH);
  AttnParams d96 = hopper_params();
  d96.head_dim_qk = d96.head_dim_v = 96;
  c = select_backend(d96, FA_PLATFORM_CUDA, h100(), req, always);
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  req.index_base = true;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, always);
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
}

TEST(SelectBackend, BroadcastDropoutRunsTheCudaFlashKernels) {
  // One dropout mask for every batch entry and head: cuDNN draws one per (batch, head).
  AttnParams p = hopper_params();
  p.is_training = 1, p.dropout = 0.1f;
  BackendRequest req;
  req.dropout_broadcast = true;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "dropout_broadcast")) << c.reason;
  // Without dropout the flag changes nothing.
  p.dropout = 0.0f;
  c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  EXPECT_NE(c.backend, FA_BACKEND_CUDA_FLASH) << c.reason;
  // On the CPU the engine does it.
  p.dropout = 0.1f;
  c = select_backend(p, FA_PLATFORM_CPU, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH);
}

TEST(SelectBackend, CudaFlashNeedsSm80AndTheSharedMemory) {
  AttnParams p = hopper_params();
  p.dtype = FA_FLOAT32;
  PlatformInfo turing = h100();
  turing.sm = 75;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, turing, BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE);
  EXPECT_TRUE(has(c.reason, "8.0 or newer")) << c.reason;
  // float32 at head dim 512 needs ~170 KB: an H100 has it, a 100 KB device does not.
  p.head_dim_qk = p.head_dim_v = 512;
  c = select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  PlatformInfo small = h100();
  small.smem_optin = 101376;
  c = select_backend(p, FA_PLATFORM_CUDA, small, BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE);
  EXPECT_TRUE(has(c.reason, "shared memory")) << c.reason;
}

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
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap),
                                  BackendOptions{}),
                   FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, d == 64 ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN);
    p.mask_type = FA_CAUSAL_MASK, p.seqlen_q = p.seqlen_kv = 16384;
    const std::string measured = hopper_plain_measured(p);
    const std::string name = "head dim " + std::to_string(d);
    bool has_rows = false;
    for (const auto& row : hopper_rules::kMeasured) has_rows |= row.head_dim == d;
    if (!has_rows) EXPECT_TRUE(has(measured, name)) << measured;
    if (!measured.empty()) EXPECT_TRUE(has(measured, name)) << measured;
    const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), {}, BackendOptions{});
    // The backward by its own table (head dim 64 only: the Hopper backward takes no 256).
    const bool hopper_bwd = d == 64 && hopper_plain_measured(p, /*backward=*/true).empty();
    expect_kernels(c, FA_BACKEND_CUDNN, measured.empty() ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDNN,
                   hopper_bwd ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDNN);
  }
}

// Sinks (off-by-one, learnable) join the kernel's epilogue: the Hopper forward keeps them
// (cuDNN's backward, 9.13 or newer, reads the lse they are in); older cuDNN sends the call to
// the CUDA flash kernels both ways.
TEST(SelectBackend, HopperForwardTakesSinks) {
  for (int32_t type : {FA_OFF_BY_ONE_SOFTMAX, FA_LEARNABLE_SOFTMAX}) {
    AttnParams p = hopper_params();
    p.softmax_type = type;
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(ScoreModKind::kSoftcap),
                                  BackendOptions{}),
                   FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
    PlatformInfo old = h100();
    old.cudnn_version = 91200;
    const BackendChoice c =
        select_backend(p, FA_PLATFORM_CUDA, old, with(ScoreModKind::kSoftcap), BackendOptions{});
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
  req.mask_bias = true;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(c.reason, "dense mask")) << c.reason;
  req = with(ScoreModKind::kSoftcap);
  req.mask_bias = true;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(p, req, h100()), "before the score_mod"));
  req = BackendRequest{};
  req.mask_bias = true;
  AttnParams sliced = p;
  sliced.batch = 4, sliced.num_slices = 2;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(sliced, req, h100()), "one vmap slice"));
}

// Any other bias: the kernel adds it, but slower than cuDNN and the CUDA flash kernels
// (bench/RESULTS.md), so only FUSEDATTN_HOPPER_FWD=1 sends it there: a post-scale bias with
// cuDNN's backward, a pre-scale one (cuDNN serves none) with the CUDA flash backward. The
// Hopper backward takes neither, dbias wanted or not.
TEST(SelectBackend, HopperForwardAddsOtherBiases) {
  AttnParams p = hopper_params();
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 2, p.bias_heads = 8;
  for (bool no_dbias : {false, true}) {
    BackendRequest req;
    req.no_dbias = no_dbias;
    EXPECT_EQ(hopper_fwd_unsupported_reason(p, req, h100()), "");
    EXPECT_TRUE(has(hopper_bwd_unsupported_reason(p, req, h100()), "folded boolean mask"));
    BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
    EXPECT_TRUE(has(c.reason, "its bias path measured slower")) << c.reason;
    BackendOptions on;
    on.hopper_fwd = on.hopper_bwd = HopperMode::kAlways;
    c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, on);
    expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
    AttnParams pre = p;
    pre.bias_type = FA_PRE_SCALE_BIAS;
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), req, on);
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDA_FLASH);
    EXPECT_TRUE(has(c.reason, "PRE_SCALE_BIAS")) << c.reason;
    // With a score_mod the kernels would add it after the modifier: the flash kernels.
    BackendRequest sm = with(ScoreModKind::kSoftcap);
    sm.no_dbias = no_dbias;
    EXPECT_TRUE(has(hopper_fwd_unsupported_reason(pre, sm, h100()), "before the score_mod"));
    c = select_backend(pre, FA_PLATFORM_CUDA, h100(), sm, on);
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  }
  // Head dim 256: the Hopper forward by the measurement (faster than the flash kernels'
  // there), for a pre-scale bias only.
  AttnParams d256 = p;
  d256.head_dim_qk = d256.head_dim_v = 256;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_CUDNN, FA_BACKEND_CUDNN);
  d256.bias_type = FA_PRE_SCALE_BIAS;
  BackendChoice c = select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "measured faster than the CUDA flash kernels")) << c.reason;
  BackendOptions off;
  off.hopper_fwd = HopperMode::kOff;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, off),
                 FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  // THD with a bias: the flash kernels.
  AttnParams thd = p;
  thd.bias_type = FA_PRE_SCALE_BIAS;
  thd.layout = FA_THD_THD_THD, thd.max_segments = 3, thd.mask_type = FA_PADDING_CAUSAL_MASK;
  EXPECT_TRUE(has(hopper_fwd_unsupported_reason(thd, BackendRequest{}, h100()), "THD"));
}

// A dense mask's backward runs the Hopper backward (it skips the tiles the forward skips)
// when no dbias is wanted, at head dims 64 and 128; else cuDNN's. Plain calls keep cuDNN's backward.
TEST(SelectBackend, HopperBackwardTakesDenseMasksWithoutDbias) {
  AttnParams p = hopper_params();
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
  BackendRequest req;
  req.mask_bias = true, req.no_dbias = true;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "backward hopper")) << c.reason;
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_BWD), "hopper");
  req.no_dbias = false;  // the bias carries a gradient
  c = select_backend(p, FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(c.reason, "no dbias")) << c.reason;
  req.no_dbias = true;
  AttnParams d64 = p;
  d64.head_dim_qk = d64.head_dim_v = 64;
  expect_kernels(select_backend(d64, FA_PLATFORM_CUDA, h100(), req, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  AttnParams d256 = p;
  d256.head_dim_qk = d256.head_dim_v = 256;
  expect_kernels(select_backend(d256, FA_PLATFORM_CUDA, h100(), req, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
  EXPECT_TRUE(has(hopper_bwd_unsupported_reason(d256, req, h100()), "head dims 64 and 128"));
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
  // Head dim 256 (and FUSEDATTN_HOPPER_BWD=0): cuDNN's deterministic algorithm.
  AttnParams d256 = hopper_params();
  d256.head_dim_qk = d256.head_dim_v = 256;
  c = select_backend(d256, FA_PLATFORM_CUDA, h100(), det, BackendOptions{});
  EXPECT_EQ(c.backward, FA_BACKEND_CUDNN) << c.reason;
  EXPECT_TRUE(has(c.reason, "deterministic algorithm")) << c.reason;
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

// Plain calls: the Hopper backward can run them (no THD; head dims 64 and 128); the
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
  EXPECT_EQ(select_backend(d256, FA_PLATFORM_CUDA, h100(), BackendRequest{}, always).backward, FA_BACKEND_CUDNN);
  // A bias that is no dense mask: cuDNN's backward (its forward's rules decline it too).
  AttnParams bias = plain;
  bias.bias_type = FA_POST_SCALE_BIAS, bias.bias_batch = 1, bias.bias_heads = 1;
  EXPECT_NE(hopper_bwd_unsupported_reason(bias, BackendRequest{}, h100()), "");
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

TEST(SelectBackend, InvalidCallsGetNoKernel) {
  AttnParams p = hopper_params();
  p.heads_q = 3;
  for (int32_t platform : {FA_PLATFORM_CPU, FA_PLATFORM_CUDA}) {
    const BackendChoice c =
        select_backend(p, platform, h100(), with(ScoreModKind::kSoftcap), BackendOptions{});
    EXPECT_EQ(c.status.code, FA_INVALID_ARGUMENT);
    EXPECT_EQ(c.backend, FA_BACKEND_NONE);
    EXPECT_EQ(c.forward, FA_BACKEND_NONE);
    EXPECT_EQ(c.backward, FA_BACKEND_NONE);
  }
}

TEST(BackendNames, HopperHasOne) {
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_FWD), "hopper");
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_BWD), "hopper");
  EXPECT_STREQ(backend_name(FA_BACKEND_HOPPER_BWD + 1), "unknown");
}

// --- recognize_score_mod ----------------------------------------------------------

const int64_t kExt[4] = {2, 8, 512, 512};

// [0 operands, fwd, bwd]
std::vector<int32_t> no_operand_attr(const std::vector<int32_t>& fwd) {
  std::vector<int32_t> a = {0};
  const auto bwd = program(6, {{SM_CONST, 0, 0, 0}}, {1.0f});
  a.insert(a.end(), fwd.begin(), fwd.end());
  a.insert(a.end(), bwd.begin(), bwd.end());
  return a;
}

ScoreModForm form_of(const std::vector<int32_t>& attr) {
  ScoreMod sm;
  EXPECT_TRUE(decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm).ok());
  return recognize_score_mod(&sm);
}

TEST(RecognizeScoreMod, NoneSoftcapAlibiOther) {
  EXPECT_EQ(recognize_score_mod(nullptr).kind, ScoreModKind::kNone);

  // tanh(s / 30) * 30
  const ScoreModForm cap = form_of(no_operand_attr(program(
      5, {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0}, {SM_MUL, 7, 5, 0}},
      {30.0f})));
  EXPECT_EQ(cap.kind, ScoreModKind::kSoftcap);
  EXPECT_FLOAT_EQ(cap.softcap_k1, 30.0f);
  EXPECT_FLOAT_EQ(cap.softcap_k2, 1.0f / 30.0f);

  // s - slopes[h] * (q - kv), slopes [1, 8, 1, 1]
  std::vector<int32_t> alibi = {1, 1, 8, 1, 1};
  for (const auto& prog : {program(6, {{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0}},
                                   {}),
                           program(7, {{SM_CONST, 0, 0, 0}}, {1.0f}),
                           program(7, {{SM_CONST, 0, 0, 0}}, {0.0f})})
    alibi.insert(alibi.end(), prog.begin(), prog.end());
  const ScoreModForm a = form_of(alibi);
  EXPECT_EQ(a.kind, ScoreModKind::kAlibi);
  EXPECT_EQ(a.alibi.sign, 1.0f);
  EXPECT_FALSE(a.alibi.abs);

  // s * 2
  const ScoreModForm other =
      form_of(no_operand_attr(program(5, {{SM_CONST, 0, 0, 0}, {SM_MUL, 0, 5, 0}}, {2.0f})));
  EXPECT_EQ(other.kind, ScoreModKind::kOther);
}

// --- parse_backend_options ------------------------------------------------------------

BackendOptions parse(const std::map<std::string, std::string>& env) {
  return parse_backend_options([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ParseBackendOptions, DefaultsWithNothingSet) {
  const BackendOptions o = parse({});
  EXPECT_EQ(o.hopper_fwd, HopperMode::kMeasured);
  EXPECT_TRUE(o.flash_score_mod);
  EXPECT_EQ(o.cudnn_heur, CudnnHeur::kA);
  EXPECT_FALSE(o.cudnn_plan.has_value());
  EXPECT_FALSE(o.cudnn_engine.has_value());
  EXPECT_FALSE(o.cudnn_kernel_cfg.has_value());
  EXPECT_FALSE(o.cudnn_plan_log);
  EXPECT_EQ(o.f32_matmul, F32Matmul::kAsCalled);
}

TEST(ParseBackendOptions, FlashScoreModOffOnlyWithZero) {
  EXPECT_TRUE(parse({{"FUSEDATTN_FLASH_SCORE_MOD", "1"}}).flash_score_mod);
  EXPECT_FALSE(parse({{"FUSEDATTN_FLASH_SCORE_MOD", "0"}}).flash_score_mod);
  EXPECT_TRUE(parse({{"FUSEDATTN_FLASH_SCORE_MOD", "yes"}}).flash_score_mod);
}

TEST(ParseBackendOptions, Float32MatmulFollowsTheCallUnlessForced) {
  EXPECT_EQ(parse({{"FUSEDATTN_F32_MATMUL", "tf32"}}).f32_matmul, F32Matmul::kTf32);
  EXPECT_EQ(parse({{"FUSEDATTN_F32_MATMUL", "float32"}}).f32_matmul, F32Matmul::kExact);
  EXPECT_EQ(parse({{"FUSEDATTN_F32_MATMUL", "TF32 "}}).f32_matmul, F32Matmul::kAsCalled);
  // As called: TF32 unless the call asks float32 accuracy (kRequestF32Exact).
  const BackendOptions called = parse({});
  EXPECT_TRUE(f32_tf32(called, false));
  EXPECT_FALSE(f32_tf32(called, true));
  const BackendOptions tf32 = parse({{"FUSEDATTN_F32_MATMUL", "tf32"}});
  EXPECT_TRUE(f32_tf32(tf32, false));
  EXPECT_TRUE(f32_tf32(tf32, true));
  const BackendOptions exact = parse({{"FUSEDATTN_F32_MATMUL", "float32"}});
  EXPECT_FALSE(f32_tf32(exact, false));
  EXPECT_FALSE(f32_tf32(exact, true));
}

TEST(ParseBackendOptions, HopperForwardOffAlwaysOrMeasured) {
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_FWD", "0"}}).hopper_fwd, HopperMode::kOff);
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_FWD", "1"}}).hopper_fwd, HopperMode::kAlways);
  for (const char* v : {"", "off", "00", "2"})
    EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_FWD", v}}).hopper_fwd, HopperMode::kMeasured) << v;
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_BWD", "0"}}).hopper_bwd, HopperMode::kOff);
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_BWD", "1"}}).hopper_bwd, HopperMode::kAlways);
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_BWD", "1"}}).hopper_fwd, HopperMode::kMeasured);
  EXPECT_EQ(parse({}).hopper_bwd, HopperMode::kMeasured);
}

TEST(ParseBackendOptions, HopperPersistentIsANumberWhenSet) {
  EXPECT_FALSE(parse({}).hopper_persistent.has_value());
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_PERSISTENT", "1"}}).hopper_persistent, 1);
  EXPECT_EQ(parse({{"FUSEDATTN_HOPPER_PERSISTENT", "0"}}).hopper_persistent, 0);
}

TEST(BackendOptions, HopperOverrideAppliesAndResets) {
  const HopperMode env = backend_options().hopper_fwd;
  set_hopper_fwd_override(1);
  EXPECT_EQ(backend_options().hopper_fwd, HopperMode::kAlways);
  set_hopper_fwd_override(0);
  EXPECT_EQ(backend_options().hopper_fwd, HopperMode::kOff);
  set_hopper_fwd_override(-1);
  EXPECT_EQ(backend_options().hopper_fwd, env);
  set_hopper_fwd_override(7);  // out of range: back to the environment's
  EXPECT_EQ(backend_options().hopper_fwd, env);
  // The backward's, independently.
  const HopperMode env_bwd = backend_options().hopper_bwd;
  set_hopper_bwd_override(0);
  EXPECT_EQ(backend_options().hopper_bwd, HopperMode::kOff);
  EXPECT_EQ(backend_options().hopper_fwd, env);
  set_hopper_bwd_override(1);
  EXPECT_EQ(backend_options().hopper_bwd, HopperMode::kAlways);
  set_hopper_bwd_override(-1);
  EXPECT_EQ(backend_options().hopper_bwd, env_bwd);
}

TEST(ParseBackendOptions, CudnnHeuristics) {
  EXPECT_EQ(parse({{"FUSEDATTN_CUDNN_HEUR", "B"}}).cudnn_heur, CudnnHeur::kB);
  EXPECT_EQ(parse({{"FUSEDATTN_CUDNN_HEUR", "FALLBACK"}}).cudnn_heur, CudnnHeur::kFallback);
  EXPECT_EQ(parse({{"FUSEDATTN_CUDNN_HEUR", "A"}}).cudnn_heur, CudnnHeur::kA);
  EXPECT_EQ(parse({{"FUSEDATTN_CUDNN_HEUR", "b"}}).cudnn_heur, CudnnHeur::kA);
}

TEST(ParseBackendOptions, CudnnPlanEngineAndLog) {
  const BackendOptions o = parse({{"FUSEDATTN_CUDNN_PLAN", "3"},
                                  {"FUSEDATTN_CUDNN_ENGINE", "8"},
                                  {"FUSEDATTN_CUDNN_KERNEL_CFG", "12"},
                                  {"FUSEDATTN_CUDNN_PLAN_LOG", ""}});
  EXPECT_EQ(o.cudnn_plan, std::optional<int64_t>(3));
  EXPECT_EQ(o.cudnn_engine, std::optional<int64_t>(8));
  EXPECT_EQ(o.cudnn_kernel_cfg, std::optional<int64_t>(12));
  EXPECT_TRUE(o.cudnn_plan_log);
  // Set but no number: atoll's 0.
  EXPECT_EQ(parse({{"FUSEDATTN_CUDNN_PLAN", ""}}).cudnn_plan, std::optional<int64_t>(0));
}

TEST(ParseBackendOptions, KernelConfigIsReadOnlyWithAnEngine) {
  EXPECT_FALSE(parse({{"FUSEDATTN_CUDNN_KERNEL_CFG", "12"}}).cudnn_kernel_cfg.has_value());
}

}  // namespace
}  // namespace fusedattn
