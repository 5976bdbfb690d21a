#include "fusedattn/attention/cuda/keep_mask.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "fusedattn/core/codes.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda {
namespace {

// Each thread folds 16 keys a step (one 16-byte load where the mask is 16-byte aligned and
// the 16 keys lie inside n); the rest one key at a time.
template <class T>
__global__ void fold_kernel(const uint8_t* __restrict__ mask, int64_t n, T keep, T drop,
                            T* __restrict__ out) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const bool vec = (reinterpret_cast<uintptr_t>(mask) % 16 == 0) &&
                   (reinterpret_cast<uintptr_t>(out) % 16 == 0);
  const int64_t whole = vec ? n / 16 : 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < whole; i += stride) {
    const uint4 m = reinterpret_cast<const uint4*>(mask)[i];
    uint8_t b[16];
    memcpy(b, &m, 16);
    T v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = b[j] ? keep : drop;
    uint4* o = reinterpret_cast<uint4*>(out + 16 * i);
#pragma unroll
    for (int j = 0; j < int(sizeof(T)); ++j) o[j] = reinterpret_cast<const uint4*>(v)[j];
  }
  for (int64_t i = 16 * whole + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    out[i] = mask[i] ? keep : drop;
}

template <class T>
Status launch(const uint8_t* mask, int64_t n, T keep, T drop, void* out, cudaStream_t stream) {
  const int64_t blocks = std::clamp<int64_t>((n / 16 + 255) / 256, 1, 4096);
  fold_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(mask, n, keep, drop,
                                                                     static_cast<T*>(out));
  return cuda_status(cudaGetLastError(), "fold_keep_mask");
}

}  // namespace

Status fold_keep_mask(const uint8_t* mask, int64_t n, int32_t dtype, float masked, void* out,
                      cudaStream_t stream) {
  if (n <= 0) return Status::Ok();
  switch (dtype) {
    case FA_FLOAT32: return launch<float>(mask, n, 0.0f, masked, out, stream);
    case FA_BFLOAT16:
      return launch<uint16_t>(mask, n, 0, __bfloat16_as_ushort(__float2bfloat16_rn(masked)), out,
                              stream);
    case FA_FLOAT16:
      return launch<uint16_t>(mask, n, 0, __half_as_ushort(__float2half_rn(masked)), out, stream);
  }
  return Status::Invalid("fold_keep_mask: dtype code " + std::to_string(dtype) +
                         "; allowed float32, bfloat16, float16");
}

}  // namespace fusedattn::cuda
