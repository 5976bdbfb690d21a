// Backward small-seq CUDA kernels: q, dout [packs, Tq, Hq, D], k, v [packs, Tkv, Hkv, D],
//   probs P [packs, Tq, Hq, W] f32, stats [packs, Tq, Hq, 2] f32 -> dq [packs, Tq, Hq, D],
//   dk, dv [packs, Tkv, Hkv, D]. A work item is one (segment, kv head).
// With dP_j = dout . v_j, delta = sum_j P_j dP_j and dS_j = P_j (dP_j - delta):
//   dq = scale sum_j dS_j k_j,  dk_j = scale sum_rows dS_j q,  dv_j = sum_rows P_j dout,
// where "rows" are the (query row, q head) pairs of the segment that see key j. A kv row
// belongs to one segment, so its item owns dk/dv there: no atomics.
// Two kernels:
// - No GQA (group 1): teams of lanes, as in the forward (see "Backward in teams" below);
//   segments that broke the promise are left to the whole warp at the end (bwd_general).
// - GQA: a warp an item, a dq pass per (query row, q head), then a dk/dv pass that sums
//   over the group in registers (q, dout and V come back from L1).
// P comes from the forward where it holds every weight of the segment; where a segment
// broke the promise (more q rows or keys than P holds) the weights are recomputed from
// q, k and the saved log-sum-exp. delta is summed in float32 from the weights, not
// taken as dout . out: out is rounded to T, and in bf16/fp16 that rounding shows in dq
// (the dS_j no longer sum to 0). In the warp path, when a row's keys fit one chunk, delta
// comes from the chunk's registers; otherwise a first pass over V (row_delta) finds it,
// and keeps the dP_j in shared memory for the main pass, which then reads only K.
#pragma once

#include <type_traits>

#include "fusedattn/small_seq/cuda/fwd_kernel.cuh"

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

// dq of query row t, head h (keys [0, hi) of the segment kept). kUseProbs: the weights
// come from P, else from q, k and the log-sum-exp. kStashed (with P, for rows whose keys
// span several chunks): the delta pass keeps dP in shared memory and the main pass reads
// no V.
template <class T, int D, int kCs, bool kUseProbs, bool kStashed = false>
__device__ void bwd_row(const KernelArgs& a, int pack, int t, int h, const Rows& kv, int hi,
                        int lane) {
  constexpr bool use_probs = kUseProbs, stashed = kStashed;
  static_assert(!kStashed || kUseProbs, "dP is stashed only where P bounds the keys");
  using G = Geo<T, D>;
  constexpr int kLpr = G::kLpr, kRps = G::kRps, kE = G::kE;
  constexpr int kChunk = kCs * kRps;
  const int sub = lane / kLpr, pos = lane % kLpr;
  const int64_t kv0 = row_offset(pack, a.kvs.tokens, kv.begin, a.heads_kv, h / a.group, D);
  const T* kb = static_cast<const T*>(a.k) + kv0;
  const T* vb = static_cast<const T*>(a.v) + kv0;
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

  const int n = hi;  // key rows visited
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
      const float ds = p[c] * (dp[c] - delta);  // 0 for keys the row does not keep
      axpy<T, D>(dq, ds, kr[c]);
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

// A segment that broke the promise (more query rows or keys than P holds): the weights
// are recomputed from q, k and the log-sum-exp; correct, not fast (one key row per
// sub-group at a time).
template <class T, int D>
__device__ void bwd_general(const KernelArgs& a, int pack, int hk, const Rows& qr, const Rows& kv,
                            int lane) {
  const int hq0 = hk * a.group;
  for (int r = 0; r < qr.len; ++r)
    for (int h = hq0; h < hq0 + a.group; ++h)
      bwd_row<T, D, 1, false>(a, pack, qr.begin + r, h, kv, row_hi(a.mask, r, qr.len, kv.len),
                              lane);
  bwd_kv<T, D, 1, false>(a, pack, hk, qr, kv, lane);
}

// One work item of the GQA kernel: dq per (row, q head), then dk/dv over the group.
template <class T, int D, int kCs, int kCb>
__device__ void bwd_item(const KernelArgs& a, int pack, int hk, const Rows& qr, const Rows& kv,
                         int lane) {
  if (!fast_segment(qr.len, kv.len, a.width)) return bwd_general<T, D>(a, pack, hk, qr, kv, lane);
  constexpr int kChunk = kCs * Geo<T, D>::kRps;
  for (int r = 0; r < qr.len; ++r)
    for (int h = hk * a.group; h < (hk + 1) * a.group; ++h) {
      const int hi = row_hi(a.mask, r, qr.len, kv.len);
      if (hi <= kChunk) bwd_row<T, D, kCs, true>(a, pack, qr.begin + r, h, kv, hi, lane);
      else bwd_row<T, D, kCs, true, true>(a, pack, qr.begin + r, h, kv, hi, lane);
    }
  bwd_kv<T, D, kCb, true>(a, pack, hk, qr, kv, lane);
}

// Zeroes dq, dk and dv of the rows a segment owns but does not use.
template <class T, int D>
__device__ void bwd_zero_gaps(const KernelArgs& a, int pack, int hk, const Rows& qr,
                              const Rows& kv, int lane) {
  constexpr int kLpr = Geo<T, D>::kLpr, kRps = Geo<T, D>::kRps;
  const int sub = lane / kLpr, pos = lane % kLpr;
  for_gaps(qr, [&](int begin, int end) {
    for (int h = hk * a.group; h < (hk + 1) * a.group; ++h)
      zero_rows<T, D>(a.dq, pack, a.qs.tokens, a.heads_q, h, begin, end, sub, kRps, pos);
  });
  for_gaps(kv, [&](int begin, int end) {
    zero_rows<T, D>(a.dk, pack, a.kvs.tokens, a.heads_kv, hk, begin, end, sub, kRps, pos);
    zero_rows<T, D>(a.dv, pack, a.kvs.tokens, a.heads_kv, hk, begin, end, sub, kRps, pos);
  });
}

// Blocks per SM to reserve registers for, GQA kernel. Left to itself, ptxas spills to
// reach a high occupancy, and with a larger minimum it spills to fit; 1 lets it use what
// the code needs, except where a warp's chunk is small (one 16-byte vector per lane per
// row, at most 2 rows per sub-group): there 4 blocks (<= 128 registers).
template <class T, int D, int kCs>
constexpr int bwd_gqa_min_blocks() {
  return Geo<T, D>::kVpl != 1 || kCs > 2 ? 1 : 4;
}

template <class T, int D, int kCs, int kCb>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, (bwd_gqa_min_blocks<T, D, kCs>()))
    small_seq_bwd_gqa_kernel(const KernelArgs a) {
  const int lane = threadIdx.x & 31;
  for_each_unit(a, a.heads_kv, [&](int pack, int hk, const Rows& qr, const Rows& kv) {
    bwd_item<T, D, kCs, kCb>(a, pack, hk, qr, kv, lane);
    bwd_zero_gaps<T, D>(a, pack, hk, qr, kv, lane);
  });
}

// ---- Backward in teams ----------------------------------------------------------------
// Without GQA a segment's common case is one query row, so the backward can stream like
// the forward: teams of kLpr lanes, one (segment, head) each, a step being a chunk of kTs
// keys whose K, V and P slices (and, on the first step, q and dout) are copied into shared
// memory kBwdStages - 1 steps ahead. Streaming needs no second pass over the keys:
//   dq = scale (A - delta B),  A = sum_j P_j dP_j k_j,  B = sum_j P_j k_j
// both summed as the keys go by; dv_j = P_j dout is written at key j's step; dk_j =
// scale (P_j dP_j - P_j delta) q waits for delta, at the row's last step, which takes
// P_j and P_j dP_j of the earlier keys from shared memory (the team's stash) and those of
// its own chunk from registers. A segment without query row only zeroes its rows.
// Segments that broke the promise (several query rows, more keys than P holds) are left
// for the warp to retrace after its teams are done (bwd_general; correct, not fast).

constexpr int kBwdStages = 3;  // steps a team has in shared memory: 1 computed, 2 in flight

enum BwdKind : int32_t { kBwdPast = 0, kBwdRow, kBwdNoRow, kBwdDeferred };

struct BwdStep {
  Rows qr, kv;        // the segment's rows (its unused rows are zeroed on its first step)
  int32_t pack, h;    // pack and head (q head = kv head)
  int32_t hi;         // keys the query row keeps (the segment has kv.len)
  int32_t j0;         // first key of this chunk
  int32_t kind;       // BwdKind
};

// One warp's stage: [kSlots][32] vectors (q, dout, K rows, V rows: slot-major, lane-minor
// as in the forward), then [kTs][32] floats of P (lane-minor: each lane copies the weights
// of the chunk's keys for itself).
template <class T, int D, int kTs>
struct BwdLayout {
  static constexpr int kVpl = Geo<T, D>::kVpl;
  static constexpr int kSlots = kVpl * (2 + 2 * kTs);
  static constexpr int kStageVecs = kSlots * 32 + kTs * 8;
  static constexpr int kBlockBytes = kWarpsPerBlock * kBwdStages * kStageVecs * 16;
  __device__ static constexpr int q() { return 0; }
  __device__ static constexpr int dout() { return kVpl; }
  __device__ static constexpr int k(int c) { return kVpl * (2 + c); }
  __device__ static constexpr int v(int c) { return kVpl * (2 + kTs + c); }
  // P of key c of the chunk, for `lane`, in a warp's stage (uint4 or const uint4)
  template <class V>
  __device__ static auto p(V* stage, int c, int lane) {
    using F = std::conditional_t<std::is_const_v<V>, const float, float>;
    return reinterpret_cast<F*>(stage + kSlots * 32) + c * 32 + lane;
  }
};

// Walks a team's backward steps: its work items, then chunks of the query row's keys.
template <int kLpr, int kTs>
struct BwdWalker {
  ItemWalker<kLpr> it;
  BwdStep s;  // the next step

  __device__ BwdWalker(const KernelArgs& a, RawRows (*st)[2], int lane)
      : it(a, a.heads_kv, st, lane) {
    start_item();
  }

  __device__ void start_item() {
    s.j0 = 0;
    if (!it.valid) {
      s.kind = kBwdPast;
      return;
    }
    s.pack = it.pack;
    s.h = it.h;
    s.qr = it.qr;
    s.kv = it.kv;
    s.hi = row_hi(it.a.mask, 0, 1, it.kv.len);
    s.kind = !fast_segment(it.qr.len, it.kv.len, it.a.width) ? kBwdDeferred
             : it.qr.len == 0                                ? kBwdNoRow
                                                             : kBwdRow;
  }

  __device__ void advance() {
    if (s.kind == kBwdRow) {
      s.j0 += kTs;
      if (s.j0 < s.kv.len) return;
    }
    it.next();
    start_item();
  }
};

// Starts the copies of step s into the warp's `stage` (this lane's places in it) and closes
// the group (an empty one for other steps: every step is one group).
template <class T, int D, int kTs>
__device__ __forceinline__ void bwd_copy(const KernelArgs& a, const BwdStep& s, uint4* stage,
                                         int lane, int pos) {
  using L = BwdLayout<T, D, kTs>;
  if (s.kind == kBwdRow) {
    const int64_t qrow = row_offset(s.pack, a.qs.tokens, s.qr.begin, a.heads_q, s.h, 1);
    if (s.j0 == 0) {
      RowSlice<T, D>::copy_async(static_cast<const T*>(a.q) + qrow * D, pos,
                                 stage + 32 * L::q() + lane);
      RowSlice<T, D>::copy_async(static_cast<const T*>(a.dout) + qrow * D, pos,
                                 stage + 32 * L::dout() + lane);
    }
    const int64_t kv0 = row_offset(s.pack, a.kvs.tokens, s.kv.begin, a.heads_kv, s.h, D);
    const int kv_stride = a.heads_kv * D;
#pragma unroll
    for (int c = 0; c < kTs; ++c) {
      const int j = s.j0 + c;
      if (j < s.kv.len) {
        const int64_t off = kv0 + int64_t{j} * kv_stride;
        RowSlice<T, D>::copy_async(static_cast<const T*>(a.k) + off, pos,
                                   stage + 32 * L::k(c) + lane);
        RowSlice<T, D>::copy_async(static_cast<const T*>(a.v) + off, pos,
                                   stage + 32 * L::v(c) + lane);
      }
      if (j < s.hi)
        cp_async4(L::p(stage, c, lane), a.probs_in + qrow * a.width + j);
    }
  }
  cp_async_commit();
}

// What a team carries from step to step of a row (float32).
template <class T, int D>
struct BwdRowState {
  static constexpr int kE = Geo<T, D>::kE;
  float qf[kE], dof[kE], sa[kE], sb[kE], delta;  // sa, sb: A and B above
};

// One step (a chunk of keys) of a row, from the warp's stage; the row's last step writes
// dq and every dk. stash: the team's [2][kMaxWidth] floats (P_j, then P_j dP_j).
template <class T, int D, int kTs>
__device__ __forceinline__ void bwd_step(const KernelArgs& a, const BwdStep& d,
                                         const uint4* stage, float* stash,
                                         BwdRowState<T, D>& st, unsigned mask, int lane,
                                         int pos) {
  using G = Geo<T, D>;
  using L = BwdLayout<T, D, kTs>;
  constexpr int kLpr = G::kLpr, kE = G::kE;
  const int n = d.kv.len;
  const int64_t kv0 = row_offset(d.pack, a.kvs.tokens, d.kv.begin, a.heads_kv, d.h, D);
  const int kv_stride = a.heads_kv * D;
  T* dkb = static_cast<T*>(a.dk) + kv0;
  T* dvb = static_cast<T*>(a.dv) + kv0;
  RowSlice<T, D> x;
  if (d.j0 == 0) {
    x.load_shared(stage + 32 * L::q() + lane);
    x.to_float(st.qf);
    x.load_shared(stage + 32 * L::dout() + lane);
    x.to_float(st.dof);
    st.delta = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) st.sa[e] = st.sb[e] = 0.0f;
  }
  float p[kTs], pdp[kTs];
#pragma unroll
  for (int c = 0; c < kTs; ++c) {
    const int j = d.j0 + c;
    float part = 0.0f;
    if (j < n) {
      x.load_shared(stage + 32 * L::v(c) + lane);
      part = dot<T, D>(st.dof, x);
    }
    const float dp = row_sum<kLpr>(part, mask);
    p[c] = j < d.hi ? *L::p(stage, c, lane) : 0.0f;  // 0 for keys the row does not keep
    pdp[c] = p[c] * dp;
    st.delta += pdp[c];
    if (j < n) {
      x.load_shared(stage + 32 * L::k(c) + lane);
      axpy2<T, D>(st.sa, pdp[c], st.sb, p[c], x);
      store_row<T, D>(dvb + int64_t{j} * kv_stride, pos, st.dof, p[c]);
    }
  }
  if (d.j0 + kTs < n) {  // not the last step: keep P_j and P_j dP_j for dk
    if (pos == 0) {
#pragma unroll
      for (int c = 0; c < kTs; ++c) {
        stash[d.j0 + c] = p[c];  // j0 + c < n <= width <= kMaxWidth
        stash[kMaxWidth + d.j0 + c] = pdp[c];
      }
    }
    return;
  }
  const float delta = st.delta;
  float dq[kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) dq[e] = fmaf(-delta, st.sb[e], st.sa[e]);
  const int64_t qrow = row_offset(d.pack, a.qs.tokens, d.qr.begin, a.heads_q, d.h, 1);
  store_row<T, D>(static_cast<T*>(a.dq) + qrow * D, pos, dq, a.scale);
  for (int j = 0; j < d.j0; ++j)  // the earlier chunks' keys (stash written before the
    store_row<T, D>(dkb + int64_t{j} * kv_stride, pos, st.qf,  // loop's __syncwarp)
                    fmaf(-stash[j], delta, stash[kMaxWidth + j]) * a.scale);
#pragma unroll
  for (int c = 0; c < kTs; ++c) {
    const int j = d.j0 + c;
    if (j < n)
      store_row<T, D>(dkb + int64_t{j} * kv_stride, pos, st.qf,
                      fmaf(-p[c], delta, pdp[c]) * a.scale);
  }
}

// Zeroes a segment's unused rows of dq, dk and dv (one team), and with no query row also
// its dk and dv.
template <class T, int D>
__device__ void bwd_team_zero(const KernelArgs& a, const BwdStep& d, int pos) {
  for_gaps(d.qr, [&](int begin, int end) {
    zero_rows<T, D>(a.dq, d.pack, a.qs.tokens, a.heads_q, d.h, begin, end, 0, 1, pos);
  });
  auto kv_rows = [&](int begin, int end) {
    zero_rows<T, D>(a.dk, d.pack, a.kvs.tokens, a.heads_kv, d.h, begin, end, 0, 1, pos);
    zero_rows<T, D>(a.dv, d.pack, a.kvs.tokens, a.heads_kv, d.h, begin, end, 0, 1, pos);
  };
  for_gaps(d.kv, kv_rows);
  if (d.kind == kBwdNoRow) kv_rows(d.kv.begin, d.kv.begin + d.kv.len);
}

// Blocks per SM the team kernel is compiled for: as many as its shared memory allows
// (stages, plus about 10 KiB of its own), at most 4 (<= 128 registers a thread).
template <class T, int D, int kTs>
constexpr int bwd_team_min_blocks() {
  constexpr int by_smem = (220 * 1024) / (BwdLayout<T, D, kTs>::kBlockBytes + 10 * 1024);
  return by_smem < 1 ? 1 : (by_smem > 4 ? 4 : by_smem);
}

template <class T, int D, int kTs>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, (bwd_team_min_blocks<T, D, kTs>()))
    small_seq_bwd_team_kernel(const KernelArgs a) {
  using L = BwdLayout<T, D, kTs>;
  constexpr int kLpr = Geo<T, D>::kLpr, kTeams = 32 / kLpr;
  extern __shared__ uint4 bwd_smem[];  // [warps][kBwdStages][kStageVecs]
  __shared__ RawRows staged[kWarpsPerBlock][32][2];  // kLpr entries a team
  __shared__ BwdStep ring[kWarpsPerBlock][kTeams][kBwdStages + 1];
  __shared__ float stash[kWarpsPerBlock][kTeams][2 * kMaxWidth];
  __shared__ int deferred[kWarpsPerBlock];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, team = lane / kLpr;
  const int pos = lane % kLpr;
  const unsigned mask = team_mask<kLpr>(lane);
  uint4* stages = bwd_smem + warp * (kBwdStages * L::kStageVecs);
  BwdStep* steps = ring[warp][team];
  if (lane == 0) deferred[warp] = 0;
  __syncwarp();

  BwdWalker<kLpr, kTs> walk(a, staged[warp] + team * kLpr, lane);
  // As in the forward: step k's copies go to stage k % kBwdStages, its descriptor to
  // steps[k % (kBwdStages + 1)].
  auto issue = [&](int k) {
    if (pos == 0) steps[k % (kBwdStages + 1)] = walk.s;
    bwd_copy<T, D, kTs>(a, walk.s, stages + (k % kBwdStages) * L::kStageVecs, lane, pos);
    if (walk.s.kind != kBwdPast) walk.advance();
  };
#pragma unroll
  for (int k = 0; k < kBwdStages - 1; ++k) issue(k);

  BwdRowState<T, D> st;
  for (int k = 0;; ++k) {
    issue(k + kBwdStages - 1);
    __syncwarp(mask);
    const BwdStep d = steps[k % (kBwdStages + 1)];
    if (d.kind == kBwdPast) break;
    if (d.kind == kBwdDeferred) {
      if (pos == 0) deferred[warp] = 1;
      continue;
    }
    cp_async_wait<kBwdStages - 1>();  // step k's copies have landed
    if (d.j0 == 0) bwd_team_zero<T, D>(a, d, pos);
    if (d.kind == kBwdRow)
      bwd_step<T, D, kTs>(a, d, stages + (k % kBwdStages) * L::kStageVecs, stash[warp][team], st,
                          mask, lane, pos);
  }
  cp_async_wait<0>();  // nothing left in flight at exit (the last groups are empty)

  __syncwarp();  // the teams are done (and `deferred` is final)
  if (!deferred[warp]) return;
  const int first = (blockIdx.x * kWarpsPerBlock + warp) * kTeams;
  const int stride = gridDim.x * kWarpsPerBlock * kTeams;
  for (int t = 0; t < kTeams; ++t) {
    ItemWalker<32> w(a, a.heads_kv, staged[warp], lane, first + t, stride);
    while (w.valid) {
      if (!fast_segment(w.qr.len, w.kv.len, a.width)) {
        bwd_general<T, D>(a, w.pack, w.h, w.qr, w.kv, lane);
        bwd_zero_gaps<T, D>(a, w.pack, w.h, w.qr, w.kv, lane);
      }
      w.next();
    }
  }
}

}  // namespace fusedattn::small_seq::cuda
