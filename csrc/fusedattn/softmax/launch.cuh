// Launch configuration of the CUDA softmax kernels: which row-group width (TPR)
// and bytes per thread (BPT) serve a row of R bytes, and the launch itself.
//
//   R <= 512 B      TPR = the next power of two >= R / 16 (1..32), 16 B per thread
//   R <= 1 KiB      one warp per row, 32 B per thread   (rows per 128-thread block: 4)
//   R <= 2 KiB      one warp per row, 64 B per thread
//   R <= 4..32 KiB  one block of 128..1024 threads per row, 32 B per thread
//   R <= 64 KiB     1024 threads, 64 B per thread (kCudaSoftmaxMaxRowBytes)
//
// Why: a whole row stays in registers between the loads and the stores (one pass
// over memory), so bytes per thread are kept small enough for high occupancy
// (the forward holds BPT / sizeof(T) floats per thread, the backward 2 * BPT bytes),
// and wide rows get wide groups rather than more registers. Enough rows are in
// flight per SM (>= 32 KiB of loads) to cover DRAM latency; a block reduction costs
// two __syncthreads per row, which rows of >= 4 KiB amortize.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "../cuda/check.h"
#include "../status.h"
#include "kernels.cuh"

namespace fusedattn::softmax::cuda {

template <int N>
using Int = std::integral_constant<int, N>;

// Calls f(Int<TPR>, Int<BPT>) for the configuration of a row of row_bytes.
template <class F>
Status with_config(int64_t row_bytes, F&& f) {
  if (row_bytes <= 16) return f(Int<1>{}, Int<16>{});
  if (row_bytes <= 32) return f(Int<2>{}, Int<16>{});
  if (row_bytes <= 64) return f(Int<4>{}, Int<16>{});
  if (row_bytes <= 128) return f(Int<8>{}, Int<16>{});
  if (row_bytes <= 256) return f(Int<16>{}, Int<16>{});
  if (row_bytes <= 512) return f(Int<32>{}, Int<16>{});
  if (row_bytes <= 1024) return f(Int<32>{}, Int<32>{});
  if (row_bytes <= 2048) return f(Int<32>{}, Int<64>{});
  if (row_bytes <= 4096) return f(Int<128>{}, Int<32>{});
  if (row_bytes <= 8192) return f(Int<256>{}, Int<32>{});
  if (row_bytes <= 16384) return f(Int<512>{}, Int<32>{});
  if (row_bytes <= 32768) return f(Int<1024>{}, Int<32>{});
  if (row_bytes <= kCudaSoftmaxMaxRowBytes) return f(Int<1024>{}, Int<64>{});
  return Status::Internal("softmax: a row of " + std::to_string(row_bytes) +
                          " bytes reached the CUDA launcher (choose_kernel should have sent it "
                          "to the fallback)");
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Launches `kernel` over all rows: one row group per block, in chunks of at most
// 2^30 blocks (the grid's x limit is 2^31 - 1; no real call needs a second chunk).
template <int TPR, class Args, class Kernel>
Status launch_rows(Kernel kernel, Args a, cudaStream_t stream) {
  constexpr int64_t kRows = Group<TPR>::kRows, kMaxBlocks = int64_t{1} << 30;
  for (a.row0 = 0; a.row0 < a.rows; a.row0 += kMaxBlocks * kRows) {
    const int64_t blocks = std::min(kMaxBlocks, (a.rows - a.row0 + kRows - 1) / kRows);
    kernel<<<static_cast<unsigned int>(blocks), Group<TPR>::kBlock, 0, stream>>>(a);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return Status::Ok();
}

// The scalar (unaligned-row) kernels of 2-byte types hold 32 elements a thread as
// 32 separate units at 64 B per thread: past the 64 registers of a 1024-thread block.
// choose_kernel() sends those rows (Skv > 16384, Skv % 8 != 0) to the fallback.
template <class T, int BPT>
constexpr bool kScalarServed = sizeof(T) == 4 || BPT <= 32;

inline Status scalar_not_served(int64_t skv) {
  return Status::Internal("softmax: an unaligned row of " + std::to_string(skv) +
                          " 2-byte elements reached the CUDA launcher (choose_kernel should "
                          "have sent it to the fallback)");
}

template <class T>
Status launch_fwd(const FwdArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  // 16-byte units need every row start 16-byte aligned (and the mask's 8/4-byte
  // units theirs); otherwise the scalar kernel runs.
  const bool vec = (int64_t{a.skv} * sizeof(T)) % 16 == 0 && aligned16(a.x) && aligned16(a.y) &&
                   (!a.mask || reinterpret_cast<uintptr_t>(a.mask) % kVec == 0);
  return with_config(int64_t{a.skv} * sizeof(T), [&](auto tpr, auto bpt) -> Status {
    constexpr int TPR = decltype(tpr)::value, E = decltype(bpt)::value / sizeof(T);
    if (vec) return launch_rows<TPR>(softmax_fwd_kernel<T, TPR, E, kVec>, a, stream);
    if constexpr (kScalarServed<T, decltype(bpt)::value>)
      return launch_rows<TPR>(softmax_fwd_kernel<T, TPR, E, 1>, a, stream);
    return scalar_not_served(a.skv);
  });
}

template <class T>
Status launch_bwd(const BwdArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = (int64_t{a.skv} * sizeof(T)) % 16 == 0 && aligned16(a.y) && aligned16(a.dy) &&
                   aligned16(a.dx);
  return with_config(int64_t{a.skv} * sizeof(T), [&](auto tpr, auto bpt) -> Status {
    constexpr int TPR = decltype(tpr)::value, E = decltype(bpt)::value / sizeof(T);
    if (vec) return launch_rows<TPR>(softmax_bwd_kernel<T, TPR, E, kVec>, a, stream);
    if constexpr (kScalarServed<T, decltype(bpt)::value>)
      return launch_rows<TPR>(softmax_bwd_kernel<T, TPR, E, 1>, a, stream);
    return scalar_not_served(a.skv);
  });
}

}  // namespace fusedattn::softmax::cuda
