// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend (backend.cc, hopper_plain_measured) reads it. Empty: not measured,
// plain calls run cuDNN.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py (dev/hopper_fwd/plain_gpu.sh)
// bf16, head dim 128, B x S = 16384 tokens; ratio = cuDNN's forward time / the Hopper forward's.
#pragma once

#include <cstdint>

namespace fusedattn::hopper_rules {

// The Hopper forward takes a class of calls when it measured at least this much faster:
// repeated runs of the same kernels move by about 2% (bench/RESULTS.md), so a smaller lead is
// no lead.
inline constexpr double kMargin = 1.02;

enum MaskClass : int32_t { kFull = 0, kCausal = 1, kWindow = 2 };

struct Measured {
  int32_t mask;     // MaskClass
  int64_t seqlen;   // Sq = Skv of the measured call (batch x seqlen = 16384, 16 heads)
  double ratio;     // cuDNN's forward time / the Hopper forward's
};

inline constexpr const char* kMeasuredOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasured[] = {
    {kFull, 1024, 0.867},  // hopper 0.296 ms, cuDNN 0.257 ms
    {kFull, 2048, 0.959},  // hopper 0.508 ms, cuDNN 0.487 ms
    {kFull, 4096, 0.998},  // hopper 0.945 ms, cuDNN 0.943 ms
    {kFull, 8192, 1.021},  // hopper 1.796 ms, cuDNN 1.833 ms
    {kFull, 16384, 1.036},  // hopper 3.505 ms, cuDNN 3.632 ms
    {kCausal, 1024, 0.768},  // hopper 0.218 ms, cuDNN 0.168 ms
    {kCausal, 2048, 0.921},  // hopper 0.325 ms, cuDNN 0.299 ms
    {kCausal, 4096, 1.031},  // hopper 0.540 ms, cuDNN 0.556 ms
    {kCausal, 8192, 1.078},  // hopper 0.969 ms, cuDNN 1.045 ms
    {kCausal, 16384, 1.083},  // hopper 1.838 ms, cuDNN 1.991 ms
    {kWindow, 1024, 0.847},  // hopper 0.196 ms, cuDNN 0.166 ms
    {kWindow, 2048, 0.961},  // hopper 0.202 ms, cuDNN 0.194 ms
    {kWindow, 4096, 0.942},  // hopper 0.217 ms, cuDNN 0.205 ms
    {kWindow, 8192, 0.956},  // hopper 0.221 ms, cuDNN 0.211 ms
    {kWindow, 16384, 0.959},  // hopper 0.223 ms, cuDNN 0.214 ms
};
inline constexpr int kMeasuredRows = 15;

}  // namespace fusedattn::hopper_rules
