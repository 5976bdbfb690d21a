// Launches one variant of the Hopper flash forward kernel (fwd_kernel.cuh). Each variant is
// instantiated in a translation unit of its own (instance.cu.in, the list in CMakeLists.txt);
// flash_fwd.cu declares launch and picks the variant.
#pragma once

#include <cuda_runtime.h>

#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/attention/hopper/fwd_kernel.cuh"

namespace fusedattn::cuda::hopper {

// a: the kernel's arguments, filled by flash_fwd; grid: thread blocks of Dims<kD, kGroups>::kThreads.
template <class Mod, bool kCausal, bool kBf16, int kD, int kGroups>
Status launch(const FwdArgs& a, dim3 grid, cudaStream_t stream) {
  auto kernel = flash_fwd_kernel<Mod, kCausal, kBf16, kD, kGroups>;
  constexpr size_t smem = kSmemBytes<kD, kGroups, Mod::kBiasTile>;
  static_assert(smem <= 227 * 1024, "shared memory");
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, Dims<kD, kGroups>::kThreads, smem, stream>>>(a);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::cuda::hopper
