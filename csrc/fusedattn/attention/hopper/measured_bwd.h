// Where the Hopper flash backward runs plain calls (no score_mod) faster than cuDNN's backward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py --backward --json /root/out/measured_bwd.json --head-dims 64 --merge
// bf16, B x S = 16384 tokens, 2048 / D heads; ratio = cuDNN's forward+backward time / with the Hopper backward (the same forward).
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredBwdOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasuredBwd[] = {
    {kFull, 64, 1024, 0.836},  // hopper 1.576 ms, cuDNN 1.318 ms
    {kFull, 64, 2048, 0.914},  // hopper 2.564 ms, cuDNN 2.343 ms
    {kFull, 64, 4096, 0.971},  // hopper 4.558 ms, cuDNN 4.426 ms
    {kFull, 64, 8192, 1.016},  // hopper 8.349 ms, cuDNN 8.483 ms
    {kFull, 64, 16384, 1.025},  // hopper 16.314 ms, cuDNN 16.720 ms
    {kCausal, 64, 1024, 0.772},  // hopper 1.182 ms, cuDNN 0.912 ms
    {kCausal, 64, 2048, 0.858},  // hopper 1.695 ms, cuDNN 1.454 ms
    {kCausal, 64, 4096, 0.937},  // hopper 2.728 ms, cuDNN 2.557 ms
    {kCausal, 64, 8192, 0.987},  // hopper 4.689 ms, cuDNN 4.629 ms
    {kCausal, 64, 16384, 1.021},  // hopper 8.545 ms, cuDNN 8.720 ms
    {kWindow, 64, 1024, 0.761},  // hopper 1.142 ms, cuDNN 0.869 ms
    {kWindow, 64, 2048, 0.781},  // hopper 1.248 ms, cuDNN 0.975 ms
    {kWindow, 64, 4096, 0.786},  // hopper 1.294 ms, cuDNN 1.018 ms
    {kWindow, 64, 8192, 0.791},  // hopper 1.316 ms, cuDNN 1.041 ms
    {kWindow, 64, 16384, 0.789},  // hopper 1.332 ms, cuDNN 1.051 ms
    {kFull, 128, 1024, 0.847},  // hopper 1.310 ms, cuDNN 1.110 ms
    {kFull, 128, 2048, 0.899},  // hopper 2.193 ms, cuDNN 1.972 ms
    {kFull, 128, 4096, 0.946},  // hopper 3.973 ms, cuDNN 3.757 ms
    {kFull, 128, 8192, 0.962},  // hopper 7.497 ms, cuDNN 7.213 ms
    {kFull, 128, 16384, 0.980},  // hopper 14.429 ms, cuDNN 14.137 ms
    {kCausal, 128, 1024, 0.784},  // hopper 0.942 ms, cuDNN 0.739 ms
    {kCausal, 128, 2048, 0.861},  // hopper 1.409 ms, cuDNN 1.213 ms
    {kCausal, 128, 4096, 0.919},  // hopper 2.306 ms, cuDNN 2.118 ms
    {kCausal, 128, 8192, 0.943},  // hopper 4.085 ms, cuDNN 3.854 ms
    {kCausal, 128, 16384, 0.955},  // hopper 7.487 ms, cuDNN 7.149 ms
    {kWindow, 128, 1024, 0.770},  // hopper 0.879 ms, cuDNN 0.676 ms
    {kWindow, 128, 2048, 0.786},  // hopper 0.959 ms, cuDNN 0.754 ms
    {kWindow, 128, 4096, 0.789},  // hopper 1.000 ms, cuDNN 0.789 ms
    {kWindow, 128, 8192, 0.771},  // hopper 1.036 ms, cuDNN 0.799 ms
    {kWindow, 128, 16384, 0.802},  // hopper 1.025 ms, cuDNN 0.822 ms
};
inline constexpr int kMeasuredBwdRows = 30;

}  // namespace fusedattn::hopper_rules
