// Launches one variant of the Hopper flash backward kernel (bwd_kernel.cuh). flash_bwd.cu
// picks the variant; head dim 256's variants compile in a translation unit of their own
// (flash_bwd_d256.cu), beside the others.
#pragma once

#include <cuda_runtime.h>

#include "fusedattn/attention/hopper/bwd_kernel.cuh"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda::hopper {

// a: the kernel's arguments, filled by flash_bwd; a.dq_sem picks the deterministic variant.
template <bool kCausal, bool kBf16, bool kDense, int kD, int kMod = kBwdPlain>
Status launch_bwd(const BwdArgs& a, dim3 grid, cudaStream_t stream) {
  auto kernel = a.dq_sem ? flash_bwd_kernel<kCausal, kBf16, kDense, kD, true, kMod>
                         : flash_bwd_kernel<kCausal, kBf16, kDense, kD, false, kMod>;
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kBwdSmemBytes<kD, kDense, kMod>)));
  kernel<<<grid, BwdDims::kThreads, kBwdSmemBytes<kD, kDense, kMod>, stream>>>(a);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

// Head dim 256's variants (flash_bwd_d256.cu): plain, softcap (mod kBwdSoftcap; dense: a
// bias beside it, dbias where wanted), ALiBi (kBwdAlibi, kBwdAlibiAbs: the same, through
// launch_bwd_d256_alibi), a dense mask or bias (dense), with dbias (mod kBwdDbias, dense).
Status launch_bwd_d256(const BwdArgs& a, dim3 grid, bool causal, bool bf16, bool dense, int mod,
                       cudaStream_t stream);
// Its ALiBi variants (flash_bwd_d256_alibi.cu; abs: |kv - q|).
Status launch_bwd_d256_alibi(const BwdArgs& a, dim3 grid, bool causal, bool bf16, bool dense, bool abs,
                             cudaStream_t stream);

}  // namespace fusedattn::cuda::hopper
