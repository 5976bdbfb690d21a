// Where the Hopper flash backward runs plain calls (no score_mod) faster than cuDNN's backward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-29: python scripts/tune_hopper.py --backward --json /root/out/measured_bwd.json
// bf16, B x S = 16384 tokens, 2048 / D heads; ratio = cuDNN's forward+backward time / with the Hopper backward (the same forward).
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredBwdOn = "NVIDIA H200, 2026-11-29";
inline constexpr Measured kMeasuredBwd[] = {
    {kFull, 64, 1024, 1.019},  // hopper 1.301 ms, cuDNN 1.326 ms
    {kFull, 64, 2048, 1.058},  // hopper 2.238 ms, cuDNN 2.367 ms
    {kFull, 64, 4096, 1.071},  // hopper 4.119 ms, cuDNN 4.413 ms
    {kFull, 64, 8192, 1.095},  // hopper 7.788 ms, cuDNN 8.527 ms
    {kFull, 64, 16384, 1.093},  // hopper 15.296 ms, cuDNN 16.718 ms
    {kCausal, 64, 1024, 1.036},  // hopper 0.884 ms, cuDNN 0.916 ms
    {kCausal, 64, 2048, 1.060},  // hopper 1.374 ms, cuDNN 1.456 ms
    {kCausal, 64, 4096, 1.095},  // hopper 2.354 ms, cuDNN 2.577 ms
    {kCausal, 64, 8192, 1.113},  // hopper 4.182 ms, cuDNN 4.657 ms
    {kCausal, 64, 16384, 1.117},  // hopper 7.884 ms, cuDNN 8.805 ms
    {kWindow, 64, 1024, 1.028},  // hopper 0.850 ms, cuDNN 0.873 ms
    {kWindow, 64, 2048, 1.019},  // hopper 0.952 ms, cuDNN 0.970 ms
    {kWindow, 64, 4096, 1.024},  // hopper 0.990 ms, cuDNN 1.014 ms
    {kWindow, 64, 8192, 1.022},  // hopper 1.013 ms, cuDNN 1.035 ms
    {kWindow, 64, 16384, 1.024},  // hopper 1.022 ms, cuDNN 1.047 ms
    {kFull, 128, 1024, 0.937},  // hopper 1.144 ms, cuDNN 1.072 ms
    {kFull, 128, 2048, 0.982},  // hopper 1.982 ms, cuDNN 1.947 ms
    {kFull, 128, 4096, 0.999},  // hopper 3.672 ms, cuDNN 3.669 ms
    {kFull, 128, 8192, 1.008},  // hopper 6.997 ms, cuDNN 7.056 ms
    {kFull, 128, 16384, 1.007},  // hopper 13.740 ms, cuDNN 13.843 ms
    {kCausal, 128, 1024, 0.933},  // hopper 0.793 ms, cuDNN 0.740 ms
    {kCausal, 128, 2048, 0.970},  // hopper 1.223 ms, cuDNN 1.185 ms
    {kCausal, 128, 4096, 0.993},  // hopper 2.079 ms, cuDNN 2.065 ms
    {kCausal, 128, 8192, 0.995},  // hopper 3.795 ms, cuDNN 3.774 ms
    {kCausal, 128, 16384, 1.017},  // hopper 6.972 ms, cuDNN 7.089 ms
    {kWindow, 128, 1024, 0.932},  // hopper 0.730 ms, cuDNN 0.680 ms
    {kWindow, 128, 2048, 0.935},  // hopper 0.808 ms, cuDNN 0.755 ms
    {kWindow, 128, 4096, 0.931},  // hopper 0.843 ms, cuDNN 0.785 ms
    {kWindow, 128, 8192, 0.931},  // hopper 0.858 ms, cuDNN 0.799 ms
    {kWindow, 128, 16384, 0.955},  // hopper 0.862 ms, cuDNN 0.824 ms
};
inline constexpr int kMeasuredBwdRows = 30;

}  // namespace fusedattn::hopper_rules
