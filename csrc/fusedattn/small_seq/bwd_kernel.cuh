// Backward small-seq CUDA kernel. A warp works on one (segment, kv head) at a time:
//   q, dout [packs, Tq, Hq, D], k, v [packs, Tkv, Hkv, D], probs P [packs, Tq, Hq, W] f32,
//   stats [packs, Tq, Hq, 2] f32 -> dq [packs, Tq, Hq, D], dk, dv [packs, Tkv, Hkv, D].
// With dP_j = dout . v_j, delta = sum_j P_j dP_j and dS_j = P_j (dP_j - delta):
//   dq = scale sum_j dS_j k_j,  dk_j = scale sum_rows dS_j q,  dv_j = sum_rows P_j dout,
// where "rows" are the (query row, q head) pairs of the segment that see key j. A kv row
// belongs to one segment, so its warp owns dk/dv there: no atomics.
// One query and no GQA (the common case): one pass over the keys writes dq, dk and dv.
// Otherwise a dq pass per (query row, q head), then a dk/dv pass that sums over the
// group in registers (q, dout and V come back from L1).
// P comes from the forward where it holds every weight of the segment; where a segment
// broke the promise (more q rows or keys than P holds) the weights are recomputed from
// q, k and the saved log-sum-exp. delta is summed in float32 from the weights, not
// taken as dout . out: out is rounded to T, and in bf16/fp16 that rounding shows in dq
// (the dS_j no longer sum to 0). When a row's keys fit one chunk, delta comes from the
// chunk's registers; otherwise a first pass over V (row_delta) finds it, and keeps the
// dP_j in shared memory for the main pass, which then reads only K: V is read once.
#pragma once

#include "fwd_kernel.cuh"

namespace fusedattn::small_seq::cuda {

// delta = sum_j P_j dP_j over the keys [0, hi) of one (query row, head), as a pass of
// its own over V (and K when the weights are recomputed). Every lane gets it. With
// dp_out (a warp's kMaxWidth floats of shared memory), dP_j goes to dp_out[j] too.
template <class T, int D, bool kUseProbs>
__device__ float row_delta(const T* kb, const T* vb, int kv_stride, int hi, const float* prow,
                           const float (&qf)[Geo<T, D>::kE], const float (&dof)[Geo<T, D>::kE],
                           float s2, float lse2, int lane, float* dp_out = nullptr) {
  using G = Geo<T, D>;
  constexpr int kLpr = G::kLpr, kRps = G::kRps;
  const int sub = lane / kLpr, pos = lane % kLpr;
  float acc = 0.0f;
  for (int j0 = 0; j0 < hi; j0 += kRps) {  // warp-uniform: every lane joins the sums
    const int j = j0 + sub;
    RowSlice<T, D> vr, kr;
    if (j < hi) vr.load(vb + int64_t{j} * kv_stride, pos);
    else vr.zero();
    float p;
    if constexpr (kUseProbs) {
      p = j < hi ? __ldg(prow + j) : 0.0f;
    } else {
      if (j < hi) kr.load(kb + int64_t{j} * kv_stride, pos);
      else kr.zero();
      const float s = row_sum<kLpr>(dot<T, D>(qf, kr));
      p = j < hi ? exp2f(s * s2 - lse2) : 0.0f;
    }
    const float dp = row_sum<kLpr>(dot<T, D>(dof, vr));
    if (dp_out && pos == 0 && j < hi) dp_out[j] = dp;
    acc += p * dp;
  }
  return across_rows_sum<kLpr>(acc);
}

// dq of query row t, head h (keys [0, hi) of the segment kept). With kWriteKv (the
// segment's only (row, head) pair), also dk and dv of every key row of the segment.
// kUseProbs: the weights come from P, else from q, k and the log-sum-exp. kStashed
// (with P, for rows whose keys span several chunks): the delta pass keeps dP in shared
// memory and the main pass reads no V. A code path of its own: mixed with the other
// it spills (ptxas, the 5-block budget of bwd_min_blocks).
template <class T, int D, int kCs, bool kUseProbs, bool kWriteKv, bool kStashed = false>
__device__ void bwd_row(const KernelArgs& a, int pack, int t, int h, const Rows& kv, int hi,
                        int lane) {
  constexpr bool use_probs = kUseProbs, write_kv = kWriteKv, stashed = kStashed;
  static_assert(!kStashed || kUseProbs, "dP is stashed only where P bounds the keys");
  using G = Geo<T, D>;
  constexpr int kLpr = G::kLpr, kRps = G::kRps, kE = G::kE;
  constexpr int kChunk = kCs * kRps;
  const int sub = lane / kLpr, pos = lane % kLpr;
  const int64_t kv0 = row_offset(pack, a.kvs.tokens, kv.begin, a.heads_kv, h / a.group, D);
  const T* kb = static_cast<const T*>(a.k) + kv0;
  const T* vb = static_cast<const T*>(a.v) + kv0;
  T* dkb = static_cast<T*>(a.dk) + kv0;
  T* dvb = static_cast<T*>(a.dv) + kv0;
  const int kv_stride = a.heads_kv * D;
  const int64_t qrow = row_offset(pack, a.qs.tokens, t, a.heads_q, h, 1);

  float qf[kE], dof[kE];
  load_row<T, D>(static_cast<const T*>(a.q) + qrow * D, pos, qf);
  load_row<T, D>(static_cast<const T*>(a.dout) + qrow * D, pos, dof);
  const float* prow = a.probs_in + qrow * a.width;
  const float s2 = a.scale * kLog2e;
  const float lse2 = use_probs || hi == 0 ? 0.0f : a.stats_in[qrow * 2 + 1] * kLog2e;
  float dq[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) dq[e] = 0.0f;

  const int n = write_kv ? kv.len : hi;  // key rows visited
  const bool one_chunk = !stashed && n <= kChunk;  // delta from the chunk's registers
  // (stashed: hi <= n <= width <= kMaxWidth)
  __shared__ float dp_stash[kWarpsPerBlock][kMaxWidth];
  float* stash = stashed ? dp_stash[threadIdx.x / 32] : nullptr;
  if (stashed) __syncwarp();  // the previous work item's reads of the stash are done
  float delta = one_chunk ? 0.0f
                          : row_delta<T, D, use_probs>(kb, vb, kv_stride, hi, prow, qf, dof, s2,
                                                       lse2, lane, stash);
  if (stashed) __syncwarp();  // the stash is written
  for (int j0 = 0; j0 < n; j0 += kChunk) {
    RowSlice<T, D> kr[kCs], vr[kCs];
    float p[kCs];
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = j0 + c * kRps + sub;
      if (j < n) {
        kr[c].load(kb + int64_t{j} * kv_stride, pos);
        if (!stashed) vr[c].load(vb + int64_t{j} * kv_stride, pos);
      } else {
        kr[c].zero();
        if (!stashed) vr[c].zero();
      }
      p[c] = use_probs && j < hi ? __ldg(prow + j) : 0.0f;
    }
    float dp[kCs];
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = j0 + c * kRps + sub;
      // (keys past hi: P = 0, so dS = 0 whatever dP is)
      if constexpr (stashed) dp[c] = j < hi ? stash[j] : 0.0f;
      else dp[c] = row_sum<kLpr>(dot<T, D>(dof, vr[c]));
      if constexpr (!use_probs) {
        const float s = row_sum<kLpr>(dot<T, D>(qf, kr[c]));
        p[c] = j < hi ? exp2f(s * s2 - lse2) : 0.0f;
      }
    }
    if (one_chunk) {
      float acc = 0.0f;
#pragma unroll
      for (int c = 0; c < kCs; ++c) acc += p[c] * dp[c];
      delta = across_rows_sum<kLpr>(acc);
    }
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = j0 + c * kRps + sub;
      const float ds = p[c] * (dp[c] - delta);  // 0 for keys the row does not keep
      axpy<T, D>(dq, ds, kr[c]);
      if constexpr (write_kv) {
        if (j < n) {
          store_row<T, D>(dkb + int64_t{j} * kv_stride, pos, qf, ds * a.scale);
          store_row<T, D>(dvb + int64_t{j} * kv_stride, pos, dof, p[c]);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) dq[e] = across_rows_sum<kLpr>(dq[e]);
  if (sub == 0) store_row<T, D>(static_cast<T*>(a.dq) + qrow * D, pos, dq, a.scale);
}

// dk, dv of every key row of the segment for kv head hk, summed over the segment's
// query rows and the q heads of the group.
template <class T, int D, int kCb, bool kUseProbs>
__device__ void bwd_kv(const KernelArgs& a, int pack, int hk, const Rows& qr, const Rows& kv,
                       int lane) {
  constexpr bool use_probs = kUseProbs;
  using G = Geo<T, D>;
  constexpr int kLpr = G::kLpr, kRps = G::kRps, kE = G::kE;
  constexpr int kChunk = kCb * kRps;
  const int sub = lane / kLpr, pos = lane % kLpr;
  const int64_t kv0 = row_offset(pack, a.kvs.tokens, kv.begin, a.heads_kv, hk, D);
  const T* kb = static_cast<const T*>(a.k) + kv0;
  const T* vb = static_cast<const T*>(a.v) + kv0;
  T* dkb = static_cast<T*>(a.dk) + kv0;
  T* dvb = static_cast<T*>(a.dv) + kv0;
  const int kv_stride = a.heads_kv * D;
  const float s2 = a.scale * kLog2e;

  for (int j0 = 0; j0 < kv.len; j0 += kChunk) {
    RowSlice<T, D> kr[kCb], vr[kCb];
    float dk[kCb][kE], dv[kCb][kE];
#pragma unroll
    for (int c = 0; c < kCb; ++c) {
      const int j = j0 + c * kRps + sub;
      if (j < kv.len) {
        kr[c].load(kb + int64_t{j} * kv_stride, pos);
        vr[c].load(vb + int64_t{j} * kv_stride, pos);
      } else {
        kr[c].zero();
        vr[c].zero();
      }
#pragma unroll
      for (int e = 0; e < kE; ++e) dk[c][e] = dv[c][e] = 0.0f;
    }
    for (int r = 0; r < qr.len; ++r) {
      const int hi = row_hi(a.mask, r, qr.len, kv.len);
      if (j0 >= hi) continue;  // the row keeps no key of this chunk
      for (int h = hk * a.group; h < (hk + 1) * a.group; ++h) {
        const int64_t qrow = row_offset(pack, a.qs.tokens, qr.begin + r, a.heads_q, h, 1);
        float qf[kE], dof[kE];
        load_row<T, D>(static_cast<const T*>(a.q) + qrow * D, pos, qf);
        load_row<T, D>(static_cast<const T*>(a.dout) + qrow * D, pos, dof);
        const float* prow = a.probs_in + qrow * a.width;
        const float lse2 = use_probs ? 0.0f : a.stats_in[qrow * 2 + 1] * kLog2e;
        const float delta =
            row_delta<T, D, use_probs>(kb, vb, kv_stride, hi, prow, qf, dof, s2, lse2, lane);
#pragma unroll
        for (int c = 0; c < kCb; ++c) {
          const int j = j0 + c * kRps + sub;
          const float dp = row_sum<kLpr>(dot<T, D>(dof, vr[c]));
          float p;
          if constexpr (use_probs) {
            p = j < hi ? __ldg(prow + j) : 0.0f;
          } else {
            const float s = row_sum<kLpr>(dot<T, D>(qf, kr[c]));
            p = j < hi ? exp2f(s * s2 - lse2) : 0.0f;
          }
          const float ds = p * (dp - delta);
#pragma unroll
          for (int e = 0; e < kE; ++e) {
            dk[c][e] = fmaf(ds, qf[e], dk[c][e]);
            dv[c][e] = fmaf(p, dof[e], dv[c][e]);
          }
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kCb; ++c) {
      const int j = j0 + c * kRps + sub;
      if (j < kv.len) {
        store_row<T, D>(dkb + int64_t{j} * kv_stride, pos, dk[c], a.scale);
        store_row<T, D>(dvb + int64_t{j} * kv_stride, pos, dv[c], 1.0f);
      }
    }
  }
}

// One work item the general way: loads from global memory as it goes.
template <class T, int D, int kCs, int kCb>
__device__ void bwd_item(const KernelArgs& a, int pack, int hk, const Rows& qr, const Rows& kv,
                         int lane) {
  const int hq0 = hk * a.group;
  const bool use_probs = fast_segment(qr.len, kv.len, a.width);
  constexpr int kChunk = kCs * Geo<T, D>::kRps;
  if (use_probs && qr.len == 1 && a.group == 1) {
    // The common case: one (row, head) pair writes dq, dk and dv in one pass.
    const int hi = row_hi(a.mask, 0, 1, kv.len);
    if (kv.len <= kChunk) bwd_row<T, D, kCs, true, true>(a, pack, qr.begin, hk, kv, hi, lane);
    else bwd_row<T, D, kCs, true, true, true>(a, pack, qr.begin, hk, kv, hi, lane);
  } else if (use_probs) {
    // GQA (or a segment without query): dq per (row, head), then dk/dv over the group.
    for (int r = 0; r < qr.len; ++r)
      for (int h = hq0; h < hq0 + a.group; ++h) {
        const int hi = row_hi(a.mask, r, qr.len, kv.len);
        if (hi <= kChunk) bwd_row<T, D, kCs, true, false>(a, pack, qr.begin + r, h, kv, hi, lane);
        else bwd_row<T, D, kCs, true, false, true>(a, pack, qr.begin + r, h, kv, hi, lane);
      }
    bwd_kv<T, D, kCb, true>(a, pack, hk, qr, kv, lane);
  } else {
    // A broken promise: correct, not fast (one key row per sub-group at a time).
    for (int r = 0; r < qr.len; ++r)
      for (int h = hq0; h < hq0 + a.group; ++h)
        bwd_row<T, D, 1, false, false>(a, pack, qr.begin + r, h, kv,
                                       row_hi(a.mask, r, qr.len, kv.len), lane);
    bwd_kv<T, D, 1, false>(a, pack, hk, qr, kv, lane);
  }
}

// Zeroes dq, dk and dv of the rows a segment owns but does not use.
template <class T, int D>
__device__ void bwd_zero_gaps(const KernelArgs& a, int pack, int hk, const Rows& qr,
                              const Rows& kv, int lane) {
  for_gaps(qr, [&](int begin, int end) {
    for (int h = hk * a.group; h < (hk + 1) * a.group; ++h)
      zero_rows<T, D>(a.dq, pack, a.qs.tokens, a.heads_q, h, begin, end, lane);
  });
  for_gaps(kv, [&](int begin, int end) {
    zero_rows<T, D>(a.dk, pack, a.kvs.tokens, a.heads_kv, hk, begin, end, lane);
    zero_rows<T, D>(a.dv, pack, a.kvs.tokens, a.heads_kv, hk, begin, end, lane);
  });
}

// ---- Pipelined backward ---------------------------------------------------------------
// Where a chunk's slices fit in a modest amount of shared memory, the warp copies the q,
// dout, P, K and V slices of its next work item into shared memory (cp.async) while it
// computes the current one, as the forward does (fwd_kernel.cuh), for the items of the
// common case: one query row, no GQA, every key within one chunk and P's width. Other
// items take bwd_item when their turn comes (nothing copied ahead).

constexpr int kBwdStages = 2;  // items a warp has in shared memory: 1 computed, 1 in flight

struct BwdStep {
  Rows qr, kv;
  int32_t pack, hk;
  int32_t fast;   // the common case: its slices are in shared memory
  int32_t valid;  // 0: past the warp's last item
};

// A warp's stage: [kSlots][32] vectors: q, dout, K rows, V rows, then P (4 of 16 bytes used).
template <class T, int D, int kCs>
struct BwdLayout {
  static constexpr int kVpl = Geo<T, D>::kVpl;
  static constexpr int kSlots = kVpl * (2 + 2 * kCs) + kCs;
  static constexpr int kStageVecs = kSlots * 32;
  static constexpr int kBlockBytes = kWarpsPerBlock * kBwdStages * kStageVecs * 16;
  static constexpr bool kPipelined = kBlockBytes <= 64 * 1024;
  __device__ static constexpr int q() { return 0; }
  __device__ static constexpr int dout() { return kVpl; }
  __device__ static constexpr int k(int c) { return kVpl * (2 + c); }
  __device__ static constexpr int v(int c) { return kVpl * (2 + kCs + c); }
  __device__ static constexpr int p(int c) { return kVpl * (2 + 2 * kCs) + c; }
};

// Starts the copies of a common-case item into `stage` (this lane's place) and closes the
// group (an empty one for the other items: every item is one group).
template <class T, int D, int kCs>
__device__ __forceinline__ void bwd_copy(const KernelArgs& a, const BwdStep& s, uint4* stage,
                                         int lane) {
  using G = Geo<T, D>;
  using L = BwdLayout<T, D, kCs>;
  const int sub = lane / G::kLpr, pos = lane % G::kLpr;
  if (s.fast) {
    const int n = s.kv.len, hi = row_hi(a.mask, 0, 1, n);
    const int64_t qrow = row_offset(s.pack, a.qs.tokens, s.qr.begin, a.heads_q, s.hk, 1);
    RowSlice<T, D>::copy_async(static_cast<const T*>(a.q) + qrow * D, pos, stage + 32 * L::q());
    RowSlice<T, D>::copy_async(static_cast<const T*>(a.dout) + qrow * D, pos,
                               stage + 32 * L::dout());
    const int64_t kv0 = row_offset(s.pack, a.kvs.tokens, s.kv.begin, a.heads_kv, s.hk, D);
    const int kv_stride = a.heads_kv * D;
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = c * G::kRps + sub;
      if (j < n) {
        const int64_t off = kv0 + int64_t{j} * kv_stride;
        RowSlice<T, D>::copy_async(static_cast<const T*>(a.k) + off, pos, stage + 32 * L::k(c));
        RowSlice<T, D>::copy_async(static_cast<const T*>(a.v) + off, pos, stage + 32 * L::v(c));
      }
      if (j < hi) cp_async4(stage + 32 * L::p(c), a.probs_in + qrow * a.width + j);
    }
  }
  cp_async_commit();
}

// The common case from shared memory: bwd_row's one-chunk path (dq, dk, dv in one pass).
template <class T, int D, int kCs>
__device__ __forceinline__ void bwd_fast(const KernelArgs& a, const BwdStep& d,
                                         const uint4* stage, int lane) {
  using G = Geo<T, D>;
  using L = BwdLayout<T, D, kCs>;
  constexpr int kLpr = G::kLpr, kRps = G::kRps, kE = G::kE;
  const int sub = lane / kLpr, pos = lane % kLpr;
  const int n = d.kv.len, hi = row_hi(a.mask, 0, 1, n);
  const int64_t kv0 = row_offset(d.pack, a.kvs.tokens, d.kv.begin, a.heads_kv, d.hk, D);
  T* dkb = static_cast<T*>(a.dk) + kv0;
  T* dvb = static_cast<T*>(a.dv) + kv0;
  const int kv_stride = a.heads_kv * D;
  const int64_t qrow = row_offset(d.pack, a.qs.tokens, d.qr.begin, a.heads_q, d.hk, 1);

  float qf[kE], dof[kE], dq[kE], p[kCs], dp[kCs];
  RowSlice<T, D> x;
  x.load_shared(stage + 32 * L::q());
  x.to_float(qf);
  x.load_shared(stage + 32 * L::dout());
  x.to_float(dof);
  float acc = 0.0f;
#pragma unroll
  for (int c = 0; c < kCs; ++c) {
    const int j = c * kRps + sub;
    float part = 0.0f;
    if (j < n) {
      x.load_shared(stage + 32 * L::v(c));
      part = dot<T, D>(dof, x);
    }
    dp[c] = row_sum<kLpr>(part);
    p[c] = j < hi ? reinterpret_cast<const float*>(stage + 32 * L::p(c))[0] : 0.0f;
    acc += p[c] * dp[c];
  }
  const float delta = across_rows_sum<kLpr>(acc);
#pragma unroll
  for (int e = 0; e < kE; ++e) dq[e] = 0.0f;
#pragma unroll
  for (int c = 0; c < kCs; ++c) {
    const int j = c * kRps + sub;
    if (j < n) {
      const float ds = p[c] * (dp[c] - delta);  // 0 for keys the row does not keep
      x.load_shared(stage + 32 * L::k(c));
      axpy<T, D>(dq, ds, x);
      store_row<T, D>(dkb + int64_t{j} * kv_stride, pos, qf, ds * a.scale);
      store_row<T, D>(dvb + int64_t{j} * kv_stride, pos, dof, p[c]);
    }
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) dq[e] = across_rows_sum<kLpr>(dq[e]);
  if (sub == 0) store_row<T, D>(static_cast<T*>(a.dq) + qrow * D, pos, dq, a.scale);
}

template <class T, int D, int kCs, int kCb>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, (bwd_min_blocks<T, D, kCs>()))
    small_seq_bwd_kernel(const KernelArgs a) {
  using L = BwdLayout<T, D, kCs>;
  constexpr int kChunk = kCs * Geo<T, D>::kRps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  if constexpr (!L::kPipelined) {
    for_each_unit(a, a.heads_kv, [&](int pack, int hk, const Rows& qr, const Rows& kv) {
      bwd_item<T, D, kCs, kCb>(a, pack, hk, qr, kv, lane);
      bwd_zero_gaps<T, D>(a, pack, hk, qr, kv, lane);
    });
  } else {
    extern __shared__ uint4 bwd_smem[];  // [warps][kBwdStages][kSlots][32]
    __shared__ RawRows staged[kWarpsPerBlock][32][2];
    __shared__ BwdStep ring[kWarpsPerBlock][kBwdStages + 1];
    uint4* mine = bwd_smem + warp * (kBwdStages * L::kStageVecs) + lane;
    BwdStep* steps = ring[warp];
    ItemWalker<32> walk(a, a.heads_kv, staged[warp], lane);
    // As in the forward: item k's copies go to stage k % kBwdStages, its descriptor to
    // steps[k % (kBwdStages + 1)].
    auto issue = [&](int k) {
      BwdStep s;
      s.valid = walk.valid;
      s.pack = walk.pack;
      s.hk = walk.h;
      s.qr = walk.qr;
      s.kv = walk.kv;
      s.fast = walk.valid && a.group == 1 && walk.qr.len == 1 &&
               fast_segment(walk.qr.len, walk.kv.len, a.width) && walk.kv.len <= kChunk;
      if (lane == 0) steps[k % (kBwdStages + 1)] = s;
      bwd_copy<T, D, kCs>(a, s, mine + (k % kBwdStages) * L::kStageVecs, lane);
      if (walk.valid) walk.next();
    };
#pragma unroll
    for (int k = 0; k < kBwdStages - 1; ++k) issue(k);
    for (int k = 0;; ++k) {
      issue(k + kBwdStages - 1);
      __syncwarp();
      const BwdStep d = steps[k % (kBwdStages + 1)];
      if (!d.valid) break;
      cp_async_wait<kBwdStages - 1>();  // item k's copies have landed
      if (d.fast) bwd_fast<T, D, kCs>(a, d, mine + (k % kBwdStages) * L::kStageVecs, lane);
      else bwd_item<T, D, kCs, kCb>(a, d.pack, d.hk, d.qr, d.kv, lane);
      bwd_zero_gaps<T, D>(a, d.pack, d.hk, d.qr, d.kv, lane);
    }
    cp_async_wait<0>();
  }
}

}  // namespace fusedattn::small_seq::cuda
