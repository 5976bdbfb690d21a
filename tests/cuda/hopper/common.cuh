// What the Hopper kernel tests share: the device check, random fills, dense masks.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace fusedattn::cuda::hopper::test_util {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

inline bool has_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  return prop.major == 9 && prop.minor == 0;
}

__device__ inline uint32_t hash(uint32_t x) {
  x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16;
  return x;
}

template <class T>
__global__ void fill(T* x, size_t n, uint32_t seed, float amp) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float u = (hash(static_cast<uint32_t>(i) * 2654435761u + seed) >> 8) * (1.0f / 16777216.0f);
    x[i] = static_cast<T>(amp * (2.0f * u - 1.0f));
  }
}

// A dense mask as a folded bias [Bm, Hm, Sq, Skv] (contiguous): kind 1 keeps j <= i (causal
// written out); kind 2 keeps a band i - 300 <= j <= i + 50 with holes (about one key in 7
// dropped) shifted by 13 a (b, h) table, and every row i % 97 == 5 keeps nothing; kept keys
// hold 0, or with values a bias in [-0.5, 0.5); dropped ones `masked`.
template <class T>
__global__ void fill_mask(T* m, int64_t tables, int64_t Sq, int64_t Skv, int kind, bool values,
                          float masked, uint32_t seed) {
  const int64_t n = tables * Sq * Skv;
  for (int64_t x = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; x < n; x += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = x % Skv, i = x / Skv % Sq, t = x / (Sq * Skv);
    bool keep = j <= i;
    if (kind == 2) {
      const int64_t c = i + 13 * t;
      keep = j >= c - 300 && j <= c + 50 && hash(static_cast<uint32_t>(x) + seed) % 7 != 0 && i % 97 != 5;
    }
    const float u = (hash(static_cast<uint32_t>(x) * 747796405u + seed) >> 8) * (1.0f / 16777216.0f);
    m[x] = static_cast<T>(keep ? (values ? u - 0.5f : 0.0f) : masked);
  }
}

// The boolean keep mask of a folded one (FlashFwdParams / FlashBwdParams::bias_keep): 1
// where the key is kept, 0 where it holds `masked`.
template <class T>
__global__ void keep_bytes(const T* m, int64_t n, float masked, uint8_t* keep) {
  for (int64_t x = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; x < n; x += int64_t{gridDim.x} * blockDim.x)
    keep[x] = static_cast<float>(m[x]) != masked;
}

}  // namespace fusedattn::cuda::hopper::test_util
