// Where the Hopper flash forward runs plain calls (no score_mod) faster than cuDNN's forward
// graph: written by scripts/tune_hopper.py from its measurement (device, date and command
// below); select_backend reads it by the rule of hopper/table.h.
// Measured on NVIDIA H200, 2026-11-28: python scripts/tune_hopper.py --head-dims 256 --merge
// (dev/hopper_fwd/d64_gpu.sh, TUNE_DIMS=256; head dims 64 and 128 kept from session 24's
// runs; bench/runs/2026-11-28/session25)
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
    {kFull, 256, 1024, 0.878},  // hopper 0.278 ms, cuDNN 0.244 ms
    {kFull, 256, 2048, 0.932},  // hopper 0.486 ms, cuDNN 0.453 ms
    {kFull, 256, 4096, 0.994},  // hopper 0.871 ms, cuDNN 0.865 ms
    {kFull, 256, 8192, 1.025},  // hopper 1.643 ms, cuDNN 1.684 ms
    {kFull, 256, 16384, 1.023},  // hopper 3.213 ms, cuDNN 3.286 ms
    {kCausal, 256, 1024, 0.850},  // hopper 0.191 ms, cuDNN 0.162 ms
    {kCausal, 256, 2048, 0.946},  // hopper 0.297 ms, cuDNN 0.281 ms
    {kCausal, 256, 4096, 0.992},  // hopper 0.519 ms, cuDNN 0.515 ms
    {kCausal, 256, 8192, 1.038},  // hopper 0.946 ms, cuDNN 0.982 ms
    {kCausal, 256, 16384, 1.152},  // hopper 1.657 ms, cuDNN 1.908 ms
    {kWindow, 256, 1024, 0.955},  // hopper 0.164 ms, cuDNN 0.156 ms
    {kWindow, 256, 2048, 1.011},  // hopper 0.179 ms, cuDNN 0.181 ms
    {kWindow, 256, 4096, 1.050},  // hopper 0.187 ms, cuDNN 0.196 ms
    {kWindow, 256, 8192, 1.052},  // hopper 0.189 ms, cuDNN 0.198 ms
    {kWindow, 256, 16384, 1.094},  // hopper 0.186 ms, cuDNN 0.204 ms
    {kThd, 256, 1024, 0.969},  // hopper 0.144 ms, cuDNN 0.139 ms
    {kThd, 256, 2048, 0.950},  // hopper 0.192 ms, cuDNN 0.183 ms
    {kThd, 256, 4096, 1.024},  // hopper 0.271 ms, cuDNN 0.278 ms
    {kThd, 256, 8192, 1.017},  // hopper 0.376 ms, cuDNN 0.382 ms
    {kThd, 256, 16384, 1.060},  // hopper 0.652 ms, cuDNN 0.692 ms
};
inline constexpr int kMeasuredRows = 60;

}  // namespace fusedattn::hopper_rules
