// A boolean keep mask (backend.h's kRequestMaskKeepOnly: the bias operand is
// dot_product_attention's mask itself, one byte a key, nonzero keeps it) folded into the
// bias the kernels that add a bias's values read: 0 at kept keys, the masked value
// (fa_masked_bias_value) at dropped ones -- what XLA's `where` gave before, so every
// backend keeps the same answer. The Hopper kernels' tile classification reads the bytes
// instead (no fold).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/core/status.h"

namespace fusedattn::cuda {

// out[i] = mask[i] ? 0 : masked, in dtype (FA_FLOAT32, FA_BFLOAT16 or FA_FLOAT16); n
// elements, both contiguous. masked must be exact in dtype.
Status fold_keep_mask(const uint8_t* mask, int64_t n, int32_t dtype, float masked, void* out,
                      cudaStream_t stream);

}  // namespace fusedattn::cuda
