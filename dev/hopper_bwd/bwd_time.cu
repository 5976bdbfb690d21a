// Times the Hopper backward (flash_bwd: its three kernels) alone on random inputs, the
// forward's lse from a random row max (the backward's cost does not depend on it):
//   nvcc -std=c++17 -O3 -arch=sm_90a -Icsrc --expt-relaxed-constexpr dev/hopper_bwd/bwd_time.cu \
//     csrc/fusedattn/attention/hopper/flash_bwd.cu csrc/fusedattn/attention/hopper/tma_map.cu -o .carry/bwd_time
//   .carry/bwd_time B S H Hkv causal(0/1) [left window] [fp16] [dense] [head dim]
// dense 1: the band passed as a dense mask (a folded bias of [1, 1, S, S]) instead of the type;
// FA_KEEP=1: declared without values (FlashBwdParams::mask_keep_only: head dim 64's
// 128-query variant).
// Prints ms (median of 20) and TFLOP/s (2.5x the forward's matmul flops, causal half), then
// the sum and the sum of |x| of dq, dk and dv: two builds of the kernel must print the same
// (dk / dv bitwise; dq to rounding, its atomics add in any order), and how many dq values
// one more call changes (FA_DETERMINISTIC=1: FlashBwdParams::deterministic, 0 expected).
// FA_SOFTCAP=c: the softcap score_mod (FlashBwdParams::softcap). FA_ALIBI=slope: ALiBi with
// one slope, scores - slope |kv - q| (FlashBwdParams::alibi_*). FA_BIAS=1 / 2: a bias [1, H,
// S, S] of values in [-1, 1), post- / pre-scale (no dbias), instead of a dense mask; with
// FA_DBIAS=1 its gradient too (FA_BIAS_B=1: a bias [B, H, S, S]; FA_DBIAS_TILE=0: dbias's
// stores as pairs, not through shared memory).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fusedattn/attention/hopper/flash_bwd.h"

using namespace fusedattn::cuda::hopper;

__global__ void fill(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u + seed;
    h ^= h >> 15, h *= 0x2c1b3c6d, h ^= h >> 12;
    x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}
// A dense mask [1, 1, S, S] as a folded bias: j <= i (and j >= i - left when left >= 0)
// kept as 0, the rest `masked`.
__global__ void fill_mask(__nv_bfloat16* m, int64_t S, int left, float masked) {
  for (int64_t x = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; x < S * S; x += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = x / S, j = x % S;
    m[x] = __float2bfloat16(j <= i && (left < 0 || j >= i - left) ? 0.0f : masked);
  }
}
__global__ void fill_lse(float* x, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = 3.0f;
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: bwd_time B S H Hkv causal [left] [fp16]\n");
    return 2;
  }
  const int64_t B = atoi(argv[1]), S = atoi(argv[2]), H = atoi(argv[3]), Hkv = atoi(argv[4]);
  const int64_t D = argc > 9 ? atoi(argv[9]) : 128;
  const bool causal = atoi(argv[5]) != 0;
  const int left = argc > 6 ? atoi(argv[6]) : -1;
  const bool fp16 = argc > 7 && atoi(argv[7]) != 0;
  const bool dense = argc > 8 && atoi(argv[8]) != 0;
  const int64_t nq = B * S * H * D, nk = B * S * Hkv * D;
  __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float* lse;
  for (auto** t : {&q, &o, &dout, &dq}) cudaMalloc(t, nq * 2);
  for (auto** t : {&k, &v, &dk, &dv}) cudaMalloc(t, nk * 2);
  cudaMalloc(&lse, B * H * S * 4);
  uint32_t seed = 1;
  for (auto* t : {q, o, dout}) fill<<<1024, 256>>>(t, nq, seed++);
  for (auto* t : {k, v}) fill<<<1024, 256>>>(t, nk, seed++);
  fill_lse<<<1024, 256>>>(lse, B * H * S);
  FlashBwdParams p;
  p.q = q, p.k = k, p.v = v, p.out = o, p.dout = dout, p.lse = lse, p.dq = dq, p.dk = dk, p.dv = dv;
  p.q_b = p.o_b = p.do_b = p.dq_b = S * H * D;
  p.q_s = p.o_s = p.do_s = p.dq_s = H * D;
  p.q_h = p.o_h = p.do_h = p.dq_h = D;
  p.k_b = p.v_b = p.dk_b = p.dv_b = S * Hkv * D;
  p.k_s = p.v_s = p.dk_s = p.dv_s = Hkv * D;
  p.k_h = p.v_h = p.dk_h = p.dv_h = D;
  p.l_b = H * S, p.l_h = S, p.l_s = 1;
  p.batch = B, p.seqlen_q = p.seqlen_kv = S, p.heads_q = H, p.heads_kv = Hkv, p.head_dim = D;
  p.bf16 = !fp16, p.scale = 1.0f / sqrtf(float(D));
  p.causal = causal || left >= 0, p.diag = 0;
  p.left_bound = left >= 0, p.lo_diag = -left;
  if (dense) {
    __nv_bfloat16* m;
    cudaMalloc(&m, S * S * 2);
    p.mask_value = __bfloat162float(__float2bfloat16(-0.7f * 3.3895313892515355e38f));
    fill_mask<<<1024, 256>>>(m, S, left, p.mask_value);
    p.bias = m, p.mask_bias = true, p.bias_s = S;
    p.mask_keep_only = getenv("FA_KEEP") && atoi(getenv("FA_KEEP")) != 0;
    p.causal = false, p.left_bound = false;
  }
  if (getenv("FA_BIAS") && atoi(getenv("FA_BIAS")) != 0) {
    // FA_BIAS_B=1: [B, H, S, S] (dbias written per element) instead of [1, H, S, S]
    const int64_t bb = getenv("FA_BIAS_B") && atoi(getenv("FA_BIAS_B")) != 0 ? B : 1;
    __nv_bfloat16* bias;
    cudaMalloc(&bias, bb * H * S * S * 2);
    fill<<<1024, 256>>>(bias, bb * H * S * S, 99);
    p.bias = bias, p.bias_s = S, p.bias_h = S * S, p.bias_heads = H;
    p.bias_b = H * S * S, p.bias_batch = bb;
    p.pre_scale_bias = atoi(getenv("FA_BIAS")) == 2;
    if (getenv("FA_DBIAS") && atoi(getenv("FA_DBIAS")) != 0) {  // its gradient too ([1, H]: summed over B)
      void* dbias;
      cudaMalloc(&dbias, bb * H * S * S * 2);
      p.dbias = dbias, p.want_dbias = true;
      // FA_DBIAS_TILE=0: the pairs' stores (FlashBwdParams::dbias_tile)
      if (getenv("FA_DBIAS_TILE")) p.dbias_tile = atoi(getenv("FA_DBIAS_TILE")) != 0;
    }
  }
  p.deterministic = getenv("FA_DETERMINISTIC") && atoi(getenv("FA_DETERMINISTIC")) != 0;
  if (getenv("FA_SOFTCAP")) p.softcap = static_cast<float>(atof(getenv("FA_SOFTCAP")));
  if (getenv("FA_ALIBI")) {
    const float slope = static_cast<float>(atof(getenv("FA_ALIBI")));
    float* d_slope;
    cudaMalloc(&d_slope, 4);
    cudaMemcpy(d_slope, &slope, 4, cudaMemcpyHostToDevice);
    p.alibi_slopes = d_slope, p.alibi_stride = 0, p.alibi_sign = -1.0f, p.alibi_abs = true;
  }
  void* ws;
  cudaMalloc(&ws, flash_bwd_workspace_bytes(p));
  p.workspace = ws, p.workspace_bytes = flash_bwd_workspace_bytes(p);
  const std::string why = flash_bwd_unsupported(p, 90);
  if (!why.empty()) {
    fprintf(stderr, "unsupported: %s\n", why.c_str());
    return 1;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 25; ++r) {
    cudaEventRecord(e0);
    const auto st = flash_bwd(p, 0);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    if (!st.ok()) {
      fprintf(stderr, "%s\n", st.message.c_str());
      return 1;
    }
    float t;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= 5) ms.push_back(t);
  }
  if (cudaGetLastError() != cudaSuccess) return 1;
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  double pairs = double(S) * S;
  if (left >= 0) pairs = double(S) * (left + 1);
  else if (causal) pairs /= 2;
  const double flops = 2.5 * 4.0 * B * H * pairs * D;
  auto sums = [](const __nv_bfloat16* d, int64_t n) {
    std::vector<__nv_bfloat16> h(n);
    cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost);
    double s = 0, a = 0;
    for (const auto& x : h) s += __bfloat162float(x), a += std::fabs(__bfloat162float(x));
    char buf[64];
    snprintf(buf, sizeof buf, "%.5e/%.6e", s, a);
    return std::string(buf);
  };
  // dq of one more call against the last one's, bit for bit.
  std::vector<__nv_bfloat16> dq1(nq), dq2(nq);
  cudaMemcpy(dq1.data(), dq, nq * 2, cudaMemcpyDeviceToHost);
  if (!flash_bwd(p, 0).ok() || cudaDeviceSynchronize() != cudaSuccess) return 1;
  cudaMemcpy(dq2.data(), dq, nq * 2, cudaMemcpyDeviceToHost);
  int64_t differ = 0;
  for (int64_t i = 0; i < nq; ++i)
    differ += __bfloat16_as_ushort(dq1[i]) != __bfloat16_as_ushort(dq2[i]);
  printf("%s%s%s", p.deterministic ? "[deterministic] " : "", p.softcap > 0 ? "[softcap] " : "",
         p.alibi_slopes ? "[alibi] " : "");
  printf("bwd%s D %lld B %lld S %lld H %lld Hkv %lld %s%s: %.3f ms  %.0f TFLOP/s  sums dq %s dk %s dv %s  repeat: %lld dq values differ\n", dense ? (p.mask_keep_only ? " (dense mask, keep-only)" : " (dense mask)") : p.bias ? (p.dbias ? (p.pre_scale_bias ? " (pre-scale bias, dbias)" : " (bias, dbias)") : (p.pre_scale_bias ? " (pre-scale bias)" : " (bias)")) : "", (long long)D, (long long)B, (long long)S,
         (long long)H, (long long)Hkv, causal ? "causal" : "full",
         left >= 0 ? (" window " + std::to_string(left)).c_str() : "", med, flops / med / 1e9,
         sums(dq, nq).c_str(), sums(dk, nk).c_str(), sums(dv, nk).c_str(), (long long)differ);
  return 0;
}
