// The register-resident CUDA flash backward (FlashAttention-2's layout) for head dims up
// to 128: flash.cu's bwd_kernel, its algorithm and per-element rules, with S^T, dP^T, P^T,
// dS^T and the dK, dV accumulators in registers.
//
// One block = one (batch, kv head, key tile of 64 keys; key tiles major, so that under a
// causal mask the heaviest blocks of every head start first), 4 warps; warp w owns keys
// 16 w .. 16 w + 15 and their dK, dV rows (16 x D float32 accumulators each, in C layout).
// K and V stay in shared memory. The block walks every q head of the GQA group and every
// query tile of kBMQ = 64 rows that keeps one of its keys (the tables' TileRange, as
// bwd_kernel skips tiles); Q, dO and the tile's kept ranges, lse and delta go through two
// buffers (cp.async: tile u + 1 loads while tile u computes; float32 at D = 128 takes one
// buffer of half a tile, BwdSmem's HALF, so that two blocks share an SM). Per query tile a warp first
// draws dropout's keep bits of its 16 x 64 elements (one register), then, per half of 32
// queries (so that S^T and dP^T take 32 registers beside dK and dV's 128):
//   S^T = K_w Q^T and dP^T = V_w dO^T   (16 keys x 32 queries, mma.sync accumulators)
//   P^T, dS^T element by element        (bwd_kernel's rules: mask, bias, exp(s - lse),
//                                        dropout, the bias = -inf rule, dbias atomics)
//   dV += P^T dO, dK += dS^T Q          (P^T, dS^T repacked as the A operand: mma.cuh)
// then the block stores dS^T (in T, as the dK product rounded it; float32 for float32)
// over its dO buffer, which no warp reads any more, and warp w adds dS K for queries
// 16 w .. 16 w + 15 into the float32 dq accumulator with atomics (flash.cu's dq_kernel
// scales and converts it). 16-bit inputs use ldmatrix and m16n8k16; float32 m16n8k8 in
// TF32 (the inputs rounded once a call, flash.cu's round_inputs_tf32: cvt.rna.tf32 is a
// few integer instructions on sm_90, and a cvt per fragment load was a third of the
// kernel's), 3xTF32 when EXACT (mma.cuh); TF32 fragments of [row][k] tiles come by
// ldmatrix. A call without bias, dropout, dbias or score_mod runs the PLAIN instance
// (bwd_elements_plain: no per-element tests inside the kept band); in TF32 at D = 64 it
// holds the warp's K and V rows as A fragments for the whole block (mma_abt2_rega).
//
// Registers (ptxas, sm_90a): 249-255 for bf16, fp16 and float32 at D = 128 (some spill a
// few bytes; the score_mod instances more), 175-206 at D = 64 but the plain TF32 one (255,
// no spills: the K / V fragments); the S^T and dP^T products share one rolled k loop
// (mma_abt2, KU = 1: hoisted loads would spill).
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

constexpr int kWarps = 4, kKeys = 64, BMQ = kBMQ;
static_assert(kKeys == 16 * kWarps, "a warp owns 16 keys");
static_assert(BMQ == 64, "the query tile is the tables' tile (flash.cu's build_tables)");

// Shared memory: K, V [kKeys][LD]; per buffer Q, dO [QROWS][LD] (dO's also dS^T [key][query]
// once the tile's dV is done), the rows' kept keys (lo, hi), lse and delta.
// HALF (float32 at D = 128): one buffer of half a tile (QROWS = 32 rows of Q and dO, 101 KiB
// in all), so that two blocks share an SM (a whole tile's one buffer, 135 KiB, left one block
// of 4 warps an SM); Q and dO then come a half at a time, and dS^T [kKeys][32] goes over the
// half's Q and dO (adjacent: 64 rows of LD) once both are read.
template <class T, int D>
struct BwdSmem {
  static constexpr int kPad = 16 / int(sizeof(T)), LD = D + kPad;
  static constexpr bool HALF = sizeof(T) == 4 && D == 128;
  static constexpr int NBUF = HALF ? 1 : 2, QROWS = HALF ? BMQ / 2 : BMQ;
  static constexpr size_t tile = size_t(64) * LD * sizeof(T), qtile = size_t(QROWS) * LD * sizeof(T);
  static constexpr size_t k = 0, v = tile, q = 2 * tile, dout = q + NBUF * qtile, keys = dout + NBUF * qtile,
                          lse = keys + NBUF * BMQ * 8, delta = lse + NBUF * BMQ * 4, total = delta + NBUF * BMQ * 4;
  static_assert(HALF ? dout == q + qtile : LD >= BMQ + kPad, "dS^T [kKeys][QROWS] fits the Q / dO buffer");
};

// The element step of a call without bias, dropout, dbias or score_mod (PLAIN): P^T =
// exp(s scale - lse), dS^T = P^T (dP^T - delta), zeros outside a row's kept keys and for
// dead rows (lse +-inf), as bwd_elements; without a test per element when every row of the
// half keeps the warp's 16 keys (jw = its first), and the exponent one FMA (lse in log2).
template <int NH>
__device__ __forceinline__ void bwd_elements_plain(float (&st)[NH][4], float (&dpt)[NH][4], float scale_log2, int j0,
                                                   int jw, int col0, int t, const int2* kept, const float* lse_rows,
                                                   const float* dl_rows) {
  bool whole = true;
#pragma unroll
  for (int n = 0; n < NH; ++n)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int col = col0 + 8 * n + 2 * t + cc;
      const int2 kr = kept[col];
      whole &= kr.x <= jw && kr.y >= jw + 16 && fabsf(lse_rows[col]) != kInf;
    }
  if (__all_sync(0xffffffffu, whole)) {
#pragma unroll
    for (int n = 0; n < NH; ++n)
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int col = col0 + 8 * n + 2 * t + cc;
        const float l2 = lse_rows[col] * kLog2e, dl = dl_rows[col];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + cc;
          const float pr = exp2_approx(fmaf(st[n][e], scale_log2, -l2));
          st[n][e] = pr;
          dpt[n][e] = pr * (dpt[n][e] - dl);
        }
      }
    return;
  }
#pragma unroll
  for (int n = 0; n < NH; ++n)
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int col = col0 + 8 * n + 2 * t + cc;
      const float lse = lse_rows[col], l2 = lse * kLog2e, dl = dl_rows[col];
      const int2 kr = kept[col];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = 2 * r + cc, j = j0 + 8 * r;
        const bool keep = fabsf(lse) != kInf && j >= kr.x && j < kr.y;
        const float pr = keep ? exp2_approx(fmaf(st[n][e], scale_log2, -l2)) : 0.0f;
        st[n][e] = pr;
        dpt[n][e] = keep ? pr * (dpt[n][e] - dl) : 0.0f;
      }
    }
}

// q, k, v, dout [B, S, H, D|Dv] (strided views), lse [B, Hq, Sq], delta [B, Hq, Sq];
// dq_acc [B, Sq, Hq, Dp] f32 (+= scale-free dS K), dbias_acc the bias's shape f32 or null;
// dk, dv [B, Skv, Hkv, D|Dv] written.
// SM: a score_mod (c.sm) runs in the element step (a kernel of its own: the interpreter's
// calls out of the hot loop's registers). PLAIN: no bias, dropout, dbias or score_mod
// (bwd_elements_plain).
template <class T, int D, bool EXACT, bool SM, bool PLAIN>
__global__ void __launch_bounds__(kWarps * 32) bwd_kernel(const Call c, const float* delta, float* dq_acc,
                                                          float* dbias_acc) {
  static_assert(!(SM && PLAIN));
  using L = BwdSmem<T, D>;
  constexpr bool RAW = std::is_same_v<T, float> && !EXACT;  // TF32: inputs rounded once a call (flash.cu)
  constexpr int LD = L::LD, NT = BMQ / 8, DT = D / 8, DC = 64;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem + L::k);
  T* sV = reinterpret_cast<T*>(smem + L::v);
  T* sQ = reinterpret_cast<T*>(smem + L::q);
  T* sDO = reinterpret_cast<T*>(smem + L::dout);
  int2* sKeys = reinterpret_cast<int2*>(smem + L::keys);
  float* sLse = reinterpret_cast<float*>(smem + L::lse);
  float* sDelta = reinterpret_cast<float*>(smem + L::delta);
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q, Hkv = p.heads_kv;
  const int64_t group = Hq / Hkv, n_qt = (Sq + BMQ - 1) / BMQ;
  // Key tiles major over every (batch, kv head): a causal call's heaviest blocks (the first
  // keys, kept by every later query tile) start first, so the last wave is of light ones.
  const int64_t task = blockIdx.x, nbh = p.batch * Hkv;
  const int64_t kt = task / nbh, hk = task % Hkv, b = (task % nbh) / Hkv;
  const int64_t k0 = kt * kKeys, Dqk = p.head_dim_qk, Dv = p.head_dim_v;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;

  const T* kp = static_cast<const T*>(c.a.k) + b * c.a.sk.b + k0 * c.a.sk.s + hk * c.a.sk.h;
  const T* vp = static_cast<const T*>(c.a.v) + b * c.a.sv.b + k0 * c.a.sv.s + hk * c.a.sv.h;
  const int64_t keys = std::min<int64_t>(kKeys, Skv - k0);
  cp_async_rows<T, D, LD>(sK, kp, c.a.sk.s, keys, Dqk, kKeys);
  cp_async_rows<T, D, LD>(sV, vp, c.a.sv.s, keys, Dv, kKeys);
  cp_async_commit();

  // The block's work: u = q-head-in-group * n_qt + query tile, over tiles keeping a key of
  // [k0, k0 + kKeys) (TileRange depends on the tile only).
  const int64_t n_u = group * n_qt;
  auto next = [&](int64_t u) { return next_bwd_tile(c, b, n_qt, n_u, k0, u); };
  // Tile u's Q, dO rows (cp.async, one group; HALF: half hq's) into buffer buf, and with the
  // first rows the tile's kept keys, lse, delta.
  constexpr bool HALF = L::HALF;
  constexpr int QR = L::QROWS;
  auto issue = [&](int64_t u, int buf, int hq) {
    const int64_t h = hk * group + u / n_qt, t0 = (u % n_qt) * BMQ, q0 = t0 + hq * QR;
    const int64_t rows = std::min<int64_t>(QR, Sq - q0);
    cp_async_rows<T, D, LD>(sQ + buf * QR * LD, static_cast<const T*>(c.a.q) + b * c.a.sq.b + q0 * c.a.sq.s + h * c.a.sq.h,
                     c.a.sq.s, rows, Dqk, QR);
    cp_async_rows<T, D, LD>(sDO + buf * QR * LD,
                     static_cast<const T*>(c.a.dout) + b * c.a.sdo.b + q0 * c.a.sdo.s + h * c.a.sdo.h, c.a.sdo.s,
                     rows, Dv, QR);
    cp_async_commit();
    if (hq == 0) load_bwd_rows(c, delta, b, h, t0, sKeys + buf * BMQ, sLse + buf * BMQ, sDelta + buf * BMQ);
  };
  // dQ += dS K for 16 queries from row i0 (dS^T's columns at sDS, [key][query] rows of LD)
  // and head-dim columns d0 .. d0 + DC - 1 (flash_common.cuh's add_dq_rows).
  auto add_dq = [&](const T* sDS, int64_t h, int64_t i0, int d0) {
    add_dq_rows<T, LD, kKeys, DC, EXACT, RAW>(dq_acc + ((b * Sq + i0) * Hq + h) * c.Dp + d0, Hq * c.Dp, Sq - i0,
                                              Dqk - d0, sDS, sK + d0, lane);
  };

  // dK, dV rows g, g + 8 of the warp's keys, columns 8 dn + 2t, + 1 (C layout).
  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int dn = 0; dn < DT; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dn][e] = dv[dn][e] = 0.0f;

  SmGradSums sums;  // score_mod operand gradients (c.sm_dops)
  if (SM && c.sm_dops) sm_sums_init(sums);
  // The plain TF32 instance at head dim 64 holds the warp's K and V rows as A fragments for
  // the block (64 registers, from the tile once it lands): S^T and dP^T read only Q and dO
  // from shared memory.
  constexpr bool REGA = RAW && PLAIN && D == 64;
  uint32_t ka[REGA ? D / 8 : 1][4], va[REGA ? D / 8 : 1][4];

  int64_t u = next(0);
  if (u < n_u) issue(u, 0, 0);
  for (int it = 0; u < n_u; ++it) {
    const int buf = L::NBUF == 2 ? it & 1 : 0;
    if constexpr (!HALF) {
      cp_async_wait<0>();
      __syncthreads();  // tile u landed; every warp is done with buffer buf ^ 1
    }
    if constexpr (REGA) {
      if (it == 0) {  // K and V landed with the first tile
#pragma unroll
        for (int ks = 0; ks < D / 8; ++ks) {
          ldsm_tf32_a<LD>(ka[ks], sK + warp * 16 * LD, ks * 8, lane);
          ldsm_tf32_a<LD>(va[ks], sV + warp * 16 * LD, ks * 8, lane);
        }
      }
    }
    const int64_t un = next(u + 1);
    if (L::NBUF == 2 && un < n_u) issue(un, buf ^ 1, 0);

    const int64_t h = hk * group + u / n_qt, q0 = (u % n_qt) * BMQ;
    const T* bias = bias_plane<T>(c, b, h);
    float* dbias = nullptr;
    if (dbias_acc) dbias = dbias_acc + (b / c.bs) * c.a.bias_slice + (b % c.bs) * c.a.bias_b + h * c.a.bias_h;
    const Drop drop(c, b, h);
    const SmHead sm = sm_head(c, b, h);
    T* sQb = sQ + buf * QR * LD;
    T* sDOb = sDO + buf * QR * LD;
    const int2* kept = sKeys + buf * BMQ;
    const float* lseb = sLse + buf * BMQ;
    const float* deltab = sDelta + buf * BMQ;

    // Dropout's keep bits first, while only dK, dV hold registers: bit 4 n + e for element
    // (n, e) below (drop.z's rule; its value is inv_keep or 0).
    const uint32_t zbits = PLAIN ? 0u : bwd_drop_bits(drop, q0, k0 + warp * 16 + g, t);

    // The tile in two halves of 32 queries (hq), so that S^T and dP^T take 32 registers,
    // not 64, beside dK and dV's 128. Half 0's dS^T waits in `held` (packed as T; float32:
    // the floats) until no warp reads the dO buffer any more.
    constexpr int NH = NT / 2, QH = BMQ / 2;
    uint32_t held[NH][4];
    const int j0 = int(k0) + warp * 16 + g;  // keys fit int32 (RowInfo's)
    const int64_t bs = c.a.bias_s;
#pragma unroll
    for (int hq = 0; hq < 2; ++hq) {
      if constexpr (HALF) {
        cp_async_wait<0>();
        __syncthreads();  // the half landed (with the tile's rows for half 0)
      }
      T* sQh = HALF ? sQb : sQb + hq * QH * LD;
      T* sDOh = HALF ? sDOb : sDOb + hq * QH * LD;
      // st[n][e], dpt[n][e]: key 16 w + g + 8 (e / 2), query 32 hq + 8 n + 2t + e % 2.
      float st[NH][4], dpt[NH][4];
#pragma unroll
      for (int n = 0; n < NH; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
      // S^T = K_w Q^T and dP^T = V_w dO^T, in one k loop.
      if constexpr (REGA)
        mma_abt2_rega<LD, QH, D>(st, ka, sQh, dpt, va, sDOh, lane);
      else
        mma_abt2<T, LD, QH, D, EXACT, 1, RAW>(st, sK + warp * 16 * LD, sQh, dpt, sV + warp * 16 * LD, sDOh, lane);

      // P^T (dropped out) into st, dS^T into dpt (bwd_kernel's element step); bias and
      // dbias at query i, key j through pointers stepped by 8 queries per n.
      const T* bq = bias ? bias + (q0 + hq * QH + 2 * t) * bs + j0 : nullptr;
      float* dbq = dbias ? dbias + (q0 + hq * QH + 2 * t) * bs + j0 : nullptr;
      if constexpr (PLAIN)
        bwd_elements_plain<NH>(st, dpt, p.scale * kLog2e, j0, int(k0) + warp * 16, hq * QH, t, kept,
                               lseb, deltab);
      else
        bwd_elements<T, NH, SM>(st, dpt, c, j0, hq * QH, t, kept, lseb, deltab, bq, dbq, bs, drop.on,
                                drop.inv_keep, zbits >> (4 * hq * NH), sm, q0, sums);
      mma_pb<T, LD, QH, D, EXACT, RAW>(dv, st, sDOh, lane);   // dV += P^T dO
      mma_pb<T, LD, QH, D, EXACT, RAW>(dk, dpt, sQh, lane);   // dK += dS^T Q

      // dS^T [key][query] (T; float32 for float32, TF32-rounded when RAW) over the dO tile
      // at the end: the warp's rows g, g + 8, query pairs 8 n + 2t of each half.
      // HALF: the half's dS^T [key][32 queries] over its Q and dO (64 rows of LD).
      T* sDS = HALF ? sQb : sDOb;
      auto put = [&](int hh, int n, int r, uint32_t x0, uint32_t x1) {
        T* dst = sDS + (warp * 16 + g + 8 * r) * LD + hh * QH + 8 * n + 2 * t;
        if constexpr (std::is_same_v<T, float>) {
          dst[0] = __uint_as_float(x0);
          dst[1] = __uint_as_float(x1);
        } else {
          *reinterpret_cast<uint32_t*>(dst) = x0;
        }
      };
#pragma unroll
      for (int n = 0; n < NH; ++n) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          uint32_t x0, x1;
          if constexpr (RAW) {
            x0 = to_tf32(dpt[n][2 * r]), x1 = to_tf32(dpt[n][2 * r + 1]);
          } else if constexpr (std::is_same_v<T, float>) {
            x0 = __float_as_uint(dpt[n][2 * r]), x1 = __float_as_uint(dpt[n][2 * r + 1]);
          } else {
            x0 = pack2<T>(dpt[n][2 * r], dpt[n][2 * r + 1]), x1 = 0;
          }
          if constexpr (HALF) {
            if (n == 0 && r == 0) __syncthreads();  // no warp reads the half's Q, dO any more
            put(0, n, r, x0, x1);
          } else if (hq == 0) {
            held[n][2 * r] = x0, held[n][2 * r + 1] = x1;
          } else {
            if (n == 0 && r == 0) __syncthreads();  // no warp reads this buffer's dO any more
            put(0, n, r, held[n][2 * r], held[n][2 * r + 1]);
            put(1, n, r, x0, x1);
          }
        }
      }
      if constexpr (HALF) {
        __syncthreads();
        // dQ for the half's 32 queries: warp w takes 16 of them (w % 2) and head-dim columns
        // DC (w / 2) .., D = 2 DC.
        static_assert(D == 2 * DC && QH == 32, "HALF: four 16 x DC products a half");
        const int d0 = (warp / 2) * DC;
        if (d0 < Dqk) add_dq(sDS + (warp % 2) * 16, h, q0 + hq * QH + (warp % 2) * 16, d0);
        __syncthreads();  // every warp is done with the buffer
        if (hq == 0)
          issue(u, 0, 1);
        else if (un < n_u)
          issue(un, 0, 0);
      }
    }

    if constexpr (!HALF) {
      __syncthreads();
      // dQ += dS K for queries 16 w .. 16 w + 15, head-dim chunks of DC.
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += DC) {
        if (d0 >= Dqk) break;
        add_dq(sDOb + warp * 16, h, q0 + warp * 16, d0);
      }
    }
    u = un;
  }
  cp_async_wait<0>();  // K, V when no tile kept a key
  if (SM && c.sm_dops) sm_sums_flush(sums);

  // dK = scale dK_acc, dV = dV_acc for keys < Skv, columns < the real dims.
  T* dkp = static_cast<T*>(c.a.dk) + b * c.a.sdk.b + k0 * c.a.sdk.s + hk * c.a.sdk.h;
  T* dvp = static_cast<T*>(c.a.dv) + b * c.a.sdv.b + k0 * c.a.sdv.s + hk * c.a.sdv.h;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = warp * 16 + g + 8 * r;
    if (row >= keys) continue;
#pragma unroll
    for (int dn = 0; dn < DT; ++dn) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = 8 * dn + 2 * t + e;
        if (col < Dqk) dkp[row * c.a.sdk.s + col] = from_f<T>(p.scale * dk[dn][2 * r + e]);
        if (col < Dv) dvp[row * c.a.sdv.s + col] = from_f<T>(dv[dn][2 * r + e]);
      }
    }
  }
}

template <class T, int D, bool EXACT, bool SM>
Status launch_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream) {
  const AttnParams& p = c.p;
  const int64_t blocks = p.batch * p.heads_kv * ((p.seqlen_kv + kKeys - 1) / kKeys);
  const size_t smem = BwdSmem<T, D>::total;
  auto kernel = bwd_kernel<T, D, EXACT, SM, false>;
  if constexpr (!SM) {
    const bool plain = !c.a.bias && !dbias_acc && !has_dropout(p);
    if (plain) kernel = bwd_kernel<T, D, EXACT, false, true>;
  }
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if constexpr (BwdSmem<T, D>::HALF)  // two blocks an SM need the whole carveout as shared memory
    FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                 int(cudaSharedmemCarveoutMaxShared)));
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(c, delta, dq_acc, dbias_acc);
  return cuda_status(cudaGetLastError(), "the flash backward (mma)");
}

size_t bwd_smem(int elem, int64_t d) {
  if (elem == 4) return d == 64 ? BwdSmem<float, 64>::total : BwdSmem<float, 128>::total;
  return d == 64 ? BwdSmem<__half, 64>::total : BwdSmem<__half, 128>::total;
}

}  // namespace

bool mma_bwd_fits(const AttnParams& p, const AttnTensors& a) {
  if (std::max(p.head_dim_qk, p.head_dim_v) > 128) return false;
  return mma_rows_fit(p, {a.sq, a.sk, a.sv, a.sdo}, {a.q, a.k, a.v, a.dout},
                      bwd_smem(p.dtype == FA_FLOAT32 ? 4 : 2, mma_head_dim_tile(p)));
}

template <class T, bool EXACT>
Status mma_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream) {
  if (mma_head_dim_tile(c.p) == 64)
    return c.sm ? launch_bwd<T, 64, EXACT, true>(c, delta, dq_acc, dbias_acc, stream)
                : launch_bwd<T, 64, EXACT, false>(c, delta, dq_acc, dbias_acc, stream);
  return c.sm ? launch_bwd<T, 128, EXACT, true>(c, delta, dq_acc, dbias_acc, stream)
              : launch_bwd<T, 128, EXACT, false>(c, delta, dq_acc, dbias_acc, stream);
}

template Status mma_bwd<__nv_bfloat16, false>(const Call&, const float*, float*, float*, cudaStream_t);
template Status mma_bwd<__half, false>(const Call&, const float*, float*, float*, cudaStream_t);
template Status mma_bwd<float, false>(const Call&, const float*, float*, float*, cudaStream_t);
template Status mma_bwd<float, true>(const Call&, const float*, float*, float*, cudaStream_t);

}  // namespace fusedattn::cuda::flash::detail
