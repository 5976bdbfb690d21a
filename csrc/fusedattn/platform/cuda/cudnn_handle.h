// One cuDNN handle per device, created on first use. A handle is bound to the
// caller's stream for each call, so a call holds the device's lock from
// cudnnSetStream until its work is enqueued (execution itself is asynchronous).
#pragma once

#include <mutex>

#include "fusedattn/platform/cuda/cudnn_loader.h"

namespace fusedattn::cudnn {

struct DeviceHandle {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
};

// The handle of `device` (created with that device current); not ok when cuDNN
// cannot be loaded or the handle cannot be created.
Status device_handle(int device, DeviceHandle** out);

}  // namespace fusedattn::cudnn
