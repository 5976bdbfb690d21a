// CUDA status checks for the CUDA side of the engine: every runtime call's result
// becomes a Status that names the call, so an FFI handler can return it.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fusedattn/core/status.h"

namespace fusedattn::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")");
}

}  // namespace fusedattn::cuda

// Evaluates a cudaError_t expression; returns its Status from the enclosing function on failure.
#define FA_CUDA_RETURN_IF_ERROR(expr)                                               \
  do {                                                                              \
    ::fusedattn::Status _fa_cs = ::fusedattn::cuda::cuda_status((expr), #expr);     \
    if (!_fa_cs.ok()) return _fa_cs;                                                \
  } while (0)
