// Launch configuration of the CUDA softmax kernels: which row-group width (TPR)
// and bytes per thread (BPT) serve a row of R bytes. Host code only (no CUDA
// headers), so the kernels' host emulation in tests/cpp picks the same configs.
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

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "fusedattn/core/status.h"
#include "fusedattn/softmax/params.h"

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

// Whether a call can use 16-byte units: every row start 16-byte aligned in x/y
// (or y/dy/dx), and the mask's units (16 / sizeof(T) bytes) aligned too.
template <class T>
bool vectorizable(int64_t skv, std::initializer_list<const void*> ptrs, const void* mask) {
  constexpr uintptr_t kVec = 16 / sizeof(T);
  bool ok = (skv * static_cast<int64_t>(sizeof(T))) % 16 == 0;
  for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok && (!mask || reinterpret_cast<uintptr_t>(mask) % kVec == 0);
}

// The scalar (unaligned-row) kernel of 2-byte types at 1024 threads and 64 B a
// thread holds 32 elements as 32 separate units: past the 64 registers a thread of
// a 1024-thread block may have. choose_kernel() sends those rows (Skv > 16384,
// Skv % 8 != 0) to the fallback; every other configuration has a scalar kernel.
template <class T, int TPR, int BPT>
constexpr bool kScalarServed = sizeof(T) == 4 || TPR < 1024 || BPT <= 32;

inline Status scalar_not_served(int64_t skv) {
  return Status::Internal("softmax: an unaligned row of " + std::to_string(skv) +
                          " 2-byte elements reached the CUDA launcher (choose_kernel should "
                          "have sent it to the fallback)");
}

}  // namespace fusedattn::softmax::cuda
