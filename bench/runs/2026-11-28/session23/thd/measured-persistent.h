// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py --classes causal --out /root/out/measured-persistent.h
// bf16, head dim 128, B x S = 16384 tokens; ratio = cuDNN's forward time / the Hopper forward's.
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasured[] = {
    {kCausal, 1024, 0.869},  // hopper 0.198 ms, cuDNN 0.172 ms
    {kCausal, 2048, 1.023},  // hopper 0.297 ms, cuDNN 0.304 ms
    {kCausal, 4096, 1.103},  // hopper 0.505 ms, cuDNN 0.557 ms
    {kCausal, 8192, 1.118},  // hopper 0.939 ms, cuDNN 1.050 ms
    {kCausal, 16384, 1.126},  // hopper 1.775 ms, cuDNN 1.999 ms
};
inline constexpr int kMeasuredRows = 5;

}  // namespace fusedattn::hopper_rules
