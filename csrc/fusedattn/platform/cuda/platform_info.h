// The facts about a CUDA device that select_backend() needs (PlatformInfo):
// compute capability and the cuDNN this process can load.
#pragma once

#include "fusedattn/attention/backend.h"

namespace fusedattn::cuda {

// Read once per device and remembered.
Status platform_info(int device, PlatformInfo* out);

}  // namespace fusedattn::cuda
