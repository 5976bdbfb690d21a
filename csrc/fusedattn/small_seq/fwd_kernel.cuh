// Forward small-seq CUDA kernel. A warp works on one (segment, q head) at a time:
//   q [packs, Tq, Hq, D], k/v [packs, Tkv, Hkv, D] -> out [packs, Tq, Hq, D],
//   probs P [packs, Tq, Hq, W] f32 and stats [packs, Tq, Hq, 2] f32 (when save_aux).
// A segment normally has one query row, so a warp reads its q row once, streams the
// segment's K and V rows in chunks of kCs rows per sub-group (all loads of a chunk
// are issued before any is used, so many bytes are in flight), and keeps an online
// softmax across chunks in float32. Neighbouring warps take the neighbouring heads
// of the same segment: with GQA they read the same K/V rows, which L1 serves.
#pragma once

#include <math.h>

#include "kernel_args.h"
#include "warp_row.cuh"

namespace fusedattn::small_seq::cuda {

constexpr int kWarpsPerBlock = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Element offset of row (pack, t, h) in a [packs, tokens, heads, dim] tensor.
__device__ __forceinline__ int64_t row_offset(int pack, int tokens, int t, int heads, int h,
                                              int dim) {
  return ((int64_t{pack} * tokens + t) * heads + h) * dim;
}

// Calls fn(begin, end) for the rows a segment owns but does not use.
template <class F>
__device__ __forceinline__ void for_gaps(const Rows& r, F&& fn) {
  const int end_before = min(r.begin, r.own_end);
  if (r.own_begin < end_before) fn(r.own_begin, end_before);
  const int start_after = max(r.begin + r.len, r.own_begin);
  if (start_after < r.own_end) fn(start_after, r.own_end);
}

// Zeroes rows [begin, end) of head h of a [packs, tokens, heads, D] tensor (one row per sub-group).
template <class T, int D>
__device__ void zero_rows(void* base, int pack, int tokens, int heads, int h, int begin, int end,
                          int lane) {
  using G = Geo<T, D>;
  for (int t = begin + lane / G::kLpr; t < end; t += G::kRps)
    store_zero_row<T, D>(static_cast<T*>(base) + row_offset(pack, tokens, t, heads, h, D),
                         lane % G::kLpr);
}

// Runs body(pack, head, q rows, kv rows) for each of this warp's work items, a work
// item being one segment of a pack and one head (q head forward, kv head backward).
// The grid is sized to stay resident (launch.cuh), so warp w of W takes the items
// w, w + W, w + 2W, ...: neighbouring warps work on neighbouring heads of one segment
// at the same time. The segment entries of 32 items are loaded at once (one item per
// lane, staged in shared memory), so their latency is paid once per 32 items.
template <class Body>
__device__ __forceinline__ void for_each_unit(const KernelArgs& a, int heads, Body&& body) {
  __shared__ RawRows staged[kWarpsPerBlock][32][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  // validate() keeps units below 2^30, so u0 + 32 * warps cannot overflow.
  for (int u0 = blockIdx.x * kWarpsPerBlock + warp; u0 < a.units; u0 += 32 * warps) {
    const int mine = u0 + lane * warps;
    if (mine < a.units) {
      const int seg = mine / heads;
      const int s = seg % a.segments, pack = seg / a.segments;
      staged[warp][lane][0] = load_rows(a.qs, pack, a.segments, s);
      staged[warp][lane][1] = load_rows(a.kvs, pack, a.segments, s);
    }
    __syncwarp();
    const int count = min(32, (a.units - u0 + warps - 1) / warps);
#pragma unroll 1
    for (int i = 0; i < count; ++i) {
      const int u = u0 + i * warps;
      const int seg = u / heads;
      const int s = seg % a.segments, pack = seg / a.segments;
      body(pack, u % heads, clamp_rows(a.qs, staged[warp][i][0], a.segments, s),
           clamp_rows(a.kvs, staged[warp][i][1], a.segments, s));
    }
    __syncwarp();  // every lane is done with the staged entries before they are replaced
  }
}

// Blocks per SM to reserve registers for. Left to itself, ptxas spills to reach a
// high occupancy, and with a larger minimum it spills to fit; 1 lets it use what the
// code needs, except where a warp's chunk is small (one 16-byte vector per lane per row,
// at most 2 rows per sub-group): there a warp has little in flight, so more warps must
// be resident: 6 blocks (24 warps, <= 85 registers) for the one-row forward, 5 (<= 102)
// elsewhere, 4 for the backward where that still spills (float32, sm_80, 2-byte D 256). All without
// spills (ptxas -v, sm_80 and sm_90a).
template <class T, int D, int kCs, bool kBackward>
constexpr int min_blocks() {
  if (Geo<T, D>::kVpl != 1 || kCs > 2) return 1;
  if (!kBackward) return kCs == 1 ? 6 : 5;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 4;  // sm_80's backward code needs a few more registers
#else
  return sizeof(T) == 4 || D == 256 ? 4 : 5;  // 2-byte D 256: its stashed dP path spills at 5
#endif
}

// One query row t of head h against the keys [kv.begin, kv.begin + n) of its kv head.
template <class T, int D, int kCs>
__device__ void fwd_row(const KernelArgs& a, int pack, int t, int h, const Rows& kv, int n,
                        int lane) {
  using G = Geo<T, D>;
  constexpr int kLpr = G::kLpr, kRps = G::kRps, kE = G::kE;
  constexpr int kChunk = kCs * kRps;  // key rows per chunk
  const int sub = lane / kLpr, pos = lane % kLpr;
  const int64_t kv0 = row_offset(pack, a.kvs.tokens, kv.begin, a.heads_kv, h / a.group, D);
  const T* kb = static_cast<const T*>(a.k) + kv0;
  const T* vb = static_cast<const T*>(a.v) + kv0;
  const int kv_stride = a.heads_kv * D;  // elements from one key row to the next
  const int64_t qrow = row_offset(pack, a.qs.tokens, t, a.heads_q, h, 1);

  // Scores in log2 units: exp2 is one instruction.
  float qf[kE];
  load_row<T, D>(static_cast<const T*>(a.q) + qrow * D, pos, qf, a.scale * kLog2e);
  float* prow = a.save_aux ? a.probs + qrow * a.width : nullptr;
  float m = -INFINITY, l = 0.0f, acc[kE], sc[kCs];
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = 0.0f;
#pragma unroll
  for (int c = 0; c < kCs; ++c) sc[c] = -INFINITY;

  for (int j0 = 0; j0 < n; j0 += kChunk) {
    RowSlice<T, D> kr[kCs], vr[kCs];
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = j0 + c * kRps + sub;
      if (j < n) {
        kr[c].load(kb + int64_t{j} * kv_stride, pos);
        vr[c].load(vb + int64_t{j} * kv_stride, pos);
      }
    }
    float chunk_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = j0 + c * kRps + sub;
      const float s = row_sum<kLpr>(j < n ? dot<T, D>(qf, kr[c]) : 0.0f);
      sc[c] = j < n ? s : -INFINITY;
      chunk_max = fmaxf(chunk_max, sc[c]);
    }
    // Finite: row j0 < n is in this chunk.
    const float m_new = fmaxf(m, across_rows_max<kLpr>(chunk_max));
    const float alpha = exp2f(m - m_new);  // 0 on the first chunk (m = -inf)
    float chunk_sum = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[e] *= alpha;
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = j0 + c * kRps + sub;
      const float p = j < n ? exp2f(sc[c] - m_new) : 0.0f;
      if (j < n) axpy<T, D>(acc, p, vr[c]);
      chunk_sum += p;
    }
    l = l * alpha + across_rows_sum<kLpr>(chunk_sum);
    m = m_new;
    // Scores of all but the last chunk wait in P (raw) until the final max and sum
    // are known; the lane that parks a score is the lane that reads it back.
    if (prow && j0 + kChunk < n) {
#pragma unroll
      for (int c = 0; c < kCs; ++c) {
        const int j = j0 + c * kRps + sub;
        if (pos == 0 && j < a.width) prow[j] = sc[c];
      }
    }
  }

#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = across_rows_sum<kLpr>(acc[e]);
  const float inv = n > 0 ? 1.0f / l : 0.0f;
  if (sub == 0) store_row<T, D>(static_cast<T*>(a.out) + qrow * D, pos, acc, inv);
  if (!prow) return;

  const int last0 = n > 0 ? (n - 1) / kChunk * kChunk : 0;  // first row of the last chunk
  if (pos == 0) {
    for (int j = sub; j < last0 && j < a.width; j += kRps) prow[j] = exp2f(prow[j] - m) * inv;
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = last0 + c * kRps + sub;
      if (j < a.width) prow[j] = j < n ? exp2f(sc[c] - m) * inv : 0.0f;
    }
  }
  for (int j = last0 + kChunk + lane; j < a.width; j += 32) prow[j] = 0.0f;
  if (lane == 0) {
    a.stats[qrow * 2] = n > 0 ? m * kLn2 : -INFINITY;
    a.stats[qrow * 2 + 1] = n > 0 ? (m + log2f(l)) * kLn2 : -INFINITY;
  }
}

template <class T, int D, int kCs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, (min_blocks<T, D, kCs, false>()))
    small_seq_fwd_kernel(const KernelArgs a) {
  const int lane = threadIdx.x & 31;
  for_each_unit(a, a.heads_q, [&](int pack, int h, const Rows& qr, const Rows& kv) {
    for (int r = 0; r < qr.len; ++r)
      fwd_row<T, D, kCs>(a, pack, qr.begin + r, h, kv, row_hi(a.mask, r, qr.len, kv.len), lane);

    for_gaps(qr, [&](int begin, int end) {
      zero_rows<T, D>(a.out, pack, a.qs.tokens, a.heads_q, h, begin, end, lane);
      if (!a.save_aux) return;
      for (int t = begin; t < end; ++t) {
        const int64_t row = row_offset(pack, a.qs.tokens, t, a.heads_q, h, 1);
        for (int j = lane; j < a.width; j += 32) a.probs[row * a.width + j] = 0.0f;
        if (lane < 2) a.stats[row * 2 + lane] = -INFINITY;
      }
    });
  });
}

}  // namespace fusedattn::small_seq::cuda
