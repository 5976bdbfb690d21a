// Where the Hopper flash backward runs plain calls (no score_mod) faster than cuDNN's backward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-30: python scripts/tune_hopper.py --backward --head-dims 256 --merge --json /root/out/measured_bwd.json
// bf16, B x S = 16384 tokens, 2048 / D heads; ratio = cuDNN's forward+backward time / with the Hopper backward (the same forward).
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredBwdOn = "NVIDIA H200, 2026-11-30";
inline constexpr Measured kMeasuredBwd[] = {
    {kFull, 64, 1024, 1.019},  // hopper 1.301 ms, cuDNN 1.326 ms (NVIDIA H200, 2026-11-29)
    {kFull, 64, 2048, 1.058},  // hopper 2.238 ms, cuDNN 2.367 ms (NVIDIA H200, 2026-11-29)
    {kFull, 64, 4096, 1.071},  // hopper 4.119 ms, cuDNN 4.413 ms (NVIDIA H200, 2026-11-29)
    {kFull, 64, 8192, 1.095},  // hopper 7.788 ms, cuDNN 8.527 ms (NVIDIA H200, 2026-11-29)
    {kFull, 64, 16384, 1.093},  // hopper 15.296 ms, cuDNN 16.718 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 64, 1024, 1.036},  // hopper 0.884 ms, cuDNN 0.916 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 64, 2048, 1.060},  // hopper 1.374 ms, cuDNN 1.456 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 64, 4096, 1.095},  // hopper 2.354 ms, cuDNN 2.577 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 64, 8192, 1.113},  // hopper 4.182 ms, cuDNN 4.657 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 64, 16384, 1.117},  // hopper 7.884 ms, cuDNN 8.805 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 64, 1024, 1.028},  // hopper 0.850 ms, cuDNN 0.873 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 64, 2048, 1.019},  // hopper 0.952 ms, cuDNN 0.970 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 64, 4096, 1.024},  // hopper 0.990 ms, cuDNN 1.014 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 64, 8192, 1.022},  // hopper 1.013 ms, cuDNN 1.035 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 64, 16384, 1.024},  // hopper 1.022 ms, cuDNN 1.047 ms (NVIDIA H200, 2026-11-29)
    {kFull, 128, 1024, 1.004},  // hopper 1.098 ms, cuDNN 1.103 ms (NVIDIA H200, 2026-11-29)
    {kFull, 128, 2048, 1.000},  // hopper 1.935 ms, cuDNN 1.934 ms (NVIDIA H200, 2026-11-29)
    {kFull, 128, 4096, 1.010},  // hopper 3.658 ms, cuDNN 3.694 ms (NVIDIA H200, 2026-11-29)
    {kFull, 128, 8192, 1.022},  // hopper 6.970 ms, cuDNN 7.121 ms (NVIDIA H200, 2026-11-29)
    {kFull, 128, 16384, 1.018},  // hopper 13.683 ms, cuDNN 13.932 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 128, 1024, 1.004},  // hopper 0.743 ms, cuDNN 0.745 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 128, 2048, 0.995},  // hopper 1.209 ms, cuDNN 1.203 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 128, 4096, 1.014},  // hopper 2.058 ms, cuDNN 2.087 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 128, 8192, 1.021},  // hopper 3.767 ms, cuDNN 3.846 ms (NVIDIA H200, 2026-11-29)
    {kCausal, 128, 16384, 1.028},  // hopper 6.955 ms, cuDNN 7.152 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 128, 1024, 0.993},  // hopper 0.684 ms, cuDNN 0.679 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 128, 2048, 0.982},  // hopper 0.768 ms, cuDNN 0.754 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 128, 4096, 0.988},  // hopper 0.800 ms, cuDNN 0.791 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 128, 8192, 0.993},  // hopper 0.820 ms, cuDNN 0.814 ms (NVIDIA H200, 2026-11-29)
    {kWindow, 128, 16384, 0.968},  // hopper 0.843 ms, cuDNN 0.815 ms (NVIDIA H200, 2026-11-29)
    {kFull, 256, 1024, 1.068},  // hopper 1.319 ms, cuDNN 1.409 ms
    {kFull, 256, 2048, 1.040},  // hopper 2.385 ms, cuDNN 2.481 ms
    {kFull, 256, 4096, 1.012},  // hopper 4.548 ms, cuDNN 4.602 ms
    {kFull, 256, 8192, 1.087},  // hopper 8.733 ms, cuDNN 9.495 ms
    {kFull, 256, 16384, 1.104},  // hopper 17.204 ms, cuDNN 18.999 ms
    {kCausal, 256, 1024, 1.042},  // hopper 0.850 ms, cuDNN 0.885 ms
    {kCausal, 256, 2048, 1.014},  // hopper 1.408 ms, cuDNN 1.428 ms
    {kCausal, 256, 4096, 1.043},  // hopper 2.464 ms, cuDNN 2.569 ms
    {kCausal, 256, 8192, 1.004},  // hopper 4.591 ms, cuDNN 4.611 ms
    {kCausal, 256, 16384, 1.048},  // hopper 8.680 ms, cuDNN 9.093 ms
    {kWindow, 256, 1024, 1.068},  // hopper 0.735 ms, cuDNN 0.785 ms
    {kWindow, 256, 2048, 1.069},  // hopper 0.817 ms, cuDNN 0.874 ms
    {kWindow, 256, 4096, 1.060},  // hopper 0.861 ms, cuDNN 0.913 ms
    {kWindow, 256, 8192, 1.048},  // hopper 0.883 ms, cuDNN 0.926 ms
    {kWindow, 256, 16384, 1.062},  // hopper 0.896 ms, cuDNN 0.952 ms
};
inline constexpr int kMeasuredBwdRows = 45;

}  // namespace fusedattn::hopper_rules
