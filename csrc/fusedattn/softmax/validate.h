// The checks of a SoftmaxParams, and which kernel (if any) serves it.
//
// validate() runs once at the boundary (FFI handlers, and Python through the C
// API at trace time); kernels assume valid input. choose_kernel() is the one
// place that decides whether our kernel serves a call on a platform or the
// pure-JAX fallback runs: Python's is_softmax_kernel_available() and softmax()
// ask it, so the answer a user gets is what runs.
#pragma once

#include <string>

#include "fusedattn/core/status.h"
#include "fusedattn/softmax/params.h"

namespace fusedattn::softmax {

// Every check, the dtype included (only float32, bfloat16 and float16 pass).
Status validate(const SoftmaxParams& p);

struct KernelChoice {
  bool available = false;  // our kernel serves the call (else the pure-JAX fallback)
  Status status;           // not ok: the call is invalid on any path
  std::string reason;      // why the kernel does or does not serve it
};

// dtype -1 (a floating type the kernels do not take) is valid here: the fallback
// serves it. cuda_built: whether this library has the CUDA kernels.
KernelChoice choose_kernel(const SoftmaxParams& p, int32_t platform, bool cuda_built);

}  // namespace fusedattn::softmax
