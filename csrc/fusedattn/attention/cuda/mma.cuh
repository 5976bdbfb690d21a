// Warp-level tensor-core primitives for sm_80 and newer (PTX mma.sync, ldmatrix,
// cp.async), as the register-resident flash kernels (flash_mma.cu) use them.
//
// Fragment layouts (g = lane / 4, t = lane % 4; rows of A and C are the M dim):
//   m16n8k16 (bf16 / fp16; a 32-bit register holds two elements, the lower column first)
//     A 16x16: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//     B 16x8:  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   m16n8k8 (tf32; one element per register)
//     A 16x8:  a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
//     B 8x8:   b0 (k t, n g)  b1 (k t+4, n g)
//   C 16x8 (float32): c0, c1 (g, 2t..2t+1)  c2, c3 (g+8, 2t..2t+1)
// A C fragment pair (n-tiles 2k, 2k+1) is the A fragment of k-step k for m16n8k16 once
// packed (pack2). For m16n8k8 a C tile serves as A under a permutation of the k dim:
// logical column t is key 2t, t+4 is key 2t+1 (a = {c0, c2, c1, c3}), so B must read
// rows 2t and 2t+1 for b0, b1 (the same permutation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fusedattn::cuda::mma {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8, and
// register m receives matrix m (thread (g, t): row g, columns 2t, 2t+1).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// The same, transposed: thread (g, t) receives rows 2t, 2t+1 of column g.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a b (m16n8k16, T = __nv_bfloat16 or __half).
template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// c += a b (m16n8k8, TF32 operands given as their 32-bit patterns).
__device__ __forceinline__ void mma1688(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// A float32 operand as TF32: hi, and (EXACT) the TF32 remainder lo = x - hi.
template <int N, bool EXACT>
struct Tf32 {
  uint32_t hi[N], lo[EXACT ? N : 1];
  __device__ __forceinline__ explicit Tf32(const float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      hi[i] = to_tf32(x[i]);
      if constexpr (EXACT) lo[i] = to_tf32(x[i] - __uint_as_float(hi[i]));
    }
  }
};

// c += a b in TF32 (EXACT: 3xTF32, a.b = a_hi.b_hi + a_hi.b_lo + a_lo.b_hi: about float32's
// accuracy).
template <bool EXACT>
__device__ __forceinline__ void mma_f32(float (&c)[4], const Tf32<4, EXACT>& a, const Tf32<2, EXACT>& b) {
  if constexpr (EXACT) {
    const uint32_t alo[4] = {a.lo[0], a.lo[1], a.lo[2], a.lo[3]};
    const uint32_t ahi[4] = {a.hi[0], a.hi[1], a.hi[2], a.hi[3]};
    mma1688(c, alo, b.hi[0], b.hi[1]);
    mma1688(c, ahi, b.lo[0], b.lo[1]);
    mma1688(c, ahi, b.hi[0], b.hi[1]);
  } else {
    const uint32_t ahi[4] = {a.hi[0], a.hi[1], a.hi[2], a.hi[3]};
    mma1688(c, ahi, b.hi[0], b.hi[1]);
  }
}

// Two floats as a 32-bit pair of T (lo in the lower half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

}  // namespace fusedattn::cuda::mma
