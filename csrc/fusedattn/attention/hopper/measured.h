// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py --head-dims 64 128 --merge
// (dev/hopper_fwd/d64_gpu.sh; every class at both head dims, after the producer gave the
// consumers 232 registers)
// bf16, B x S = 16384 tokens, 2048 / D heads; ratio = cuDNN's forward time / the Hopper forward's.
#pragma once

#include "fusedattn/attention/hopper/table.h"

namespace fusedattn::hopper_rules {

inline constexpr const char* kMeasuredOn = "NVIDIA H200, 2026-11-28";
inline constexpr Measured kMeasured[] = {
    {kFull, 64, 1024, 0.891},  // hopper 0.373 ms, cuDNN 0.332 ms
    {kFull, 64, 2048, 0.941},  // hopper 0.672 ms, cuDNN 0.633 ms
    {kFull, 64, 4096, 0.975},  // hopper 1.270 ms, cuDNN 1.238 ms
    {kFull, 64, 8192, 1.012},  // hopper 2.406 ms, cuDNN 2.434 ms
    {kFull, 64, 16384, 1.029},  // hopper 4.735 ms, cuDNN 4.872 ms
    {kCausal, 64, 1024, 0.820},  // hopper 0.259 ms, cuDNN 0.213 ms
    {kCausal, 64, 2048, 0.915},  // hopper 0.400 ms, cuDNN 0.366 ms
    {kCausal, 64, 4096, 1.011},  // hopper 0.678 ms, cuDNN 0.686 ms
    {kCausal, 64, 8192, 1.055},  // hopper 1.227 ms, cuDNN 1.295 ms
    {kCausal, 64, 16384, 1.090},  // hopper 2.320 ms, cuDNN 2.528 ms
    {kWindow, 64, 1024, 0.956},  // hopper 0.233 ms, cuDNN 0.223 ms
    {kWindow, 64, 2048, 1.012},  // hopper 0.255 ms, cuDNN 0.258 ms
    {kWindow, 64, 4096, 1.042},  // hopper 0.266 ms, cuDNN 0.277 ms
    {kWindow, 64, 8192, 1.053},  // hopper 0.270 ms, cuDNN 0.284 ms
    {kWindow, 64, 16384, 1.074},  // hopper 0.270 ms, cuDNN 0.290 ms
    {kThd, 64, 1024, 0.774},  // hopper 0.253 ms, cuDNN 0.196 ms
    {kThd, 64, 2048, 0.861},  // hopper 0.299 ms, cuDNN 0.258 ms
    {kThd, 64, 4096, 0.895},  // hopper 0.420 ms, cuDNN 0.376 ms
    {kThd, 64, 8192, 0.917},  // hopper 0.556 ms, cuDNN 0.510 ms
    {kThd, 64, 16384, 1.023},  // hopper 0.889 ms, cuDNN 0.910 ms
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
