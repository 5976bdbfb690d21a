#include "fusedattn/platform/cuda/cudnn_handle.h"

#include <map>
#include <memory>

#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cudnn {

Status device_handle(int device, DeviceHandle** out) {
  Status s = load_library();
  if (!s.ok()) return s;
  static std::mutex mu;
  // Never freed: XLA threads may use a handle until the process exits.
  static auto* handles = new std::map<int, std::unique_ptr<DeviceHandle>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*handles)[device];
  if (!slot) {
    int current = 0;
    FA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    FA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    auto h = std::make_unique<DeviceHandle>();
    s = create_handle(&h->handle);
    FA_CUDA_RETURN_IF_ERROR(cudaSetDevice(current));
    if (!s.ok()) return s;
    slot = std::move(h);
  }
  *out = slot.get();
  return Status::Ok();
}

}  // namespace fusedattn::cudnn
