// Forward small-seq CUDA kernel: q [packs, Tq, Hq, D], k/v [packs, Tkv, Hkv, D] ->
//   out [packs, Tq, Hq, D], probs P [packs, Tq, Hq, W] f32 and stats [packs, Tq, Hq, 2] f32
//   (when save_aux). A team of lanes (a warp or part of one, see "Forward" below) works on
// one (segment, q head) at a time: a segment normally has one query row, so the team reads
// its q row once, streams the segment's K and V rows in chunks through shared memory
// (copied a few steps ahead), and keeps an online softmax across chunks in float32.
// Neighbouring teams take the neighbouring heads of the same segment: with GQA they read
// the same K/V rows, which L2 serves (the copies pass L1 by, see cp_async16).
// The helpers above "Forward" (work items, zeroing) and the walkers serve the backward too.
#pragma once

#include <math.h>

#include "fusedattn/small_seq/cuda/kernel_args.h"
#include "fusedattn/small_seq/cuda/warp_row.cuh"

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

// Zeroes rows [begin, end) of head h of a [packs, tokens, heads, D] tensor: the kLpr lanes
// of row group `group` of `groups` zero the rows begin + group, begin + group + groups, ...
// (a warp: its kRps sub-groups; a team: one group).
template <class T, int D>
__device__ void zero_rows(void* base, int pack, int tokens, int heads, int h, int begin, int end,
                          int group, int groups, int pos) {
  for (int t = begin + group; t < end; t += groups)
    store_zero_row<T, D>(static_cast<T*>(base) + row_offset(pack, tokens, t, heads, h, D), pos);
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

// ---- Forward -----------------------------------------------------------------------
// The forward splits a warp into teams of kLpr lanes (Geo: the lanes that share a head
// row; D 128 bf16: two teams of 16, D >= 256: one team of 32); a team works on one work
// item at a time, so a warp has kRps items in hand, and no reduction crosses teams.
// A team's work is a sequence of steps; a step is one chunk of kCs keys of one query row
// (or, for a segment without query rows, only the zeroing of its rows). The team copies
// the q, K and V slices of a step into shared memory with cp.async kFwdStages - 1 steps
// before it computes it, so several work items' rows are in flight without holding
// registers (one item a warp at a time, the narrow rows, D 128/256 with a few keys, were
// latency-bound at 70-85% of the copy bandwidth). Each lane copies and later reads its
// own slices only. Step descriptors go from the copying code (the "walker") to the
// computing code through a small ring in shared memory. Teams of a warp run the same
// code on similar items, so they mostly issue together; every shuffle and barrier names
// only its team's lanes, so where they part (ragged segments) each still runs correctly.

constexpr int kFwdStages = 3;  // steps a team has in shared memory: 1 computed, 2 in flight
// (the kernel's default: dev/small_seq/small_seq_fwd_sweep.cu times other depths)

struct FwdStep {
  Rows qr;           // the segment's q rows (its unused rows are zeroed on its first step)
  int32_t pack, h;   // pack and q head
  int32_t t;         // query row (pack-relative); -1: none (a segment without query rows)
  int32_t kv_begin;  // first key row of the segment
  int32_t n;         // keys the row keeps
  int32_t j0;        // first key of this chunk
  int32_t first;     // first step of its work item
  int32_t valid;     // 0: past the team's last work item
};

// Shared memory of one warp and stage: [kSlots][32] vectors (slot-major, lane-minor: a
// warp's access to one slot is 512 contiguous bytes, free of bank conflicts).
template <class T, int D, int kCs, int kStages = kFwdStages>
struct FwdLayout {
  static constexpr int kVpl = Geo<T, D>::kVpl;
  static constexpr int kSlots = kVpl * (1 + 2 * kCs);  // q, K rows, V rows
  static constexpr int kStageVecs = kSlots * 32;
  static constexpr int kBlockBytes = kWarpsPerBlock * kStages * kStageVecs * 16;
  __device__ static constexpr int q() { return 0; }
  __device__ static constexpr int k(int c) { return kVpl * (1 + c); }
  __device__ static constexpr int v(int c) { return kVpl * (1 + kCs + c); }
};

// The lanes of the team of `lane` (teams of kLpr lanes).
template <int kLpr>
__device__ __forceinline__ unsigned team_mask(int lane) {
  if constexpr (kLpr == 32) return kAllLanes;
  else return ((1u << kLpr) - 1) << (lane / kLpr * kLpr);
}

// Walks a team's work items in order: u = v, v + V, v + 2V, ... for team v of V (so
// neighbouring teams take neighbouring heads of a segment), their segment entries loaded
// kLpr at a time, one a lane, into `staged`. heads: q heads (forward) or kv heads
// (backward) a segment has. Team-uniform; a team of 32 lanes is a warp.
template <int kLpr>
struct ItemWalker {
  const KernelArgs& a;
  RawRows (*staged)[2];  // this team's kLpr segment entries (q, kv)
  unsigned mask;
  int heads, pos, teams, u0, i, count;
  bool valid;   // false: past the team's last item
  int pack, h;  // the current item
  Rows qr, kv;

  __device__ ItemWalker(const KernelArgs& args, int heads_, RawRows (*st)[2], int lane)
      : ItemWalker(args, heads_, st, lane, first_item(lane),
                   gridDim.x * kWarpsPerBlock * (32 / kLpr)) {}

  // Walks the items first, first + stride, ... instead (a warp retracing its teams' items).
  __device__ ItemWalker(const KernelArgs& args, int heads_, RawRows (*st)[2], int lane, int first,
                        int stride)
      : a(args), staged(st), mask(team_mask<kLpr>(lane)), heads(heads_), pos(lane % kLpr),
        teams(stride), u0(first) {
    valid = u0 < a.units;
    if (valid) load_group();
  }

  // The first item of the team of `lane`.
  __device__ static int first_item(int lane) {
    return (blockIdx.x * kWarpsPerBlock + threadIdx.x / 32) * (32 / kLpr) + lane / kLpr;
  }

  __device__ void load_group() {
    __syncwarp(mask);  // every lane has read the previous entries
    const int mine = u0 + pos * teams;  // < 2^30 + 32 * teams: no overflow (validate())
    if (mine < a.units) {
      const int seg = mine / heads;
      const int sg = seg % a.segments, pk = seg / a.segments;
      staged[pos][0] = load_rows(a.qs, pk, a.segments, sg);
      staged[pos][1] = load_rows(a.kvs, pk, a.segments, sg);
    }
    __syncwarp(mask);
    count = min(kLpr, (a.units - u0 + teams - 1) / teams);
    enter(0);
  }

  __device__ void enter(int item) {
    i = item;
    const int u = u0 + i * teams;
    const int seg = u / heads;
    const int sg = seg % a.segments;
    pack = seg / a.segments;
    h = u % heads;
    qr = clamp_rows(a.qs, staged[i][0], a.segments, sg);
    kv = clamp_rows(a.kvs, staged[i][1], a.segments, sg);
  }

  __device__ void next() {
    if (i + 1 < count) return enter(i + 1);
    u0 += kLpr * teams;
    valid = u0 < a.units;
    if (valid) load_group();
  }
};

// Walks a team's forward steps: its work items, then their query rows, then chunks.
template <int kLpr, int kChunk>
struct FwdWalker {
  ItemWalker<kLpr> it;
  int r;
  FwdStep s;  // the next step

  __device__ FwdWalker(const KernelArgs& a, RawRows (*st)[2], int lane)
      : it(a, a.heads_q, st, lane) {
    start_item();
  }

  __device__ void start_item() {
    s.valid = it.valid;
    if (!it.valid) return;
    s.pack = it.pack;
    s.h = it.h;
    s.qr = it.qr;
    s.kv_begin = it.kv.begin;
    s.first = 1;
    s.j0 = 0;
    r = 0;
    set_row();
  }

  __device__ void set_row() {
    const bool has = r < s.qr.len;
    s.t = has ? s.qr.begin + r : -1;
    s.n = has ? row_hi(it.a.mask, r, s.qr.len, it.kv.len) : 0;
  }

  __device__ void advance() {
    s.first = 0;
    if (r < s.qr.len) {
      s.j0 += kChunk;
      if (s.j0 < s.n) return;
      s.j0 = 0;
      ++r;
      if (r < s.qr.len) return set_row();
    }
    it.next();
    start_item();
  }
};

// Starts the copies of step s into `stage` (this lane's place in it) and closes the group
// (an empty one past the end: every step is one group). Key j0 + c goes to K/V slot c.
template <class T, int D, int kCs>
__device__ __forceinline__ void fwd_copy(const KernelArgs& a, const FwdStep& s, uint4* stage,
                                         int pos) {
  using L = FwdLayout<T, D, kCs>;
  using S = RowSlice<T, D>;  // copies past L1 (cp_async16's kStream)
  if (s.valid && s.t >= 0) {
    if (s.j0 == 0) {
      const int64_t qrow = row_offset(s.pack, a.qs.tokens, s.t, a.heads_q, s.h, D);
      S::template copy_async<true>(static_cast<const T*>(a.q) + qrow, pos, stage + 32 * L::q());
    }
    const int64_t kv0 = row_offset(s.pack, a.kvs.tokens, s.kv_begin, a.heads_kv, s.h / a.group, D);
    const int kv_stride = a.heads_kv * D;  // elements from one key row to the next
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = s.j0 + c;
      if (j < s.n) {
        const int64_t off = kv0 + int64_t{j} * kv_stride;
        S::template copy_async<true>(static_cast<const T*>(a.k) + off, pos, stage + 32 * L::k(c));
        S::template copy_async<true>(static_cast<const T*>(a.v) + off, pos, stage + 32 * L::v(c));
      }
    }
  }
  cp_async_commit();
}

// The online-softmax state of one query row, carried from chunk to chunk (float32; scores
// in log2 units, exp2 being one instruction).
template <class T, int D, int kCs>
struct FwdRow {
  static constexpr int kE = Geo<T, D>::kE;
  float qf[kE], acc[kE], sc[kCs], m, l;
};

// One chunk of keys [j0, j0 + kCs) of a row, from shared memory; the first chunk of a
// row starts its state. Every lane of the team gets every score. With save_aux, scores of
// all but the last chunk wait (raw) in the team's stash, kMaxWidth floats of shared
// memory, until the final max and sum are known (kept in P itself, the row's end would
// wait on reading them back).
template <class T, int D, int kCs>
__device__ __forceinline__ void fwd_chunk(const KernelArgs& a, const FwdStep& d,
                                          const uint4* stage, float* stash,
                                          FwdRow<T, D, kCs>& st, unsigned mask, int pos) {
  using G = Geo<T, D>;
  using L = FwdLayout<T, D, kCs>;
  constexpr int kLpr = G::kLpr, kE = G::kE;
  if (d.j0 == 0) {
    RowSlice<T, D> qs;
    qs.load_shared(stage + 32 * L::q());
    qs.to_float(st.qf, a.scale * kLog2e);
    st.m = -INFINITY;
    st.l = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) st.acc[e] = 0.0f;
  }
  if (d.n == 0) return;  // no keys: the state stays empty (m = -inf, l = 0)
  float chunk_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < kCs; ++c) {
    float part = 0.0f;
    if (d.j0 + c < d.n) {
      RowSlice<T, D> kr;
      kr.load_shared(stage + 32 * L::k(c));
      part = dot<T, D>(st.qf, kr);
    }
    const float s = row_sum<kLpr>(part, mask);
    st.sc[c] = d.j0 + c < d.n ? s : -INFINITY;
    chunk_max = fmaxf(chunk_max, st.sc[c]);
  }
  // Finite: key j0 < n is in this chunk.
  const float m_new = fmaxf(st.m, chunk_max);
  const float alpha = exp2f(st.m - m_new);  // 0 on the first chunk (m = -inf)
  float chunk_sum = 0.0f;
#pragma unroll
  for (int e = 0; e < kE; ++e) st.acc[e] *= alpha;
#pragma unroll
  for (int c = 0; c < kCs; ++c) {
    if (d.j0 + c < d.n) {
      const float p = exp2f(st.sc[c] - m_new);
      RowSlice<T, D> vr;
      vr.load_shared(stage + 32 * L::v(c));
      axpy<T, D>(st.acc, p, vr);
      chunk_sum += p;
    }
  }
  st.l = st.l * alpha + chunk_sum;
  st.m = m_new;
  if (a.save_aux && pos == 0 && d.j0 + kCs < d.n) {
#pragma unroll
    for (int c = 0; c < kCs; ++c)
      if (d.j0 + c < a.width) stash[d.j0 + c] = st.sc[c];  // width <= kMaxWidth
  }
}

// After a row's last chunk: out = acc / l, and with save_aux P (normalized) and the stats.
// The stash holds the earlier chunks' scores (written before the step loop's __syncwarp).
template <class T, int D, int kCs>
__device__ __forceinline__ void fwd_finish(const KernelArgs& a, const FwdStep& d, int64_t qrow,
                                           float* prow, const float* stash,
                                           const FwdRow<T, D, kCs>& st, int pos) {
  constexpr int kLpr = Geo<T, D>::kLpr;
  const int n = d.n;
  const float m = st.m;
  const float inv = n > 0 ? 1.0f / st.l : 0.0f;
  store_row<T, D>(static_cast<T*>(a.out) + qrow * D, pos, st.acc, inv);
  if (!prow) return;

  const int last0 = d.j0;  // first key of the last chunk
  for (int j = pos; j < last0 && j < a.width; j += kLpr) prow[j] = exp2f(stash[j] - m) * inv;
  if (pos == 0) {
#pragma unroll
    for (int c = 0; c < kCs; ++c) {
      const int j = last0 + c;
      if (j < a.width) prow[j] = j < n ? exp2f(st.sc[c] - m) * inv : 0.0f;
    }
    a.stats[qrow * 2] = n > 0 ? m * kLn2 : -INFINITY;
    a.stats[qrow * 2 + 1] = n > 0 ? (m + log2f(st.l)) * kLn2 : -INFINITY;
  }
  for (int j = last0 + kCs + pos; j < a.width; j += kLpr) prow[j] = 0.0f;
}

// Zeroes the outputs of the segment's q rows that it owns but does not use (one team).
template <class T, int D>
__device__ void fwd_zero_gaps(const KernelArgs& a, const FwdStep& d, int pos) {
  constexpr int kLpr = Geo<T, D>::kLpr;
  for_gaps(d.qr, [&](int begin, int end) {
    for (int t = begin; t < end; ++t) {
      const int64_t row = row_offset(d.pack, a.qs.tokens, t, a.heads_q, d.h, 1);
      store_zero_row<T, D>(static_cast<T*>(a.out) + row * D, pos);
      if (!a.save_aux) continue;
      for (int j = pos; j < a.width; j += kLpr) a.probs[row * a.width + j] = 0.0f;
      if (pos < 2) a.stats[row * 2 + pos] = -INFINITY;
    }
  });
}

// Blocks per SM the forward is compiled for: as many as its shared memory allows, at most
// 4 (16 warps, <= 128 registers a thread). The copies in flight take no registers, and 16
// warps keep enough of them going: at 6 blocks (registers capped at 80) the forward moved
// 0.6 to 6.8 points of the copy bandwidth less at every point of the bench grid
// (dev/small_seq/small_seq_fwd_sweep.cu on the H100, bench/RESULTS.md).
template <class T, int D, int kCs, int kStages = kFwdStages>
constexpr int fwd_min_blocks() {
  constexpr int by_smem = (200 * 1024) / FwdLayout<T, D, kCs, kStages>::kBlockBytes;
  return by_smem < 1 ? 1 : (by_smem > 4 ? 4 : by_smem);
}

// kStages, kBlocks: the defaults unless a sweep asks for others.
template <class T, int D, int kCs, int kStages = kFwdStages,
          int kBlocks = fwd_min_blocks<T, D, kCs, kStages>()>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, kBlocks)
    small_seq_fwd_kernel(const KernelArgs a) {
  using L = FwdLayout<T, D, kCs, kStages>;
  constexpr int kLpr = Geo<T, D>::kLpr;
  extern __shared__ uint4 fwd_smem[];  // [warps][kStages][kSlots][32]
  __shared__ RawRows staged[kWarpsPerBlock][32][2];  // kLpr entries a team
  __shared__ FwdStep ring[kWarpsPerBlock][32 / kLpr][kStages + 1];
  __shared__ float stash[kWarpsPerBlock][32 / kLpr][kMaxWidth];  // a team's raw scores
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, pos = lane % kLpr;
  const unsigned mask = team_mask<kLpr>(lane);
  uint4* mine = fwd_smem + warp * (kStages * L::kStageVecs) + lane;
  FwdStep* steps = ring[warp][lane / kLpr];

  FwdWalker<kLpr, kCs> walk(a, staged[warp] + lane / kLpr * kLpr, lane);
  // Step k's copies go to stage k % kStages, its descriptor to steps[k % (kStages + 1)]:
  // one more descriptor than stages, so a lane still reading step k's while another lane
  // already writes step k + kStages's never meet (the __syncwarp below bounds the skew).
  auto issue = [&](int k) {
    if (pos == 0) steps[k % (kStages + 1)] = walk.s;
    fwd_copy<T, D, kCs>(a, walk.s, mine + (k % kStages) * L::kStageVecs, pos);
    if (walk.s.valid) walk.advance();
  };
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);

  FwdRow<T, D, kCs> st;
  for (int k = 0;; ++k) {
    issue(k + kStages - 1);
    __syncwarp(mask);
    const FwdStep d = steps[k % (kStages + 1)];
    if (!d.valid) break;
    cp_async_wait<kStages - 1>();  // step k's copies have landed
    if (d.first) fwd_zero_gaps<T, D>(a, d, pos);
    if (d.t < 0) continue;
    const uint4* stage = mine + (k % kStages) * L::kStageVecs;
    const int64_t qrow = row_offset(d.pack, a.qs.tokens, d.t, a.heads_q, d.h, 1);
    float* prow = a.save_aux ? a.probs + qrow * a.width : nullptr;
    float* scores = stash[warp][lane / kLpr];
    fwd_chunk<T, D, kCs>(a, d, stage, scores, st, mask, pos);
    if (d.j0 + kCs >= d.n) fwd_finish<T, D, kCs>(a, d, qrow, prow, scores, st, pos);
  }
  cp_async_wait<0>();  // nothing left in flight at exit (the last groups are empty)
}

}  // namespace fusedattn::small_seq::cuda
