// select_backend(): which backend serves an AttnParams on a platform, and why
// the others cannot. Python asks the same function (c_api.cc), so the backend
// a user is told about is the one that runs.
#pragma once

#include <string>

#include "params.h"
#include "status.h"

namespace fusedattn {

struct BackendChoice {
  int32_t backend = FA_BACKEND_NONE;  // FaBackend
  Status status;                      // not ok when no backend serves the call
  std::string reason;                 // why this backend, and why not the others
};

BackendChoice select_backend(const AttnParams& p, int32_t platform);

}  // namespace fusedattn
