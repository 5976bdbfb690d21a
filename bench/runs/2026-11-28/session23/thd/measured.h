// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py --classes full causal window thd --merge --out /root/out/measured.h
// bf16, head dim 128, B x S = 16384 tokens; ratio = cuDNN's forward time / the Hopper forward's.
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasured[] = {
    {kFull, 1024, 0.873},  // hopper 0.293 ms, cuDNN 0.256 ms
    {kFull, 2048, 0.935},  // hopper 0.514 ms, cuDNN 0.480 ms
    {kFull, 4096, 0.999},  // hopper 0.938 ms, cuDNN 0.937 ms
    {kFull, 8192, 1.046},  // hopper 1.753 ms, cuDNN 1.834 ms
    {kFull, 16384, 1.078},  // hopper 3.378 ms, cuDNN 3.642 ms
    {kCausal, 1024, 0.734},  // hopper 0.232 ms, cuDNN 0.171 ms
    {kCausal, 2048, 0.911},  // hopper 0.331 ms, cuDNN 0.302 ms
    {kCausal, 4096, 1.024},  // hopper 0.537 ms, cuDNN 0.550 ms
    {kCausal, 8192, 1.101},  // hopper 0.947 ms, cuDNN 1.043 ms
    {kCausal, 16384, 1.111},  // hopper 1.806 ms, cuDNN 2.007 ms
    {kWindow, 1024, 0.968},  // hopper 0.174 ms, cuDNN 0.168 ms
    {kWindow, 2048, 1.049},  // hopper 0.188 ms, cuDNN 0.197 ms
    {kWindow, 4096, 1.053},  // hopper 0.198 ms, cuDNN 0.208 ms
    {kWindow, 8192, 1.057},  // hopper 0.205 ms, cuDNN 0.216 ms
    {kWindow, 16384, 1.085},  // hopper 0.204 ms, cuDNN 0.221 ms
    {kThd, 1024, 0.837},  // hopper 0.170 ms, cuDNN 0.142 ms
    {kThd, 2048, 0.876},  // hopper 0.214 ms, cuDNN 0.188 ms
    {kThd, 4096, 0.982},  // hopper 0.297 ms, cuDNN 0.292 ms
    {kThd, 8192, 0.959},  // hopper 0.407 ms, cuDNN 0.391 ms
    {kThd, 16384, 1.067},  // hopper 0.671 ms, cuDNN 0.716 ms
};
inline constexpr int kMeasuredRows = 20;

}  // namespace fusedattn::hopper_rules
