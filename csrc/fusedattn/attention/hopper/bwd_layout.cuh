// The Hopper flash backward's data (bwd_kernel.cuh runs it, flash_bwd.cu fills it): its
// arguments (BwdArgs), its blocks' extents and variants, its shared memory (BwdSmem), dQ's
// float32 accumulator order (bwd_dq_index), and the query blocks a key block visits
// (bwd_tile).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedattn/attention/hopper/scores.cuh"
#include "fusedattn/attention/hopper/sm90.cuh"

namespace fusedattn::cuda::hopper {

struct BwdArgs {
  CUtensorMap q, k, v, dout;  // {D, S, H, B}; q and dout boxes {64, 64}, k and v {64, 128}
  // The bias's {Skv, Sq, H, B} (boxes {64, 64}: two a tile) when bias_tma: its tiles come
  // through shared memory (BwdSmem::bias) with Q and dO; else (rows not 16-byte multiples)
  // each value is read from global memory where it is added.
  CUtensorMap bias_map;
  int bias_tma;
  // [B * Hq, sq_pad] (sq_pad: Sq rounded up to 64): lse in log2 units (+inf where a row's P
  // is 0: a row that keeps nothing, a padded or absent one) and D = rowsum(dO * O).
  const float* lse2;
  const float* dsum;
  float* dq_acc;  // [B * Hq, sq_pad, D] in bwd_dq_index's order, zero at launch
  void* dk;
  void* dv;
  int64_t dk_b, dk_s, dk_h, dv_b, dv_s, dv_h;
  int dkv_vec;  // dk and dv 16-byte aligned, strides multiples of 8: 16-byte stores
  int batch, seqlen_q, seqlen_kv, heads_q, heads_per_kv, sq_pad;
  int diag, lo_diag, bottom_right;  // the band, as FwdArgs
  const int* q_lens;
  const int* kv_lens;
  int lens_stride;
  float scale_log2;  // scale log2(e)
  float scale;
  // kSoftcap: x = cap_out tanh(s cap_in) (cap_in = scale / c, cap_out = c log2(e)).
  float cap_in, cap_out;
  // kAlibi: head h's slope slopes[h * slope_stride] * slope_mul (+-log2(e)).
  const float* slopes;
  int slope_stride;
  float slope_mul;
  // Non-null: the slopes' gradient, sum over the head's scores of dS g(kv - q) times
  // dslope_mul (the sign), added to dslopes[h * slope_stride] in float32 (a warp's sum at a
  // time: not bitwise repeatable).
  float* dslopes;
  float dslope_mul;
  // A dense mask (FwdArgs' fields of the same names; its bias values, if any, join the
  // scores: no dbias) or a bias (no dbias): tiles classifies (tbl, 64-query block, 128-key
  // block) as classify_mask does (a bias: every tile 5, its values read, or 13 with its
  // tiles by TMA, bit 3: read by ldmatrix; no bits), keep_bits a mask's bits (rows
  // mask_m * 64 a table).
  const uint16_t* bias;
  int64_t bias_b, bias_h, bias_s;
  float bias_mul;  // the bias in the softmax's log2 units: log2(e), scale log2(e) pre-scale
  int bias_heads;
  uint32_t masked_bits;  // a mask's dropped value; kNoMaskedBits for a bias (none dropped)
  // Non-null (the dense variants): dbias, the bias's strides; each visited element's dS (as the
  // dS^T buffer holds it, in T) times dbias_mul goes there in T, or (dbias_acc non-null: the
  // bias broadcasts) is added to dbias_acc[tbl][q][key] in float32.
  void* dbias;
  float* dbias_acc;
  float dbias_mul;
  int dbias_vec;  // pairs of keys at once: dbias_acc float2-aligned, or dbias 4-byte aligned
  // Whole rows of the tile at once (the dense variants but the keep-only one; dbias with the
  // call's extents, no dbias_acc): the group's dS through the stage's bias buffer (free after
  // the products' barrier), then each thread stores 16 bytes of a row (dbias 16-byte aligned,
  // strides multiples of 8).
  int dbias_tile;
  // dbias written per element: the kernel zeros the rows of its keys no iteration visits (no
  // pass over the whole tensor before it).
  int dbias_zeros;
  const uint8_t* tiles;
  const uint32_t* keep_bits;
  int words_per_row, mask_m, mask_n;
  // A folded mask's column ranges (mask_tiles.cuh's mask_columns: [tbl * mask_n + key block]
  // the query tiles [x, y) that keep a key of it); null: a bias (every tile kept).
  const int2* cols;
  // Non-null: deterministic dQ (kDet); two counters a 64-row block of dq_acc ([B * Hq *
  // sq_pad / 64, 2]: head dim 128, a group's 64 columns each; else slot 0), zero at launch.
  int* dq_sem;
};

// BwdArgs::masked_bits of a bias: no 16-bit value equals it.
constexpr uint32_t kNoMaskedBits = 0x10000u;

struct BwdDims {
  // kBlockM: the rows of a dense mask's tiles and of dq_acc's blocks; kPadM: Sq's padding in
  // the scratch (a multiple of every variant's query block).
  // kBlockN: a dense mask's tables' key blocks (the kernel's, but head dim 256's: kBwdBlockN).
  static constexpr int kBlockM = 64, kPadM = 128, kBlockN = 128, kThreads = 256;
};
// kDense: a dense mask (BwdArgs::tiles); without it the band alone (no mask code compiled in).
// kDet: deterministic dQ (BwdArgs::dq_sem). kMod: the score modifier (BwdMod; ALiBi's and
// softcap's dense variants take a bias, its gradient too where BwdArgs::dbias is set), or with
// a dense mask kBwdDbias (plain; the bias's gradient written:
// BwdArgs::dbias; its stores cost the variants without one 39% when compiled into them) or
// kBwdKeep (head dim 64: a mask that keeps or drops keys and holds no values, 128-query
// blocks as without a mask, no bias tiles in shared memory; a tile that does hold values
// reads them from global memory, mode 2).
enum BwdMod : int { kBwdPlain = 0, kBwdSoftcap = 1, kBwdAlibi = 2, kBwdAlibiAbs = 3, kBwdDbias = 4, kBwdKeep = 5 };
// The query block of a variant: 128 rows at head dim 64 without a dense mask or with a
// keep-only one (S^T and dP^T m64n128 products, FlashAttention-3's tile there), else 64
// (the dense variants' bias tiles would not fit beside the stages at 128).
template <int kD, bool kDense, int kMod = kBwdPlain>
constexpr int kBwdBlockM = kD == 64 && (!kDense || kMod == kBwdKeep) ? 128 : 64;
// The keys of a block: 128, or 64 at head dim 256 (kWide: dK and dV of 128 keys would take
// 256 registers a thread each).
template <int kD>
constexpr int kBwdBlockN = kD == 256 ? 64 : 128;

// kD / 64 spans of 64 columns a tile, kM query rows, kBwdBlockN<kD> keys.
template <int kD, int kM>
struct BwdSmem {
  static constexpr int kSpans = kD / 64, kN = kBwdBlockN<kD>;
  static constexpr bool kWide = kD == 256;
  uint8_t k[kSpans * kN * 128];
  uint8_t v[kSpans * kN * 128];
  uint8_t q[2][kSpans * kM * 128];
  uint8_t dout[2][kSpans * kM * 128];
  // dS^T of alternate iterations: the block's keys, spans of 64 queries; kWide: [1] P^T
  uint8_t ds[2][kWide ? 2 : kM / 64][kN * 128];
  // Each group's part of dQ (bwd_dq_index's order); kWide: [w][0] kDet's give-up flag only.
  float dq[2][kWide ? 4 : 64 * 64];
  float lse2[2][kM];
  float dsum[2][kM];
  uint64_t kv_full, full[2];
  // The dense variants' bias tiles (BwdArgs::bias_tma), with the stage's Q and dO: kM rows of
  // two 64-key spans, 128-byte swizzled. Last: the other variants' shared memory ends before it.
  alignas(1024) uint8_t bias[2][2 * kM * 128];
};
// dq_acc's order: each 64-row block of a (batch, head) holds kD * 64 floats, as the groups'
// dQ parts leave shared memory: head dims 128 and 256, columns 64w.. at 4096 w; a part a
// float4 per accumulator step j (8 columns) and thread (warp = row / 16, lane = 4 (row % 8)
// + col % 8 / 2), the float4 holding (row, col + 0, 1) and (row + 8, col + 0, 1). The index
// of the pair (row, col), (row, col + 1) of a block (col even):
__host__ __device__ inline int bwd_dq_index(int kD, int row, int col) {
  const int w = kD >= 128 ? col / 64 : 0, c = col % 64, j = c / 8;
  const int tid = (row / 16) * 32 + (row % 8) * 4 + c % 8 / 2;
  return w * 4096 + (j * 128 + tid) * 4 + 2 * (row % 16 / 8);
}

template <class Smem>
constexpr size_t kBiasAt = offsetof(Smem, bias);
// (Head dim 256 has no bias stages: its tiles' values are read from global memory.)
template <int kD, bool kDense, int kMod = kBwdPlain>
constexpr size_t kBwdSmemBytes =
    (kDense && kMod != kBwdKeep && kD != 256 ? sizeof(BwdSmem<kD, kBwdBlockM<kD, kDense, kMod>>)
                                             : kBiasAt<BwdSmem<kD, kBwdBlockM<kD, kDense, kMod>>>) + 1024;
static_assert(kBwdSmemBytes<128, true> <= 227 * 1024, "the dense head dim 128 variant's shared memory");
static_assert(kBwdSmemBytes<256, true> <= 227 * 1024, "the head dim 256 variants' shared memory");

// The work of block (n, h_kv, b): the query blocks [m_begin, m_end) of each head of the group.
struct BwdTile {
  int n0, q_len, kv_len, diag, lo_diag, m_begin, m_end;
};

template <bool kCausal, int bm, int bn>
__device__ __forceinline__ BwdTile bwd_tile(const BwdArgs& a, int n, int b) {
  BwdTile t;
  t.n0 = n * bn;
  t.q_len = a.seqlen_q, t.kv_len = a.seqlen_kv;
  if (a.q_lens) {
    const int i = b * a.lens_stride;
    t.q_len = min(max(a.q_lens[i], 0), a.seqlen_q);
    t.kv_len = min(max(a.kv_lens[i], 0), a.seqlen_kv);
  }
  const long long diag0 = a.bottom_right ? t.kv_len - t.q_len : 0;
  t.diag = clamp_edge(diag0 + a.diag);
  t.lo_diag = a.lo_diag == kNoEdge ? kNoEdge : clamp_edge(diag0 + a.lo_diag);
  t.m_begin = 0;
  t.m_end = (t.q_len + bm - 1) / bm;
  const int last_key = min(t.n0 + bn, t.kv_len) - 1;
  if (last_key < t.n0) {  // no key of the block kept
    t.m_end = 0;
    return t;
  }
  // Query i sees key j when j <= i + diag (causal) and j >= i + lo_diag.
  if (kCausal) {
    const long long first = static_cast<long long>(t.n0) - t.diag;
    t.m_begin = static_cast<int>(max(0LL, first) / bm);
  }
  if (t.lo_diag != kNoEdge) {
    const long long last = static_cast<long long>(last_key) - t.lo_diag;  // the last query
    t.m_end = last < 0 ? 0 : static_cast<int>(min(static_cast<long long>(t.m_end), last / bm + 1));
  }
  return t;
}

}  // namespace fusedattn::cuda::hopper
