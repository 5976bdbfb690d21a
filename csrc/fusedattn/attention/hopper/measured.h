// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py --head-dims 64 --merge
// (dev/hopper_fwd/d64_gpu.sh; head dim 64: full rows with three consumer groups, causal, window
// and THD rows again with the groups rule of flash_fwd.cu; the head dim 128 rows kept from the
// first run, after the producer gave the consumers 232 registers; bench/runs/2026-11-28/session24)
// bf16, B x S = 16384 tokens, 2048 / D heads; ratio = cuDNN's forward time / the Hopper forward's.
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasured[] = {
    {kFull, 64, 1024, 0.945},  // hopper 0.348 ms, cuDNN 0.329 ms
    {kFull, 64, 2048, 1.075},  // hopper 0.597 ms, cuDNN 0.642 ms
    {kFull, 64, 4096, 1.100},  // hopper 1.127 ms, cuDNN 1.239 ms
    {kFull, 64, 8192, 1.147},  // hopper 2.111 ms, cuDNN 2.421 ms
    {kFull, 64, 16384, 1.170},  // hopper 4.134 ms, cuDNN 4.838 ms
    {kCausal, 64, 1024, 0.838},  // hopper 0.253 ms, cuDNN 0.212 ms
    {kCausal, 64, 2048, 0.939},  // hopper 0.390 ms, cuDNN 0.366 ms
    {kCausal, 64, 4096, 1.029},  // hopper 0.664 ms, cuDNN 0.683 ms
    {kCausal, 64, 8192, 1.099},  // hopper 1.193 ms, cuDNN 1.312 ms
    {kCausal, 64, 16384, 1.125},  // hopper 2.263 ms, cuDNN 2.546 ms
    {kWindow, 64, 1024, 1.001},  // hopper 0.223 ms, cuDNN 0.223 ms
    {kWindow, 64, 2048, 1.079},  // hopper 0.241 ms, cuDNN 0.260 ms
    {kWindow, 64, 4096, 1.074},  // hopper 0.256 ms, cuDNN 0.274 ms
    {kWindow, 64, 8192, 1.096},  // hopper 0.260 ms, cuDNN 0.285 ms
    {kWindow, 64, 16384, 1.113},  // hopper 0.259 ms, cuDNN 0.289 ms
    {kThd, 64, 1024, 0.776},  // hopper 0.250 ms, cuDNN 0.194 ms
    {kThd, 64, 2048, 0.862},  // hopper 0.295 ms, cuDNN 0.255 ms
    {kThd, 64, 4096, 0.932},  // hopper 0.400 ms, cuDNN 0.372 ms
    {kThd, 64, 8192, 0.953},  // hopper 0.534 ms, cuDNN 0.509 ms
    {kThd, 64, 16384, 1.056},  // hopper 0.864 ms, cuDNN 0.912 ms
    {kFull, 128, 1024, 0.905},  // hopper 0.286 ms, cuDNN 0.259 ms
    {kFull, 128, 2048, 1.019},  // hopper 0.481 ms, cuDNN 0.490 ms
    {kFull, 128, 4096, 1.040},  // hopper 0.904 ms, cuDNN 0.940 ms
    {kFull, 128, 8192, 1.063},  // hopper 1.728 ms, cuDNN 1.837 ms
    {kFull, 128, 16384, 1.076},  // hopper 3.386 ms, cuDNN 3.642 ms
    {kCausal, 128, 1024, 0.891},  // hopper 0.192 ms, cuDNN 0.171 ms
    {kCausal, 128, 2048, 1.020},  // hopper 0.296 ms, cuDNN 0.301 ms
    {kCausal, 128, 4096, 1.085},  // hopper 0.507 ms, cuDNN 0.550 ms
    {kCausal, 128, 8192, 1.101},  // hopper 0.932 ms, cuDNN 1.027 ms
    {kCausal, 128, 16384, 1.131},  // hopper 1.772 ms, cuDNN 2.004 ms
    {kWindow, 128, 1024, 0.975},  // hopper 0.169 ms, cuDNN 0.165 ms
    {kWindow, 128, 2048, 1.059},  // hopper 0.183 ms, cuDNN 0.194 ms
    {kWindow, 128, 4096, 1.075},  // hopper 0.193 ms, cuDNN 0.207 ms
    {kWindow, 128, 8192, 1.103},  // hopper 0.195 ms, cuDNN 0.215 ms
    {kWindow, 128, 16384, 1.111},  // hopper 0.196 ms, cuDNN 0.217 ms
    {kThd, 128, 1024, 0.856},  // hopper 0.166 ms, cuDNN 0.142 ms
    {kThd, 128, 2048, 0.908},  // hopper 0.210 ms, cuDNN 0.190 ms
    {kThd, 128, 4096, 0.967},  // hopper 0.292 ms, cuDNN 0.283 ms
    {kThd, 128, 8192, 0.975},  // hopper 0.402 ms, cuDNN 0.392 ms
    {kThd, 128, 16384, 1.052},  // hopper 0.675 ms, cuDNN 0.710 ms
};
inline constexpr int kMeasuredRows = 40;

}  // namespace fusedattn::hopper_rules
