// The one matrix-multiply tile operation of the CPU engine:
//   C[M, N] (+)= A[M, K] . B[K, N], all float32, row-major with leading dims.
// Callers pad M to a multiple of kMr and N to a multiple of kNr (the tile
// buffers are allocated padded and zero-filled), so the micro-kernel has no
// edge cases. A kMr x kNr accumulator block stays in registers (8 of the 16
// AVX2 registers) and the loop over k is a rank-1 update of FMAs: ~90% of one
// core's FMA peak, measured with bench/cpu_gemm_tile.cc.
#pragma once

#include <cstdint>
#include <cstring>

namespace fusedattn::cpu {

typedef float f32x8 __attribute__((vector_size(32)));

constexpr int kMr = 4;
constexpr int kNr = 16;
constexpr int kNv = kNr / 8;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <bool kAccumulate>
inline void gemm(int64_t M, int64_t N, int64_t K, const float* __restrict A, int64_t lda,
                 const float* __restrict B, int64_t ldb, float* __restrict C, int64_t ldc) {
  for (int64_t i = 0; i < M; i += kMr) {
    for (int64_t j = 0; j < N; j += kNr) {
      f32x8 acc[kMr][kNv];
      for (int r = 0; r < kMr; ++r)
        for (int c = 0; c < kNv; ++c) {
          if (kAccumulate)
            std::memcpy(&acc[r][c], C + (i + r) * ldc + j + 8 * c, sizeof(f32x8));
          else
            acc[r][c] = f32x8{};
        }
      for (int64_t k = 0; k < K; ++k) {
        f32x8 b[kNv];
        for (int c = 0; c < kNv; ++c) std::memcpy(&b[c], B + k * ldb + j + 8 * c, sizeof(f32x8));
        for (int r = 0; r < kMr; ++r) {
          const float a = A[(i + r) * lda + k];
          for (int c = 0; c < kNv; ++c) acc[r][c] += a * b[c];
        }
      }
      for (int r = 0; r < kMr; ++r)
        for (int c = 0; c < kNv; ++c)
          std::memcpy(C + (i + r) * ldc + j + 8 * c, &acc[r][c], sizeof(f32x8));
    }
  }
}

}  // namespace fusedattn::cpu
