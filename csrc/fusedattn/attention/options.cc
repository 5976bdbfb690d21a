#include "fusedattn/attention/options.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace fusedattn {
namespace {

std::optional<int64_t> number(const char* value) {
  if (!value) return std::nullopt;
  return static_cast<int64_t>(std::atoll(value));
}

HopperMode hopper_mode(const char* value) {
  if (value && std::strcmp(value, "0") == 0) return HopperMode::kOff;
  if (value && std::strcmp(value, "1") == 0) return HopperMode::kAlways;
  return HopperMode::kMeasured;
}

}  // namespace

BackendOptions parse_backend_options(const EnvLookup& env) {
  BackendOptions o;
  o.hopper_fwd = hopper_mode(env("FUSEDATTN_HOPPER_FWD"));
  o.hopper_bwd = hopper_mode(env("FUSEDATTN_HOPPER_BWD"));
  o.hopper_persistent = number(env("FUSEDATTN_HOPPER_PERSISTENT"));
  const char* bias_tile = env("FUSEDATTN_HOPPER_BIAS_TILE");
  o.hopper_bias_tile = !bias_tile || std::strcmp(bias_tile, "0") != 0;
  const char* bias_reads = env("FUSEDATTN_HOPPER_BIAS_READS");
  o.hopper_bias_reads = bias_reads && std::strcmp(bias_reads, "1") == 0;
  const char* flash_sm = env("FUSEDATTN_FLASH_SCORE_MOD");
  o.flash_score_mod = !flash_sm || std::strcmp(flash_sm, "0") != 0;
  o.cuda_smem_limit = number(env("FUSEDATTN_CUDA_SMEM_LIMIT"));
  const char* f32 = env("FUSEDATTN_F32_MATMUL");
  if (f32 && std::strcmp(f32, "tf32") == 0) o.f32_matmul = F32Matmul::kTf32;
  if (f32 && std::strcmp(f32, "float32") == 0) o.f32_matmul = F32Matmul::kExact;
  if (const char* heur = env("FUSEDATTN_CUDNN_HEUR")) {
    if (std::strcmp(heur, "B") == 0) o.cudnn_heur = CudnnHeur::kB;
    if (std::strcmp(heur, "FALLBACK") == 0) o.cudnn_heur = CudnnHeur::kFallback;
  }
  o.cudnn_plan = number(env("FUSEDATTN_CUDNN_PLAN"));
  o.cudnn_engine = number(env("FUSEDATTN_CUDNN_ENGINE"));
  if (o.cudnn_engine) o.cudnn_kernel_cfg = number(env("FUSEDATTN_CUDNN_KERNEL_CFG"));
  o.cudnn_plan_log = env("FUSEDATTN_CUDNN_PLAN_LOG") != nullptr;
  return o;
}

namespace {
std::atomic<int32_t> hopper_override{-1}, hopper_bwd_override{-1};
}  // namespace

BackendOptions backend_options() {
  static const BackendOptions options =
      parse_backend_options([](const char* name) { return std::getenv(name); });
  BackendOptions o = options;
  const int32_t mode = hopper_override.load(std::memory_order_relaxed);
  if (mode >= 0) o.hopper_fwd = static_cast<HopperMode>(mode);
  const int32_t bwd = hopper_bwd_override.load(std::memory_order_relaxed);
  if (bwd >= 0) o.hopper_bwd = static_cast<HopperMode>(bwd);
  return o;
}

void set_hopper_fwd_override(int32_t mode) {
  hopper_override.store(mode >= 0 && mode <= 2 ? mode : -1, std::memory_order_relaxed);
}

void set_hopper_bwd_override(int32_t mode) {
  hopper_bwd_override.store(mode >= 0 && mode <= 2 ? mode : -1, std::memory_order_relaxed);
}

}  // namespace fusedattn
