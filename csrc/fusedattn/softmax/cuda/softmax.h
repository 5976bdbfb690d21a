// The CUDA softmax kernels (semantics in params.h, design in kernels.cuh), as
// the FFI handler calls them: asynchronous on `stream`, errors as a Status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/core/status.h"
#include "fusedattn/softmax/params.h"

namespace fusedattn::softmax {

// x, y: p.dims, p.dtype (device); mask: p.mask_dims bool, or null unless p.has_mask.
// Assumes validate(p) passed and choose_kernel(p, CUDA) said available.
Status cuda_softmax_fwd(const SoftmaxParams& p, const void* x, const uint8_t* mask, void* y,
                        cudaStream_t stream);

// y, dy, dx: p.dims, p.dtype (device); y is the forward output.
Status cuda_softmax_bwd(const SoftmaxParams& p, const void* y, const void* dy, void* dx,
                        cudaStream_t stream);

}  // namespace fusedattn::softmax
