// select_backend(): the forward and backward kernels each platform gets, and why (CPU, cuDNN,
// the CUDA flash kernels, XLA's reference; the Hopper kernels' rules: test_backend_hopper.cc);
// recognize_score_mod() on the programs the Hopper kernels take; and parse_backend_options()
// on every knob of options.h.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/options.h"
#include "fusedattn/attention/params.h"
#include "attention/backend_cases.h"
#include "score_mod/programs.h"

namespace fusedattn {
namespace {

using test::expect_kernels;
using test::h100;
using test::has;
using test::hopper_params;
using test::program;
using test::with;

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
    // (softcap with the bias as tiles, Skv a multiple of 8: the Hopper kernels both ways,
    // the bias joining q.k before the tanh.)
    const int32_t k = kind == ScoreModKind::kSoftcap ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDA_FLASH;
    const int32_t kb = kind == ScoreModKind::kSoftcap ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDA_FLASH;
    const BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind),
                                           flash_score_mod());
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, k, kb);
    EXPECT_TRUE(has(c.reason, "bias after the score_mod")) << c.reason;
    // The default is on; turned off, XLA's reference, saying why.
    expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind), BackendOptions{}),
                   FA_BACKEND_CUDA_FLASH, k, kb);
    const BackendChoice off = select_backend(p, FA_PLATFORM_CUDA, h100(), with(kind),
                                             flash_score_mod(false));
    expect_kernels(off, FA_BACKEND_XLA_REFERENCE, FA_BACKEND_XLA_REFERENCE,
                   FA_BACKEND_XLA_REFERENCE);
    EXPECT_TRUE(has(off.reason, "FUSEDATTN_FLASH_SCORE_MOD=0")) << off.reason;
    expect_kernels(select_backend(p, FA_PLATFORM_CPU, h100(), with(kind), BackendOptions{}),
                   FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH, FA_BACKEND_CPU_FLASH);
  }
  AttnParams p = hopper_params();  // without a score_mod: cuDNN's graph, the Hopper forward
  p.bias_type = FA_POST_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 1;
  expect_kernels(select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{}),
                 FA_BACKEND_CUDNN, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDNN);
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
  // ALiBi's slopes' gradient: the Hopper forward (ALiBi in the kernel) and backward (the
  // slopes' gradient summed in it); the flash kernels' backward with FUSEDATTN_HOPPER_BWD=0,
  // none in deterministic mode (both sum it with float32 atomics).
  BackendRequest alibi = with(ScoreModKind::kAlibi);
  alibi.score_mod_grads = true;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), alibi, flash_score_mod());
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "ALiBi in the kernel")) << c.reason;
  EXPECT_TRUE(has(c.reason, "slopes' gradient summed in the kernel")) << c.reason;
  BackendOptions bwd_off = flash_score_mod();
  bwd_off.hopper_bwd = HopperMode::kOff;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), alibi, bwd_off);
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_CUDA_FLASH);
  BackendRequest det = alibi;
  det.deterministic = true;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), det, flash_score_mod());
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_NONE);
  EXPECT_TRUE(has(c.reason, "no deterministic backward")) << c.reason;
  BackendOptions off = flash_score_mod();  // the Hopper backward from the flash kernels' lse
  off.hopper_fwd = HopperMode::kOff;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), alibi, off);
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_BWD);
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
  // (Skv not a multiple of 8: the Hopper forward would read the bias a score at a time, so
  // the flash kernels' forward; a multiple of 8 below.)
  p.bias_type = FA_PRE_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 8, p.seqlen_kv = 500;
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
    // (a pre-scale bias's backward, dbias too: the Hopper backward)
    const int32_t bwd = why == "PRE_SCALE_BIAS" ? FA_BACKEND_HOPPER_BWD : FA_BACKEND_CUDA_FLASH;
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, bwd);
    EXPECT_TRUE(has(c.reason, "cuda_flash")) << c.reason;
    EXPECT_TRUE(has(c.reason, why)) << why << ": " << c.reason;
    // FUSEDATTN_HOPPER_FWD=1: the Hopper forward takes the forward of those it can (a
    // pre-scale bias), the flash kernels the backward from its lse; not on a device
    // without wgmma.
    const bool hopper = why == "PRE_SCALE_BIAS";
    BackendOptions always;
    always.hopper_fwd = HopperMode::kAlways;
    c = select_backend(call, FA_PLATFORM_CUDA, h100(), BackendRequest{}, always);
    expect_kernels(c, FA_BACKEND_CUDA_FLASH, hopper ? FA_BACKEND_HOPPER_FWD : FA_BACKEND_CUDA_FLASH, bwd);
    EXPECT_EQ(has(c.reason, "forward hopper"), hopper) << c.reason;
    PlatformInfo ampere = h100();
    ampere.sm = 80;
    expect_kernels(select_backend(call, FA_PLATFORM_CUDA, ampere, BackendRequest{}, always),
                   FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  }
  // A pre-scale bias of Skv a multiple of 8: the Hopper forward reads its tiles (faster than
  // the flash kernels' forward), by default.
  p = hopper_params();
  p.bias_type = FA_PRE_SCALE_BIAS, p.bias_batch = 1, p.bias_heads = 8;
  BackendChoice c = select_backend(p, FA_PLATFORM_CUDA, h100(), BackendRequest{}, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "bias tiles")) << c.reason;
}

TEST(SelectBackend, IndexBaseAndRejectedGraphsRunTheCudaFlashKernels) {
  BackendRequest req;
  req.index_base = true;
  BackendChoice c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH);
  EXPECT_TRUE(has(c.reason, "index_base")) << c.reason;
  req = BackendRequest{};
  req.cudnn_rejected = true;
  // A graph cuDNN rejected: the Hopper backward takes the backward it can run.
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, BackendOptions{});
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_BWD);
  EXPECT_TRUE(has(c.reason, "rejected")) << c.reason;
  // FUSEDATTN_HOPPER_FWD=1: the Hopper forward takes the forward it can run (not with an
  // index_base, nor at head dims it lacks).
  BackendOptions always;
  always.hopper_fwd = HopperMode::kAlways;
  c = select_backend(hopper_params(), FA_PLATFORM_CUDA, h100(), req, always);
  expect_kernels(c, FA_BACKEND_CUDA_FLASH, FA_BACKEND_HOPPER_FWD, FA_BACKEND_HOPPER_BWD);
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

TEST(ParseBackendOptions, CudaSharedMemoryLimitInBytes) {
  EXPECT_FALSE(parse({}).cuda_smem_limit.has_value());
  EXPECT_EQ(parse({{"FUSEDATTN_CUDA_SMEM_LIMIT", "166912"}}).cuda_smem_limit, 166912);
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
  EXPECT_TRUE(parse({}).hopper_bias_tile);
  EXPECT_TRUE(parse({{"FUSEDATTN_HOPPER_BIAS_TILE", "1"}}).hopper_bias_tile);
  EXPECT_FALSE(parse({{"FUSEDATTN_HOPPER_BIAS_TILE", "0"}}).hopper_bias_tile);
  EXPECT_FALSE(parse({}).hopper_bias_reads);
  EXPECT_FALSE(parse({{"FUSEDATTN_HOPPER_BIAS_READS", "0"}}).hopper_bias_reads);
  EXPECT_TRUE(parse({{"FUSEDATTN_HOPPER_BIAS_READS", "1"}}).hopper_bias_reads);
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
