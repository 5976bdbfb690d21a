// BackendOptions: the attention engine's tuning knobs, read from the environment once.
//
// None of them but FUSEDATTN_F32_MATMUL changes a result; each picks among kernels or cuDNN plans that compute
// the same attention, for comparisons and plan experiments (bench/, dev/cudnn/cudnn_plans.sh).
//
//   FUSEDATTN_HOPPER_FWD=0          hopper_fwd = false: the calls the Hopper flash forward
//                                   would take (softcap / ALiBi score_mod, head dim 128,
//                                   sm_90) run cuDNN's forward graph instead. Any other
//                                   value, or unset: the Hopper forward takes them.
//   FUSEDATTN_F32_MATMUL=tf32       f32_tf32 = true: the CUDA flash kernels multiply float32
//                                   inputs in plain TF32 (10-bit mantissas, ~1e-3 relative
//                                   error, XLA's default precision) instead of 3xTF32 (about
//                                   float32's accuracy, ~3x the tensor-core work). The one
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
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

namespace fusedattn {

enum class CudnnHeur : int32_t { kA = 0, kB = 1, kFallback = 2 };

struct BackendOptions {
  bool hopper_fwd = true;
  bool f32_tf32 = false;
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

// The process's options: the environment, read on first use (thread-safe), then kept.
const BackendOptions& backend_options();

}  // namespace fusedattn
