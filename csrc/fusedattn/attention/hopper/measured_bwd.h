// Where the Hopper flash backward runs plain calls faster than cuDNN's backward graph:
// written by scripts/tune_hopper.py --backward from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Not measured yet: no rows, so plain calls keep cuDNN's backward.
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredBwdOn = "not measured";
inline constexpr const Measured* kMeasuredBwd = nullptr;
inline constexpr int kMeasuredBwdRows = 0;

}  // namespace fusedattn::hopper_rules
