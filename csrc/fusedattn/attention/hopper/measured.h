// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py
// bf16, head dim 128, B x S = 16384 tokens; ratio = cuDNN's forward time / the Hopper forward's.
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasured[] = {
    {kFull, 1024, 0.870},  // hopper 0.294 ms, cuDNN 0.256 ms
    {kFull, 2048, 0.932},  // hopper 0.511 ms, cuDNN 0.477 ms
    {kFull, 4096, 1.003},  // hopper 0.927 ms, cuDNN 0.930 ms
    {kFull, 8192, 1.018},  // hopper 1.785 ms, cuDNN 1.817 ms
    {kFull, 16384, 1.024},  // hopper 3.530 ms, cuDNN 3.613 ms
    {kCausal, 1024, 0.769},  // hopper 0.218 ms, cuDNN 0.168 ms
    {kCausal, 2048, 0.920},  // hopper 0.318 ms, cuDNN 0.292 ms
    {kCausal, 4096, 1.027},  // hopper 0.530 ms, cuDNN 0.544 ms
    {kCausal, 8192, 1.061},  // hopper 0.963 ms, cuDNN 1.021 ms
    {kCausal, 16384, 1.091},  // hopper 1.826 ms, cuDNN 1.992 ms
    {kWindow, 1024, 0.931},  // hopper 0.177 ms, cuDNN 0.164 ms
    {kWindow, 2048, 1.016},  // hopper 0.191 ms, cuDNN 0.194 ms
    {kWindow, 4096, 1.006},  // hopper 0.203 ms, cuDNN 0.204 ms
    {kWindow, 8192, 1.049},  // hopper 0.204 ms, cuDNN 0.214 ms
    {kWindow, 16384, 1.080},  // hopper 0.201 ms, cuDNN 0.217 ms
};
inline constexpr int kMeasuredRows = 15;

}  // namespace fusedattn::hopper_rules
