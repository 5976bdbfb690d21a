// The register-resident CUDA flash forward (FlashAttention-2's layout): flash.cu's forward
// algorithm and rules with S, P and O in registers; head dims up to 128 here, up to 512 in
// wide_fwd_kernel below (the head dims streamed, the output in column chunks).
//
// One block = one (batch, q head, query tile of 128 rows), 8 warps of 16 rows each; the
// heaviest tiles (the last, under a causal mask) of every head start first. Q stays in
// shared memory; K and V tiles of 64 keys stream through two cp.async buffers (tile t + 1
// loads while tile t computes). Per key tile a warp computes S = Q K^T into mma.sync
// accumulators, masks / biases / exponentiates / drops out its rows in registers (a row's
// four lanes join their maxima and sums with two shuffles) and multiplies P, repacked as
// the A operand, by V into O. 16-bit inputs use ldmatrix and m16n8k16; float32 m16n8k8 in
// TF32, 3xTF32 when EXACT (mma.cuh); in TF32 the inputs come rounded once a call
// (flash.cu's round_inputs_tf32), not at every fragment load (cvt.rna.tf32 is a few
// integer instructions on sm_90).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "fusedattn/attention/cuda/flash_common.cuh"
#include "fusedattn/attention/cuda/mma.cuh"
#include "fusedattn/attention/options.h"
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

// Rows g and g + 8 of a warp (fwd.cc's per-row state): kept keys, m (running max with the
// sink), l (sum), mx (max of real keys).
struct FwdRows {
  RowInfo ri[2];
  int64_t row[2];
  float m[2], l[2], mx[2];
  __device__ __forceinline__ FwdRows(const Call& c, int64_t b, int64_t row0, float sink) {
    const int64_t Sq = c.p.seqlen_q;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row[r] = row0 + 8 * r;
      ri[r] = row[r] < Sq ? c.rows[b * Sq + row[r]] : RowInfo{-1, -1, -1, -1};
      const bool real = ri[r].q_base >= 0;
      m[r] = real ? sink : -kInf;
      l[r] = real && sink != -kInf ? 1.0f : 0.0f;
      mx[r] = -kInf;
    }
  }
};

// Key tile [k0, k0 + kBN) of rows R (fwd.cc's row loop): the raw scores s (mma C layout, n-tile
// n: keys 8 n ..) become P (masked, biased, exponentiated against the new running max,
// dropped out), R's m, l, mx move on, alpha = the factor O must be rescaled by. A tile that
// every row of the warp keeps whole skips the per-key mask test. FULL: dropout (drop.on)
// and the score_mod (sm.prog, applied to each kept score after scale and bias) run.
template <class T, int NT, bool FULL>
__device__ __forceinline__ void softmax_tile(float (&s)[NT][4], float (&alpha)[2], FwdRows& R, const Call& c,
                                             int64_t k0, int t, const T* bias, const Drop& drop,
                                             const SmHead& sm) {
  const float scale = c.p.scale;
  const int jt = int(k0) + 2 * t;  // this thread's first key (keys fit int32: RowInfo)
  const bool whole = __all_sync(0xffffffffu, R.ri[0].lo <= k0 && R.ri[0].hi >= k0 + kBN &&
                                                 R.ri[1].lo <= k0 && R.ri[1].hi >= k0 + kBN);
  float rmax[2] = {-kInf, -kInf};
  if (whole && !bias && !(FULL && sm.prog)) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= scale, rmax[e >> 1] = max_nan(rmax[e >> 1], s[n][e]);
  } else {
    int64_t qpos[2] = {0, 0};  // ALiBi: the rows' query positions in their sequences
    if constexpr (FULL)
      if (sm.form == kDevFormAlibi)
        for (int r = 0; r < 2; ++r) qpos[r] = sm_qpos(sm, R.row[r], R.ri[r]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      bool keep[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, j = jt + 8 * n + (e & 1);
        keep[e] = j >= R.ri[r].lo && j < R.ri[r].hi;
        s[n][e] *= scale;
        if (bias && keep[e]) s[n][e] += c.bmul * to_f(bias[R.row[r] * c.a.bias_s + j]);
      }
      if constexpr (FULL) {
        if (sm.form == kDevFormSoftcap) {  // closed forms inline (sm_head: none without sm)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = sm_softcap(sm, s[n][e]);
        } else if (sm.form == kDevFormAlibi) {
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[n][e] += sm.fa * sm_alibi_dist(sm, qpos[e >> 1], R.ri[e >> 1].kv_base, jt + 8 * n + (e & 1));
        } else if (sm.prog) {  // the interpreter: the n-tile's four scores at once
          Sm4 q;
          q.live = 0;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            q.i[e] = R.row[e >> 1], q.j[e] = jt + 8 * n + (e & 1), q.s[e] = s[n][e];
            q.live |= uint32_t(keep[e]) << e;
          }
          if (q.live) {
            const float4 f = sm_forward4(sm, q);
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = lane4(f, e);
          }
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = keep[e] ? s[n][e] : -kInf;  // a masked key's NaN does not count
        rmax[e >> 1] = max_nan(rmax[e >> 1], s[n][e]);
      }
    }
  }
  float sum[2] = {0.0f, 0.0f};
  bool live[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rmax[r] = quad_max(rmax[r]);  // NaN when a kept score is NaN
    const bool any = max(int64_t(R.ri[r].lo), k0) < min(int64_t(R.ri[r].hi), k0 + kBN);
    R.mx[r] = nan_max(R.mx[r], rmax[r]);
    const float m_new = nan_max(R.m[r], rmax[r]);
    live[r] = m_new > -kInf;
    alpha[r] = 1.0f;
    if (!live[r]) {
      if (m_new != m_new && any) R.m[r] = R.l[r] = m_new;
    } else {
      alpha[r] = R.m[r] == m_new ? 1.0f : exp_approx(R.m[r] - m_new);
      R.m[r] = m_new;
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      // exp(-inf) = 0: masked keys; a dead row's probabilities are 0.
      float pr = live[r] ? exp_approx(s[n][e] - R.m[r]) : 0.0f;
      sum[r] += pr;
      if constexpr (FULL)
        if (drop.on && pr != 0.0f) pr *= drop.z(R.row[r], jt + 8 * n + (e & 1));
      s[n][e] = pr;
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] = quad_sum(sum[r]);
    if (live[r]) R.l[r] = R.l[r] * alpha[r] + sum[r];
  }
}

// O *= alpha per row, then O += P V (V: the tile's kBN rows at sV, N columns).
template <class T, int LD, int N, bool EXACT, bool RAW = false>
__device__ __forceinline__ void rescale_add_pv(float (&o)[N / 8][4], const float (&alpha)[2], const float (&pr)[kBN / 8][4],
                                               const T* sV, int lane) {
#pragma unroll
  for (int dn = 0; dn < N / 8; ++dn) {
    o[dn][0] *= alpha[0], o[dn][1] *= alpha[0];
    o[dn][2] *= alpha[1], o[dn][3] *= alpha[1];
  }
  mma_pb<T, LD, kBN, N, EXACT, RAW>(o, pr, sV, lane);
}

// out = O / l for rows R (columns col0 + 8 dn + 2t, + 1 below Dv), lse = m + log l when
// write_lse (fwd.cc's end of task); returns the rows' max of real keys, for max_logit.
template <class T, int DN>
__device__ __forceinline__ float finish_rows(const float (&o)[DN][4], const FwdRows& R, const Call& c, int64_t b,
                                             int64_t h, int t, int64_t col0, bool write_lse) {
  T* out = static_cast<T*>(c.a.out) + b * c.a.so.b + h * c.a.so.h + col0;
  const int64_t Dv = c.p.head_dim_v - col0;
  float local_max = -kInf;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (R.row[r] >= c.p.seqlen_q) continue;
    const bool any = R.l[r] != 0.0f;
    const bool zero = !any || R.ri[r].hi <= R.ri[r].lo;
    const float inv = any ? 1.0f / R.l[r] : 0.0f;
    T* orow = out + R.row[r] * c.a.so.s;
#pragma unroll
    for (int dn = 0; dn < DN; ++dn) {
      const int col = dn * 8 + 2 * t;
      if (col < Dv) orow[col] = from_f<T>(zero ? 0.0f : o[dn][2 * r] * inv);
      if (col + 1 < Dv) orow[col + 1] = from_f<T>(zero ? 0.0f : o[dn][2 * r + 1] * inv);
    }
    if (write_lse && t == 0)
      c.a.lse[b * c.a.slse.b + h * c.a.slse.h + R.row[r] * c.a.slse.s] = any ? R.m[r] + logf(R.l[r]) : -kInf;
    local_max = nan_max(local_max, R.mx[r]);
  }
  return local_max;
}

// The block's max of the warps' local_max into *dst (sWmax: kWarps floats of shared memory).
__device__ __forceinline__ void block_max(float local_max, float* sWmax, float* dst, int warp, int lane) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) local_max = nan_max(local_max, __shfl_xor_sync(0xffffffffu, local_max, off));
  if (lane == 0) sWmax[warp] = local_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float tm = -kInf;
    for (int w = 0; w < kWarps; ++w) tm = nan_max(tm, sWmax[w]);
    *dst = tm;
  }
}

// FULL: the full per-element step, dropout and score_mod (a kernel of its own: their
// per-key Philox and interpreter code out of the hot loop).
template <class T, int D, bool EXACT, bool FULL>
__global__ void __launch_bounds__(kWarps * 32) fwd_kernel(const Call c, float* tile_max) {
  constexpr int BM = kMmaBM, NT = kBN / 8, DT = D / 8;
  constexpr bool RAW = std::is_same_v<T, float> && !EXACT;  // TF32: inputs rounded once a call (flash.cu)
  using L = Smem<T, D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::q);
  T* sK = reinterpret_cast<T*>(smem + L::k);
  T* sV = reinterpret_cast<T*>(smem + L::v);
  float* sWmax = reinterpret_cast<float*>(smem + L::wmax);
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q;
  const int64_t n_qt = (Sq + BM - 1) / BM;
  // Query tiles major, the last first, over every (batch, head): a causal call's heaviest
  // blocks start first, so the last wave is of light ones.
  const int64_t task = blockIdx.x, nbh = p.batch * Hq;
  const int64_t qt = n_qt - 1 - task / nbh, h = task % Hq, b = (task % nbh) / Hq;
  const int64_t hk = h / (Hq / p.heads_kv), q0 = qt * BM;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;

  const T* q = static_cast<const T*>(c.a.q) + b * c.a.sq.b + q0 * c.a.sq.s + h * c.a.sq.h;
  const T* kp = static_cast<const T*>(c.a.k) + b * c.a.sk.b + hk * c.a.sk.h;
  const T* vp = static_cast<const T*>(c.a.v) + b * c.a.sv.b + hk * c.a.sv.h;
  const T* bias = bias_plane<T>(c, b, h);
  const Drop drop(c, b, h);
  const SmHead sm = sm_head(c, b, h);

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

  FwdRows R(c, b, q0 + warp * 16 + g, sink_logit(c, b, h));
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
    mma_abt<T, L::LD, kBN, D, EXACT, D, RAW>(s, sQ + warp * 16 * L::LD, sK + buf * kBN * L::LD, lane);  // S = Q_w K^T
    float alpha[2];
    softmax_tile<T, NT, FULL>(s, alpha, R, c, k0, t, bias, drop, sm);
    rescale_add_pv<T, L::LD, D, EXACT, RAW>(o, alpha, s, sV + buf * kBN * L::LD, lane);  // O = alpha O + P V
    __syncthreads();  // the next iteration loads into this buffer
  }
  cp_async_wait<0>();

  const float local_max = finish_rows<T, DT>(o, R, c, b, h, t, 0, true);
  if (tile_max) block_max(local_max, sWmax, tile_max + (b * Hq + h) * n_qt + qt, warp, lane);
}

// ---- head dims above 128 ------------------------------------------------------------
// The same forward with the head dims streamed: one block = one (batch, q head, query tile
// of 128 rows, output chunk oc of kDO = 128 columns of v), 8 warps of 16 rows; per key tile
// S = Q K^T over the whole q/k head dim in chunks of KC columns, then O[:, oc] += P V[:, oc].
// S is thus computed once per output chunk of 256 columns (without dropout, score_mod or
// 3xTF32; else 128): the price of O staying in registers. Only the first chunk's block writes
// lse and the tile's max. One block of 8 warps per SM (registers). Two ways to feed it:
//   QRES (where the shared memory holds the query tile whole: q/k head dims up to 256 in
//        float32, 512 in 16-bit; 190 / 222 KiB for 16-bit / float32 at 256 output columns):
//        the tile's Q loaded once; K chunks through a ring of three cp.async stages (chunk
//        c + 2 loads while chunk c multiplies); one V buffer, loaded beside the key tile's
//        first K chunk once every warp is done with the last tile's P V;
//   streamed (else, e.g. sm_80's 163 KiB): Q and K chunks through two stages, Q's reloaded
//        per key tile (from L2), V through two buffers; 123 KiB for 16-bit inputs (90 KiB
//        with 128 columns), 188 KiB for float32 (KC = 32; 123 with 128-column chunks).
constexpr int kMaxDim = 512;

// DO: the output chunk, 256 columns where v's head dim is wider than 128 and the call has no
// dropout, score_mod or 3xTF32 (O's 128 registers fit beside the rest; with their state or
// 3xTF32's fragments they spill), else 128 (wide_do).
template <class T, int DO>
struct WideSmem {
  static constexpr int KC = sizeof(T) == 4 ? 32 : 64, kPad = 16 / int(sizeof(T));
  static constexpr int kDO = DO;
  static constexpr int LDC = KC + kPad, LDO = kDO + kPad;
  static constexpr int stage = (kMmaBM + kBN) * LDC, q_at = 0, k_at = kMmaBM * LDC;  // elements
  static constexpr size_t v = size_t(2) * stage * sizeof(T), wmax = v + size_t(2) * kBN * LDO * sizeof(T),
                          total = wmax + kWarps * 4;
};

// QRES's: Q [kMmaBM][LDQ] (QD columns: the widest q/k head dim it takes), NST K stages
// [kBN][LDC], one V buffer [kBN][LDO], the warps' maxima. LDQ = 4 mod 32 floats / 16 bytes
// past 128: conflict-free fragment loads.
template <class T, int DO>
struct WideQSmem {
  using W = WideSmem<T, DO>;
  static constexpr int NST = 3, QD = sizeof(T) == 4 ? 256 : kMaxDim, LDQ = QD + W::kPad;
  static constexpr size_t k = size_t(kMmaBM) * LDQ * sizeof(T), v = k + size_t(NST) * kBN * W::LDC * sizeof(T),
                          wmax = v + size_t(kBN) * W::LDO * sizeof(T), total = wmax + kWarps * 4;
};

template <class T, bool EXACT, bool FULL, int DO, bool QRES>
__global__ void __launch_bounds__(kWarps * 32) wide_fwd_kernel(const Call c, float* tile_max) {
  static_assert(DO == 128 || (DO == 256 && !EXACT && !FULL), "256-column chunks: no 3xTF32, dropout, score_mod");
  using L = WideSmem<T, DO>;
  using LQ = WideQSmem<T, DO>;
  constexpr bool RAW = std::is_same_v<T, float> && !EXACT;  // TF32: inputs rounded once a call (flash.cu)
  constexpr int BM = kMmaBM, NT = kBN / 8, kDO = L::kDO, DN = kDO / 8;
  constexpr int KC = L::KC, LDC = L::LDC, LDO = L::LDO, LDQ = LQ::LDQ, VE = 16 / int(sizeof(T));
  extern __shared__ __align__(128) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem + (QRES ? LQ::k : 0));
  T* sQ = reinterpret_cast<T*>(smem);  // QRES
  T* sV = reinterpret_cast<T*>(smem + (QRES ? LQ::v : L::v));
  float* sWmax = reinterpret_cast<float*>(smem + (QRES ? LQ::wmax : L::wmax));
  const AttnParams& p = c.p;
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q, Dqk = p.head_dim_qk, Dv = p.head_dim_v;
  const int64_t n_qt = (Sq + BM - 1) / BM, n_oc = (Dv + kDO - 1) / kDO, n_kc = (Dqk + KC - 1) / KC;
  const int64_t task = blockIdx.x, oc = task % n_oc, rest = task / n_oc;
  const int64_t qt = n_qt - 1 - rest % n_qt, h = (rest / n_qt) % Hq, b = rest / (n_qt * Hq);
  const int64_t hk = h / (Hq / p.heads_kv), q0 = qt * BM, oc0 = oc * kDO;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;

  const T* q = static_cast<const T*>(c.a.q) + b * c.a.sq.b + q0 * c.a.sq.s + h * c.a.sq.h;
  const T* kp = static_cast<const T*>(c.a.k) + b * c.a.sk.b + hk * c.a.sk.h;
  const T* vp = static_cast<const T*>(c.a.v) + b * c.a.sv.b + hk * c.a.sv.h + oc0;
  const T* bias = bias_plane<T>(c, b, h);
  const Drop drop(c, b, h);
  const SmHead sm = sm_head(c, b, h);
  const int64_t rows = std::min<int64_t>(BM, Sq - q0);

  const TileRange tr = c.tiles[b * n_qt + qt];
  const int64_t kb = tr.lo / kBN * kBN;
  const int64_t n_kt = tr.lo < tr.hi ? (tr.hi - kb + kBN - 1) / kBN : 0;
  auto issue_v = [&](int64_t it, T* dst) {
    const int64_t k0 = kb + it * kBN, keys = std::min<int64_t>(kBN, Skv - k0);
    cp_async_rows<T, kDO, LDO>(dst, vp + k0 * c.a.sv.s, c.a.sv.s, keys, Dv - oc0, kBN);
  };

  FwdRows R(c, b, q0 + warp * 16 + g, sink_logit(c, b, h));
  float o[DN][4];
#pragma unroll
  for (int dn = 0; dn < DN; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;

  if constexpr (QRES) {
    // Step j = (key tile j / n_kc, head-dim chunk j % n_kc): its K chunk goes to stage j % NST,
    // in the cp.async group committed two steps before (group j; the prologue's are 0 and 1).
    constexpr int NST = LQ::NST;
    const int64_t n_steps = n_kt * n_kc;
    auto issue_k = [&](int64_t j) {
      const int64_t it = j / n_kc, d0 = (j % n_kc) * KC, k0 = kb + it * kBN;
      cp_async_rows<T, KC, LDC>(ring + int(j % NST) * kBN * LDC, kp + k0 * c.a.sk.s + d0, c.a.sk.s,
                                std::min<int64_t>(kBN, Skv - k0), Dqk - d0, kBN);
    };
    if (n_kt > 0) {
      // The query tile's rows and n_kc chunks of columns (zeros past the rows and Dqk).
      const int cpr = int(n_kc) * KC / VE;
      for (int idx = threadIdx.x; idx < BM * cpr; idx += blockDim.x) {
        const int r = idx / cpr, ch = idx % cpr;
        const bool ok = r < rows && ch * VE < Dqk;
        cp_async16(sQ + r * LDQ + ch * VE, ok ? q + r * c.a.sq.s + ch * VE : q, ok);
      }
      issue_v(0, sV);
      issue_k(0);
    }
    cp_async_commit();
    if (n_steps > 1) issue_k(1);
    cp_async_commit();
    for (int64_t it = 0; it < n_kt; ++it) {
      float sc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
      for (int64_t kc = 0; kc < n_kc; ++kc) {
        const int64_t j = it * n_kc + kc;
        cp_async_wait<1>();
        __syncthreads();  // step j landed; every warp is done with stage (j + 2) % NST and, at kc 0, with V
        if (kc == 0 && it > 0) issue_v(it, sV);
        if (j + 2 < n_steps) issue_k(j + 2);
        cp_async_commit();
        mma_abt<T, LDC, kBN, KC, EXACT, KC, RAW, LDQ>(sc, sQ + warp * 16 * LDQ + kc * KC,
                                                      ring + int(j % NST) * kBN * LDC, lane);  // S += Q_w K^T
      }
      // V (group it n_kc + 2 for it > 0) has landed with the last step's group when the tile
      // has three chunks or more; else wait for it.
      if (n_kc < 3 && it > 0) {
        cp_async_wait<0>();
        __syncthreads();
      }
      float alpha[2];
      softmax_tile<T, NT, FULL>(sc, alpha, R, c, kb + it * kBN, t, bias, drop, sm);
      rescale_add_pv<T, LDO, kDO, EXACT, RAW>(o, alpha, sc, sV, lane);
    }
  } else {
    // Head-dim chunk kc of key tile it into stage s (and with chunk 0 the tile's V columns).
    auto issue = [&](int64_t it, int64_t kc, int s) {
      const int64_t k0 = kb + it * kBN, keys = std::min<int64_t>(kBN, Skv - k0), d0 = kc * KC;
      T* st = ring + s * L::stage;
      cp_async_rows<T, KC, LDC>(st + L::q_at, q + d0, c.a.sq.s, rows, Dqk - d0, BM);
      cp_async_rows<T, KC, LDC>(st + L::k_at, kp + k0 * c.a.sk.s + d0, c.a.sk.s, keys, Dqk - d0, kBN);
      if (kc == 0) issue_v(it, sV + (it & 1) * kBN * LDO);
    };
    if (n_kt > 0) issue(0, 0, 0);
    cp_async_commit();
    int s = 0;
    for (int64_t it = 0; it < n_kt; ++it) {
      float sc[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
      for (int64_t kc = 0; kc < n_kc; ++kc) {
        cp_async_wait<0>();
        __syncthreads();  // chunk kc landed; every warp is done with stage s ^ 1 (and the last V)
        if (kc + 1 < n_kc) issue(it, kc + 1, s ^ 1);
        else if (it + 1 < n_kt) issue(it + 1, 0, s ^ 1);
        cp_async_commit();
        const T* st = ring + s * L::stage;
        mma_abt<T, LDC, kBN, KC, EXACT, KC, RAW>(sc, st + L::q_at + warp * 16 * LDC, st + L::k_at, lane);  // S += Q_w K^T
        s ^= 1;
      }
      float alpha[2];
      softmax_tile<T, NT, FULL>(sc, alpha, R, c, kb + it * kBN, t, bias, drop, sm);
      rescale_add_pv<T, LDO, kDO, EXACT, RAW>(o, alpha, sc, sV + (it & 1) * kBN * LDO, lane);
    }
  }
  cp_async_wait<0>();

  const float local_max = finish_rows<T, DN>(o, R, c, b, h, t, oc0, oc == 0);
  if (tile_max && oc == 0) block_max(local_max, sWmax, tile_max + (b * Hq + h) * n_qt + qt, warp, lane);
}

template <class T, int D, bool EXACT, bool FULL>
Status launch_fwd(const Call& c, float* tile_max, cudaStream_t stream) {
  const AttnParams& p = c.p;
  const int64_t blocks = p.batch * p.heads_q * ((p.seqlen_q + kMmaBM - 1) / kMmaBM);
  const size_t smem = Smem<T, D>::total;
  auto kernel = fwd_kernel<T, D, EXACT, FULL>;
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(c, tile_max);
  return cuda_status(cudaGetLastError(), "the flash forward (mma)");
}

// The output chunk of a call: 256 columns where wide_fwd_kernel takes them, v's head dim is
// above 128 (a call of Dv <= 128 would compute half a chunk of zeros: D 384 / Dv 128 in float32
// 2.12 -> 2.41 ms, H200, session 45) and the device has the shared memory (float32's 188 KiB:
// not an sm_80's 163), else 128.
template <class T, bool EXACT, bool FULL>
int wide_do(int64_t dv) {
  return !EXACT && !FULL && dv > 128 && WideSmem<T, 256>::total <= smem_optin() ? 256 : 128;
}

template <class T, bool EXACT, bool FULL, int DO>
Status launch_wide_fwd(const Call& c, float* tile_max, cudaStream_t stream) {
  const AttnParams& p = c.p;
  using L = WideSmem<T, DO>;
  using LQ = WideQSmem<T, DO>;
  const int64_t n_oc = (p.head_dim_v + L::kDO - 1) / L::kDO;
  const int64_t blocks = p.batch * p.heads_q * ((p.seqlen_q + kMmaBM - 1) / kMmaBM) * n_oc;
  // The query tile held whole where the head dim and the device's shared memory allow.
  const bool qres = p.head_dim_qk <= LQ::QD && LQ::total <= smem_optin();
  const size_t smem = qres ? LQ::total : L::total;
  auto kernel = qres ? wide_fwd_kernel<T, EXACT, FULL, DO, true> : wide_fwd_kernel<T, EXACT, FULL, DO, false>;
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<unsigned(blocks), kWarps * 32, smem, stream>>>(c, tile_max);
  return cuda_status(cudaGetLastError(), "the flash forward (mma, head dims > 128)");
}

size_t fwd_smem(int elem, int64_t d) {
  if (elem == 4) return d == 64 ? Smem<float, 64>::total : Smem<float, 128>::total;
  return d == 64 ? Smem<__half, 64>::total : Smem<__half, 128>::total;
}

}  // namespace

size_t smem_optin() {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return 0;
  const std::optional<int64_t> limit = backend_options().cuda_smem_limit;
  return limit && *limit > 0 ? std::min(size_t(optin), size_t(*limit)) : size_t(optin);
}

bool mma_rows_fit(const AttnParams& p, std::initializer_list<ViewStrides> views,
                  std::initializer_list<const void*> ptrs, size_t smem) {
  const int64_t v = 16 / (p.dtype == FA_FLOAT32 ? 4 : 2);
  if (p.head_dim_qk % v || p.head_dim_v % v) return false;
  for (const ViewStrides& s : views)
    if (s.b % v || s.s % v || s.h % v) return false;
  for (const void* ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16) return false;
  return smem <= smem_optin();
}

bool mma_fwd_fits(const AttnParams& p, const AttnTensors& a) {
  const int64_t d = std::max(p.head_dim_qk, p.head_dim_v);
  const int elem = p.dtype == FA_FLOAT32 ? 4 : 2;
  if (d > kMaxDim) return false;
  // (head dims above 128: the 128-column chunks' shared memory; wide_do takes 256 where it fits)
  const size_t smem = d > 128 ? (elem == 4 ? WideSmem<float, 128>::total : WideSmem<__half, 128>::total)
                              : fwd_smem(elem, mma_head_dim_tile(p));
  return mma_rows_fit(p, {a.sq, a.sk, a.sv}, {a.q, a.k, a.v}, smem);
}

template <class T, bool EXACT>
Status mma_fwd(const Call& c, float* tile_max, cudaStream_t stream) {
  const bool full = (c.p.is_training && c.p.dropout > 0.0f) || c.sm;  // Drop's rule, or a score_mod
  if (std::max(c.p.head_dim_qk, c.p.head_dim_v) > 128) {
    if (full) return launch_wide_fwd<T, EXACT, true, 128>(c, tile_max, stream);
    if (wide_do<T, EXACT, false>(c.p.head_dim_v) == 256) {
      if constexpr (!EXACT) return launch_wide_fwd<T, EXACT, false, 256>(c, tile_max, stream);
    }
    return launch_wide_fwd<T, EXACT, false, 128>(c, tile_max, stream);
  }
  if (mma_head_dim_tile(c.p) == 64)
    return full ? launch_fwd<T, 64, EXACT, true>(c, tile_max, stream) : launch_fwd<T, 64, EXACT, false>(c, tile_max, stream);
  return full ? launch_fwd<T, 128, EXACT, true>(c, tile_max, stream) : launch_fwd<T, 128, EXACT, false>(c, tile_max, stream);
}

template Status mma_fwd<__nv_bfloat16, false>(const Call&, float*, cudaStream_t);
template Status mma_fwd<__half, false>(const Call&, float*, cudaStream_t);
template Status mma_fwd<float, false>(const Call&, float*, cudaStream_t);
template Status mma_fwd<float, true>(const Call&, float*, cudaStream_t);

}  // namespace fusedattn::cuda::flash::detail
