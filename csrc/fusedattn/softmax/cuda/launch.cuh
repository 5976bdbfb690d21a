// Launches the CUDA softmax kernels with the configuration of config.h.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/core/status.h"
#include "fusedattn/softmax/cuda/config.h"
#include "fusedattn/softmax/cuda/kernels.cuh"

namespace fusedattn::softmax::cuda {

// Launches `kernel` over all row groups (row_groups(a)), kRows groups per block, in
// chunks of at most 2^30 blocks (the grid's x limit is 2^31 - 1; no real call
// needs a second chunk).
template <int TPR, class Args, class Kernel>
Status launch_rows(Kernel kernel, Args a, cudaStream_t stream) {
  constexpr int64_t kRows = Group<TPR>::kRows, kMaxBlocks = int64_t{1} << 30;
  const int64_t groups = row_groups(a);
  for (a.row0 = 0; a.row0 < groups; a.row0 += kMaxBlocks * kRows) {
    const int64_t blocks = std::min(kMaxBlocks, (groups - a.row0 + kRows - 1) / kRows);
    kernel<<<static_cast<unsigned int>(blocks), Group<TPR>::kBlock, 0, stream>>>(a);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return Status::Ok();
}

template <class T>
Status launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vectorizable<T>(a.skv, {a.x, a.y}, a.mask);  // else the scalar kernel
  return with_config(int64_t{a.skv} * sizeof(T), [&](auto tpr, auto bpt) -> Status {
    constexpr int TPR = decltype(tpr)::value, E = decltype(bpt)::value / sizeof(T);
    if (vec) {
      const FwdArgs k = for_kernel<TPR, kVec>(a);
      return launch_rows<TPR>(fwd_kernel<T, TPR, E, kVec>(k), k, stream);
    }
    if constexpr (kScalarServed<T, TPR, decltype(bpt)::value>) {
      const FwdArgs k = for_kernel<TPR, 1>(a);
      return launch_rows<TPR>(fwd_kernel<T, TPR, E, 1>(k), k, stream);
    }
    return scalar_not_served(a.skv);
  });
}

template <class T>
Status launch_bwd(const BwdArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = vectorizable<T>(a.skv, {a.y, a.dy, a.dx}, nullptr);
  return with_config(int64_t{a.skv} * sizeof(T), [&](auto tpr, auto bpt) -> Status {
    constexpr int TPR = decltype(tpr)::value, E = decltype(bpt)::value / sizeof(T);
    if (vec) return launch_rows<TPR>(softmax_bwd_kernel<T, TPR, E, kVec>, a, stream);
    if constexpr (kScalarServed<T, TPR, decltype(bpt)::value>)
      return launch_rows<TPR>(softmax_bwd_kernel<T, TPR, E, 1>, a, stream);
    return scalar_not_served(a.skv);
  });
}

}  // namespace fusedattn::softmax::cuda
