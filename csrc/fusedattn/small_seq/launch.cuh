// Picks the chunk size of the small-seq kernels and launches them; included by the
// per-head-dim files (small_seq_d*.cu) so each head dim compiles on its own.
//
// kCs (key rows per sub-group and chunk, forward and the backward's dq pass) is the
// smallest power of two that covers P's width W in one chunk, capped so a chunk's K
// and V slices take at most 64 registers: a small W keeps few registers and many warps
// resident, a large W issues many loads per warp. kCb (the backward's dk/dv pass,
// GQA or broken promises only) also keeps its float accumulators within 64 registers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "../cuda/check.h"
#include "bwd_kernel.cuh"

namespace fusedattn::small_seq::cuda {

template <class T, int D>
struct Chunks {
  using G = Geo<T, D>;
  static constexpr int kCsMax = 8 / G::kVpl;
  static constexpr int kCbMax = 1;
};

inline int chunk_steps(int64_t width, int rows_per_step, int cap) {
  const int64_t steps = (width + rows_per_step - 1) / rows_per_step;
  int cs = 1;
  while (cs < steps && cs < cap) cs *= 2;
  return cs;
}

// Blocks of `kernel` that stay resident on the current device: the kernels walk
// their work items in a loop, so a larger grid would only queue. The per-SM figure of
// each kernel is asked once (it depends on the kernel's registers, not on the call).
template <class Kernel>
Status resident_blocks(Kernel kernel, int64_t* blocks) {
  static std::atomic<int> per_sm{0};
  int device = 0, sms = 0, n = per_sm.load(std::memory_order_relaxed);
  FA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  FA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (n == 0) {
    FA_CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarpsPerBlock * 32, 0));
    n = n > 0 ? n : 1;
    per_sm.store(n, std::memory_order_relaxed);
  }
  *blocks = int64_t{sms} * n;
  return Status::Ok();
}

template <class Kernel>
Status launch_kernel(Kernel kernel, const KernelArgs& a, cudaStream_t stream, const char* what) {
  int64_t resident = 0;
  Status s = resident_blocks(kernel, &resident);
  if (!s.ok()) return s;
  const int64_t needed = (a.units + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>(needed < resident ? needed : resident));
  kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(a);
  return fusedattn::cuda::cuda_status(cudaGetLastError(), what);
}

template <class T, int D, int kCs>
Status launch_chunked(const KernelArgs& a, bool backward, cudaStream_t stream) {
  constexpr int kCb = kCs < Chunks<T, D>::kCbMax ? kCs : Chunks<T, D>::kCbMax;
  if (backward)
    return launch_kernel(small_seq_bwd_kernel<T, D, kCs, kCb>, a, stream,
                         "small-seq backward kernel launch");
  return launch_kernel(small_seq_fwd_kernel<T, D, kCs>, a, stream,
                       "small-seq forward kernel launch");
}

template <class T, int D>
Status launch_typed(const KernelArgs& a, bool backward, cudaStream_t stream) {
  constexpr int kMax = Chunks<T, D>::kCsMax;
  switch (chunk_steps(a.width, Geo<T, D>::kRps, kMax)) {
    case 1: return launch_chunked<T, D, 1>(a, backward, stream);
    case 2:
      if constexpr (kMax >= 2) return launch_chunked<T, D, 2>(a, backward, stream);
      break;
    case 4:
      if constexpr (kMax >= 4) return launch_chunked<T, D, 4>(a, backward, stream);
      break;
    case 8:
      if constexpr (kMax >= 8) return launch_chunked<T, D, 8>(a, backward, stream);
      break;
  }
  return Status::Internal("small-seq: no kernel for this chunk size (a bug)");
}

template <int D>
Status launch_head_dim(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream) {
  switch (dtype) {
    case FA_BFLOAT16: return launch_typed<__nv_bfloat16, D>(a, backward, stream);
    case FA_FLOAT16: return launch_typed<__half, D>(a, backward, stream);
    case FA_FLOAT32: return launch_typed<float, D>(a, backward, stream);
  }
  return Status::Internal("small-seq: no kernel for dtype code " + std::to_string(dtype));
}

// Defined in small_seq_d{64,128,256,512}.cu.
Status launch_d64(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream);
Status launch_d128(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream);
Status launch_d256(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream);
Status launch_d512(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream);

}  // namespace fusedattn::small_seq::cuda
