// validate(): every check of an AttnParams, run once at the boundary (the FFI
// handlers and the Python query API both call it); kernels assume valid input.
#pragma once

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace fusedattn {

Status validate(const AttnParams& p);

}  // namespace fusedattn
