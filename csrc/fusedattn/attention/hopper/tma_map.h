// Tensor maps (the copy engine's view of a tensor) for the Hopper kernels.
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>
#include <initializer_list>

#include "fusedattn/core/status.h"

namespace fusedattn::cuda::hopper {

// A {D, S, H, B} map over a bf16 / fp16 tensor (strides in elements, the head dim
// contiguous) with boxes of 64 x `rows` (one 128-byte swizzle span of a tile's rows).
// Extents of 1 get a stride that is valid but never used. `name` goes into the error.
Status make_map(CUtensorMap* map, const void* base, bool bf16, int64_t D, int64_t S, int64_t H,
                int64_t B, int64_t s_s, int64_t s_h, int64_t s_b, uint32_t rows, const char* name);

// Whether 16-bit tensors' rows take whole 16-byte units, as the copy engine's maps and 16-byte
// loads need: every pointer 16-byte aligned, every stride (in elements) a multiple of 8.
bool rows16(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> strides);

}  // namespace fusedattn::cuda::hopper
