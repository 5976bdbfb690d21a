// Do MUFU / FMA work and wgmma share something on Hopper? One warpgroup keeps
// the tensor cores busy with S = Q K^T (8 wgmma m64n128k16, 512 cycles at full
// rate) while another runs a loop of one operation on 16 independent chains;
// both rates are reported, side by side and alone. Build here, run on the GPU
// machine:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     dev/hopper_fwd/mufu_mma_probe.cu -o .carry/mufu_mma_probe &&
//     .carry/mufu_mma_probe
#include <cstdio>

#include "fusedattn/attention/hopper/fwd_kernel.cuh"

using namespace fusedattn::cuda::hopper;

enum Op { kNone, kEx2, kEx2Bf16x2, kTanh, kFfma, kFadd, kOps };
const char *kOpNames[kOps] = {"idle", "ex2.f32", "ex2.bf16x2", "tanh.f32", "ffma", "fadd"};

template <int op>
__device__ __forceinline__ float step(float x) {
  float y = x;
  if constexpr (op == kEx2) asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  if constexpr (op == kEx2Bf16x2) {
    uint32_t u = __float_as_uint(x), r;
    asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(r) : "r"(u));
    y = __uint_as_float(r);
  }
  if constexpr (op == kTanh) asm volatile("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  if constexpr (op == kFfma) asm volatile("fma.rn.f32 %0, %1, %1, %1;" : "=f"(y) : "f"(x));
  if constexpr (op == kFadd) asm volatile("add.f32 %0, %1, %1;" : "=f"(y) : "f"(x));
  return y;
}

// cycles: [0] op group cycles, [1] its operations (warp instructions of one
// warp), [2] mma group cycles, [3] its products.
template <int op, bool kMma>
__global__ void __launch_bounds__(384, 1) probe(int iters, unsigned long long *c, float *sink) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint8_t tiles[Dims<128>::kTileBytes];
  __shared__ volatile int done;
  const int group = threadIdx.x / 128, tid = threadIdx.x % 128;
  for (int i = threadIdx.x; i < Dims<128>::kTileBytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t *>(tiles)[i] = 0x3c003c00u ^ (i * 2654435761u >> 20);
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  if (group == 2 && !kMma) return;
  if constexpr (kMma) {
    if (group == 2) {
      float t[64];
      for (int i = 0; i < 64; ++i) t[i] = 0.0f;
      const uint32_t q = smem_addr(tiles);
      const long long start = clock64();
      long long n = 0;
      for (; !done; ++n) {
        fence_regs(t);
        wgmma_fence();
        issue_qk<true, 128>(t, q, q);
        wgmma_wait<0>();
        fence_regs(t);
      }
      const long long end = clock64();
      if (t[tid % 64] == 12345.0f) sink[0] = t[0];
      if (tid == 0) {
        atomicAdd(c + 2, static_cast<unsigned long long>(end - start));
        atomicAdd(c + 3, static_cast<unsigned long long>(n));
      }
      return;
    }
  }
  if (group != 1) return;
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = -0.001f * (tid + i);
  const long long start = clock64();
  if constexpr (op == kNone) {
    while (clock64() - start < 4 * static_cast<long long>(iters)) {
    }
  } else {
    for (int it = 0; it < iters; ++it) {
#pragma unroll
      for (int i = 0; i < 16; ++i) x[i] = step<op>(x[i]);
    }
  }
  const long long end = clock64();
  if (tid == 0) done = 1;
  float acc = 0.0f;
  for (int i = 0; i < 16; ++i) acc += x[i];
  if (acc == 12345.0f) sink[0] = acc;
  if (tid == 0 && op != kNone) {
    atomicAdd(c, static_cast<unsigned long long>(end - start));
    atomicAdd(c + 1, static_cast<unsigned long long>(iters) * 16);
  }
#endif
}

int main() {
  unsigned long long *c;
  float *sink;
  cudaMalloc(&c, 32);
  cudaMalloc(&sink, 4);
  const int blocks = 132, iters = 20000;
  using K = void (*)(int, unsigned long long *, float *);
  const K alone[kOps] = {probe<0, false>, probe<1, false>, probe<2, false>,
                         probe<3, false>, probe<4, false>, probe<5, false>};
  const K mma[kOps] = {probe<0, true>, probe<1, true>, probe<2, true>,
                       probe<3, true>, probe<4, true>, probe<5, true>};
  for (int op = 0; op < kOps; ++op) {
    for (int with = 0; with < 2; ++with) {
      const K k = with ? mma[op] : alone[op];
      k<<<blocks, 384>>>(100, c, sink);
      cudaMemset(c, 0, 32);
      k<<<blocks, 384>>>(iters, c, sink);
      unsigned long long h[4] = {};
      const cudaError_t e = cudaMemcpy(h, c, 32, cudaMemcpyDeviceToHost);
      std::printf("%-11s %-9s", kOpNames[op], with ? "+ wgmma" : "alone");
      if (h[1]) std::printf("  %5.2f cycles a warp instruction", double(h[0]) / h[1]);
      if (h[3]) std::printf("  Q K^T %5.0f cycles (512 at full rate)", double(h[2]) / h[3]);
      std::printf("%s\n", e == cudaSuccess ? "" : cudaGetErrorString(e));
    }
  }
  return 0;
}
