// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend (backend.cc, hopper_plain_measured) reads it. Empty: not measured,
// plain calls run cuDNN.
#pragma once

#include <cstdint>

namespace fusedattn::hopper_rules {

enum MaskClass : int32_t { kFull = 0, kCausal = 1, kWindow = 2 };

struct Measured {
  int32_t mask;     // MaskClass
  int64_t seqlen;   // Sq = Skv of the measured call (batch x seqlen = 16384, 16 heads)
  double ratio;     // cuDNN's forward time / the Hopper forward's
};

inline constexpr const char* kMeasuredOn = "not measured";
inline constexpr Measured kMeasured[] = {{kFull, 0, 0.0}};  // a placeholder row: ratio 0
inline constexpr int kMeasuredRows = 0;

}  // namespace fusedattn::hopper_rules
