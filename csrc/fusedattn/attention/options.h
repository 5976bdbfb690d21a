// BackendOptions: the attention engine's tuning knobs, read from the environment once.
//
// None of them but FUSEDATTN_F32_MATMUL changes a result; each picks among kernels or cuDNN plans that compute
// the same attention, for comparisons and plan experiments (bench/, dev/cudnn/cudnn_plans.sh).
//
//   FUSEDATTN_HOPPER_FWD=0|1        hopper_fwd: which calls the Hopper flash forward (head dim
//                                   128, sm_90) takes. Unset (or anything else): kMeasured,
//                                   its softcap / ALiBi score_mods always, plain calls where
//                                   the checked-in measurement (hopper/measured.h, written by
//                                   scripts/tune_hopper.py) found it faster than cuDNN's
//                                   forward graph. 0: kOff, cuDNN's forward for all of them.
//                                   1: kAlways, every call it can run (plain ones included).
//                                   set_hopper_fwd_override() overrides it for the process.
//   FUSEDATTN_HOPPER_BWD=0|1        hopper_bwd: the same for the Hopper flash backward (head
//                                   dims 64 and 128): unset, a dense mask's backward always,
//                                   plain calls where hopper/measured_bwd.h found it faster
//                                   than cuDNN's backward graph; 0 none; 1 every call it can
//                                   run. set_hopper_bwd_override() overrides it.
//   FUSEDATTN_HOPPER_PERSISTENT=0|1 hopper_persistent: the Hopper forward's blocks, one a
//                                   tile (0) or one an SM taking tiles in turn (1); unset:
//                                   the kernel decides (dev/hopper_fwd: measurements).
//   FUSEDATTN_HOPPER_BIAS_TILE=0    hopper_bias_tile = false: the Hopper forward reads a bias
//                                   a score at a time from global memory instead of its
//                                   tiles through the copy engine (A/B; FlashFwdParams::bias_tile).
//   FUSEDATTN_HOPPER_BIAS_READS=1   hopper_bias_reads = true: the Hopper forward runs plain
//                                   calls without a bias on the instances that carry the
//                                   bias-read and dense-mask code (A/B of session 38;
//                                   FlashFwdParams::bias_reads).
//   FUSEDATTN_FLASH_SCORE_MOD=0     flash_score_mod = false: the score_mod calls cuDNN
//                                   declines (a bias, a shard's index_base, a rejected
//                                   graph, the operands' gradient taken) run XLA's reference
//                                   (materialized scores) instead of the CUDA flash kernels
//                                   (the program interpreted in their tiles, the operands'
//                                   gradients in-kernel, O(S) memory). Any other value, or
//                                   unset: the CUDA flash kernels take them
//                                   (tests/python/score_mod/test_score_mod_gpu.py).
//   FUSEDATTN_CUDA_SMEM_LIMIT=bytes cuda_smem_limit: the CUDA flash kernels (cuda/) pick their
//                                   variants as on a device whose per-block shared memory
//                                   is at most this many bytes (166912: sm_80's 163 KiB), so
//                                   an H100 runs an A100's kernels
//                                   (test_cuda_flash_gpu.py's test_sm80_shared_memory).
//                                   Not a positive number: the device's own.
//   FUSEDATTN_F32_MATMUL=tf32|float32
//                                   f32_matmul: how the CUDA flash kernels multiply float32
//                                   inputs, whatever the call asks. Unset (or anything
//                                   else): as the call asks, which is jax's matmul
//                                   precision at trace time (backend.h's kRequestF32Exact):
//                                   plain TF32 by default, as XLA's own float32 matmuls on
//                                   the GPU (10-bit mantissas, ~1e-3 relative error), 3xTF32
//                                   under jax.default_matmul_precision("highest" or
//                                   "float32") (about float32's accuracy, ~3x the
//                                   tensor-core work). tf32 / float32: always that. The one
//                                   knob here that changes results, within that error.
//   FUSEDATTN_CUDNN_HEUR=A|B|FALLBACK
//                                   cudnn_heur: the cuDNN heuristics mode whose list of
//                                   plans is built (A when unset or anything else).
//   FUSEDATTN_CUDNN_PLAN=i          cudnn_plan: build the list's plan i instead of the
//                                   first that builds.
//   FUSEDATTN_CUDNN_ENGINE=e        cudnn_engine: ask for engine e's plan instead of the
//                                   heuristics' list ...
//   FUSEDATTN_CUDNN_KERNEL_CFG=k    cudnn_kernel_cfg: ... with this KERNEL_CFG knob (read
//                                   only with FUSEDATTN_CUDNN_ENGINE).
//   FUSEDATTN_CUDNN_PLAN_LOG        cudnn_plan_log (set to anything): print each graph's
//                                   list of plans, the engines' knobs and the plan built to
//                                   stderr.
// Numbers are read as atoll reads them (a value that is no number reads as 0).
//
// Not here: FUSEDATTN_DETERMINISTIC=1 (a bitwise repeatable backward) is a property of a call,
// read by Python when the call is traced (python/fusedattn/determinism.py, also TE's and XLA's
// switches) and passed as backend.h's kRequestDeterministic, as jax's matmul precision is.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace fusedattn {

enum class CudnnHeur : int32_t { kA = 0, kB = 1, kFallback = 2 };
// Which calls a Hopper kernel takes (FUSEDATTN_HOPPER_FWD, FUSEDATTN_HOPPER_BWD).
enum class HopperMode : int32_t { kOff = 0, kAlways = 1, kMeasured = 2 };
enum class F32Matmul : int32_t { kAsCalled = 0, kTf32 = 1, kExact = 2 };

struct BackendOptions {
  HopperMode hopper_fwd = HopperMode::kMeasured;
  HopperMode hopper_bwd = HopperMode::kMeasured;
  std::optional<int64_t> hopper_persistent;
  bool hopper_bias_tile = true;
  bool hopper_bias_reads = false;
  bool flash_score_mod = true;
  std::optional<int64_t> cuda_smem_limit;
  F32Matmul f32_matmul = F32Matmul::kAsCalled;
  CudnnHeur cudnn_heur = CudnnHeur::kA;
  std::optional<int64_t> cudnn_plan;
  std::optional<int64_t> cudnn_engine;
  std::optional<int64_t> cudnn_kernel_cfg;
  bool cudnn_plan_log = false;
};

// name -> value, or null when unset (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

// The options the variables above set, read through `env` (tests pass a map).
BackendOptions parse_backend_options(const EnvLookup& env);

// The process's options: the environment, read on first use (thread-safe), then kept,
// with the override below applied.
BackendOptions backend_options();

// Overrides FUSEDATTN_HOPPER_FWD for this process from now on (the measurement script and
// tests compare kernels in one process); mode < 0 goes back to the environment's. Calls
// decide at run time, so it applies to compiled functions too (their workspace is cuDNN's
// either way).
void set_hopper_fwd_override(int32_t mode);
// The same for FUSEDATTN_HOPPER_BWD. Workspaces are sized for either backward wherever the
// Hopper backward can run (ffi_cuda.cc), so it applies to compiled functions too.
void set_hopper_bwd_override(int32_t mode);

// Whether the CUDA flash kernels multiply a call's float32 inputs in plain TF32: the
// options' f32_matmul, else the call's request (exact: backend.h's kRequestF32Exact set).
inline bool f32_tf32(const BackendOptions& o, bool exact_requested) {
  if (o.f32_matmul == F32Matmul::kTf32) return true;
  if (o.f32_matmul == F32Matmul::kExact) return false;
  return !exact_requested;
}

}  // namespace fusedattn
