// Where the Hopper flash backward runs plain calls (no score_mod) faster than cuDNN's backward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-29: python scripts/tune_hopper.py --backward --json /root/out/measured_bwd.json --head-dims 128 --merge
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
    {kFull, 128, 1024, 1.004},  // hopper 1.098 ms, cuDNN 1.103 ms
    {kFull, 128, 2048, 1.000},  // hopper 1.935 ms, cuDNN 1.934 ms
    {kFull, 128, 4096, 1.010},  // hopper 3.658 ms, cuDNN 3.694 ms
    {kFull, 128, 8192, 1.022},  // hopper 6.970 ms, cuDNN 7.121 ms
    {kFull, 128, 16384, 1.018},  // hopper 13.683 ms, cuDNN 13.932 ms
    {kCausal, 128, 1024, 1.004},  // hopper 0.743 ms, cuDNN 0.745 ms
    {kCausal, 128, 2048, 0.995},  // hopper 1.209 ms, cuDNN 1.203 ms
    {kCausal, 128, 4096, 1.014},  // hopper 2.058 ms, cuDNN 2.087 ms
    {kCausal, 128, 8192, 1.021},  // hopper 3.767 ms, cuDNN 3.846 ms
    {kCausal, 128, 16384, 1.028},  // hopper 6.955 ms, cuDNN 7.152 ms
    {kWindow, 128, 1024, 0.993},  // hopper 0.684 ms, cuDNN 0.679 ms
    {kWindow, 128, 2048, 0.982},  // hopper 0.768 ms, cuDNN 0.754 ms
    {kWindow, 128, 4096, 0.988},  // hopper 0.800 ms, cuDNN 0.791 ms
    {kWindow, 128, 8192, 0.993},  // hopper 0.820 ms, cuDNN 0.814 ms
    {kWindow, 128, 16384, 0.968},  // hopper 0.843 ms, cuDNN 0.815 ms
};
inline constexpr int kMeasuredBwdRows = 30;

}  // namespace fusedattn::hopper_rules
