// What bounds the Hopper forward's softmax phase? Times the kernel's own
// softmax_step (fwd_kernel.cuh) on one consumer warpgroup's registers, in
// cycles a step, alone and beside tensor-core work, for the plain and softcap
// modifiers:
//   alone       one warpgroup, nothing else on the SM
//   both        both consumer warpgroups run softmax steps at once
//   other mma   the other warpgroup keeps the tensor cores busy (S = Q K^T,
//   smem operands) own mma     the same warpgroup issues a Q K^T before each
//   step and waits after it
// Build here, run on the GPU machine (log:
// bench/runs/2026-11-24/softmax_phase_probe.log):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     dev/hopper_fwd/softmax_phase_probe.cu -o .carry/softmax_phase_probe &&
//     .carry/softmax_phase_probe
#include <cstdio>

#include "fusedattn/attention/hopper/fwd_kernel.cuh"

using namespace fusedattn::cuda::hopper;

enum Mode { kAlone, kBoth, kOtherMma, kOwnMma };
constexpr int kModes = 4;
const char *kModeNames[kModes] = {"alone", "both", "other mma", "own mma"};

// cycles[0]: the softmax group's cycles (group 1), cycles[1]: its steps;
// cycles[2], [3]: the same for the tensor-core group (group 2: Q K^T products,
// 8 wgmma each) while group 1 runs.
template <class Mod, int mode>
__global__ void __launch_bounds__(384, 1)
    probe(int steps, unsigned long long *cycles, float *sink) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint8_t tiles[Dims<128>::kTileBytes];  // Q = K: garbage bf16
  __shared__ volatile int done;
  const int group = threadIdx.x / 128, tid = threadIdx.x % 128;
  for (int i = threadIdx.x; i < Dims<128>::kTileBytes / 4; i += blockDim.x)
    reinterpret_cast<uint32_t *>(tiles)[i] = 0x3c003c00u ^ (i * 2654435761u >> 20);
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  if (group == 0) return;
  constexpr bool kMmaGroup2 = mode == kOtherMma;
  FwdArgs a{};
  a.seqlen_kv = 1 << 30;
  a.mul_in = 0.088f / 50.0f;
  a.mul_out = 50.0f * 1.4427f;
  float s[64], t[64], mx[2] = {-INFINITY, -INFINITY}, mx_old[2];
  for (int i = 0; i < 64; ++i) s[i] = t[i] = 0.01f * ((tid * 7 + i * 13) % 97) - 0.4f;
  const uint32_t q = smem_addr(tiles), k = q;
  auto mma = [&] {
    fence_regs(t);
    wgmma_fence();
    issue_qk<true, 128>(t, q, k);
  };
  if constexpr (kMmaGroup2) {
    if (group == 2) {  // products until group 1 is done
      const long long start = clock64();
      long long n = 0;
      for (; !done; ++n) {
        mma();
        wgmma_wait<0>();
        fence_regs(t);
      }
      const long long end = clock64();
      if (t[tid % 64] == 12345.0f) sink[0] = t[0];
      if (tid == 0) {
        atomicAdd(cycles + 2, static_cast<unsigned long long>(end - start));
        atomicAdd(cycles + 3, static_cast<unsigned long long>(n));
      }
      return;
    }
  }
  if (mode != kBoth && group == 2) return;
  const long long start = clock64();
  for (int it = 0; it < steps; ++it) {
    if constexpr (mode == kOwnMma) mma();
    const bool r = softmax_step<Mod, false, false>(s, mx, mx_old, a, 0, 0, 0.0f);
    if constexpr (mode == kOwnMma) {
      wgmma_wait<0>();
      fence_regs(t);
    }
    const float m = r ? 0.5f : 0.25f;  // one FFMA a score makes the next step's scores
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = fmaf(s[i], m, 0.01f * i);
  }
  const long long end = clock64();
  if (tid == 0 && group == 1) done = 1;
  float acc = mx[0] + mx_old[1];
  for (int i = 0; i < 64; ++i) acc += s[i] + t[i];
  if (acc == 12345.0f) sink[0] = acc;
  if (group == 1 && tid == 0) {
    atomicAdd(cycles, static_cast<unsigned long long>(end - start));
    atomicAdd(cycles + 1, static_cast<unsigned long long>(steps));
  }
#endif
}

int main() {
  unsigned long long *cycles;
  float *sink;
  cudaMalloc(&cycles, 32);
  cudaMalloc(&sink, 4);
  const int blocks = 132, steps = 2000;
  using K = void (*)(int, unsigned long long *, float *);
  auto run = [&](const K *kernels, const char *name) {
    for (int m = 0; m < kModes; ++m) {
      kernels[m]<<<blocks, 384>>>(10, cycles, sink);  // warm
      cudaMemset(cycles, 0, 32);
      kernels[m]<<<blocks, 384>>>(steps, cycles, sink);
      unsigned long long c[4] = {};
      cudaMemcpy(c, cycles, 32, cudaMemcpyDeviceToHost);
      const cudaError_t e = cudaGetLastError();
      std::printf("%-16s %-10s", name, kModeNames[m]);
      if (c[1]) std::printf("  softmax %6.0f cycles a step", double(c[0]) / c[1]);
      if (c[3]) std::printf("  Q K^T %5.0f cycles (512 at full rate)", double(c[2]) / c[3]);
      std::printf("%s\n", e == cudaSuccess ? "" : cudaGetErrorString(e));
    }
  };
  const K plain[kModes] = {probe<PlainScores, 0>, probe<PlainScores, 1>, probe<PlainScores, 2>,
                           probe<PlainScores, 3>};
  const K softcap[kModes] = {probe<SoftcapScores, 0>, probe<SoftcapScores, 1>,
                             probe<SoftcapScores, 2>, probe<SoftcapScores, 3>};
  run(plain, "plain");
  run(softcap, "softcap");
  return 0;
}
