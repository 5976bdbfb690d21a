// The CUDA softmax kernels: one pass over memory, a whole row held in registers.
//
// A row of Skv elements is spread over a group of TPR threads; each thread holds
// E elements as E / VEC units of VEC contiguous elements, unit k of thread t at
// element (t + k * TPR) * VEC, so a warp's loads are contiguous. VEC is 16 bytes
// of elements when the row length allows 16-byte alignment, else 1. Groups of
// TPR <= 32 threads reduce with shuffles (128-thread blocks, several rows per
// block); TPR >= 128 is one row per block, reduced through shared memory. All
// math is float32; exp is ex2.approx on logits pre-multiplied by scale * log2(e).
//
// Causal rows (i = row % Sq) read only their first min(i + 1, Skv) elements and
// write zeros after them. Loads of x, y and dy stream (__ldcs: read once). A
// broadcast mask (the [B, 1, Sq, Skv] mask of [B, H, Sq, Skv] logits) is read once
// per row group and kept in registers while the group runs the `reps` rows that
// share it (the heads), so DRAM sees the mask once, not once per head.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "fusedattn/softmax/mask_rows.h"

namespace fusedattn::softmax::cuda {

// x [rows, Skv] -> y [rows, Skv], T; mask rows of Skv bytes (nonzero = masked out),
// located by mask_rows, or null.
struct FwdArgs {
  const void* x;
  const uint8_t* mask;
  void* y;
  int64_t row0, rows;  // this launch's first row group; all rows
  int32_t reps;        // rows per row group, consecutive in launch order, sharing one mask row
  int64_t sq;
  int32_t skv;        // <= kMaxSeqLen: in-row indices are 32-bit
  int32_t rows32;     // rows < 2^32: row arithmetic (%, /) in 32 bits
  float scale_log2e;  // scale * log2(e)
  int32_t causal;
  MaskRows mask_rows;
};

// y, dy [rows, Skv] -> dx [rows, Skv], T.
struct BwdArgs {
  const void* y;
  const void* dy;
  void* dx;
  int64_t row0, rows;  // this launch's first row (a group is one row); all rows
  int64_t sq;
  int32_t skv;
  int32_t rows32;
  float scale;
  int32_t causal;
};

// Rows per forward row group: a divisor of the rows that share a mask row (the
// broadcast steps, innermost in launch order), at most kMaxReps so that a group's
// serial loop stays short, and small enough to leave >= kMinGroups groups to
// fill the GPU (min_groups: the tests lower it to reach the loop on small calls).
constexpr int64_t kMinGroups = 4096;
inline int32_t mask_reps(const MaskRows& m, int64_t rows, int64_t min_groups) {
  constexpr int64_t kMaxReps = 16;
  int64_t shared = 1;
  for (int32_t d = 0; d < m.n && m.launch_stride[d] == 0; ++d) shared *= m.launch_size[d];
  for (int64_t r = std::min(shared, kMaxReps); r > 1; --r)
    if (shared % r == 0 && rows / r >= min_groups) return static_cast<int32_t>(r);
  return 1;
}

// The arguments of a call described by p (assumes validate(p) passed).
inline FwdArgs make_fwd_args(const SoftmaxParams& p, const void* x, const uint8_t* mask, void* y,
                             int64_t min_groups = kMinGroups) {
  constexpr float kLog2e = 1.4426950408889634f;
  FwdArgs a;
  a.x = x;
  a.mask = p.has_mask ? mask : nullptr;
  a.y = y;
  a.row0 = 0;
  a.rows = softmax_rows(p);
  a.rows32 = a.rows <= int64_t{UINT32_MAX};
  a.sq = softmax_q(p);
  a.skv = static_cast<int32_t>(softmax_kv(p));  // <= kMaxSeqLen (validate)
  a.scale_log2e = p.scale * kLog2e;
  a.causal = p.softmax_type == FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED;
  a.mask_rows = p.has_mask ? make_mask_rows(p) : MaskRows{};
  a.reps = p.has_mask ? mask_reps(a.mask_rows, a.rows, min_groups) : 1;
  return a;
}

inline BwdArgs make_bwd_args(const SoftmaxParams& p, const void* y, const void* dy, void* dx) {
  BwdArgs a;
  a.y = y;
  a.dy = dy;
  a.dx = dx;
  a.row0 = 0;
  a.rows = softmax_rows(p);
  a.rows32 = a.rows <= int64_t{UINT32_MAX};
  a.sq = softmax_q(p);
  a.skv = static_cast<int32_t>(softmax_kv(p));
  a.scale = p.scale;
  a.causal = p.softmax_type == FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED;
  return a;
}

// Whether the forward kernel of (TPR, VEC) loops a row group over the rows sharing a
// mask row. Not the 1024-thread kernels (64 registers a thread: holding the mask and
// the next row's logits spills) nor the scalar ones (a mask byte per register).
template <int TPR, int VEC>
constexpr bool kSharesMask = TPR < 1024 && VEC > 1;

// a as the forward kernel of (TPR, VEC) takes it: one row a group where it does not
// share the mask. Launchers (and the tests' emulation) pass this to the kernel.
template <int TPR, int VEC>
FwdArgs for_kernel(FwdArgs a) {
  if (!kSharesMask<TPR, VEC>) a.reps = 1;
  return a;
}

// Row groups a launch covers (the grid is groups / rows-per-block blocks).
inline int64_t row_groups(const FwdArgs& a) { return a.rows / a.reps; }
inline int64_t row_groups(const BwdArgs& a) { return a.rows; }

// Storage bits of each dtype and their conversions (round to nearest even).
template <class T>
struct Elem;
template <>
struct Elem<float> {
  using Bits = float;
  static __device__ __forceinline__ float to_f(Bits b) { return b; }
  static __device__ __forceinline__ Bits from_f(float f) { return f; }
};
template <>
struct Elem<__nv_bfloat16> {
  using Bits = unsigned short;
  static __device__ __forceinline__ float to_f(Bits b) {
    return __uint_as_float(uint32_t{b} << 16);
  }
  static __device__ __forceinline__ Bits from_f(float f) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
};
template <>
struct Elem<__half> {
  using Bits = unsigned short;
  static __device__ __forceinline__ float to_f(Bits b) { return __half2float(__ushort_as_half(b)); }
  static __device__ __forceinline__ Bits from_f(float f) {
    return __half_as_ushort(__float2half_rn(f));
  }
};

// The machine type of an N-byte load or store.
template <int N>
struct Raw;
template <>
struct Raw<16> {
  using type = int4;
};
template <>
struct Raw<8> {
  using type = int2;
};
template <>
struct Raw<4> {
  using type = int;
};
template <>
struct Raw<2> {
  using type = unsigned short;
};
template <>
struct Raw<1> {
  using type = unsigned char;
};

// N elements of trivially copyable type B, moved as one load/store.
template <class B, int N>
union Pack {
  using RawT = typename Raw<sizeof(B) * N>::type;
  RawT raw;
  B v[N];
};

__device__ __forceinline__ float ex2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;  // ex2(-inf) = +0, ex2(NaN) = NaN
#else
  return exp2f(x);  // the host emulation of the kernels (tests/cpp/cuda_emulation.h)
#endif
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

template <int TPR>
struct Group {
  static constexpr int kBlock = TPR < 128 ? 128 : TPR;  // threads per block
  static constexpr int kRows = kBlock / TPR;            // rows per block
  static constexpr int kWarps = kBlock / 32;
  static_assert(TPR <= 32 || kRows == 1, "groups wider than a warp own their block");
};

// Reduces v over the TPR threads of a row group; every thread gets the result.
// smem: kWarps floats, used only when TPR > 32. A kernel that reduces again into
// the same smem must pass another group_reduce's barrier (into other smem) first,
// so that every warp has read the previous value: the forward alternates two.
template <int TPR, class Op>
__device__ __forceinline__ float group_reduce(float v, float* smem, Op op) {
#pragma unroll
  for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o /= 2)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (TPR > 32) {
    constexpr int kW = TPR / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) smem[threadIdx.x / 32] = v;
    __syncthreads();
    // Each aligned run of kW lanes holds all kW partials, so the butterfly below leaves
    // the total in every lane (not only in lanes < kW).
    v = smem[lane % kW];
#pragma unroll
    for (int o = kW / 2; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}

// Elements of a row that can be kept: Skv, or min(i + 1, Skv) for causal row i.
__device__ __forceinline__ int kept_len(int64_t row, int64_t sq, int skv, bool causal,
                                        bool rows32) {
  if (!causal) return skv;
  const int64_t i =
      rows32 ? int64_t{static_cast<uint32_t>(row) % static_cast<uint32_t>(sq)} : row % sq;
  return static_cast<int>(min(i + 1, int64_t{skv}));
}

__device__ __forceinline__ void locate_mask_row(const MaskRows& m, int64_t t, bool rows32,
                                                int64_t* row, int64_t* mask_off) {
  if (rows32) locate_row(m, static_cast<uint32_t>(t), row, mask_off);
  else locate_row(m, t, row, mask_off);
}

// Forward: x [rows, Skv] T -> y [rows, Skv] T, mask rows [.., Skv] bool (a.mask_rows
// maps a row to its mask row) or none. y = softmax over the kept elements of
// x * scale; 0 elsewhere and on rows that keep nothing. One row group per TPR
// threads, a.reps rows one after another: the mask row is loaded once, and each
// row's logits are loaded before the previous row is reduced and stored, so a
// row's loads are always in flight. kLoop: compiled with that loop (fwd_kernel picks
// it only for reps > 1: the loop's code slows the one-row case by 10-25% on an H100).
template <class T, int TPR, int E, int VEC, bool kLoop>
__global__ void __launch_bounds__(Group<TPR>::kBlock) softmax_fwd_kernel(const FwdArgs a) {
  using G = Group<TPR>;
  using B = typename Elem<T>::Bits;
  using P = Pack<B, VEC>;
  using M = Pack<uint8_t, VEC>;
  constexpr int kIters = E / VEC;
  static_assert(E % VEC == 0, "E must be a multiple of VEC");
  __shared__ float smem_max[G::kWarps], smem_sum[G::kWarps];

  const int t = threadIdx.x % TPR;
  static_assert(!kLoop || kSharesMask<TPR, VEC>, "only kernels that share the mask loop");
  const int reps = kLoop ? a.reps : 1;  // constant 1: no loop is compiled
  const int64_t group = a.row0 + int64_t{blockIdx.x} * G::kRows + threadIdx.x / TPR;
  const bool live = group * reps < a.rows;  // dead threads still join the reductions
  // The logits row of launch index r and, for r's group, the mask row offset.
  auto locate = [&](int64_t r, int64_t* moff) {
    int64_t row = r, off = 0;
    if (a.mask) locate_mask_row(a.mask_rows, r, a.rows32, &row, &off);
    if (moff) *moff = off;
    return row;
  };
  // Loads the kept prefix of row `row`'s logits (n elements) into in[]; the rest 0.
  auto load = [&](int64_t row, int n, P* in) {
    const B* x = static_cast<const B*>(a.x) + row * a.skv;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int c = (t + k * TPR) * VEC;
      in[k].raw = typename P::RawT{};
      if (c < n) in[k].raw = __ldcs(reinterpret_cast<const typename P::RawT*>(x + c));
    }
  };

  int64_t moff = 0;
  int64_t row = live ? locate(group * reps, &moff) : 0;
  int n = live ? kept_len(row, a.sq, a.skv, a.causal, a.rows32) : 0;
  M mk[kIters];
  P in[kIters];
  load(row, n, in);
  const uint8_t* mrow = (a.mask && live) ? a.mask + moff : nullptr;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int c = (t + k * TPR) * VEC;
    mk[k].raw = typename M::RawT{};
    if (mrow && c < n) mk[k].raw = __ldg(reinterpret_cast<const typename M::RawT*>(mrow + c));
  }

  for (int r = 0; r < reps; ++r) {
    float v[kIters][VEC];
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int c = (t + k * TPR) * VEC;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const bool keep = c + e < n && mk[k].v[e] == 0;
        v[k][e] = keep ? Elem<T>::to_f(in[k].v[e]) * a.scale_log2e : -INFINITY;
        m = fmaxf(m, v[k][e]);  // fmaxf skips NaN; the NaN still poisons the sum below
      }
    }
    // The next row of the group: its loads go out before this row's reductions.
    const int64_t this_row = row;
    if (r + 1 < reps) {
      row = live ? locate(group * reps + r + 1, nullptr) : 0;
      n = live ? kept_len(row, a.sq, a.skv, a.causal, a.rows32) : 0;
      load(row, n, in);
    }

    m = group_reduce<TPR>(m, smem_max, MaxOp{});
    if (m == -INFINITY) m = 0.0f;  // nothing kept: every exp is 0 and the row is 0, not NaN

    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kIters; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        v[k][e] = ex2(v[k][e] - m);
        s += v[k][e];
      }
    s = group_reduce<TPR>(s, smem_sum, SumOp{});
    const float inv = s == 0.0f ? 0.0f : 1.0f / s;  // NaN logits: s is NaN, so is the row

    B* y = static_cast<B*>(a.y) + this_row * a.skv;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int c = (t + k * TPR) * VEC;
      if (live && c < a.skv) {
        P out;
#pragma unroll
        for (int e = 0; e < VEC; ++e) out.v[e] = Elem<T>::from_f(v[k][e] * inv);
        *reinterpret_cast<typename P::RawT*>(y + c) = out.raw;
      }
    }
  }
}

// The forward kernel of (T, TPR, E, VEC) for a (as for_kernel<TPR, VEC> gives it).
using FwdKernel = void (*)(const FwdArgs);
template <class T, int TPR, int E, int VEC>
FwdKernel fwd_kernel(const FwdArgs& a) {
  if constexpr (kSharesMask<TPR, VEC>)
    if (a.reps > 1) return softmax_fwd_kernel<T, TPR, E, VEC, true>;
  return softmax_fwd_kernel<T, TPR, E, VEC, false>;
}

// Backward: y, dy [rows, Skv] T -> dx [rows, Skv] T, dx = scale * y * (dy - sum_j y dy)
// over the kept elements; 0 after a causal row's diagonal (y is 0 there, so nothing
// past it is read). One row per TPR threads.
template <class T, int TPR, int E, int VEC>
__global__ void __launch_bounds__(Group<TPR>::kBlock) softmax_bwd_kernel(const BwdArgs a) {
  using G = Group<TPR>;
  using B = typename Elem<T>::Bits;
  using P = Pack<B, VEC>;
  using R = typename P::RawT;
  constexpr int kIters = E / VEC;
  static_assert(E % VEC == 0, "E must be a multiple of VEC");
  // y and dy as floats need 2E registers; past 32 a 1024-thread block (64 registers
  // a thread) would spill, so those rows (2-byte types, 32 KiB < row <= 64 KiB) read
  // y and dy a second time for dx instead of holding them. The second read finds
  // the row in L1/L2 (the first one used the default caching for that reason), so
  // DRAM still sees one pass.
  constexpr bool kReload = TPR == 1024 && 2 * E > 32;
  __shared__ float smem_sum[G::kWarps];

  const int t = threadIdx.x % TPR;
  const int64_t row = a.row0 + int64_t{blockIdx.x} * G::kRows + threadIdx.x / TPR;
  const bool live = row < a.rows;
  const int n = live ? kept_len(row, a.sq, a.skv, a.causal, a.rows32) : 0;
  const R* y = reinterpret_cast<const R*>(static_cast<const B*>(a.y) + row * a.skv);
  const R* dy = reinterpret_cast<const R*>(static_cast<const B*>(a.dy) + row * a.skv);

  P yv[kIters], dyv[kIters];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int u = t + k * TPR;  // unit index: elements u * VEC ...
    yv[k].raw = R{};
    dyv[k].raw = R{};
    if (u * VEC < n) {
      yv[k].raw = kReload ? y[u] : __ldcs(y + u);
      dyv[k].raw = kReload ? dy[u] : __ldcs(dy + u);
    }
  }

  float d = 0.0f;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int c = (t + k * TPR) * VEC;
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      if (c + e < n) d += Elem<T>::to_f(yv[k].v[e]) * Elem<T>::to_f(dyv[k].v[e]);
  }
  d = group_reduce<TPR>(d, smem_sum, SumOp{});

  R* dx = reinterpret_cast<R*>(static_cast<B*>(a.dx) + row * a.skv);
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int u = t + k * TPR, c = u * VEC;
    if (live && c < a.skv) {
      if (kReload && c < n) {
        yv[k].raw = __ldcs(y + u);
        dyv[k].raw = __ldcs(dy + u);
      }
      P out;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float yf = Elem<T>::to_f(yv[k].v[e]), dyf = Elem<T>::to_f(dyv[k].v[e]);
        out.v[e] = Elem<T>::from_f(c + e < n ? a.scale * yf * (dyf - d) : 0.0f);
      }
      dx[u] = out.raw;
    }
  }
}

}  // namespace fusedattn::softmax::cuda
