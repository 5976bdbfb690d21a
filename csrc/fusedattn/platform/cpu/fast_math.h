// The CPU engine's names for core/fast_math.h (vectorizable exp, tanh, sigmoid and a
// NaN-keeping max, shared with the CUDA kernels' score_mod programs), and their double
// forms for the float64 engine (exact: std::exp, no approximation).
#pragma once

#include <cmath>

#include "fusedattn/core/fast_math.h"

namespace fusedattn::cpu {

using fusedattn::exact_edges_exp;
using fusedattn::fast_exp;
using fusedattn::fast_sigmoid;
using fusedattn::fast_tanh;
using fusedattn::nan_max;

// nan_max in double.
inline double nan_max(double a, double b) { return b > a || b != b ? b : a; }

// The engine's exp of its arithmetic type: fast_exp in float32 (callers zero masked
// entries explicitly), std::exp in double.
inline float acc_exp(float x) { return fast_exp(x); }
inline double acc_exp(double x) { return std::exp(x); }

}  // namespace fusedattn::cpu
