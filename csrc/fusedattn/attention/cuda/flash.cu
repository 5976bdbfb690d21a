// The generic CUDA flash-attention kernels (flash.h): forward and backward on wmma
// tensor-core fragments, the CPU engine's algorithm and rules (attention/cpu/fwd.cc,
// bwd.cc) per tile.
//
// Forward: one block = one (batch, q head, query tile of BM = 16 W rows); warp w owns
// rows 16 w .. 16 w + 15 and does their online softmax alone. Per key tile of 64: S = Q K^T
// over 64-wide head-dim chunks (Q stays in shared memory, K chunks stream), the warp's
// rows masked / biased / exponentiated / dropped out in shared memory, then O += P V over
// 64-wide chunks of V into a float32 O in shared memory.
// Backward: one block = one (batch, kv head, key tile of BN = 16 W keys); warp w owns keys
// 16 w .. and their dK, dV rows (float32, shared memory) over every q head of the GQA
// group and every query tile of 64 that keeps one of its keys: S^T = K Q^T and
// dP^T = V dO^T, then dV += P^T dO, dK += dS^T Q, and dQ += dS K into a float32
// accumulator with atomics (a last kernel scales and converts it).
// Calls with rows of whole 16-byte chunks (head dims up to 512) run the register-resident
// mma.sync kernels instead (flash_mma.cu's forwards, flash_mma_bwd.cu's and
// flash_mma_bwd_wide.cu's backwards: the same rules); the wmma kernels here keep the rest
// (rows not 16-byte aligned), and the tables, delta and dq kernels serve all.
#include "fusedattn/attention/cuda/flash.h"
#include "fusedattn/attention/cuda/flash_common.cuh"
#include "fusedattn/attention/cuda/flash_rules.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "fusedattn/core/regions.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda::flash {
namespace {

using namespace nvcuda;
using namespace detail;

int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// ---- wmma fragments ------------------------------------------------------------------

template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static constexpr int K = 16;
  using In = __nv_bfloat16;
};
template <>
struct Mma<__half> {
  static constexpr int K = 16;
  using In = __half;
};
template <>
struct Mma<float> {
  static constexpr int K = 8;
  using In = wmma::precision::tf32;
};

template <class T>
using FragC = wmma::fragment<wmma::accumulator, 16, 16, Mma<T>::K, float>;

// An A or B fragment; for float32 also its TF32 remainder (3xTF32 when EXACT).
template <class T, bool EXACT, class Use, class Layout>
struct Frag {
  wmma::fragment<Use, 16, 16, Mma<T>::K, typename Mma<T>::In, Layout> hi, lo;
  __device__ __forceinline__ void load(const T* p, unsigned ld) {
    wmma::load_matrix_sync(hi, p, ld);
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
      for (int i = 0; i < hi.num_elements; ++i) {
        const float x = hi.x[i];
        const float h = wmma::__float_to_tf32(x);
        hi.x[i] = h;
        if constexpr (EXACT) lo.x[i] = wmma::__float_to_tf32(x - h);
      }
    }
  }
};

template <class T, bool EXACT, class LA, class LB>
__device__ __forceinline__ void mma(FragC<T>& c, const Frag<T, EXACT, wmma::matrix_a, LA>& a,
                                    const Frag<T, EXACT, wmma::matrix_b, LB>& b) {
  if constexpr (std::is_same_v<T, float> && EXACT) {
    wmma::mma_sync(c, a.lo, b.hi, c);
    wmma::mma_sync(c, a.hi, b.lo, c);
  }
  wmma::mma_sync(c, a.hi, b.hi, c);
}

// dst[r][c] (ld) = src row r (row stride rs), column c, for r < R, c < C; zero where
// r >= rows or c >= cols. The block's threads share the work.
template <class T>
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* src, int64_t rs, int R, int C,
                                          int64_t rows, int64_t cols) {
  for (int idx = threadIdx.x; idx < R * C; idx += blockDim.x) {
    const int r = idx / C, c = idx % C;
    dst[r * ld + c] = r < rows && c < cols ? src[r * rs + c] : from_f<T>(0.0f);
  }
}

// ---- the kept-key table ---------------------------------------------------------------

// Segment s of each row b (one thread per row walks them in order: mask.h's rule).
__global__ void segments_kernel(AttnMask m, int64_t B, Segment* segs) {
  const int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (b >= B) return;
  SegmentWalk w;
  if (m.seq.block) {
    const BlockPos pos = block_of(m, b);
    for (int64_t s = 0; s < m.segments; ++s) segs[b * m.segments + s] = block_segment(m, pos, b, s, &w);
  } else {
    for (int64_t s = 0; s < m.segments; ++s) segs[b * m.segments + s] = next_segment(m, b, s, &w);
  }
}

// The rows of each segment (the table was filled with -1: padding rows keep nothing).
__global__ void rows_kernel(AttnMask m, int64_t B, int64_t Sq, int64_t Skv, const Segment* segs,
                            RowInfo* rows) {
  for (int64_t bs = blockIdx.x; bs < B * m.segments; bs += gridDim.x) {
    const int64_t b = bs / m.segments;
    const Segment g = segs[bs];
    if (m.seq.block) {
      const BlockPos pos = block_of(m, b);
      const int64_t i0 = first_local(pos.q, g.q_begin, Sq);
      const int64_t i1 = first_local(pos.q, g.q_begin + g.q_len, Sq);
      for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const KeyRange k = block_keys(m.rule, pos, g, global_token(pos.q, i), Skv);
        rows[b * Sq + i] = {int32_t(k.lo), int32_t(k.hi), int32_t(g.q_begin), int32_t(g.kv_begin)};
      }
    } else {
      for (int64_t i = g.q_begin + threadIdx.x; i < g.q_begin + g.q_len; i += blockDim.x) {
        const KeyRange k = row_keys(m, g, i);
        rows[b * Sq + i] = {int32_t(k.lo), int32_t(k.hi), int32_t(g.q_begin), int32_t(g.kv_begin)};
      }
    }
  }
}

__global__ void tiles_kernel(const RowInfo* rows, int64_t B, int64_t Sq, int64_t Skv, int tile,
                             TileRange* tiles) {
  const int64_t n_t = (Sq + tile - 1) / tile;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t >= B * n_t) return;
  const int64_t b = t / n_t, q0 = (t % n_t) * tile;
  int32_t lo = int32_t(Skv), hi = 0;
  for (int64_t i = q0; i < min(Sq, q0 + tile); ++i) {
    const RowInfo r = rows[b * Sq + i];
    if (r.lo >= r.hi) continue;
    lo = min(lo, r.lo);
    hi = max(hi, r.hi);
  }
  tiles[t] = {lo, hi};
}

// ---- forward --------------------------------------------------------------------------

template <class T, int W, bool EXACT>
__global__ void __launch_bounds__(W * 32) fwd_kernel(const Call c, float* tile_max) {
  constexpr int BM = 16 * W, KM = Mma<T>::K;
  extern __shared__ __align__(128) unsigned char smem[];
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q;
  const int64_t n_qt = (Sq + BM - 1) / BM;
  const int64_t task = blockIdx.x;
  const int64_t qt = task % n_qt, h = (task / n_qt) % Hq, b = task / (n_qt * Hq);
  const int64_t hk = h / (Hq / p.heads_kv), q0 = qt * BM;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v, Dp = c.Dp, Dvp = c.Dvp;
  const FwdLayout L(W, Dp, Dvp, int(sizeof(T)));
  T* sQ = reinterpret_cast<T*>(smem + L.q);
  T* sKV = reinterpret_cast<T*>(smem + L.kv);
  float* sS = reinterpret_cast<float*>(smem + L.s);
  T* sP = reinterpret_cast<T*>(smem + L.pr);
  float* sO = reinterpret_cast<float*>(smem + L.o);
  RowInfo* sRow = reinterpret_cast<RowInfo*>(smem + L.rows);
  float* sAlpha = reinterpret_cast<float*>(smem + L.alpha);
  float* sWmax = reinterpret_cast<float*>(smem + L.wmax);
  // Per-row state (fwd.cc's m, l, mx): running max with the sink, sum, max of real keys.
  float* sM = reinterpret_cast<float*>(smem + L.state);
  float* sL = sM + BM;
  float* sMx = sL + BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const T* q = static_cast<const T*>(c.a.q) + b * c.a.sq.b + q0 * c.a.sq.s + h * c.a.sq.h;
  const T* kp = static_cast<const T*>(c.a.k) + b * c.a.sk.b + hk * c.a.sk.h;
  const T* vp = static_cast<const T*>(c.a.v) + b * c.a.sv.b + hk * c.a.sv.h;
  const T* bias = bias_plane<T>(c, b, h);
  const Drop drop(c, b, h);
  const float sink = sink_logit(c, b, h);
  const int64_t rows = min(int64_t(BM), Sq - q0);

  load_tile(sQ, L.ldq, q, c.a.sq.s, BM, int(Dp), rows, D);
  for (int r = threadIdx.x; r < BM; r += blockDim.x)
    sRow[r] = r < rows ? c.rows[b * Sq + q0 + r] : RowInfo{-1, -1, -1, -1};
  for (int64_t idx = threadIdx.x; idx < BM * Dvp; idx += blockDim.x) sO[idx] = 0.0f;
  const TileRange tr = c.tiles[b * n_qt + qt];
  __syncthreads();
  for (int r = threadIdx.x; r < BM; r += blockDim.x) {
    const bool real = sRow[r].q_base >= 0;
    sM[r] = real ? sink : -kInf;
    sL[r] = real && sink != -kInf ? 1.0f : 0.0f;
    sMx[r] = -kInf;
  }
  __syncthreads();

  for (int64_t k0 = tr.lo / kBN * kBN; k0 < tr.hi; k0 += kBN) {
    FragC<T> acc[kBN / 16];
#pragma unroll
    for (int n = 0; n < kBN / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
    for (int64_t d0 = 0; d0 < Dp; d0 += kDC) {
      const int dc = int(min(int64_t(kDC), Dp - d0));
      __syncthreads();
      load_tile(sKV, L.ldc, kp + k0 * c.a.sk.s + d0, c.a.sk.s, kBN, dc, Skv - k0, D - d0);
      __syncthreads();
      for (int kk = 0; kk < dc; kk += KM) {
        Frag<T, EXACT, wmma::matrix_a, wmma::row_major> fa;
        fa.load(sQ + warp * 16 * L.ldq + d0 + kk, L.ldq);
#pragma unroll
        for (int n = 0; n < kBN / 16; ++n) {
          Frag<T, EXACT, wmma::matrix_b, wmma::col_major> fb;
          fb.load(sKV + n * 16 * L.ldc + kk, L.ldc);
          mma(acc[n], fa, fb);
        }
      }
    }
    float* sSw = sS + warp * 16 * kBN;
#pragma unroll
    for (int n = 0; n < kBN / 16; ++n) wmma::store_matrix_sync(sSw + n * 16, acc[n], kBN, wmma::mem_row_major);
    __syncwarp();

    // The warp's rows: mask, bias, online softmax, dropout (fwd.cc's row loop). Two lanes
    // per row, 32 keys each: one shuffle joins a row's max, one its sum.
    {
      const int r = lane >> 1, half = lane & 1;
      const int R = warp * 16 + r;
      const RowInfo ri = sRow[R];
      const int64_t i = q0 + R;
      float m = sM[R], l = sL[R], mx = sMx[R];
      float* srow = sSw + r * kBN + half * 32;
      T* prow = sP + R * L.ldp + half * 32;
      const int64_t j0 = k0 + half * 32;
      const T* brow = bias ? bias + i * c.a.bias_s : nullptr;
      float row_max = -kInf;
      bool nan = false, any = false;
      for (int col = 0; col < 32; ++col) {
        const int64_t j = j0 + col;
        const bool keep = j >= ri.lo && j < ri.hi;
        float x = srow[col] * p.scale;
        if (keep && brow) x += c.bmul * to_f(brow[j]);
        x = keep ? x : -kInf;
        srow[col] = x;
        row_max = fmaxf(row_max, x);
        nan |= x != x;
        any |= keep;
      }
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      nan = __shfl_xor_sync(0xffffffffu, int(nan), 1) || nan;
      any = __shfl_xor_sync(0xffffffffu, int(any), 1) || any;
      if (nan) row_max = __int_as_float(0x7fffffff);
      mx = nan_max(mx, row_max);
      const float m_new = nan_max(m, row_max);
      const bool live = m_new > -kInf;
      float alpha = 1.0f, sum = 0.0f;
      if (!live) {
        if (m_new != m_new && any) m = l = m_new;
        for (int col = 0; col < 32; ++col) prow[col] = from_f<T>(0.0f);
      } else {
        alpha = m == m_new ? 1.0f : m == -kInf ? 0.0f : expf(m - m_new);
        for (int col = 0; col < 32; ++col) {
          const float d = srow[col] - m_new;
          float pr = d == -kInf ? 0.0f : expf(d);
          sum += pr;
          if (drop.on && pr != 0.0f) pr *= drop.z(i, j0 + col);
          prow[col] = from_f<T>(pr);
        }
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      if (live) l = l * alpha + sum, m = m_new;
      if (half == 0) sAlpha[R] = alpha, sM[R] = m, sL[R] = l, sMx[R] = mx;
    }
    __syncwarp();
    for (int r = 0; r < 16; ++r) {
      const float a = sAlpha[warp * 16 + r];
      if (a != 1.0f)
        for (int64_t col = lane; col < Dvp; col += 32) sO[(warp * 16 + r) * Dvp + col] *= a;
    }
    __syncwarp();

    // O += P V over chunks of Dv.
    for (int64_t d0 = 0; d0 < Dvp; d0 += kDC) {
      const int dc = int(min(int64_t(kDC), Dvp - d0));
      __syncthreads();
      load_tile(sKV, L.ldc, vp + k0 * c.a.sv.s + d0, c.a.sv.s, kBN, dc, Skv - k0, Dv - d0);
      __syncthreads();
      FragC<T> o[kDC / 16];
      float* oRow = sO + warp * 16 * Dvp + d0;
      _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16) wmma::load_matrix_sync(o[n], oRow + n * 16, unsigned(Dvp), wmma::mem_row_major);
      for (int kk = 0; kk < kBN; kk += KM) {
        Frag<T, EXACT, wmma::matrix_a, wmma::row_major> fa;
        fa.load(sP + warp * 16 * L.ldp + kk, L.ldp);
        _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16) {
          Frag<T, EXACT, wmma::matrix_b, wmma::row_major> fb;
          fb.load(sKV + kk * L.ldc + n * 16, L.ldc);
          mma(o[n], fa, fb);
        }
      }
      _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16) wmma::store_matrix_sync(oRow + n * 16, o[n], unsigned(Dvp), wmma::mem_row_major);
    }
  }
  __syncwarp();

  // out = O / l, lse = m + log l (fwd.cc's end of task).
  T* out = static_cast<T*>(c.a.out) + b * c.a.so.b + h * c.a.so.h;
  float local_max = -kInf;
  for (int r = 0; r < 16; ++r) {
    const int64_t i = q0 + warp * 16 + r;
    if (i >= Sq) continue;
    const int R = warp * 16 + r;
    const RowInfo ri = sRow[R];
    const float m = sM[R], l = sL[R];
    const bool any = l != 0.0f;
    const bool zero = !any || ri.hi <= ri.lo;
    const float inv = any ? 1.0f / l : 0.0f;
    for (int64_t col = lane; col < Dv; col += 32)
      out[i * c.a.so.s + col] = from_f<T>(zero ? 0.0f : sO[(warp * 16 + r) * Dvp + col] * inv);
    if (lane == 0)
      c.a.lse[b * c.a.slse.b + h * c.a.slse.h + i * c.a.slse.s] = any ? m + logf(l) : -kInf;
    local_max = nan_max(local_max, sMx[R]);
  }
  if (tile_max) {
    if (lane == 0) sWmax[warp] = local_max;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = -kInf;
      for (int w = 0; w < W; ++w) t = nan_max(t, sWmax[w]);
      tile_max[task] = t;
    }
  }
}

__global__ void max_logit_kernel(const float* tile_max, int64_t BH, int64_t n_t, float* out) {
  const int64_t bh = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (bh >= BH) return;
  float m = -kInf;
  for (int64_t t = 0; t < n_t; ++t) m = nan_max(m, tile_max[bh * n_t + t]);
  out[bh] = m;
}

// ---- backward -------------------------------------------------------------------------

// delta [B, Hq, Sq] = rowsum(dO * O); d softmax_offset [B, Hq] -= exp(sink - lse) delta.
template <class T>
__global__ void delta_kernel(const Call c, float* delta) {
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Hq = p.heads_q;
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.batch * Hq * Sq) return;
  const int64_t i = row % Sq, h = (row / Sq) % Hq, b = row / (Sq * Hq);
  const T* o = static_cast<const T*>(c.a.out) + b * c.a.so.b + i * c.a.so.s + h * c.a.so.h;
  const T* d = static_cast<const T*>(c.a.dout) + b * c.a.sdo.b + i * c.a.sdo.s + h * c.a.sdo.h;
  float sum = 0.0f;
  for (int64_t col = lane; col < p.head_dim_v; col += 32) sum += to_f(o[col]) * to_f(d[col]);
  sum = warp_sum(sum);
  if (lane != 0) return;
  delta[row] = sum;
  if (c.a.dsoftmax_offset && p.softmax_type == FA_LEARNABLE_SOFTMAX) {
    const float lse = c.a.lse[b * c.a.slse.b + h * c.a.slse.h + i * c.a.slse.s];
    if (lse != -kInf) {
      const float sink = sink_logit(c, b, h);
      const float part = (sink == lse ? 1.0f : expf(sink - lse)) * sum;
      atomicAdd(c.a.dsoftmax_offset + b * Hq + h, -part);
    }
  }
}

template <class T, int W, bool EXACT>
__global__ void __launch_bounds__(W * 32) bwd_kernel(const Call c, const float* delta,
                                                     float* dq_acc, float* dbias_acc) {
  constexpr int BN = 16 * W, KM = Mma<T>::K;
  static_assert(BN * kBMQ >= W * 16 * kDC, "the dq staging fits in the S^T buffer");
  extern __shared__ __align__(128) unsigned char smem[];
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q, Hkv = p.heads_kv;
  const int64_t group = Hq / Hkv, n_kt = (Skv + BN - 1) / BN, n_qt = (Sq + kBMQ - 1) / kBMQ;
  const int64_t task = blockIdx.x;
  const int64_t kt = task % n_kt, hk = (task / n_kt) % Hkv, b = task / (n_kt * Hkv);
  const int64_t k0 = kt * BN;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v, Dp = c.Dp, Dvp = c.Dvp;
  const BwdLayout L(W, Dp, Dvp, int(sizeof(T)));
  T* sK = reinterpret_cast<T*>(smem + L.k);
  T* sV = reinterpret_cast<T*>(smem + L.v);
  T* sC = reinterpret_cast<T*>(smem + L.ch);
  float* sSt = reinterpret_cast<float*>(smem + L.st);
  float* sDPt = reinterpret_cast<float*>(smem + L.dpt);
  T* sPt = reinterpret_cast<T*>(smem + L.pt);
  T* sDSt = reinterpret_cast<T*>(smem + L.dst);
  float* sdK = reinterpret_cast<float*>(smem + L.dk);
  float* sdV = reinterpret_cast<float*>(smem + L.dv);
  RowInfo* sRow = reinterpret_cast<RowInfo*>(smem + L.rows);
  float* sLse = reinterpret_cast<float*>(smem + L.lse);
  float* sDelta = reinterpret_cast<float*>(smem + L.delta);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t keys = min(int64_t(BN), Skv - k0);

  load_tile(sK, L.ldk, static_cast<const T*>(c.a.k) + b * c.a.sk.b + k0 * c.a.sk.s + hk * c.a.sk.h,
            c.a.sk.s, BN, int(Dp), keys, D);
  load_tile(sV, L.ldv, static_cast<const T*>(c.a.v) + b * c.a.sv.b + k0 * c.a.sv.s + hk * c.a.sv.h,
            c.a.sv.s, BN, int(Dvp), keys, Dv);
  for (int64_t idx = threadIdx.x; idx < BN * Dp; idx += blockDim.x) sdK[idx] = 0.0f;
  for (int64_t idx = threadIdx.x; idx < BN * Dvp; idx += blockDim.x) sdV[idx] = 0.0f;

  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = hk * group + g;
    const T* qh = static_cast<const T*>(c.a.q) + b * c.a.sq.b + h * c.a.sq.h;
    const T* doh = static_cast<const T*>(c.a.dout) + b * c.a.sdo.b + h * c.a.sdo.h;
    const T* bias = bias_plane<T>(c, b, h);
    float* dbias = nullptr;
    if (dbias_acc)
      dbias = dbias_acc + (b / c.bs) * c.a.bias_slice + (b % c.bs) * c.a.bias_b + h * c.a.bias_h;
    const Drop drop(c, b, h);
    for (int64_t qt = 0; qt < n_qt; ++qt) {
      const TileRange tr = c.tiles[b * n_qt + qt];
      if (max(int64_t(tr.lo), k0) >= min(int64_t(tr.hi), k0 + BN)) continue;
      const int64_t q0 = qt * kBMQ, rows = min(int64_t(kBMQ), Sq - q0);
      __syncthreads();
      for (int r = threadIdx.x; r < kBMQ; r += blockDim.x) {
        const int64_t i = q0 + r;
        sRow[r] = r < rows ? c.rows[b * Sq + i] : RowInfo{-1, -1, -1, -1};
        sLse[r] = r < rows ? c.a.lse[b * c.a.slse.b + h * c.a.slse.h + i * c.a.slse.s] : -kInf;
        sDelta[r] = r < rows ? delta[(b * Hq + h) * Sq + i] : 0.0f;
      }

      // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys.
      FragC<T> st[kBMQ / 16], dpt[kBMQ / 16];
#pragma unroll
      for (int n = 0; n < kBMQ / 16; ++n) wmma::fill_fragment(st[n], 0.0f), wmma::fill_fragment(dpt[n], 0.0f);
      // acc += (16 rows of a_base) x (chunks of src's rows q0..)^T over a head dim of Dx.
      auto rows_times = [&](FragC<T>(&acc)[kBMQ / 16], const T* a_base, int lda, const T* src,
                            int64_t rs, int64_t Dx, int64_t Dreal) {
        for (int64_t d0 = 0; d0 < Dx; d0 += kDC) {
          const int dc = int(min(int64_t(kDC), Dx - d0));
          __syncthreads();
          load_tile(sC, L.ldc, src + q0 * rs + d0, rs, kBMQ, dc, rows, Dreal - d0);
          __syncthreads();
          for (int kk = 0; kk < dc; kk += KM) {
            Frag<T, EXACT, wmma::matrix_a, wmma::row_major> fa;
            fa.load(a_base + d0 + kk, lda);
#pragma unroll
            for (int n = 0; n < kBMQ / 16; ++n) {
              Frag<T, EXACT, wmma::matrix_b, wmma::col_major> fb;
              fb.load(sC + n * 16 * L.ldc + kk, L.ldc);
              mma(acc[n], fa, fb);
            }
          }
        }
      };
      rows_times(st, sK + warp * 16 * L.ldk, L.ldk, qh, c.a.sq.s, Dp, D);
      rows_times(dpt, sV + warp * 16 * L.ldv, L.ldv, doh, c.a.sdo.s, Dvp, Dv);
      float* stw = sSt + warp * 16 * kBMQ;
      float* dptw = sDPt + warp * 16 * kBMQ;
#pragma unroll
      for (int n = 0; n < kBMQ / 16; ++n) {
        wmma::store_matrix_sync(stw + n * 16, st[n], kBMQ, wmma::mem_row_major);
        wmma::store_matrix_sync(dptw + n * 16, dpt[n], kBMQ, wmma::mem_row_major);
      }
      __syncwarp();

      // P^T (dropped out) and dS^T element by element (bwd.cc's row loop).
      for (int idx = lane; idx < 16 * kBMQ; idx += 32) {
        const int r = idx & 15, col = idx >> 4;
        const int64_t j = k0 + warp * 16 + r, i = q0 + col;
        const float lse = sLse[col];
        const bool live = lse != -kInf && lse != kInf;
        const RowInfo ri = sRow[col];
        const bool keep = live && j >= ri.lo && j < ri.hi;
        float pt = 0.0f, ds = 0.0f;
        if (keep) {
          float s = stw[r * kBMQ + col] * p.scale;
          float bv = 0.0f;
          if (bias) bv = to_f(bias[i * c.a.bias_s + j]), s += c.bmul * bv;
          const float pr = expf(s - lse);
          const float dp = dptw[r * kBMQ + col], dl = sDelta[col];
          if (drop.on) {
            const float z = drop.z(i, j);
            pt = z != 0.0f ? z * pr : 0.0f;
            ds = pr * (z * dp - dl);
          } else {
            pt = pr;
            ds = pr * (dp - dl);
          }
          if (bias && bv == -kInf && lse == lse) pt = ds = 0.0f;
          if (dbias) atomicAdd(dbias + i * c.a.bias_s + j, c.bmul * ds);
        }
        sPt[r * L.ldp + col + warp * 16 * L.ldp] = from_f<T>(pt);
        sDSt[r * L.ldp + col + warp * 16 * L.ldp] = from_f<T>(ds);
      }
      __syncwarp();

      // dV += P^T dO, dK += dS^T Q (the warp's rows).
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t Dx = pass == 0 ? Dvp : Dp, Dreal = pass == 0 ? Dv : D;
        const T* src = pass == 0 ? doh : qh;
        const int64_t rs = pass == 0 ? c.a.sdo.s : c.a.sq.s;
        const T* a_base = (pass == 0 ? sPt : sDSt) + warp * 16 * L.ldp;
        float* acc_base = (pass == 0 ? sdV : sdK) + warp * 16 * Dx;
        for (int64_t d0 = 0; d0 < Dx; d0 += kDC) {
          const int dc = int(min(int64_t(kDC), Dx - d0));
          __syncthreads();
          load_tile(sC, L.ldc, src + q0 * rs + d0, rs, kBMQ, dc, rows, Dreal - d0);
          __syncthreads();
          FragC<T> acc[kDC / 16];
          _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16)
            wmma::load_matrix_sync(acc[n], acc_base + d0 + n * 16, unsigned(Dx), wmma::mem_row_major);
          for (int kk = 0; kk < kBMQ; kk += KM) {
            Frag<T, EXACT, wmma::matrix_a, wmma::row_major> fa;
            fa.load(a_base + kk, L.ldp);
            _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16) {
              Frag<T, EXACT, wmma::matrix_b, wmma::row_major> fb;
              fb.load(sC + kk * L.ldc + n * 16, L.ldc);
              mma(acc[n], fa, fb);
            }
          }
          _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16)
            wmma::store_matrix_sync(acc_base + d0 + n * 16, acc[n], unsigned(Dx), wmma::mem_row_major);
        }
      }

      // dQ += dS K: warps take 16-query blocks; float32 atomics into dq_acc.
      float* stage = sSt + warp * 16 * kDC;  // S^T is dead by now (the passes above synced)
      for (int qb = warp; qb < kBMQ / 16; qb += W) {
        for (int64_t d0 = 0; d0 < Dp; d0 += kDC) {
          const int dc = int(min(int64_t(kDC), Dp - d0));
          FragC<T> acc[kDC / 16];
          _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16) wmma::fill_fragment(acc[n], 0.0f);
          for (int kk = 0; kk < BN; kk += KM) {
            Frag<T, EXACT, wmma::matrix_a, wmma::col_major> fa;
            fa.load(sDSt + kk * L.ldp + qb * 16, L.ldp);
            _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16) {
              Frag<T, EXACT, wmma::matrix_b, wmma::row_major> fb;
              fb.load(sK + kk * L.ldk + d0 + n * 16, L.ldk);
              mma(acc[n], fa, fb);
            }
          }
          _Pragma("unroll") for (int n = 0; n < kDC / 16; ++n) if (n < dc / 16)
            wmma::store_matrix_sync(stage + n * 16, acc[n], kDC, wmma::mem_row_major);
          __syncwarp();
          for (int idx = lane; idx < 16 * dc; idx += 32) {
            const int rr = idx / dc, cc = idx % dc;
            const int64_t i = q0 + qb * 16 + rr, d = d0 + cc;
            if (i < Sq && d < D) atomicAdd(dq_acc + ((b * Sq + i) * Hq + h) * Dp + d, stage[rr * kDC + cc]);
          }
          __syncwarp();
        }
      }
    }
  }
  __syncthreads();
  T* dk = static_cast<T*>(c.a.dk) + b * c.a.sdk.b + k0 * c.a.sdk.s + hk * c.a.sdk.h;
  T* dv = static_cast<T*>(c.a.dv) + b * c.a.sdv.b + k0 * c.a.sdv.s + hk * c.a.sdv.h;
  for (int64_t idx = threadIdx.x; idx < keys * D; idx += blockDim.x) {
    const int64_t r = idx / D, col = idx % D;
    dk[r * c.a.sdk.s + col] = from_f<T>(p.scale * sdK[r * Dp + col]);
  }
  for (int64_t idx = threadIdx.x; idx < keys * Dv; idx += blockDim.x) {
    const int64_t r = idx / Dv, col = idx % Dv;
    dv[r * c.a.sdv.s + col] = from_f<T>(sdV[r * Dvp + col]);
  }
}

template <class T>
__global__ void dq_kernel(const Call c, const float* dq_acc) {
  const AttnParams& p = c.p;
  const int64_t n = p.batch * p.seqlen_q * p.heads_q * p.head_dim_qk;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = idx % p.head_dim_qk, row = idx / p.head_dim_qk;  // row = (b, i, h)
    const int64_t h = row % p.heads_q, i = (row / p.heads_q) % p.seqlen_q;
    const int64_t b = row / (p.heads_q * p.seqlen_q);
    static_cast<T*>(c.a.dq)[b * c.a.sdq.b + i * c.a.sdq.s + h * c.a.sdq.h + d] =
        from_f<T>(p.scale * dq_acc[row * c.Dp + d]);
  }
}

template <class T>
__global__ void convert_kernel(const float* src, T* dst, int64_t n) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x)
    dst[idx] = from_f<T>(src[idx]);
}

// A float32 input [B, S, H, D] (strided view) rounded to TF32 (cvt.rna) into dst, [B, S, H,
// D] contiguous: the TF32 kernels' operands rounded once a call (their RAW operands,
// mma.cuh), not at each tile a block loads. A warp a row.
__global__ void round_tf32_kernel(const float* src, ViewStrides st, int64_t S, int64_t H, int64_t D, int64_t rows,
                                  float* dst) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; row < rows; row += warps) {
    const int64_t h = row % H, s = (row / H) % S, b = row / (H * S);
    const float* in = src + b * st.b + s * st.s + h * st.h;
    float* out = dst + row * D;
    for (int64_t d = lane; d < D; d += 32) out[d] = __uint_as_float(mma::to_tf32(in[d]));
  }
}

// ---- host side ------------------------------------------------------------------------

int fwd_warps(const AttnParams& p) { return flash::fwd_warps(p.head_dim_v); }
int bwd_warps(const AttnParams& p) { return flash::bwd_warps(p.head_dim_qk, p.head_dim_v); }
int64_t rounded(int64_t d) { return round16(d); }

// Workspace regions, in order, 256-byte aligned.
struct Plan {
  size_t rows = 0, fwd_tiles = 0, bwd_tiles = 0, segs = 0, tile_max = 0, delta = 0, dq = 0,
         dbias = 0, program = 0, q32 = 0, k32 = 0, v32 = 0, do32 = 0, total = 0;
  Plan(const AttnParams& p, bool backward, bool score_mod) {
    Regions r;
    const int64_t B = p.batch, Sq = p.seqlen_q;
    const int64_t bm = std::min<int64_t>(16 * fwd_warps(p), kMmaBM);  // the smaller tile: more tiles
    rows = r.add(size_t(B * Sq) * sizeof(RowInfo));
    segs = r.add(size_t(B * p.max_segments) * sizeof(Segment));
    if (!backward) {
      fwd_tiles = r.add(size_t(B * ceil_div(Sq, bm)) * sizeof(TileRange));
      tile_max = r.add(size_t(B * p.heads_q * ceil_div(Sq, bm)) * 4);
    } else {
      bwd_tiles = r.add(size_t(B * ceil_div(Sq, kBMQ)) * sizeof(TileRange));
      delta = r.add(size_t(B * p.heads_q * Sq) * 4);
      dq = r.add(size_t(B * Sq * p.heads_q * rounded(p.head_dim_qk)) * 4);
      if (p.bias_type != FA_NO_BIAS && p.dtype != FA_FLOAT32)
        dbias = r.add(size_t(p.num_slices * p.bias_batch * p.bias_heads * Sq * p.seqlen_kv) * 4);
    }
    if (score_mod) program = r.add(sizeof(DeviceScoreMod));
    if (p.dtype == FA_FLOAT32) {  // the inputs rounded to TF32 (a TF32 call: round_inputs_tf32)
      const int64_t Skv = p.seqlen_kv;
      q32 = r.add(size_t(B * Sq * p.heads_q * p.head_dim_qk) * 4);
      k32 = r.add(size_t(B * Skv * p.heads_kv * p.head_dim_qk) * 4);
      v32 = r.add(size_t(B * Skv * p.heads_kv * p.head_dim_v) * 4);
      if (backward) do32 = r.add(size_t(B * Sq * p.heads_q * p.head_dim_v) * 4);
    }
    total = r.total;
  }
};

// The score_mod program into the workspace (a kernel parameter: captured with the launch).
__global__ void store_program_kernel(const __grid_constant__ DeviceScoreMod sm, DeviceScoreMod* dst) {
  const uint32_t* src = reinterpret_cast<const uint32_t*>(&sm);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (size_t i = threadIdx.x; i < sizeof(DeviceScoreMod) / 4; i += blockDim.x) out[i] = src[i];
}
static_assert(sizeof(DeviceScoreMod) % 4 == 0, "copied in words");

Call make_call(const AttnParams& p, const AttnTensors& a, void* ws, const Plan& plan,
               bool backward, const ScoreModArgs& sm, bool drop_broadcast) {
  Call c;
  c.p = p;
  c.a = a;
  SeqArgs seq{a.q_seqlens, a.kv_seqlens, a.q_offsets, a.kv_offsets};
  if (a.index_base && a.index_cols > 2) seq.block = a.index_base, seq.block_cols = a.index_cols;
  c.mask = attn_mask(p, seq);
  c.Dp = rounded(p.head_dim_qk);
  c.Dvp = rounded(p.head_dim_v);
  c.bs = slice_batch(p);
  c.bmul = p.bias_type == FA_PRE_SCALE_BIAS ? p.scale : 1.0f;
  c.threshold = dropout_threshold(p.dropout);
  c.inv_keep = 1.0f / (1.0f - p.dropout);
  c.drop_broadcast = drop_broadcast;
  char* w = static_cast<char*>(ws);
  c.rows = reinterpret_cast<RowInfo*>(w + plan.rows);
  c.tiles = reinterpret_cast<TileRange*>(w + (backward ? plan.bwd_tiles : plan.fwd_tiles));
  if (p.bias_type == FA_NO_BIAS) c.a.bias = nullptr;
  if (sm.program) {
    c.sm = reinterpret_cast<const DeviceScoreMod*>(w + plan.program);
    c.sm_ops = sm.operands;
    c.sm_dops = backward ? sm.doperands : nullptr;
    c.sm_local_ops = a.index_base && a.index_cols > 2 && !is_thd(p.layout);
  }
  return c;
}

// The program into the workspace and the operands' gradients zeroed (a score_mod call).
Status prepare_score_mod(const Call& c, const ScoreModArgs& sm, cudaStream_t stream) {
  if (!sm.program) return Status::Ok();
  store_program_kernel<<<1, 256, 0, stream>>>(*sm.program, const_cast<DeviceScoreMod*>(c.sm));
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (c.sm_dops && sm.program->total > 0)
    FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.sm_dops, 0, size_t(c.p.num_slices * sm.program->total) * 4, stream));
  return Status::Ok();
}

// A TF32 call's q, k, v (and dout in the backward) rounded once into the workspace; c then
// reads them there ([B, S, H, D] contiguous). Numerically the same as rounding each
// fragment (cvt.rna of a TF32 value is itself): the kernels take them as they are.
Status round_inputs_tf32(Call* c, const Plan& plan, void* ws, bool backward, cudaStream_t stream) {
  const AttnParams& p = c->p;
  char* w = static_cast<char*>(ws);
  auto round = [&](const void*& ptr, ViewStrides& st, size_t at, int64_t S, int64_t H, int64_t D) {
    float* dst = reinterpret_cast<float*>(w + at);
    const int64_t rows = p.batch * S * H;
    if (rows == 0 || D == 0) return;
    round_tf32_kernel<<<unsigned(std::min<int64_t>(ceil_div(rows, 8), 1 << 16)), 256, 0, stream>>>(
        static_cast<const float*>(ptr), st, S, H, D, rows, dst);
    ptr = dst;
    st = ViewStrides{S * H * D, H * D, D};
  };
  round(c->a.q, c->a.sq, plan.q32, p.seqlen_q, p.heads_q, p.head_dim_qk);
  round(c->a.k, c->a.sk, plan.k32, p.seqlen_kv, p.heads_kv, p.head_dim_qk);
  round(c->a.v, c->a.sv, plan.v32, p.seqlen_kv, p.heads_kv, p.head_dim_v);
  if (backward) round(c->a.dout, c->a.sdo, plan.do32, p.seqlen_q, p.heads_q, p.head_dim_v);
  return cuda_status(cudaGetLastError(), "the TF32 rounding of the inputs");
}

Status build_tables(const Call& c, const Plan& plan, void* ws, int tile, cudaStream_t stream) {
  const AttnParams& p = c.p;
  const int64_t B = p.batch, Sq = p.seqlen_q;
  char* w = static_cast<char*>(ws);
  Segment* segs = reinterpret_cast<Segment*>(w + plan.segs);
  FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(c.rows, 0xff, size_t(B * Sq) * sizeof(RowInfo), stream));
  segments_kernel<<<unsigned(ceil_div(B, 128)), 128, 0, stream>>>(c.mask, B, segs);
  const int64_t n_seg = B * p.max_segments;
  rows_kernel<<<unsigned(std::min<int64_t>(n_seg, 1 << 20)), 128, 0, stream>>>(c.mask, B, Sq, p.seqlen_kv,
                                                                                segs, c.rows);
  const int64_t n_t = B * ceil_div(Sq, tile);
  tiles_kernel<<<unsigned(ceil_div(n_t, 128)), 128, 0, stream>>>(c.rows, B, Sq, p.seqlen_kv, tile, c.tiles);
  return cuda_status(cudaGetLastError(), "the kept-key table kernels");
}

template <class K, class... R>
Status launch(K kernel, int64_t blocks, int threads, size_t smem, cudaStream_t stream,
              const char* what, const Call& c, R... rest) {
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<unsigned(blocks), threads, smem, stream>>>(c, rest...);
  return cuda_status(cudaGetLastError(), what);
}

// mma: flash_mma.cu's register-resident forward serves the call (mma_fwd_fits).
template <class T, bool EXACT>
Status run_fwd(const Call& c, bool mma, float* tile_max, cudaStream_t stream) {
  const AttnParams& p = c.p;
  const int W = fwd_warps(p);
  if (mma) return mma_fwd<T, EXACT>(c, tile_max, stream);
  const int64_t blocks = p.batch * p.heads_q * ceil_div(p.seqlen_q, 16 * W);
  const size_t smem = FwdLayout(W, c.Dp, c.Dvp, int(sizeof(T))).total;
  if (W == 4) return launch(fwd_kernel<T, 4, EXACT>, blocks, 128, smem, stream, "the flash forward", c, tile_max);
  return launch(fwd_kernel<T, 2, EXACT>, blocks, 64, smem, stream, "the flash forward", c, tile_max);
}

template <class T, bool EXACT>
Status run_bwd(const Call& c, const float* delta, float* dq, float* dbias, cudaStream_t stream) {
  const AttnParams& p = c.p;
  // flash_mma_bwd.cu's register-resident backward where it fits (its query tile is the
  // tables' tile, kBMQ).
  if (mma_bwd_fits(p, c.a)) return mma_bwd<T, EXACT>(c, delta, dq, dbias, stream);
  if (mma_wide_bwd_fits(p, c.a)) return mma_wide_bwd<T, EXACT>(c, delta, dq, dbias, stream);
  const int W = bwd_warps(p);
  const int64_t blocks = p.batch * p.heads_kv * ceil_div(p.seqlen_kv, 16 * W);
  const size_t smem = BwdLayout(W, c.Dp, c.Dvp, int(sizeof(T))).total;
  if (W == 2) return launch(bwd_kernel<T, 2, EXACT>, blocks, 64, smem, stream, "the flash backward", c, delta, dq, dbias);
  return launch(bwd_kernel<T, 1, EXACT>, blocks, 32, smem, stream, "the flash backward", c, delta, dq, dbias);
}

template <class F>
Status by_dtype(const AttnParams& p, bool tf32, F&& f) {
  switch (p.dtype) {
    case FA_BFLOAT16: return f(__nv_bfloat16{}, std::false_type{});
    case FA_FLOAT16: return f(__half{}, std::false_type{});
    case FA_FLOAT32:
      if (tf32) return f(float{}, std::false_type{});
      return f(float{}, std::true_type{});
  }
  return Status::Invalid("flash: unsupported dtype");
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>(ceil_div(n, 256), 1 << 16)); }

}  // namespace

size_t workspace_bytes(const AttnParams& p, bool backward, bool score_mod) {
  return Plan(p, backward, score_mod).total;
}

Status forward(const AttnParams& p, const AttnTensors& a, bool f32_tf32, void* workspace,
               cudaStream_t stream, const ScoreModArgs& sm, bool drop_broadcast) {
  const Plan plan(p, false, sm.program != nullptr);
  const Call c = make_call(p, a, workspace, plan, false, sm, drop_broadcast);
  // Query tile of the kernel that runs (the tables and the maxima are per tile).
  const bool mma = mma_fwd_fits(p, a);
  if (sm.program && !mma)
    return Status::Unimplemented("the CUDA flash forward runs a score_mod only on rows of whole 16-byte "
                                 "chunks (head dims and strides multiples of 16 bytes, aligned pointers)");
  FA_RETURN_IF_NOT_OK(prepare_score_mod(c, sm, stream));
  const int bm = mma ? kMmaBM : 16 * fwd_warps(p);
  FA_RETURN_IF_NOT_OK(build_tables(c, plan, workspace, bm, stream));
  float* tile_max = a.max_logit ? reinterpret_cast<float*>(static_cast<char*>(workspace) + plan.tile_max) : nullptr;
  Call cr = c;
  if (p.dtype == FA_FLOAT32 && f32_tf32) FA_RETURN_IF_NOT_OK(round_inputs_tf32(&cr, plan, workspace, false, stream));
  FA_RETURN_IF_NOT_OK(by_dtype(p, f32_tf32, [&](auto t, auto exact) {
    return run_fwd<decltype(t), decltype(exact)::value>(cr, mma, tile_max, stream);
  }));
  if (a.max_logit) {
    const int64_t BH = p.batch * p.heads_q;
    max_logit_kernel<<<unsigned(ceil_div(BH, 128)), 128, 0, stream>>>(tile_max, BH, ceil_div(p.seqlen_q, bm),
                                                                       a.max_logit);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return Status::Ok();
}

Status backward(const AttnParams& p, const AttnTensors& a, bool f32_tf32, void* workspace,
                cudaStream_t stream, const ScoreModArgs& sm, bool drop_broadcast) {
  const Plan plan(p, true, sm.program != nullptr);
  const Call c = make_call(p, a, workspace, plan, true, sm, drop_broadcast);
  if (sm.program && !mma_bwd_fits(p, a) && !mma_wide_bwd_fits(p, a))
    return Status::Unimplemented("the CUDA flash backward runs a score_mod only on rows of whole 16-byte "
                                 "chunks (head dims and strides multiples of 16 bytes, aligned pointers) "
                                 "and, above head dim 128, where the device has its shared memory (float32: "
                                 "219 KiB a block, sm_90)");
  FA_RETURN_IF_NOT_OK(prepare_score_mod(c, sm, stream));
  char* w = static_cast<char*>(workspace);
  float* delta = reinterpret_cast<float*>(w + plan.delta);
  float* dq = reinterpret_cast<float*>(w + plan.dq);
  const bool want_dbias = a.dbias && c.a.bias;
  const int64_t n_bias = p.num_slices * p.bias_batch * p.bias_heads * p.seqlen_q * p.seqlen_kv;
  float* dbias = !want_dbias ? nullptr
                 : p.dtype == FA_FLOAT32 ? static_cast<float*>(a.dbias)
                                         : reinterpret_cast<float*>(w + plan.dbias);
  FA_RETURN_IF_NOT_OK(build_tables(c, plan, workspace, kBMQ, stream));
  const int64_t B = p.batch, Sq = p.seqlen_q, Hq = p.heads_q;
  FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq, 0, size_t(B * Sq * Hq * c.Dp) * 4, stream));
  if (dbias) FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dbias, 0, size_t(n_bias) * 4, stream));
  if (a.dsoftmax_offset)
    FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.dsoftmax_offset, 0, size_t(B * Hq) * 4, stream));
  // delta from the float32 dout; the products from the TF32-rounded inputs (a TF32 call).
  Call cr = c;
  if (p.dtype == FA_FLOAT32 && f32_tf32) FA_RETURN_IF_NOT_OK(round_inputs_tf32(&cr, plan, workspace, true, stream));
  return by_dtype(p, f32_tf32, [&](auto t, auto exact) -> Status {
    using T = decltype(t);
    const int64_t rows = B * Hq * Sq;
    delta_kernel<T><<<unsigned(ceil_div(rows * 32, 256)), 256, 0, stream>>>(c, delta);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    FA_RETURN_IF_NOT_OK((run_bwd<T, decltype(exact)::value>(cr, delta, dq, dbias, stream)));
    dq_kernel<T><<<grid_for(B * Sq * Hq * p.head_dim_qk), 256, 0, stream>>>(c, dq);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (dbias && p.dtype != FA_FLOAT32) {
      convert_kernel<T><<<grid_for(n_bias), 256, 0, stream>>>(dbias, static_cast<T*>(a.dbias), n_bias);
      FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    return Status::Ok();
  });
}

}  // namespace fusedattn::cuda::flash
