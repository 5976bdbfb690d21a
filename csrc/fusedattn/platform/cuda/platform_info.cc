#include "fusedattn/platform/cuda/platform_info.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/platform/cuda/cudnn_loader.h"

namespace fusedattn::cuda {

Status platform_info(int device, PlatformInfo* out) {
  static std::mutex mu;
  static auto* known = new std::map<int, PlatformInfo>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = known->find(device);  // failures are not remembered: a later call may find the device
  if (it == known->end()) {
    PlatformInfo info;
    info.cuda_built = true;
    int major = 0, minor = 0;
    FA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    FA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    info.sm = major * 10 + minor;
    int smem = 0;
    FA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    info.smem_optin = smem;
    const Status loaded = cudnn::load_library();
    info.cudnn_version = cudnn::version();
    if (!loaded.ok()) info.cudnn_error = loaded.message;
    it = known->emplace(device, info).first;
  }
  *out = it->second;
  return Status::Ok();
}

}  // namespace fusedattn::cuda
