// Tile movement between tensors (any storage dtype) and tile buffers of the engine's
// arithmetic type A (float32; double for float64 storage: dtypes.h's acc_t).
// Tile buffers are padded: rows past `rows` and columns past `cols` are zero,
// which is what the gemm micro-kernel needs.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "fusedattn/platform/cpu/dtypes.h"
#include "fusedattn/platform/cpu/fast_math.h"

namespace fusedattn::cpu {

constexpr int64_t kBq = 64;  // query rows per tile
constexpr int64_t kBk = 64;  // keys per tile

// A 64-byte aligned buffer of A (float or double), zero-initialized.
template <class A>
class Buffer {
 public:
  explicit Buffer(int64_t n) : v_(n + 64 / sizeof(A), A(0)) {
    auto addr = reinterpret_cast<uintptr_t>(v_.data());
    off_ = ((64 - addr % 64) % 64) / sizeof(A);
  }
  A* data() { return v_.data() + off_; }
  void zero(int64_t n) { std::memset(data(), 0, n * sizeof(A)); }

 private:
  std::vector<A> v_;
  int64_t off_;
};

// dst[r][c] = src[r * row_stride + c] * mul for r < rows, c < cols; zero elsewhere
// in the [rows_pad][ld] block.
template <class T, class A>
inline void load_rows(const T* src, int64_t row_stride, int64_t rows, int64_t cols,
                      A mul, A* dst, int64_t rows_pad, int64_t ld) {
  for (int64_t r = 0; r < rows_pad; ++r) {
    A* d = dst + r * ld;
    if (r < rows) {
      const T* s = src + r * row_stride;
      for (int64_t c = 0; c < cols; ++c) d[c] = widen(s[c]) * mul;
      for (int64_t c = cols; c < ld; ++c) d[c] = A(0);
    } else {
      for (int64_t c = 0; c < ld; ++c) d[c] = A(0);
    }
  }
}

// Transposed load: dst[c][r] = src[r * row_stride + c]; dst is [cols_pad][ld], ld >= rows.
template <class T, class A>
inline void load_rows_transposed(const T* src, int64_t row_stride, int64_t rows, int64_t cols,
                                 A* dst, int64_t cols_pad, int64_t ld) {
  std::memset(dst, 0, cols_pad * ld * sizeof(A));
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * row_stride;
    for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = widen(s[c]);
  }
}

// dst[c][r] = src[r][c] for tiles: [rows][ld_src] -> [cols][ld_dst].
template <class A>
inline void transpose(const A* src, int64_t rows, int64_t cols, int64_t ld_src, A* dst,
                      int64_t ld_dst) {
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
}

template <class T, class A>
inline void store_row(const A* src, int64_t cols, A mul, T* dst, bool zero = false) {
  for (int64_t c = 0; c < cols; ++c) dst[c] = narrow<T>(zero ? A(0) : src[c] * mul);
}

}  // namespace fusedattn::cpu
