// The register-resident CUDA flash forward (FlashAttention-2's layout) for head dims up
// to 128: flash.cu's forward algorithm and rules with S, P and O in registers.
//
// One block = one (batch, q head, query tile of 128 rows), 8 warps of 16 rows each; the
// heaviest tiles (the last, under a causal mask) start first. Q stays in shared memory;
// K and V tiles of 64 keys stream through two cp.async buffers (tile t + 1 loads while
// tile t computes). Per key tile a warp computes S = Q K^T into mma.sync accumulators,
// masks / biases / exponentiates / drops out its rows in registers (a row's four lanes
// join their maxima and sums with two shuffles) and multiplies P, repacked as the A
// operand, by V into O. 16-bit inputs use ldmatrix and m16n8k16; float32 m16n8k8 in TF32,
// 3xTF32 when EXACT (mma.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "fusedattn/attention/cuda/flash_common.cuh"
#include "fusedattn/attention/cuda/mma.cuh"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda::flash::detail {
namespace {

using namespace fusedattn::cuda::mma;

constexpr int kWarps = kMmaBM / 16, kBN = 64;

// Shared memory: Q [BM][LD], K [2][BN][LD], V [2][BN][LD], the warps' maxima.
template <class T, int D>
struct Smem {
  static constexpr int kPad = 16 / int(sizeof(T)), LD = D + kPad;
  static constexpr size_t q = 0, k = size_t(kMmaBM) * LD * sizeof(T), v = k + 2 * size_t(kBN) * LD * sizeof(T),
                          wmax = v + 2 * size_t(kBN) * LD * sizeof(T), total = wmax + kWarps * 4;
};

// A row's maximum is NaN when a kept score is (max_nan), which fwd.cc's rule makes the
// row's result.
__device__ __forceinline__ float quad_max(float x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// DROP: dropout on (a kernel of its own: the per-key Philox code out of the hot loop).
template <class T, int D, bool EXACT, bool DROP>
__global__ void __launch_bounds__(kWarps * 32) fwd_kernel(const Call c, float* tile_max) {
  constexpr int BM = kMmaBM, NT = kBN / 8, DT = D / 8;
  using L = Smem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::q);
  T* sK = reinterpret_cast<T*>(smem + L::k);
  T* sV = reinterpret_cast<T*>(smem + L::v);
  float* sWmax = reinterpret_cast<float*>(smem + L::wmax);
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q;
  const int64_t n_qt = (Sq + BM - 1) / BM;
  const int64_t task = blockIdx.x;
  const int64_t qt = n_qt - 1 - task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
  const int64_t hk = h / (Hq / p.heads_kv), q0 = qt * BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;

  const T* q = static_cast<const T*>(c.a.q) + b * c.a.sq.b + q0 * c.a.sq.s + h * c.a.sq.h;
  const T* kp = static_cast<const T*>(c.a.k) + b * c.a.sk.b + hk * c.a.sk.h;
  const T* vp = static_cast<const T*>(c.a.v) + b * c.a.sv.b + hk * c.a.sv.h;
  const T* bias = bias_plane<T>(c, b, h);
  const Drop drop(c, b, h);
  const float sink = sink_logit(c, b, h);

  cp_async_rows<T, D, L::LD>(sQ, q, c.a.sq.s, std::min<int64_t>(BM, Sq - q0), p.head_dim_qk, BM);
  cp_async_commit();
  const TileRange tr = c.tiles[b * n_qt + qt];
  const int64_t kb = tr.lo / kBN * kBN;
  const int64_t n_kt = tr.lo < tr.hi ? (tr.hi - kb + kBN - 1) / kBN : 0;
  auto issue_kv = [&](int64_t k0, int buf) {
    const int64_t keys = std::min<int64_t>(kBN, Skv - k0);
    cp_async_rows<T, D, L::LD>(sK + buf * kBN * L::LD, kp + k0 * c.a.sk.s, c.a.sk.s, keys, p.head_dim_qk, kBN);
    cp_async_rows<T, D, L::LD>(sV + buf * kBN * L::LD, vp + k0 * c.a.sv.s, c.a.sv.s, keys, p.head_dim_v, kBN);
    cp_async_commit();
  };
  if (n_kt > 0) issue_kv(kb, 0);

  // Rows g and g + 8 of the warp: kept keys and fwd.cc's m (running max with the sink),
  // l (sum), mx (max of real keys).
  RowInfo ri[2];
  int64_t row[2];
  float m[2], l[2], mx[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = q0 + warp * 16 + g + 8 * r;
    ri[r] = row[r] < Sq ? c.rows[b * Sq + row[r]] : RowInfo{-1, -1, -1, -1};
    const bool real = ri[r].q_base >= 0;
    m[r] = real ? sink : -kInf;
    l[r] = real && sink != -kInf ? 1.0f : 0.0f;
    mx[r] = -kInf;
  }
  float o[DT][4];
#pragma unroll
  for (int dn = 0; dn < DT; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;

  for (int64_t it = 0; it < n_kt; ++it) {
    const int64_t k0 = kb + it * kBN;
    const int buf = int(it & 1);
    if (it + 1 < n_kt) {
      issue_kv(k0 + kBN, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    mma_abt<T, L::LD, kBN, D, EXACT>(s, sQ + warp * 16 * L::LD, sK + buf * kBN * L::LD, lane);  // S = Q_w K^T

    // Mask, bias, online softmax and dropout of rows g, g + 8 (fwd.cc's row loop). A tile
    // that every row of the warp keeps whole skips the per-key mask test.
    const int jt = int(k0) + 2 * t;  // this thread's first key (keys fit int32: RowInfo)
    const bool whole = __all_sync(0xffffffffu, ri[0].lo <= k0 && ri[0].hi >= k0 + kBN &&
                                                   ri[1].lo <= k0 && ri[1].hi >= k0 + kBN);
    float rmax[2] = {-kInf, -kInf};
    if (whole && !bias) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[n][e] *= p.scale, rmax[e >> 1] = max_nan(rmax[e >> 1], s[n][e]);
    } else {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, j = jt + 8 * n + (e & 1);
          const bool keep = j >= ri[r].lo && j < ri[r].hi;
          float x = s[n][e] * p.scale;
          if (bias && keep) x += c.bmul * to_f(bias[row[r] * c.a.bias_s + j]);
          x = keep ? x : -kInf;  // a masked key's NaN does not count
          s[n][e] = x;
          rmax[r] = max_nan(rmax[r], x);
        }
      }
    }
    float alpha[2], sum[2] = {0.0f, 0.0f};
    bool live[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rmax[r] = quad_max(rmax[r]);  // NaN when a kept score is NaN
      const bool any = max(int64_t(ri[r].lo), k0) < min(int64_t(ri[r].hi), k0 + kBN);
      mx[r] = nan_max(mx[r], rmax[r]);
      const float m_new = nan_max(m[r], rmax[r]);
      live[r] = m_new > -kInf;
      alpha[r] = 1.0f;
      if (!live[r]) {
        if (m_new != m_new && any) m[r] = l[r] = m_new;
      } else {
        alpha[r] = m[r] == m_new ? 1.0f : exp_approx(m[r] - m_new);
        m[r] = m_new;
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        // exp(-inf) = 0: masked keys; a dead row's probabilities are 0.
        float pr = live[r] ? exp_approx(s[n][e] - m[r]) : 0.0f;
        sum[r] += pr;
        if constexpr (DROP)
          if (pr != 0.0f) pr *= drop.z(row[r], jt + 8 * n + (e & 1));
        s[n][e] = pr;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] = quad_sum(sum[r]);
      if (live[r]) l[r] = l[r] * alpha[r] + sum[r];
    }
#pragma unroll
    for (int dn = 0; dn < DT; ++dn) {
      o[dn][0] *= alpha[0], o[dn][1] *= alpha[0];
      o[dn][2] *= alpha[1], o[dn][3] *= alpha[1];
    }
    mma_pb<T, L::LD, kBN, D, EXACT>(o, s, sV + buf * kBN * L::LD, lane);  // O += P V
    __syncthreads();  // the next iteration loads into this buffer
  }
  cp_async_wait<0>();

  // out = O / l, lse = m + log l (fwd.cc's end of task).
  T* out = static_cast<T*>(c.a.out) + b * c.a.so.b + h * c.a.so.h;
  const int64_t Dv = p.head_dim_v;
  float local_max = -kInf;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= Sq) continue;
    const bool any = l[r] != 0.0f;
    const bool zero = !any || ri[r].hi <= ri[r].lo;
    const float inv = any ? 1.0f / l[r] : 0.0f;
    T* orow = out + row[r] * c.a.so.s;
#pragma unroll
    for (int dn = 0; dn < DT; ++dn) {
      const int col = dn * 8 + 2 * t;
      if (col < Dv) orow[col] = from_f<T>(zero ? 0.0f : o[dn][2 * r] * inv);
      if (col + 1 < Dv) orow[col + 1] = from_f<T>(zero ? 0.0f : o[dn][2 * r + 1] * inv);
    }
    if (t == 0) c.a.lse[b * c.a.slse.b + h * c.a.slse.h + row[r] * c.a.slse.s] = any ? m[r] + logf(l[r]) : -kInf;
    local_max = nan_max(local_max, mx[r]);
  }
  if (tile_max) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) local_max = nan_max(local_max, __shfl_xor_sync(0xffffffffu, local_max, off));
    if (lane == 0) sWmax[warp] = local_max;
    __syncthreads();
    if (threadIdx.x == 0) {
      float tm = -kInf;
      for (int w = 0; w < kWarps; ++w) tm = nan_max(tm, sWmax[w]);
      tile_max[task] = tm;
    }
  }
}

template <class T, int D, bool EXACT, bool DROP>
Status launch_fwd(const Call& c, float* tile_max, cudaStream_t stream) {
  const AttnParams& p = c.p;
  const int64_t blocks = p.batch * p.heads_q * ((p.seqlen_q + kMmaBM - 1) / kMmaBM);
  const size_t smem = Smem<T, D>::total;
  auto kernel = fwd_kernel<T, D, EXACT, DROP>;
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(c, tile_max);
  return cuda_status(cudaGetLastError(), "the flash forward (mma)");
}

size_t fwd_smem(int elem, int64_t d) {
  if (elem == 4) return d == 64 ? Smem<float, 64>::total : Smem<float, 128>::total;
  return d == 64 ? Smem<__half, 64>::total : Smem<__half, 128>::total;
}

}  // namespace

bool mma_rows_fit(const AttnParams& p, std::initializer_list<ViewStrides> views,
                  std::initializer_list<const void*> ptrs, size_t smem) {
  const int64_t v = 16 / (p.dtype == FA_FLOAT32 ? 4 : 2);
  if (p.head_dim_qk % v || p.head_dim_v % v) return false;
  for (const ViewStrides& s : views)
    if (s.b % v || s.s % v || s.h % v) return false;
  for (const void* ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16) return false;
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return false;
  return smem <= size_t(optin);
}

bool mma_fwd_fits(const AttnParams& p, const AttnTensors& a) {
  if (std::max(p.head_dim_qk, p.head_dim_v) > 128) return false;
  return mma_rows_fit(p, {a.sq, a.sk, a.sv}, {a.q, a.k, a.v},
                      fwd_smem(p.dtype == FA_FLOAT32 ? 4 : 2, mma_head_dim_tile(p)));
}

template <class T, bool EXACT>
Status mma_fwd(const Call& c, float* tile_max, cudaStream_t stream) {
  const bool drop = c.p.is_training && c.p.dropout > 0.0f;  // Drop's rule
  if (mma_head_dim_tile(c.p) == 64)
    return drop ? launch_fwd<T, 64, EXACT, true>(c, tile_max, stream) : launch_fwd<T, 64, EXACT, false>(c, tile_max, stream);
  return drop ? launch_fwd<T, 128, EXACT, true>(c, tile_max, stream) : launch_fwd<T, 128, EXACT, false>(c, tile_max, stream);
}

template Status mma_fwd<__nv_bfloat16, false>(const Call&, float*, cudaStream_t);
template Status mma_fwd<__half, false>(const Call&, float*, cudaStream_t);
template Status mma_fwd<float, false>(const Call&, float*, cudaStream_t);
template Status mma_fwd<float, true>(const Call&, float*, cudaStream_t);

}  // namespace fusedattn::cuda::flash::detail
