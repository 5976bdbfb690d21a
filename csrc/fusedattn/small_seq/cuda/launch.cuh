// Picks the chunk sizes of the small-seq kernels and launches them; included by the
// generated instantiations (instance.cu.in, the list in CMakeLists.txt) so each (head dim,
// dtype) compiles on its own. small_seq.cu declares launch_typed and dispatches.
//
// Forward: kCs keys a chunk (a team's step, fwd_kernel.cuh), the smallest power of two
// that covers P's width W, at most 2 (1 where a lane holds several vectors of a row):
// a step's slices wait in shared memory, and small steps leave room for 6-8 blocks an SM.
// Backward without GQA: kTs keys a team's step, chosen as the forward's kCs (the team
// kernel, bwd_kernel.cuh). With GQA: kCs key rows per sub-group and chunk (dq pass), the
// smallest power of two that covers W in one chunk, capped so a chunk's K and V slices take
// at most 64 registers; kCb (the dk/dv pass) keeps its float accumulators within 64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <type_traits>

#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/small_seq/cuda/bwd_kernel.cuh"

namespace fusedattn::small_seq::cuda {

template <class T, int D>
struct Chunks {
  using G = Geo<T, D>;
  static constexpr int kFwdMax = G::kVpl == 1 ? 2 : 1;
  static constexpr int kCsMax = 8 / G::kVpl;
  static constexpr int kCbMax = 1;
};

inline int chunk_steps(int64_t width, int rows_per_step, int cap) {
  const int64_t steps = (width + rows_per_step - 1) / rows_per_step;
  int cs = 1;
  while (cs < steps && cs < cap) cs *= 2;
  return cs;
}

// Launches kKernel with a grid of the blocks that stay resident on the current device:
// the kernels walk their work items in a loop, so a larger grid would only queue. Each
// kernel's per-SM figure (it depends on the kernel's registers and shared memory, not on
// the call) is asked once per device, after allowing the kernel its dynamic shared memory
// (static + dynamic beyond 48 KiB needs that; a setting of each device's own).
// per_sm_cap > 0: at most that many blocks an SM (fewer warps than fit).
template <auto kKernel>
Status launch_kernel(const KernelArgs& a, int smem, cudaStream_t stream, const char* what,
                     int per_sm_cap = 0) {
  constexpr int kDevices = 64;  // devices whose figure is kept; others ask on every launch
  static std::atomic<int> per_sm[kDevices];  // 0: not asked yet
  int device = 0, sms = 0;
  FA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  FA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int n = device < kDevices ? per_sm[device].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    if (smem > 0)
      FA_CUDA_RETURN_IF_ERROR(
          cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    FA_CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kWarpsPerBlock * 32, smem));
    n = n > 0 ? n : 1;
    if (device < kDevices) per_sm[device].store(n, std::memory_order_relaxed);
  }
  if (per_sm_cap > 0 && n > per_sm_cap) n = per_sm_cap;
  const int64_t resident = int64_t{sms} * n;
  const int64_t needed = (a.units + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const dim3 grid(static_cast<unsigned>(needed < resident ? needed : resident));
  kKernel<<<grid, kWarpsPerBlock * 32, smem, stream>>>(a);
  return fusedattn::cuda::cuda_status(cudaGetLastError(), what);
}

// Calls launch(std::integral_constant<int, cs>) for cs in {1, 2, 4, 8}, cs <= kMax.
template <int kMax, class Launch>
Status with_chunk(int cs, Launch&& launch) {
  switch (cs) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2:
      if constexpr (kMax >= 2) return launch(std::integral_constant<int, 2>{});
      break;
    case 4:
      if constexpr (kMax >= 4) return launch(std::integral_constant<int, 4>{});
      break;
    case 8:
      if constexpr (kMax >= 8) return launch(std::integral_constant<int, 8>{});
      break;
  }
  return Status::Internal("small-seq: no kernel for this chunk size (a bug)");
}

template <class T, int D>
Status launch_typed(const KernelArgs& a, bool backward, cudaStream_t stream) {
  using C = Chunks<T, D>;
  const int steps = chunk_steps(a.width, 1, C::kFwdMax);
  if (backward && a.group == 1) {
    return with_chunk<C::kFwdMax>(steps, [&](auto chunk) {
      constexpr int kTs = decltype(chunk)::value;
      return launch_kernel<small_seq_bwd_team_kernel<T, D, kTs>>(
          a, BwdLayout<T, D, kTs>::kBlockBytes, stream, "small-seq backward kernel launch");
    });
  }
  if (backward) {
    const int cs = chunk_steps(a.width, Geo<T, D>::kRps, C::kCsMax);
    return with_chunk<C::kCsMax>(cs, [&](auto chunk) {
      constexpr int kCs = decltype(chunk)::value;
      constexpr int kCb = kCs < C::kCbMax ? kCs : C::kCbMax;
      return launch_kernel<small_seq_bwd_gqa_kernel<T, D, kCs, kCb>>(
          a, 0, stream, "small-seq backward (GQA) kernel launch");
    });
  }
  // Rows of at most 4 keys and D <= 256 ran 1-2.5 points of the copy bandwidth faster with
  // 3 blocks an SM than with 4 (D 512 and longer rows 0.2-0.7 slower; H100 sweep,
  // dev/small_seq/small_seq_fwd_sweep.cu).
  const int cap = D <= 256 && a.width <= 4 ? 3 : 0;
  return with_chunk<C::kFwdMax>(steps, [&](auto chunk) {
    constexpr int kCs = decltype(chunk)::value;
    return launch_kernel<small_seq_fwd_kernel<T, D, kCs>>(
        a, FwdLayout<T, D, kCs>::kBlockBytes, stream, "small-seq forward kernel launch", cap);
  });
}

}  // namespace fusedattn::small_seq::cuda
