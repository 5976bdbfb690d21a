// select_backend(): which backend serves an AttnParams on a platform, and why
// the others cannot. Python asks the same function (c_api.cc), so the backend
// a user is told about is the one that runs.
#pragma once

#include <string>

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace fusedattn {

struct BackendChoice {
  int32_t backend = FA_BACKEND_NONE;  // FaBackend
  Status status;                      // not ok when no backend serves the call
  std::string reason;                 // why this backend, and why not the others
};

// What the CUDA rules depend on (cuda/platform.h reads it off a device).
struct PlatformInfo {
  bool cuda_built = false;     // this library has its CUDA kernels
  int64_t cudnn_version = 0;   // loaded cuDNN (e.g. 91900); 0: none could be loaded
  int32_t sm = 0;              // compute capability * 10 (90 for an H100); 0: no device
  std::string device_error;    // why the device could not be queried
  std::string cudnn_error;     // why no cuDNN could be loaded
};

BackendChoice select_backend(const AttnParams& p, int32_t platform, const PlatformInfo& info = {});

// Why cuDNN cannot serve p (empty when it can, as far as static rules tell: the
// graph's own support check, run at trace time, has the last word).
std::string cudnn_unsupported_reason(const AttnParams& p, const PlatformInfo& info);

}  // namespace fusedattn
