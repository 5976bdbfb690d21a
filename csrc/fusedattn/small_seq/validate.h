// Checks of a SmallSeqParams, and the eligibility rule of the small-seq backend.
// The FFI handlers and the Python query API (c_api.cc) ask the same functions.
#pragma once

#include <string>

#include "fusedattn/core/status.h"
#include "fusedattn/small_seq/params.h"

namespace fusedattn::small_seq {

// Every check, run once at the boundary; kernels assume valid input.
Status validate(const SmallSeqParams& p);

// Whether the small-seq backend serves a call on a platform (FaPlatform), and why not.
struct Eligibility {
  bool served = false;
  Status status;       // validate()'s verdict (ok when only the platform is missing)
  std::string reason;  // why it serves, or why not
};
Eligibility eligibility(const SmallSeqParams& p, int32_t platform, bool built_with_cuda);

}  // namespace fusedattn::small_seq
