// GPU machine: the Hopper forward with a dense mask (a folded causal or 512-key window mask
// [1, 1, S, S]), with the same band as a mask type, and with no mask (full), timed with two
// and (head dim 64) three consumer groups (FlashFwdParams::groups), alternating rounds: which
// tile height a dense mask should take (flash_fwd.cu's groups()), and an A/B of builds (one
// binary each). bf16, B 4, H 2048 / D, S 4096; arguments: the head dim (64, 128 or 256;
// 64) and a softcap for the typed rows (0: none; their label then reads "typed-sc").
//   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc dev/hopper_fwd/dense_groups_time.cu \
//     $(find build/cudatest/CMakeFiles/fusedattn_hopper.dir -name '*.o') -lcuda -o .carry/dense_groups_time
// (the objects of scripts/cuda_tests.sh build); run: .carry/dense_groups_time [D]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fusedattn/attention/hopper/flash_fwd.h"

using fusedattn::cuda::hopper::FlashFwdParams;

#include "../cuda_check.cuh"

__global__ void fill(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u + seed;
    h ^= h >> 15, h *= 0x2c1b3c6d, h ^= h >> 12;
    x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// keep j <= i (and j >= i - window when window >= 0; every key when window == -3); dropped
// keys hold `masked`
__global__ void fill_mask(__nv_bfloat16* m, int64_t S, int64_t window, float masked) {
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < S * S; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = x / S, j = x % S;
    m[x] = __float2bfloat16(window == -3 || (j <= i && (window < 0 || j >= i - window)) ? 0.0f : masked);
  }
}

__global__ void keep_of(const __nv_bfloat16* m, int64_t n, float masked, uint8_t* keep) {
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x)
    keep[x] = __bfloat162float(m[x]) != masked;
}

int main(int argc, char** argv) {
  const int64_t D = argc > 1 ? std::atoi(argv[1]) : 64, B = 4, H = 2048 / D, S = 4096, n = B * S * H * D;
  const float softcap = argc > 2 ? static_cast<float>(std::atof(argv[2])) : 0.0f;
  __nv_bfloat16 *q, *k, *v, *o, *mask;
  float* lse;
  void* tiles;
  int* counter;
  CHECK(cudaMalloc(&q, n * 2));
  CHECK(cudaMalloc(&k, n * 2));
  CHECK(cudaMalloc(&v, n * 2));
  CHECK(cudaMalloc(&o, n * 2));
  CHECK(cudaMalloc(&lse, B * H * S * 4));
  CHECK(cudaMalloc(&mask, S * S * 2));
  uint8_t* keep;
  CHECK(cudaMalloc(&keep, S * S));
  CHECK(cudaMalloc(&counter, 4));
  CHECK(cudaMalloc(&tiles, fusedattn::cuda::hopper::mask_tiles_bytes(1, 1, S, S)));
  fill<<<1024, 256>>>(q, n, 1);
  fill<<<1024, 256>>>(k, n, 2);
  fill<<<1024, 256>>>(v, n, 3);
  const float masked = __bfloat162float(__float2bfloat16(-0.7f * 3.3895313892515355e38f));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  // -2: full, no mask; -3: a dense mask that keeps every key (every tile full: the classes'
  // cost without mixed tiles). "typed-br": the typed band on the instances that carry the
  // dense mask's code (FlashFwdParams::bias_reads): the instance's cost without the mask.
  // "dense-keep": the same mask as a boolean keep mask's bytes (FlashFwdParams::bias_keep).
  for (int64_t window : {int64_t(-1), int64_t(512), int64_t(-2), int64_t(-3)}) {
    if (window != -2) fill_mask<<<1024, 256>>>(mask, S, window, masked);
    if (window != -2) keep_of<<<1024, 256>>>(mask, S * S, masked, keep);
    for (int round = 0; round < 2; ++round)
      for (int mode : {0, 3, 1, 2})  // dense, dense-keep, typed, typed-br
        for (int groups : {2, 3}) {
          const bool dense = mode == 0 || mode == 3;
          if ((groups == 3 && D != 64) || (window == -2 && dense) || (window == -3 && !dense)) continue;
          FlashFwdParams p;
          p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse, p.counter = counter;
          p.q_b = p.k_b = p.v_b = p.o_b = S * H * D;
          p.q_s = p.k_s = p.v_s = p.o_s = H * D;
          p.q_h = p.k_h = p.v_h = p.o_h = D;
          p.l_b = H * S, p.l_h = S, p.l_s = 1;
          p.batch = B, p.seqlen_q = p.seqlen_kv = S, p.heads_q = p.heads_kv = H, p.head_dim = D;
          p.bf16 = true, p.scale = 0.125f, p.groups = groups;
          if (dense) {
            p.bias = mask, p.mask_bias = true, p.mask_value = masked, p.mask_tiles = tiles;
            p.bias_batch = p.bias_heads = 1, p.bias_s = S;
            if (mode == 3) p.bias = keep, p.bias_keep = true;
          } else if (window > -2) {  // the band as a mask type
            p.causal = true, p.diag = 0, p.left_bound = window >= 0, p.lo_diag = window >= 0 ? -window : 0;
          }
          if (mode == 2) p.bias_reads = 1;
          if (softcap > 0.0f && (dense || mode == 2)) continue;  // (softcap takes no dense mask)
          p.softcap = softcap;
          for (int w = 0; w < 3; ++w)
            if (!fusedattn::cuda::hopper::flash_fwd(p, 0).ok()) { std::printf("flash_fwd failed\n"); return 1; }
          const int iters = 20;
          CHECK(cudaEventRecord(t0));
          for (int it = 0; it < iters; ++it) (void)fusedattn::cuda::hopper::flash_fwd(p, 0);
          CHECK(cudaEventRecord(t1));
          CHECK(cudaEventSynchronize(t1));
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, t0, t1));
          std::printf("r%d %-6s %-8s groups %d: %.3f ms (classification included when dense)\n", round,
                      window <= -2 ? "full" : window < 0 ? "causal" : "window",
                      mode == 3 ? "dense-keep" : dense ? "dense" : mode == 2 ? "typed-br" : softcap > 0.0f ? "typed-sc" : "typed",
                      groups, ms / iters);
        }
  }
  return 0;
}
