// The shape of hopper/measured.h and measured_bwd.h (the tables scripts/tune_hopper.py
// writes) and the rule that reads them: select_backend (backend.cc, hopper_plain_measured)
// sends a plain call to the Hopper forward (backward) when its mask class at its head dim
// measured at least kMargin faster than cuDNN's forward (forward + backward, the forward
// the same) at the largest measured S <= its Sq (no row: cuDNN).
#pragma once

#include <cstdint>

namespace fusedattn::hopper_rules {

// Repeated runs of the same kernels move by about 2% (bench/RESULTS.md), so a smaller lead
// is no lead.
inline constexpr double kMargin = 1.02;

// kThd: THD calls (any mask), measured causal with ragged segments filling each row.
enum MaskClass : int32_t { kFull = 0, kCausal = 1, kWindow = 2, kThd = 3 };

struct Measured {
  int32_t mask;     // MaskClass
  int64_t head_dim;  // of q, k and v
  int64_t seqlen;   // Sq = Skv of the measured call (batch x seqlen = 16384, 2048 / D heads)
  double ratio;     // cuDNN's time / the Hopper kernel's
};

}  // namespace fusedattn::hopper_rules
