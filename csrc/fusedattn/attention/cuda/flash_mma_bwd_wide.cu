// The register-resident CUDA flash backward for head dims above 128 (up to 512, q/k and v
// dims apart): flash_mma_bwd.cu's kernel with the head dims streamed and the outputs cut
// into column chunks, so that no buffer grows with the head dim.
//
// One block = one (batch, kv head, key tile of 64 keys, output chunk oc of DO = 256 columns,
// or 128 where shared memory is short: below), 8 warps. Warp w owns keys 16 (w % 4) .. + 15
// and columns DO / 2 (w / 4) .. of the chunk: their dK, dV (16 x DO / 2 float32 accumulators
// each, in C layout). Per query tile
// of 64 rows that keeps one of the block's keys (the tables' TileRange) and per half of 32
// queries:
//   S^T = K Q^T, dP^T = V dO^T     for the warp's 16 keys and its 16 of the half's queries
//                                  (16 (w / 4) ..: the two warps of a key group split the
//                                  queries, so each product is computed once per block), over
//                                  the whole head dims in chunks of KC columns: K, V (64 keys)
//                                  and Q, dO (32 queries) chunks stream through two cp.async
//                                  buffers (chunk c + 1 loads while chunk c multiplies)
//   P^T, dS^T element by element   (flash_common.cuh's bwd_elements), then to shared memory:
//                                  P and dS [query][key] for the half, dS^T [key][query] for
//                                  the tile; the key group's two warps meet at a barrier
//   dV += P^T dO[:, cols], dK += dS^T Q[:, cols]   (P and dS from shared memory: the key
//                                  group's 32 queries; the half's Q, dO columns of the chunk,
//                                  loaded beside the first head-dim chunk)
// then per query tile dQ[:, oc] += dS K[:, oc] (float32 atomics into dq_acc) from the block's K
// columns, loaded once: warp w its 16 queries 16 (w % 4) .. and its 128 columns. S^T and dP^T
// are computed once per output chunk (twice at head dim 512, once up to 256): the price of dK
// and dV staying in registers; the blocks of one key tile run side by side and share its loads
// in L2. Only the first chunk's block adds dbias. Shared memory: 139 KiB for 16-bit inputs,
// 219 KiB for float32 (KC = 32), whatever the head dim: one block of 8 warps an SM. A device
// with less (sm_80: 163 KiB) runs float32 calls in chunks of DO = 128 columns (155 KiB; S^T
// and dP^T once per 128 columns: twice at head dim 256). KVR (16-bit where the device has 216
// KiB a block: sm_90): the block's K and V held whole, loaded once, only Q and dO streamed, in
// chunks of 128 columns (a sync per 128 columns instead of 64, a third of the bytes loaded);
// H200 bf16 D 512 causal S 4096 backward 8.4 -> 5.5 ms (session 48).
// (Session 45: 4 warps of 16 keys x 128 columns each computed S^T and dP^T for all 32 queries
// of the half, once per 128-column chunk: 4 times at head dim 512; float32's 157 KiB left one
// block of 4 warps an SM.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "fusedattn/attention/cuda/flash_common.cuh"
#include "fusedattn/attention/cuda/flash_rules.h"
#include "fusedattn/attention/cuda/mma.cuh"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda::flash::detail {
namespace {

using namespace fusedattn::cuda::mma;

constexpr int kWarps = 8, kKeys = 64, kQH = 32, kQW = 16, kMaxDim = 512;

static_assert(kBMQ == 2 * kQH, "a query tile is two halves");
static_assert(kWarps * 16 == 2 * kKeys && kQH == 2 * kQW, "two warps a key group");

// pair_sync(kg): the two warps of key group kg (warps kg, kg + 4) meet (named barrier 1 + kg).
__device__ __forceinline__ void pair_sync(int kg) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kg), "r"(64) : "memory");
}

// Shared memory: NST stages of head-dim chunks (K, V [kKeys][LDC], Q, dO [kQH][LDC]); the
// block's K columns [kKeys][LDO]; the half's Q, dO columns [kQH][LDO]; dS^T [kKeys][LDQ] (the
// tile's 64 queries); the half's P and dS [kQH][LDK] (query rows, key columns); the tile's
// rows' kept keys, lse and delta. Row strides of 16 bytes more than the data (float32: 4 mod
// 32 floats, conflict-free for the TF32 loads; 16-bit: ldmatrix rows in distinct banks).
template <class T, int DO>
struct WideSmem {
  static_assert(DO == 256 || DO == 128, "output chunks of 256 or 128 columns");
  // NST stages of KC columns (chunk c + NST - 1 loads while chunk c multiplies). Measured
  // on the H100 (D 512 fwd+bwd, session 18's kernel): two stages of 64 columns 12.0 ms, four
  // of 32 15.5 ms (the syncs per chunk cost more than the latency they hide).
  static constexpr int NST = 2, KC = sizeof(T) == 4 ? 32 : 64;
  static constexpr int kPad = 16 / int(sizeof(T));
  static constexpr int LDC = KC + kPad, LDO = DO + kPad, LDQ = kBMQ + kPad, LDK = kKeys + kPad;
  static constexpr int stage = (2 * kKeys + 2 * kQH) * LDC;  // elements
  static constexpr int k_at = 0, v_at = kKeys * LDC, q_at = 2 * kKeys * LDC, do_at = q_at + kQH * LDC;
  static constexpr size_t ko = size_t(NST) * stage * sizeof(T), qo = ko + size_t(kKeys) * LDO * sizeof(T),
                          doo = qo + size_t(kQH) * LDO * sizeof(T), ds = doo + size_t(kQH) * LDO * sizeof(T),
                          pq = ds + size_t(kKeys) * LDQ * sizeof(T), dsq = pq + size_t(kQH) * LDK * sizeof(T),
                          keys = dsq + size_t(kQH) * LDK * sizeof(T), lse = keys + kBMQ * 8,
                          delta = lse + kBMQ * 4, total = delta + kBMQ * 4;
  static_assert(total <= 227 * 1024, "one block an SM");
  static constexpr int LDD = 0;  // (KVR's: K and V whole)
  static constexpr size_t vo = 0, ring = 0;
};

// KVR's (16-bit, 256-column chunks, where the device has 216 KiB a block): the block's K and V
// held whole [kKeys][LDD] (the head dims' KC-column chunks), NST stages of Q, dO chunks
// [kQH][LDC] of KC = 128 columns (K and V no longer stream: a sync per 128 columns, not 64),
// then WideSmem's buffers but the block's K columns (K's own, in place).
template <class T>
struct WideKVSmem {
  static_assert(sizeof(T) == 2, "16-bit inputs");
  static constexpr int NST = 2, KC = 128, kPad = 8, DO = 256;
  static constexpr int LDC = KC + kPad, LDO = DO + kPad, LDQ = kBMQ + kPad, LDK = kKeys + kPad, LDD = kMaxDim + kPad;
  static constexpr int stage = 2 * kQH * LDC;  // elements
  static constexpr int q_at = 0, do_at = kQH * LDC;
  static constexpr size_t vo = size_t(kKeys) * LDD * sizeof(T), ring = 2 * vo,
                          qo = ring + size_t(NST) * stage * sizeof(T), doo = qo + size_t(kQH) * LDO * sizeof(T),
                          ds = doo + size_t(kQH) * LDO * sizeof(T), pq = ds + size_t(kKeys) * LDQ * sizeof(T),
                          dsq = pq + size_t(kQH) * LDK * sizeof(T), keys = dsq + size_t(kQH) * LDK * sizeof(T),
                          lse = keys + kBMQ * 8, delta = lse + kBMQ * 4, total = delta + kBMQ * 4;
  static_assert(total <= 227 * 1024, "one block an SM");
};

// x as the element type of the products' shared-memory operands: T; float32 TF32-rounded
// when RAW (the products take it as TF32 already), else as it is.
template <class T, bool RAW>
__device__ __forceinline__ T as_operand(float x) {
  if constexpr (RAW) return __uint_as_float(to_tf32(x));
  else return from_f<T>(x);
}

// q, k, v, dout [B, S, H, D|Dv] (strided views), lse [B, Hq, Sq], delta [B, Hq, Sq];
// dq_acc [B, Sq, Hq, Dp] f32 (+= scale-free dS K), dbias_acc the bias's shape f32 or null;
// dk, dv [B, Skv, Hkv, D|Dv] written (the block's columns).
// SM: a score_mod (c.sm) runs in the element step (a kernel of its own). KVR: K and V held
// whole (WideKVSmem).
template <class T, int DO, bool EXACT, bool SM, bool KVR>
__global__ void __launch_bounds__(kWarps * 32) wide_bwd_kernel(const Call c, const float* delta, float* dq_acc,
                                                               float* dbias_acc) {
  static_assert(!KVR || DO == 256, "KVR: 256-column chunks");
  using L = std::conditional_t<KVR, WideKVSmem<T>, WideSmem<T, DO>>;
  constexpr int kDO = DO, kDW = DO / 2;  // the block's output columns, a warp's
  constexpr bool RAW = std::is_same_v<T, float> && !EXACT;  // TF32: inputs rounded once a call (flash.cu)
  constexpr int KC = L::KC, LDC = L::LDC, LDO = L::LDO, LDQ = L::LDQ, LDK = L::LDK, LDD = L::LDD;
  constexpr int NH = kQW / 8, DN = kDW / 8, DC = 64, VE = 16 / int(sizeof(T));
  constexpr int LDKO = KVR ? LDD : LDO;  // sKo's row stride
  extern __shared__ __align__(128) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem + L::ring);
  T* sK = reinterpret_cast<T*>(smem);  // KVR: K [kKeys][LDD], then V
  T* sVw = reinterpret_cast<T*>(smem + L::vo);
  T* sQo = reinterpret_cast<T*>(smem + L::qo);
  T* sDOo = reinterpret_cast<T*>(smem + L::doo);
  T* sDS = reinterpret_cast<T*>(smem + L::ds);
  T* sP = reinterpret_cast<T*>(smem + L::pq);
  T* sDSq = reinterpret_cast<T*>(smem + L::dsq);
  int2* sKeys = reinterpret_cast<int2*>(smem + L::keys);
  float* sLse = reinterpret_cast<float*>(smem + L::lse);
  float* sDelta = reinterpret_cast<float*>(smem + L::delta);
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q, Hkv = p.heads_kv;
  const int64_t Dqk = p.head_dim_qk, Dv = p.head_dim_v, Dmax = std::max(Dqk, Dv);
  const int64_t group = Hq / Hkv, n_kt = (Skv + kKeys - 1) / kKeys, n_qt = (Sq + kBMQ - 1) / kBMQ;
  const int64_t n_oc = (Dmax + kDO - 1) / kDO, n_kc = (Dmax + KC - 1) / KC;
  const int64_t task = blockIdx.x, oc = task % n_oc, rest = task / n_oc;
  const int64_t kt = rest % n_kt, hk = (rest / n_kt) % Hkv, b = rest / (n_kt * Hkv);
  const int64_t k0 = kt * kKeys, oc0 = oc * kDO;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int kg = warp % 4, ch = warp / 4;  // key group (16 keys), column half / query quarter
  const int64_t col0 = oc0 + ch * kDW;     // the warp's first dK / dV / dQ column

  const T* kp = static_cast<const T*>(c.a.k) + b * c.a.sk.b + k0 * c.a.sk.s + hk * c.a.sk.h;
  const T* vp = static_cast<const T*>(c.a.v) + b * c.a.sv.b + k0 * c.a.sv.s + hk * c.a.sv.h;
  const int64_t keys = std::min<int64_t>(kKeys, Skv - k0);
  T* sKo;  // the block's K columns oc0 .. (row stride LDKO)
  if constexpr (KVR) {
    // K and V whole: the head dims' n_kc chunks (zeros past the keys and the dims).
    const int cpr = int(n_kc) * KC / VE;
    for (int idx = threadIdx.x; idx < kKeys * cpr; idx += blockDim.x) {
      const int r = idx / cpr, cc = idx % cpr;
      const bool okk = r < keys && cc * VE < Dqk, okv = r < keys && cc * VE < Dv;
      cp_async16(sK + r * LDD + cc * VE, okk ? kp + r * c.a.sk.s + cc * VE : kp, okk);
      cp_async16(sVw + r * LDD + cc * VE, okv ? vp + r * c.a.sv.s + cc * VE : vp, okv);
    }
    sKo = sK + oc0;
  } else {
    sKo = reinterpret_cast<T*>(smem + L::ko);
    cp_async_rows<T, kDO, LDO>(sKo, kp + oc0, c.a.sk.s, keys, Dqk - oc0, kKeys);
  }

  const int64_t n_u = group * n_qt;
  // The first row of work item u's half hq in q and in dout.
  auto q_at = [&](int64_t u, int hq) {
    const int64_t h = hk * group + u / n_qt, r0 = (u % n_qt) * kBMQ + hq * kQH;
    return static_cast<const T*>(c.a.q) + b * c.a.sq.b + r0 * c.a.sq.s + h * c.a.sq.h;
  };
  auto do_at = [&](int64_t u, int hq) {
    const int64_t h = hk * group + u / n_qt, r0 = (u % n_qt) * kBMQ + hq * kQH;
    return static_cast<const T*>(c.a.dout) + b * c.a.sdo.b + r0 * c.a.sdo.s + h * c.a.sdo.h;
  };
  auto half_rows = [&](int64_t u, int hq) {
    return std::clamp<int64_t>(Sq - ((u % n_qt) * kBMQ + hq * kQH), 0, kQH);
  };
  // Head-dim chunk kc of work item u's half hq into stage s: K, V columns of the block's
  // keys, Q, dO columns of the half's queries (zeros past the dims and the rows).
  auto issue_chunk = [&](int64_t u, int hq, int64_t kc, int s) {
    const int64_t d0 = kc * KC, rows = half_rows(u, hq);
    T* st = ring + s * L::stage;
    if constexpr (!KVR) {
      cp_async_rows<T, KC, LDC>(st + L::k_at, kp + d0, c.a.sk.s, keys, Dqk - d0, kKeys);
      cp_async_rows<T, KC, LDC>(st + L::v_at, vp + d0, c.a.sv.s, keys, Dv - d0, kKeys);
    }
    cp_async_rows<T, KC, LDC>(st + L::q_at, q_at(u, hq) + d0, c.a.sq.s, rows, Dqk - d0, kQH);
    cp_async_rows<T, KC, LDC>(st + L::do_at, do_at(u, hq) + d0, c.a.sdo.s, rows, Dv - d0, kQH);
  };

  // dK, dV rows g, g + 8 of the warp's keys, columns col0 + 8 dn + 2t, + 1 (C layout).
  float dk[DN][4], dv[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dn][e] = dv[dn][e] = 0.0f;
  // st[n][e], dpt[n][e]: key 16 kg + g + 8 (e / 2), query 32 hq + 16 ch + 8 n + 2t + e % 2.
  float st[NH][4], dpt[NH][4];
  uint32_t zbits = 0;
  const bool do_dk = col0 < Dqk, do_dv = col0 < Dv;
  const int kl0 = kg * 16 + g;             // the thread's first key in the block (+ 8)
  const int j0 = int(k0) + kl0;            // keys fit int32 (RowInfo's)
  SmGradSums sums;  // score_mod operand gradients (c.sm_dops; chunk 0's)
  if (SM && c.sm_dops) sm_sums_init(sums);

  // The steps: (work item u, half hq, head-dim chunk kc), in order; `cur` computes, `pf`
  // loads P = NST - 1 steps ahead.
  constexpr int P = L::NST - 1;
  struct Step {
    int64_t u, kc;
    int hq;
  };
  auto advance = [&](Step x) {
    if (++x.kc == n_kc) {
      x.kc = 0;
      if (++x.hq == 2) x.hq = 0, x.u = next_bwd_tile(c, b, n_qt, n_u, k0, x.u + 1);
    }
    return x;
  };
  Step cur{next_bwd_tile(c, b, n_qt, n_u, k0, 0), 0, 0}, pf = cur;
  int s = 0, ps = 0;  // the stages of cur and pf
  for (int i = 0; i < P; ++i) {
    if (pf.u < n_u) issue_chunk(pf.u, pf.hq, pf.kc, ps), pf = advance(pf);
    cp_async_commit();
    ps = (ps + 1) % L::NST;
  }
  while (cur.u < n_u) {
    const int64_t u = cur.u, kc = cur.kc;
    const int hq = cur.hq;
    cp_async_wait<P - 1>();
    __syncthreads();  // step cur landed; every warp is done with the stage pf loads into
    if (pf.u < n_u) issue_chunk(pf.u, pf.hq, pf.kc, ps), pf = advance(pf);
    ps = (ps + 1) % L::NST;
    const int64_t h = hk * group + u / n_qt, q0 = (u % n_qt) * kBMQ;
    if (kc == 0) {
      const int64_t rows = half_rows(u, hq);
      cp_async_rows<T, kDO, LDO>(sQo, q_at(u, hq) + oc0, c.a.sq.s, rows, Dqk - oc0, kQH);
      cp_async_rows<T, kDO, LDO>(sDOo, do_at(u, hq) + oc0, c.a.sdo.s, rows, Dv - oc0, kQH);
      if (hq == 0) {
        load_bwd_rows(c, delta, b, h, q0, sKeys, sLse, sDelta);
        zbits = bwd_drop_bits(Drop(c, b, h), q0, j0, t);
      }
#pragma unroll
      for (int n = 0; n < NH; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
    }
    cp_async_commit();

    const T* sc = ring + s * L::stage;
    if constexpr (KVR)
      mma_abt2<T, LDC, kQW, KC, EXACT, 1, RAW, LDD>(st, sK + kg * 16 * LDD + kc * KC, sc + L::q_at + ch * kQW * LDC,
                                                    dpt, sVw + kg * 16 * LDD + kc * KC,
                                                    sc + L::do_at + ch * kQW * LDC, lane);
    else
      mma_abt2<T, LDC, kQW, KC, EXACT, 1, RAW>(st, sc + L::k_at + kg * 16 * LDC, sc + L::q_at + ch * kQW * LDC, dpt,
                                               sc + L::v_at + kg * 16 * LDC, sc + L::do_at + ch * kQW * LDC, lane);

    if (kc == n_kc - 1) {
      // The half's Q, dO columns came with chunk 0's group, n_kc - 1 groups before the
      // newest: done already when that is at least the P groups in flight.
      if (n_kc - 1 < P) cp_async_wait<0>();
      __syncthreads();  // the half's Q, dO columns and the tile's rows are in
      const Drop drop(c, b, h);
      const int qc = hq * kQH + ch * kQW;  // the warp's first query column of the tile
      const int64_t bs = c.a.bias_s, i0 = q0 + qc + 2 * t;
      const T* bias = bias_plane<T>(c, b, h);
      float* dbias = nullptr;
      if (dbias_acc && oc == 0)
        dbias = dbias_acc + (b / c.bs) * c.a.bias_slice + (b % c.bs) * c.a.bias_b + h * c.a.bias_h;
      SmHead sm = sm_head(c, b, h);
      if (oc != 0) sm.dops = nullptr, sm.dslope = nullptr;  // chunk 0 adds the operands' gradients (as dbias)
      // (zbits: bit 4 n + e over the tile's 8 n-tiles; this warp's are 2 (qc / 16) ..)
      bwd_elements<T, NH, SM>(st, dpt, c, j0, qc, t, sKeys, sLse, sDelta, bias ? bias + i0 * bs + j0 : nullptr,
                              dbias ? dbias + i0 * bs + j0 : nullptr, bs, drop.on, drop.inv_keep, zbits >> (qc / 2),
                              sm, q0, sums);

      // P and dS of the warp's 16 x 16 to the half's [query][key] tiles, dS^T to the tile's
      // [key][query] one (T, as the products round them; float32 for float32, TF32-rounded
      // when RAW): key kl0 + 8 r, query 16 ch + 8 n + 2t + e of the half.
#pragma unroll
      for (int n = 0; n < NH; ++n) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int kl = kl0 + 8 * r, qh = ch * kQW + 8 * n + 2 * t;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            sP[(qh + e) * LDK + kl] = as_operand<T, RAW>(st[n][2 * r + e]);
            sDSq[(qh + e) * LDK + kl] = as_operand<T, RAW>(dpt[n][2 * r + e]);
          }
          T* dst = sDS + kl * LDQ + hq * kQH + qh;
          if constexpr (std::is_same_v<T, float>) {
            dst[0] = as_operand<T, RAW>(dpt[n][2 * r]);
            dst[1] = as_operand<T, RAW>(dpt[n][2 * r + 1]);
          } else {
            *reinterpret_cast<uint32_t*>(dst) = pack2<T>(dpt[n][2 * r], dpt[n][2 * r + 1]);
          }
        }
      }
      pair_sync(kg);  // the key group's P and dS of the half's 32 queries are in
      // dV += P^T dO[:, cols], dK += dS^T Q[:, cols] over the half's 32 queries (the A
      // operands' transposes, P and dS, from the [query][key] tiles).
      if (do_dv) mma_atb<T, LDK, kQH, kDW, EXACT, RAW, LDO>(dv, sP + kg * 16, sDOo + ch * kDW, lane);
      if (do_dk) mma_atb<T, LDK, kQH, kDW, EXACT, RAW, LDO>(dk, sDSq + kg * 16, sQo + ch * kDW, lane);

      if (hq == 1) {
        __syncthreads();  // the tile's dS^T is whole
        // dQ[:, cols] += dS K[:, cols] for queries 16 kg .. 16 kg + 15 (flash_common.cuh's add_dq_rows).
        const int64_t iq = q0 + kg * 16;
#pragma unroll
        for (int d0 = 0; d0 < kDW; d0 += DC) {
          if (!do_dk || col0 + d0 >= Dqk) break;
          add_dq_rows<T, LDQ, kKeys, DC, EXACT, RAW, LDKO>(dq_acc + ((b * Sq + iq) * Hq + h) * c.Dp + col0 + d0,
                                                          Hq * c.Dp, Sq - iq, Dqk - col0 - d0, sDS + kg * 16,
                                                          sKo + ch * kDW + d0, lane);
        }
      }
    }
    cur = advance(cur);
    s = (s + 1) % L::NST;
  }
  cp_async_wait<0>();  // K's columns when no tile kept a key
  if (SM && c.sm_dops && oc == 0) sm_sums_flush(sums);

  // dK = scale dK_acc, dV = dV_acc for keys < Skv, columns < the real dims.
  T* dkp = static_cast<T*>(c.a.dk) + b * c.a.sdk.b + k0 * c.a.sdk.s + hk * c.a.sdk.h + col0;
  T* dvp = static_cast<T*>(c.a.dv) + b * c.a.sdv.b + k0 * c.a.sdv.s + hk * c.a.sdv.h + col0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = kl0 + 8 * r;
    if (row >= keys) continue;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = 8 * dn + 2 * t + e;
        if (col0 + col < Dqk) dkp[row * c.a.sdk.s + col] = from_f<T>(p.scale * dk[dn][2 * r + e]);
        if (col0 + col < Dv) dvp[row * c.a.sdv.s + col] = from_f<T>(dv[dn][2 * r + e]);
      }
    }
  }
}

}  // namespace

bool mma_wide_bwd_fits(const AttnParams& p, const AttnTensors& a) {
  const int64_t d = std::max(p.head_dim_qk, p.head_dim_v);
  if (d <= 128 || d > kMaxDim) return false;
  // (float32: the 128-column chunks' where the 256-column ones do not fit)
  const size_t smem = p.dtype == FA_FLOAT32 ? WideSmem<float, 128>::total : WideSmem<__half, 256>::total;
  return mma_rows_fit(p, {a.sq, a.sk, a.sv, a.sdo}, {a.q, a.k, a.v, a.dout}, smem);
}

namespace {

template <class T, int DO, bool EXACT, bool KVR = false>
Status launch_wide_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream) {
  const AttnParams& p = c.p;
  const int64_t n_oc = (std::max(p.head_dim_qk, p.head_dim_v) + DO - 1) / DO;
  const int64_t blocks = p.batch * p.heads_kv * ((p.seqlen_kv + kKeys - 1) / kKeys) * n_oc;
  const size_t smem = KVR ? WideKVSmem<__half>::total : WideSmem<T, DO>::total;
  auto kernel = c.sm ? wide_bwd_kernel<T, DO, EXACT, true, KVR> : wide_bwd_kernel<T, DO, EXACT, false, KVR>;
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(c, delta, dq_acc, dbias_acc);
  return cuda_status(cudaGetLastError(), "the flash backward (mma, head dims > 128)");
}

}  // namespace

// 256-column chunks where the device has their shared memory; float32 on a device with less
// (sm_80) 128 (16-bit's 139 KiB fit every device mma_wide_bwd_fits admits); 16-bit with K and
// V held whole where the device has 216 KiB (sm_90).
template <class T, bool EXACT>
Status mma_wide_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (WideSmem<T, 256>::total > smem_optin()) return launch_wide_bwd<T, 128, EXACT>(c, delta, dq_acc, dbias_acc, stream);
  } else {
    if (WideKVSmem<T>::total <= smem_optin()) return launch_wide_bwd<T, 256, EXACT, true>(c, delta, dq_acc, dbias_acc, stream);
  }
  return launch_wide_bwd<T, 256, EXACT>(c, delta, dq_acc, dbias_acc, stream);
}

template Status mma_wide_bwd<__nv_bfloat16, false>(const Call&, const float*, float*, float*, cudaStream_t);
template Status mma_wide_bwd<__half, false>(const Call&, const float*, float*, float*, cudaStream_t);
template Status mma_wide_bwd<float, false>(const Call&, const float*, float*, float*, cudaStream_t);
template Status mma_wide_bwd<float, true>(const Call&, const float*, float*, float*, cudaStream_t);

}  // namespace fusedattn::cuda::flash::detail
