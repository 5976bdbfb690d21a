// The CPU engine's names for core/fast_math.h (vectorizable exp, tanh, sigmoid and a
// NaN-keeping max, shared with the CUDA kernels' score_mod programs).
#pragma once

#include "fusedattn/core/fast_math.h"

namespace fusedattn::cpu {

using fusedattn::exact_edges_exp;
using fusedattn::fast_exp;
using fusedattn::fast_sigmoid;
using fusedattn::fast_tanh;
using fusedattn::nan_max;

}  // namespace fusedattn::cpu
