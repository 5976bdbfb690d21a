// Warp-level tensor-core primitives for sm_80 and newer (PTX mma.sync, ldmatrix,
// cp.async) and the warp-tile products built on them, as the register-resident flash
// kernels (flash_mma.cu, flash_mma_bwd.cu) use them.
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

// Rows [0, nrows) x columns [0, dreal) of src (row stride rs elements) into the R rows of
// dst (D columns, row stride LD), zeros elsewhere, in 16-byte cp.async chunks shared by
// the block's threads (dreal and rs multiples of 16 bytes, src 16-byte aligned).
template <class T, int D, int LD>
__device__ __forceinline__ void cp_async_rows(T* dst, const T* src, int64_t rs, int64_t nrows, int64_t dreal, int R) {
  constexpr int V = 16 / int(sizeof(T)), CPR = D / V;
  for (int idx = threadIdx.x; idx < R * CPR; idx += blockDim.x) {
    const int r = idx / CPR, ch = idx % CPR;
    const bool ok = r < nrows && ch * V < dreal;
    cp_async16(dst + r * LD + ch * V, ok ? src + r * rs + ch * V : src, ok);
  }
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

// ldmatrix on 32-bit elements (TF32 fragments of a [row][k] float tile, rows of LD floats,
// LD % 4 == 0; conflict-free when LD = 4 mod 32): an 8x8 b16 matrix is 8 rows x 4 floats
// and thread (g, t) receives row g, float t. The A fragment (16 rows, k kk .. kk + 7):
// matrix m = (rows 8 (m % 2) .., k kk + 4 (m / 2) ..) gives a0 .. a3.
template <int LD>
__device__ __forceinline__ void ldsm_tf32_a(uint32_t (&a)[4], const float* sA, int kk, int lane) {
  static_assert(LD % 4 == 0, "16-byte rows");
  ldsm_x4(a, sA + (lane % 8 + ((lane / 8) % 2) * 8) * LD + kk + (lane / 16) * 4);
}
// The B fragments of n-tiles 2 np, 2 np + 1 (B's rows 16 np .., k kk ..): matrix m = (rows
// 16 np + 8 (m / 2) .., k kk + 4 (m % 2) ..) gives b0, b1 of n-tile 2 np, then 2 np + 1.
template <int LD>
__device__ __forceinline__ void ldsm_tf32_b2(uint32_t (&b)[4], const float* sB, int np, int kk, int lane) {
  static_assert(LD % 4 == 0, "16-byte rows");
  ldsm_x4(b, sB + (np * 16 + (lane / 16) * 8 + lane % 8) * LD + kk + ((lane / 8) % 2) * 4);
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

// A float32 operand as TF32: hi, and (EXACT) the TF32 remainder lo = x - hi. RAW: x is
// TF32 already (a TF32 call's inputs come rounded: flash.cu), taken as it is.
template <int N, bool EXACT, bool RAW = false>
struct Tf32 {
  static_assert(!(RAW && EXACT), "3xTF32 needs the float32 operand");
  uint32_t hi[N], lo[EXACT ? N : 1];
  __device__ __forceinline__ explicit Tf32(const float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      hi[i] = RAW ? __float_as_uint(x[i]) : to_tf32(x[i]);
      if constexpr (EXACT) lo[i] = to_tf32(x[i] - __uint_as_float(hi[i]));
    }
  }
};

// c += a b in TF32 (EXACT: 3xTF32, a.b = a_hi.b_hi + a_hi.b_lo + a_lo.b_hi: about float32's
// accuracy).
template <bool EXACT, bool RA, bool RB>
__device__ __forceinline__ void mma_f32(float (&c)[4], const Tf32<4, EXACT, RA>& a, const Tf32<2, EXACT, RB>& b) {
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

// ---- warp tiles: 16 rows of a product per warp, operands in shared memory (rows of LD
// elements) or in registers; c's n-tile n holds columns 8 n .. 8 n + 7 (C layout) --------

// c (16 x N) += A B^T over k < K: A = the 16 rows at sA, B = the N rows at sB, both [row][k]
// (S = Q K^T, S^T = K Q^T). KU: the k loop's unroll factor (1 keeps the registers that
// hoisted loads would take; the backward needs them).
// One k step (8 for float32, 16 for 16-bit) of mma_abt at k = kk.
// RAW: float32 operands that are TF32 already (Tf32).
// TF32 loads its fragments with ldmatrix (a quarter of the shared-load instructions of
// scalar loads; session 43: the float32 backward 10% faster); 3xTF32 (EXACT) keeps scalar
// loads (ldmatrix there raised the head dim 128 instances' spills).
// LDA: A's row stride where it differs from B's (LD).
template <class T, int LD, int N, bool EXACT, bool RAW = false, int LDA = LD>
__device__ __forceinline__ void mma_abt_step(float (&c)[N / 8][4], const T* sA, const T* sB, int kk, int lane) {
  if constexpr (std::is_same_v<T, float> && !EXACT) {
    static_assert(N % 16 == 0, "n-tiles in pairs");
    uint32_t ar[4];
    ldsm_tf32_a<LDA>(ar, sA, kk, lane);
    const float af[4] = {__uint_as_float(ar[0]), __uint_as_float(ar[1]), __uint_as_float(ar[2]),
                         __uint_as_float(ar[3])};
    const Tf32<4, false, RAW> a(af);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t br[4];
      ldsm_tf32_b2<LD>(br, sB, np, kk, lane);
      const float b0[2] = {__uint_as_float(br[0]), __uint_as_float(br[1])};
      const float b1[2] = {__uint_as_float(br[2]), __uint_as_float(br[3])};
      mma_f32<false>(c[2 * np], a, Tf32<2, false, RAW>(b0));
      mma_f32<false>(c[2 * np + 1], a, Tf32<2, false, RAW>(b1));
    }
  } else if constexpr (std::is_same_v<T, float>) {
    const int g = lane >> 2, t = lane & 3;
    const float ar[4] = {sA[g * LDA + kk + t], sA[(g + 8) * LDA + kk + t], sA[g * LDA + kk + t + 4],
                         sA[(g + 8) * LDA + kk + t + 4]};
    const Tf32<4, EXACT, RAW> a(ar);
#pragma unroll
    for (int n = 0; n < N / 8; ++n) {
      const float* br = sB + (n * 8 + g) * LD + kk;  // b0 (k t, n g), b1 (k t + 4, n g)
      const float b[2] = {br[t], br[t + 4]};
      mma_f32<EXACT>(c[n], a, Tf32<2, EXACT, RAW>(b));
    }
  } else {
    // Matrix m = lane / 8 is (rows 8 (m % 2) .., k 8 (m / 2) ..): a0 .. a3's order.
    uint32_t a[4];
    ldsm_x4(a, sA + (lane % 8 + ((lane / 8) % 2) * 8) * LDA + kk + (lane / 16) * 8);
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      // Matrix m is (B rows = n 16 np + 8 (m / 2) .., k 8 (m % 2) ..): b0, b1 of n-tile
      // 2 np, then of 2 np + 1 (B^T's rows are B's columns: no transpose).
      uint32_t b[4];
      ldsm_x4(b, sB + (np * 16 + (lane / 16) * 8 + lane % 8) * LD + kk + ((lane / 8) % 2) * 8);
      mma16816<T>(c[2 * np], a, b[0], b[1]);
      mma16816<T>(c[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// c (16 x N) += A B^T over k < K: A = the 16 rows at sA, B = the N rows at sB, both [row][k]
// (S = Q K^T). KU: the k loop's unroll factor (1 keeps the registers that hoisted loads
// would take).
template <class T, int LD, int N, int K, bool EXACT, int KU = K, bool RAW = false, int LDA = LD>
__device__ __forceinline__ void mma_abt(float (&c)[N / 8][4], const T* sA, const T* sB, int lane) {
  constexpr int KS = std::is_same_v<T, float> ? 8 : 16;
#pragma unroll(KU)
  for (int kk = 0; kk < K; kk += KS) mma_abt_step<T, LD, N, EXACT, RAW, LDA>(c, sA, sB, kk, lane);
}

// Two such products in one k loop (S^T = K Q^T beside dP^T = V dO^T): twice the
// independent accumulators per step for the tensor cores' latency.
template <class T, int LD, int N, int K, bool EXACT, int KU = K, bool RAW = false, int LDA = LD>
__device__ __forceinline__ void mma_abt2(float (&c1)[N / 8][4], const T* sA1, const T* sB1,
                                         float (&c2)[N / 8][4], const T* sA2, const T* sB2, int lane) {
  constexpr int KS = std::is_same_v<T, float> ? 8 : 16;
#pragma unroll(KU)
  for (int kk = 0; kk < K; kk += KS) {
    mma_abt_step<T, LD, N, EXACT, RAW, LDA>(c1, sA1, sB1, kk, lane);
    mma_abt_step<T, LD, N, EXACT, RAW, LDA>(c2, sA2, sB2, kk, lane);
  }
}

// The same two products in TF32 with A1, A2 (16 x K) held in registers as A fragments
// (a1[ks]: k step ks, ldsm_tf32_a) and B1, B2 TF32 floats [row][k] in shared memory
// (S^T = K_w Q^T, dP^T = V_w dO^T with the warp's K and V rows kept for the block).
template <int LD, int N, int K>
__device__ __forceinline__ void mma_abt2_rega(float (&c1)[N / 8][4], const uint32_t (&a1)[K / 8][4], const float* sB1,
                                              float (&c2)[N / 8][4], const uint32_t (&a2)[K / 8][4], const float* sB2,
                                              int lane) {
#pragma unroll
  for (int ks = 0; ks < K / 8; ++ks) {
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b1[4], b2[4];
      ldsm_tf32_b2<LD>(b1, sB1, np, ks * 8, lane);
      ldsm_tf32_b2<LD>(b2, sB2, np, ks * 8, lane);
      mma1688(c1[2 * np], a1[ks], b1[0], b1[1]);
      mma1688(c1[2 * np + 1], a1[ks], b1[2], b1[3]);
      mma1688(c2[2 * np], a2[ks], b2[0], b2[1]);
      mma1688(c2[2 * np + 1], a2[ks], b2[2], b2[3]);
    }
  }
}

// max that propagates NaN (PTX max.NaN, sm_80+).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// 2^x and e^x on the SFU (ex2.approx; e^x as 2^(x log2 e)): relative error ~2^-21 for
// x <= 0, where the softmax uses them; e^-inf = 0, NaN stays NaN.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float exp_approx(float x) { return exp2_approx(x * kLog2e); }

// c (16 x N) += P B over k < K: P (16 x K) in registers in C layout (p[n]: k 8 n ..), B = the
// K rows at sB, [k][n] (O += P V, dV += P^T dO, dK += dS^T Q).
template <class T, int LD, int K, int N, bool EXACT, bool RAW = false>
__device__ __forceinline__ void mma_pb(float (&c)[N / 8][4], const float (&p)[K / 8][4], const T* sB, int lane) {
  if constexpr (std::is_same_v<T, float>) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < K / 8; ++n) {
      const float ar[4] = {p[n][0], p[n][2], p[n][1], p[n][3]};  // k permuted: t -> 2t, t + 4 -> 2t + 1
      const Tf32<4, EXACT> a(ar);
      const float* b0 = sB + (n * 8 + 2 * t) * LD + g;  // B rows 2t, 2t + 1 (the same permutation)
#pragma unroll
      for (int dn = 0; dn < N / 8; ++dn) {
        const float b[2] = {b0[dn * 8], b0[LD + dn * 8]};
        mma_f32<EXACT>(c[dn], a, Tf32<2, EXACT, RAW>(b));
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < K / 16; ++ks) {
      const uint32_t a[4] = {pack2<T>(p[2 * ks][0], p[2 * ks][1]), pack2<T>(p[2 * ks][2], p[2 * ks][3]),
                             pack2<T>(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                             pack2<T>(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
      for (int dp = 0; dp < N / 16; ++dp) {
        // Transposed: matrix m is (k 16 ks + 8 (m % 2) .., n 16 dp + 8 (m / 2) ..), thread
        // (g, t) gets k 2t, 2t + 1 of column g: b0, b1 of n-tile 2 dp, then 2 dp + 1.
        uint32_t b[4];
        ldsm_x4_t(b, sB + (ks * 16 + ((lane / 8) % 2) * 8 + lane % 8) * LD + dp * 16 + (lane / 16) * 8);
        mma16816<T>(c[2 * dp], a, b[0], b[1]);
        mma16816<T>(c[2 * dp + 1], a, b[2], b[3]);
      }
    }
  }
}

// c (16 x N) += A B over k < K: A's transpose = the K rows at sAt, [k][m] (16 columns m),
// B = the K rows at sB, [k][n] (dQ = dS K from dS^T; dV += P^T dO from P). Row strides LD
// (A's) and LDB (B's).
template <class T, int LD, int K, int N, bool EXACT, bool RAW = false, int LDB = LD>
__device__ __forceinline__ void mma_atb(float (&c)[N / 8][4], const T* sAt, const T* sB, int lane) {
  if constexpr (std::is_same_v<T, float>) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < K; kk += 8) {
      // The k dim permuted as in mma_pb (k t -> row kk + 2t, t + 4 -> kk + 2t + 1): rows 2t,
      // 2t + 1 at column g fall in distinct banks (LD = 4 mod 32); rows t, t + 4 did not
      // (2-way conflicts, 17% of the float32 backward's shared-load wavefronts).
      // a0 (m g, k t)  a1 (m g + 8, k t)  a2 (m g, k t + 4)  a3 (m g + 8, k t + 4)
      const float* at = sAt + (kk + 2 * t) * LD + g;
      const float ar[4] = {at[0], at[8], at[LD], at[LD + 8]};
      const Tf32<4, EXACT, RAW> a(ar);
#pragma unroll
      for (int n = 0; n < N / 8; ++n) {
        const float* br = sB + (kk + 2 * t) * LDB + n * 8 + g;  // b0 (k t, n g), b1 (k t + 4, n g)
        const float b[2] = {br[0], br[LDB]};
        mma_f32<EXACT>(c[n], a, Tf32<2, EXACT, RAW>(b));
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < K; kk += 16) {
      // Transposed: matrix m is (k 8 (m / 2) .., m 8 (m % 2) ..) of A^T, thread (g, t) gets
      // its k 2t, 2t + 1 of column (row of A) g: a0 .. a3's order.
      uint32_t a[4];
      ldsm_x4_t(a, sAt + (kk + (lane / 16) * 8 + lane % 8) * LD + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int np = 0; np < N / 16; ++np) {
        uint32_t b[4];  // as mma_pb's B
        ldsm_x4_t(b, sB + (kk + ((lane / 8) % 2) * 8 + lane % 8) * LDB + np * 16 + (lane / 16) * 8);
        mma16816<T>(c[2 * np], a, b[0], b[1]);
        mma16816<T>(c[2 * np + 1], a, b[2], b[3]);
      }
    }
  }
}

}  // namespace fusedattn::cuda::mma
