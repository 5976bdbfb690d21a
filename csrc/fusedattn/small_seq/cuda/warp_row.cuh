// Warp-level row primitives of the small-seq CUDA kernels: how a warp splits a head
// row of D elements into 16-byte vectors, loads and stores them coalesced, and
// reduces partial sums over the lanes that share a row.
//
// A row of D elements of T is kVecs 16-byte vectors. kLpr lanes share a row (a
// "sub-group"), so a warp works on kRps rows at once; a lane holds kVpl vectors
// (kE elements) of its row: vector i of lane `pos` is the row's vector i*kLpr + pos,
// so one load instruction of a sub-group reads kLpr*16 contiguous bytes.
//   bf16/fp16: D 64 -> 8 lanes/row, 4 rows/warp; 128 -> 16, 2; 256 -> 32, 1; 512 -> 32, 1 (2 vectors)
//   float32:   D 64 -> 16, 2; 128 -> 32, 1; 256 -> 32, 1 (2 vectors); 512 -> 32, 1 (4 vectors)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace fusedattn::small_seq::cuda {

constexpr unsigned kAllLanes = 0xffffffffu;

// 16-byte vector <-> kN floats.
template <class T>
struct VecIO;

template <>
struct VecIO<float> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void unpack(const uint4& r, float* x) {
    x[0] = __uint_as_float(r.x);
    x[1] = __uint_as_float(r.y);
    x[2] = __uint_as_float(r.z);
    x[3] = __uint_as_float(r.w);
  }
  __device__ __forceinline__ static uint4 pack(const float* x) {
    return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]),
                      __float_as_uint(x[3]));
  }
};

template <>
struct VecIO<__nv_bfloat16> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static void unpack2(uint32_t w, float* x) {
    x[0] = __uint_as_float(w << 16);  // bf16 is the high half of a float
    x[1] = __uint_as_float(w & 0xffff0000u);
  }
  __device__ __forceinline__ static uint32_t pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ __forceinline__ static void unpack(const uint4& r, float* x) {
    unpack2(r.x, x), unpack2(r.y, x + 2), unpack2(r.z, x + 4), unpack2(r.w, x + 6);
  }
  __device__ __forceinline__ static uint4 pack(const float* x) {
    return make_uint4(pack2(x[0], x[1]), pack2(x[2], x[3]), pack2(x[4], x[5]), pack2(x[6], x[7]));
  }
};

template <>
struct VecIO<__half> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static void unpack2(uint32_t w, float* x) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
    x[0] = f.x;
    x[1] = f.y;
  }
  __device__ __forceinline__ static uint32_t pack2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ __forceinline__ static void unpack(const uint4& r, float* x) {
    unpack2(r.x, x), unpack2(r.y, x + 2), unpack2(r.z, x + 4), unpack2(r.w, x + 6);
  }
  __device__ __forceinline__ static uint4 pack(const float* x) {
    return make_uint4(pack2(x[0], x[1]), pack2(x[2], x[3]), pack2(x[4], x[5]), pack2(x[6], x[7]));
  }
};

// 16 bytes global -> shared memory, asynchronously (sm_80+). Each lane waits for its own
// copies (cp_async_wait) and reads only what it copied itself: no warp barrier needed.
// kStream: past L1 (.cg), with L2 prefetching the 256-byte block: the forward's K/V
// stream ran 1-4.5 points of the copy bandwidth faster so, the backward's that much slower
// (H100 A/B, bench/RESULTS.md), which keeps the default.
template <bool kStream = false>
__device__ __forceinline__ void cp_async16(uint4* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kStream)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// 4 bytes global -> shared memory, asynchronously (as cp_async16).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
// Closes the lane's current group of copies.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of the lane's groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

template <class T, int D>
struct Geo {
  static constexpr int kVec = VecIO<T>::kN;
  static constexpr int kVecs = D / kVec;
  static constexpr int kLpr = kVecs < 32 ? kVecs : 32;
  static constexpr int kRps = 32 / kLpr;
  static constexpr int kVpl = kVecs / kLpr;
  static constexpr int kE = kVpl * kVec;
  static_assert(kVecs % kLpr == 0 && kLpr * kRps == 32, "D must be 64, 128, 256 or 512");
};

// A lane's slice of one row, as loaded (kept packed until used: half the registers).
template <class T, int D>
struct RowSlice {
  using G = Geo<T, D>;
  uint4 r[G::kVpl];

  __device__ __forceinline__ void load(const T* row, int pos) {
    const uint4* p = reinterpret_cast<const uint4*>(row) + pos;
#pragma unroll
    for (int i = 0; i < G::kVpl; ++i) r[i] = __ldg(p + i * G::kLpr);
  }
  // Starts copying this lane's slice of `row` to shared memory: vector i goes to slot[32 * i]
  // (slot: this lane's place in a warp's [kVpl][32] array). cp.async takes no registers,
  // so a warp can have rows of several work items in flight (see fwd_kernel.cuh).
  template <bool kStream = false>
  __device__ __forceinline__ static void copy_async(const T* row, int pos, uint4* slot) {
    const uint4* p = reinterpret_cast<const uint4*>(row) + pos;
#pragma unroll
    for (int i = 0; i < G::kVpl; ++i) cp_async16<kStream>(slot + 32 * i, p + i * G::kLpr);
  }
  // Reads what copy_async put at slot (after cp_async_wait).
  __device__ __forceinline__ void load_shared(const uint4* slot) {
#pragma unroll
    for (int i = 0; i < G::kVpl; ++i) r[i] = slot[32 * i];
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < G::kVpl; ++i) r[i] = make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ void to_float(float (&x)[G::kE], float mul = 1.0f) const {
#pragma unroll
    for (int i = 0; i < G::kVpl; ++i) VecIO<T>::unpack(r[i], x + i * G::kVec);
#pragma unroll
    for (int e = 0; e < G::kE; ++e) x[e] *= mul;
  }
};

template <class T, int D>
__device__ __forceinline__ void load_row(const T* row, int pos, float (&x)[Geo<T, D>::kE],
                                         float mul = 1.0f) {
  RowSlice<T, D> s;
  s.load(row, pos);
  s.to_float(x, mul);
}

template <class T, int D>
__device__ __forceinline__ void store_row(T* row, int pos, const float (&x)[Geo<T, D>::kE],
                                          float mul) {
  using G = Geo<T, D>;
  uint4* p = reinterpret_cast<uint4*>(row) + pos;
#pragma unroll
  for (int i = 0; i < G::kVpl; ++i) {
    float y[G::kVec];
#pragma unroll
    for (int e = 0; e < G::kVec; ++e) y[e] = x[i * G::kVec + e] * mul;
    p[i * G::kLpr] = VecIO<T>::pack(y);
  }
}

template <class T, int D>
__device__ __forceinline__ void store_zero_row(T* row, int pos) {
  using G = Geo<T, D>;
  uint4* p = reinterpret_cast<uint4*>(row) + pos;
#pragma unroll
  for (int i = 0; i < G::kVpl; ++i) p[i * G::kLpr] = make_uint4(0, 0, 0, 0);
}

// The lane's share of a . b (sum over its kE elements).
template <class T, int D>
__device__ __forceinline__ float dot(const float (&a)[Geo<T, D>::kE], const RowSlice<T, D>& b) {
  using G = Geo<T, D>;
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < G::kVpl; ++i) {
    float x[G::kVec];
    VecIO<T>::unpack(b.r[i], x);
#pragma unroll
    for (int e = 0; e < G::kVec; ++e) s = fmaf(a[i * G::kVec + e], x[e], s);
  }
  return s;
}

// acc += w * b
template <class T, int D>
__device__ __forceinline__ void axpy(float (&acc)[Geo<T, D>::kE], float w, const RowSlice<T, D>& b) {
  using G = Geo<T, D>;
#pragma unroll
  for (int i = 0; i < G::kVpl; ++i) {
    float x[G::kVec];
    VecIO<T>::unpack(b.r[i], x);
#pragma unroll
    for (int e = 0; e < G::kVec; ++e) acc[i * G::kVec + e] = fmaf(w, x[e], acc[i * G::kVec + e]);
  }
}

// a += wa * b, c += wc * b (b unpacked once)
template <class T, int D>
__device__ __forceinline__ void axpy2(float (&a)[Geo<T, D>::kE], float wa,
                                      float (&c)[Geo<T, D>::kE], float wc,
                                      const RowSlice<T, D>& b) {
  using G = Geo<T, D>;
#pragma unroll
  for (int i = 0; i < G::kVpl; ++i) {
    float x[G::kVec];
    VecIO<T>::unpack(b.r[i], x);
#pragma unroll
    for (int e = 0; e < G::kVec; ++e) {
      a[i * G::kVec + e] = fmaf(wa, x[e], a[i * G::kVec + e]);
      c[i * G::kVec + e] = fmaf(wc, x[e], c[i * G::kVec + e]);
    }
  }
}

// Sum over the kLpr lanes of a sub-group (every lane of it gets the sum). mask: the lanes
// taking part (the whole warp, or only the sub-group where sub-groups work on their own).
template <int kLpr>
__device__ __forceinline__ float row_sum(float x, unsigned mask = kAllLanes) {
#pragma unroll
  for (int o = kLpr / 2; o > 0; o >>= 1) x += __shfl_xor_sync(mask, x, o);
  return x;
}

// Sum / max over the sub-groups, lane by lane (lane pos of every sub-group gets it).
template <int kLpr>
__device__ __forceinline__ float across_rows_sum(float x) {
#pragma unroll
  for (int o = kLpr; o < 32; o <<= 1) x += __shfl_xor_sync(kAllLanes, x, o);
  return x;
}

template <int kLpr>
__device__ __forceinline__ float across_rows_max(float x) {
#pragma unroll
  for (int o = kLpr; o < 32; o <<= 1) x = fmaxf(x, __shfl_xor_sync(kAllLanes, x, o));
  return x;
}

}  // namespace fusedattn::small_seq::cuda
