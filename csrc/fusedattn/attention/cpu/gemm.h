// The one matrix-multiply tile operation of the CPU engine:
//   C[M, N] (+)= A[M, K] . B[K, N], all float32 (all double in the float64 engine),
//   row-major with leading dims.
// Callers pad M to a multiple of kMr and N to a multiple of kNr (the tile
// buffers are allocated padded and zero-filled), so the micro-kernel has no
// edge cases. A kMr x kNr accumulator block stays in registers (8 of the 16
// AVX2 registers) and the loop over k is a rank-1 update of FMAs: ~90% of one
// core's FMA peak, measured with bench/cpu_gemm_tile.cc. In double the same kernel
// runs on 4-lane vectors (twice the vectors per row of the block).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fusedattn::cpu {

typedef float f32x8 __attribute__((vector_size(32)));
typedef double f64x4 __attribute__((vector_size(32)));

// The 32-byte vector of element type E (float or double).
template <class E>
using vec32_t = std::conditional_t<std::is_same_v<E, double>, f64x4, f32x8>;

constexpr int kMr = 4;
constexpr int kNr = 16;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <bool kAccumulate, class E>
inline void gemm(int64_t M, int64_t N, int64_t K, const E* __restrict A, int64_t lda,
                 const E* __restrict B, int64_t ldb, E* __restrict C, int64_t ldc) {
  using V = vec32_t<E>;
  constexpr int kLanes = sizeof(V) / sizeof(E), kNv = kNr / kLanes;
  for (int64_t i = 0; i < M; i += kMr) {
    for (int64_t j = 0; j < N; j += kNr) {
      V acc[kMr][kNv];
      for (int r = 0; r < kMr; ++r)
        for (int c = 0; c < kNv; ++c) {
          if (kAccumulate)
            std::memcpy(&acc[r][c], C + (i + r) * ldc + j + kLanes * c, sizeof(V));
          else
            acc[r][c] = V{};
        }
      for (int64_t k = 0; k < K; ++k) {
        V b[kNv];
        for (int c = 0; c < kNv; ++c) std::memcpy(&b[c], B + k * ldb + j + kLanes * c, sizeof(V));
        for (int r = 0; r < kMr; ++r) {
          const E a = A[(i + r) * lda + k];
          for (int c = 0; c < kNv; ++c) acc[r][c] += a * b[c];
        }
      }
      for (int r = 0; r < kMr; ++r)
        for (int c = 0; c < kNv; ++c)
          std::memcpy(C + (i + r) * ldc + j + kLanes * c, &acc[r][c], sizeof(V));
    }
  }
}

}  // namespace fusedattn::cpu
