// Flash attention forward for Hopper (sm_90a), head dims 64, 128 and 256, bf16 / fp16; first
// written for the score_mod functions cuDNN's kernel runs slowest (softcap's tanh: one more
// MUFU operation per score, which cuDNN leaves unhidden), now for plain calls too where the
// table measured it faster (hopper/measured.h). The structure is FlashAttention-3's:
//   - one producer warpgroup: a single thread streams each tile's Q and its K, V blocks
//     through a ring of stages (2; 4 at head dim 64) with the copy engine (TMA), guarded by
//     full / empty mbarriers;
//   - two consumer warpgroups (head dim 64: two or three), 64 query rows each (a 128- or
//     192-row block): S = Q K^T and O += P V with wgmma, the online softmax in registers;
//   - ping-pong: the consumers take turns issuing their products (named barriers 1, 2, 3),
//     so one group's softmax (exp2, the modifier's tanh) runs while another's products do;
//   - within a group, the product P_{i-1} V_{i-1} is issued beside S_i = Q K_i^T and runs
//     while the softmax of S_i does.
// Keys are visited last block first, so the masked blocks (the causal diagonal, the ragged
// end) come first and the rest run unmasked.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fusedattn/attention/hopper/scores.cuh"
#include "fusedattn/attention/hopper/sm90.cuh"

namespace fusedattn::cuda::hopper {

// What the head dim kD (64, 128 or 256) and the consumer warpgroups kGroups set: a Q, K or V
// tile is kD / 64 spans (64 columns of its rows: one 128-byte swizzle span, the copy
// engine's box); a thread block has kGroups consumer warpgroups of 64 query rows each (head
// dim 64 may take three, as FlashAttention-3 has it there, so two groups' softmax runs while
// one's products do: flash_fwd.cu's groups() says when).
template <int kD, int kGroups, bool kBiasTile = false>
struct Dims {
  static_assert(kD == 64 || kD == 128 || kD == 256, "head dims 64, 128 and 256");
  static_assert(kGroups == 2 || (kGroups == 3 && kD == 64), "three groups at head dim 64 only");
  static constexpr int kSpans = kD / 64;
  static constexpr int kConsumers = kGroups;
  static constexpr int kBlockM = 64 * kConsumers;  // query rows of a tile
  // Keys of a step: 128; 64 at head dim 256, whose 64 KiB Q and two stages of K and V fill
  // the shared memory (a group's accumulator is then 128 registers a thread, its scores 32).
  static constexpr int kBlockN = kD == 256 ? 64 : 128;
  static constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
  static constexpr uint32_t kQSpanBytes = kBlockM * 128;   // Q's 64 columns
  static constexpr uint32_t kKVSpanBytes = kBlockN * 128;  // K's or V's 64 columns
  static constexpr uint32_t kTileBytes = kBlockN * kD * 2;  // 16 or 32 KiB
  // P's row sums: below head dim 256 a V stage is the tile and then a span of ones that P
  // V's product reads as 8 more columns of V, so the tensor cores sum P's rows into 4 more
  // accumulators (o[kD / 2 + 2r], row r). wgmma's N stops at 256, so head dim 256 adds the
  // rows up in the softmax (each thread its part, the row's 4 lanes at the end).
  static constexpr bool kOnes = kD + 8 <= 256;
  static constexpr uint32_t kVStageBytes = kTileBytes + (kOnes ? kKVSpanBytes : 0);
  static constexpr int kOutRegs = kD / 2 + (kOnes ? 4 : 0);
  static constexpr int kScores = kBlockN / 2;  // S's accumulator, a thread
  // K and V tiles in flight (a power of 2: the ring's counter wraps at 2^32). Head dim 128
  // fills the shared memory at 2; FA_HOPPER_D64_STAGES is a sweep's knob (dev/hopper_fwd).
#ifndef FA_HOPPER_D64_STAGES
#define FA_HOPPER_D64_STAGES 4
#endif
  // kBiasTile (BiasTileScores): head dim 64 keeps 2 stages, leaving room for the bias ring.
  static constexpr int kStages = kD == 64 ? (kBiasTile ? 2 : FA_HOPPER_D64_STAGES) : 2;
  // The bias ring (BiasTileScores): a stage holds each consumer group's 64 rows x kBlockN
  // keys of the bias (16 or 8 KiB); head dim 128's 192 KiB of Q, K and V leave room for one
  // stage, the others take two.
  static constexpr uint32_t kBiasBytes = 64 * kBlockN * 2;
  static constexpr int kBiasStages = !kBiasTile ? 0 : kD == 128 ? 1 : 2;
  static_assert(kSpans * kQSpanBytes + kStages * (kTileBytes + kVStageBytes) +
                        kBiasStages * kConsumers * kBiasBytes <= 227 * 1024 - 2048,
                "shared memory");
  static_assert((kStages & (kStages - 1)) == 0, "a power of 2");
  // Registers after the producer gives some back: 65536 / kThreads a thread at launch (168
  // with two consumer groups, 128 with three), and the consumers may take what the
  // producer frees, shared among them. The producer's loop (the tile scheduler, the
  // sequence tables) spilled to local memory at 24 (ptxas -v); 40 leaves head dim 128's
  // consumers 232; head dim 64's four stages want 56 (its consumers need less), and so does
  // head dim 256's producer (four spans a tile: 176 bytes spilled at 40, none at 56, with
  // the consumers' 128 accumulators at 224).
  static constexpr int kLaunchRegs = kConsumers == 2 ? 168 : 128;
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : kD == 128 ? 40 : 56;
  static constexpr int kConsumerRegs =
      (kLaunchRegs + (kLaunchRegs - kProducerRegs) / kConsumers) / 8 * 8;
};

// Everything the kernel reads. Strides are in elements; lse may be null.
struct FwdArgs {
  CUtensorMap q, k, v;  // {D, S, H, B}, box {64, kBlockM or kBlockN, 1, 1}, 128-byte swizzle
  // BiasTileScores: the bias as {Skv, Sq, bias_heads, Bm}, box {64, 64} (bias stays null:
  // bias_b / bias_heads say which planes broadcast).
  CUtensorMap bias_map;
  void* out;
  int64_t o_b, o_s, o_h;
  float* lse;  // natural log, as the CPU engine and cuDNN write it
  int64_t l_b, l_h, l_s;
  // Non-null: the max logit of each (batch row, head) at max_logit[b * ml_b + h * ml_h], kept
  // as max_logit_key() of it by atomicMax from 0 (flash_fwd zeroes it first and
  // decodes it after).
  uint32_t* max_logit;
  int64_t ml_b, ml_h;
  // A softmax with an extra logit (a sink: in the denominator and lse, no value): 0 none,
  // 1 a logit 0 (off-by-one), 2 sinks[(b / sink_rows) * heads_q + h] (learnable).
  int sink;
  const float* sinks;
  int sink_rows;
  int batch, seqlen_q, seqlen_kv, heads_q, heads_per_kv;
  int section;           // (batch, head) pairs whose blocks run side by side (block order)
  // The band, from each row's base diagonal (kv_len - q_len of its sequence when
  // bottom_right, else 0): causal (a right edge): query i sees key j when j <= i + base +
  // diag; and (any call) when j >= i + base + lo_diag, a window's left edge (-2^30: none).
  int diag, lo_diag, bottom_right;
  // Padding: sequence b keeps q_lens[b * lens_stride] queries and kv_lens[..] keys (clamped
  // to the extents); null: the extents. Padded queries get out 0 and lse -inf.
  const int* q_lens;
  const int* kv_lens;
  int lens_stride;
  // THD: batch row b packs `segments` sequences; sequence t = b * segments + s has
  // seq_q_len[t] queries from token seq_q_tok[t] - b * seqlen_q of its row, and seq_kv_len /
  // seq_kv_tok keys likewise (null: BSHD, one sequence a row). Tiles past a sequence's
  // queries are skipped, and rows of no sequence are left to the caller.
  const int* seq_q_len;
  const int* seq_kv_len;
  const int* seq_q_tok;
  const int* seq_kv_tok;
  int segments;
  // Non-null (persistent grids): the tile scheduler's counter, 0 at launch; a block that
  // finishes a tile takes the next one from it (gridDim.x + atomicAdd), so blocks stay busy
  // whatever their tiles cost. Null: block i takes tiles i, i + gridDim.x, ...
  int* counter;
  float mul_in, mul_out;  // the score modifier's constants (below)
  const float* slopes;    // ALiBi: slope of head h at slopes[h * slope_stride] (stride 0 or 1)
  int slope_stride;
  float slope_mul;        // ALiBi: the slope's factor (+-log2(e))
  // Non-null: a post-scale bias [Bm, Hm, Sq, Skv] in q's dtype (its 16 bits) at bias[b * bias_b
  // + h * bias_h + row * bias_s + col] (bias_b / bias_h 0 where broadcast), added to the
  // scores as v += bias * bias_mul (v's units: log2(e) / mul_out). bias_drop: it is a folded
  // boolean mask (kRequestMaskBias), whose keys of value masked_bits are dropped as -inf,
  // and then tiles (non-null) classifies each (tbl, query tile, key block) — bit 0 a key
  // kept, bit 1 one dropped, bit 2 a kept one with a bias not 0 — with ranges[tbl * num_m +
  // query tile] the key blocks [x, y) that keep any key (tbl = (b if bias_b else 0) *
  // bias_heads + (h if bias_heads > 1)), and keep_bits the mask as bits (a 32-bit word a
  // row's 32 keys, bit c % 32 of word c / 32: key c kept; rows num_m * kBlockM a table,
  // words_per_row a row, padded rows and keys 0). Blocks outside the range are skipped,
  // blocks of class 1 run without the mask, blocks with a bias not 0 read the bias, the
  // rest read their rows' bits (two loads a row; flash_fwd.cu's classify_mask and
  // mask_ranges write them before the kernel). Without tiles every block reads the bias.
  const uint16_t* bias;
  int64_t bias_b, bias_h, bias_s;
  float bias_mul;
  int bias_drop, bias_heads;
  uint16_t masked_bits;
  const uint8_t* tiles;
  const int2* ranges;
  const uint32_t* keep_bits;
  int words_per_row;
};

// The (batch, head) table of a call's mask classes (FwdArgs::tiles).
__device__ __forceinline__ int mask_table(const FwdArgs& a, int b, int h) {
  return (a.bias_b ? b : 0) * a.bias_heads + (a.bias_heads > 1 ? h : 0);
}

// One thread's view of the bias in a block: its first row's bias (key 0), the row stride;
// kBias softmax steps read it.
struct BiasRow {
  const uint16_t* at = nullptr;
  int64_t s = 0;
};

// The bias ring of BiasTileScores: stage st's tile of consumer group c (its 64 query rows,
// kBlockN keys as 64-key spans of 128-byte swizzled rows, 8 KiB apart), filled by the
// producer (full: one arrival and the bytes) and released by the group's 128 threads (empty).
template <class Dim, bool kOn = (Dim::kBiasStages > 0)>
struct BiasRing {
  uint8_t tile[Dim::kBiasStages][Dim::kConsumers][Dim::kBiasBytes];
  uint64_t full[Dim::kBiasStages][Dim::kConsumers], empty[Dim::kBiasStages][Dim::kConsumers];
};
template <class Dim>
struct BiasRing<Dim, false> {};

template <int kD, int kGroups, bool kBiasTile = false>
struct Smem {
  using Dim = Dims<kD, kGroups, kBiasTile>;
  uint8_t q[Dim::kSpans * Dim::kQSpanBytes];
  static constexpr int kStages = Dim::kStages;
  uint8_t k[kStages][Dim::kTileBytes];
  uint8_t v[kStages][Dim::kVStageBytes];
  BiasRing<Dim> bias;  // (after whole KiBs: its tiles stay 1024-byte aligned)
  uint64_t q_full, q_empty, k_full[kStages], k_empty[kStages], v_full[kStages],
      v_empty[kStages];
  int tile[2];  // the tile of Q phase k at [k % 2] (-1: no more), written before q_full's arrival
};
template <int kD, int kGroups, bool kBiasTile = false>
constexpr size_t kSmemBytes = sizeof(Smem<kD, kGroups, kBiasTile>) + 1024;  // + slack to align the tiles to 1024

// A float as an unsigned key of the same order (for atomicMax), NaN above everything: 0 is
// below every key (no row yet); max_logit_value decodes it.
__host__ __device__ inline uint32_t max_logit_key(float x) {
  if (x != x) return 0xffffffffu;
  uint32_t b;
  memcpy(&b, &x, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__host__ __device__ inline float max_logit_value(uint32_t key) {
  if (key == 0) return -INFINITY;
  if (key == 0xffffffffu) return NAN;
  const uint32_t b = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float x;
  memcpy(&x, &b, 4);
  return x;
}

// One step of the online softmax on this thread's kN / 2 scores of a block of kN keys:
// modify, mask, update the running max (of v) and leave exp2(x - max x) in s; returns
// whether some row of the warp moved its max (the accumulator then needs rescale_factors).
// mx_all: the rows' exact running max (mx moves lazily, below), for max_logit.
// The row sums are not added here: the tensor cores add them up in P V (Dims::kOnes), or
// the caller does (head dim 256).
// A row's max moves only when it grew by more than 8 (log2 units): until then P <= 2^8,
// which 16-bit P and the float32 sums hold exactly as well, and the accumulator's rescale
// is skipped (after FlashAttention-4). A row with nothing seen yet (max -inf) always moves.
// Mod::kRowByRow runs the two rows one after the other (softcap: row 1's tanh keeps the
// MUFU pipe busy while row 0's max goes through the shuffles); otherwise each phase runs
// for both rows before the next.
// kBias (after the modifier and the band): 1, the block's keys its rows keep as bits
// (FwdArgs::keep_bits; keep: this thread's two rows' kN / 32 words of the block, shifted
// right by 2 (lane % 4)); 2, the bias (FwdArgs::bias) read through br.
template <class Mod, bool kCausal, bool kMask, int kN, int kBias = 0, bool kBf16 = true>
__device__ __forceinline__ bool softmax_step(float (&s)[kN / 2], float (&mx)[2], float (&mx_old)[2],
                                             float (&mx_all)[2],
                                             const FwdArgs& a, int row0, int col0,
                                             float slope, int kv_len, int diag, int lo_diag,
                                             BiasRow br = {}, const uint32_t (*keep)[kN / 32] = nullptr) {
  const float d0 = static_cast<float>(col0 - row0);  // kv - q of s[0]
  constexpr int kRow = kN / 4;  // a row's scores in a thread
  auto modify = [&](int r) {
    // kBias: row r's bias at this thread's first key (rows past Sq have none)
    const uint16_t* bias_at = kBias == 2 ? br.at + 8 * r * br.s + col0 : nullptr;
    const bool bias_row = kBias == 2 && row0 + 8 * r < a.seqlen_q;
#pragma unroll
    for (int i = 0; i < kRow; ++i) {
      float& x = s[row_score(r, i)];
      x = Mod::pre(x, a.mul_in, slope, d0, static_cast<float>(8 * (i / 2) + i % 2 - 8 * r));
      if constexpr (kMask) {
        const int col = col0 + 8 * (i / 2) + i % 2, row = row0 + 8 * r;
        if (col >= kv_len || (kCausal && col > row + diag) || col < row + lo_diag)
          x = -INFINITY;
      }
      if constexpr (kBias == 1) {  // key 8 (i / 2) + 2 (lane % 4) + i % 2 of the block
        if (!((keep[r][i / 8] >> (8 * (i / 2) % 32 + i % 2)) & 1u)) x = -INFINITY;
      }
      if constexpr (kBias == 2) {  // keys past Skv have no bias (nor are kept)
        if (bias_row && col0 + 8 * (i / 2) + i % 2 < a.seqlen_kv) {
          const uint16_t bits = bias_at[8 * (i / 2) + i % 2];
          if (a.bias_drop && bits == a.masked_bits) x = -INFINITY;
          else x = fmaf(bits_to_float<kBf16>(bits), a.bias_mul, x);
        }
      }
    }
  };
  auto update_max = [&](int r) {  // a tree, then the row's 4 lanes; true if it moved
    static_assert(kRow == 16 || kRow == 32, "64 or 128 keys");
    float m[kRow / 2];  // (loops of constant trips only: anything else puts m in local memory)
#pragma unroll
    for (int i = 0; i < kRow / 2; ++i)
      m[i] = fmaxf(s[row_score(r, 2 * i)], s[row_score(r, 2 * i + 1)]);
    if constexpr (kRow == 32) {
#pragma unroll
      for (int i = 0; i < 8; ++i) m[i] = fmaxf(m[i], m[i + 8]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) m[i] = fmaxf(m[i], m[i + 4]);
    float mr = fmaxf(fmaxf(fmaxf(m[0], m[2]), fmaxf(m[1], m[3])), mx[r]);
    mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, 1));
    mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, 2));
    mx_all[r] = fmaxf(mx_all[r], mr);
    const bool move = (mr - mx[r]) * a.mul_out > 8.0f || mx[r] == -INFINITY;
    mx_old[r] = mx[r];
    if (move) mx[r] = mr;  // the same in the row's 4 lanes
    return move;
  };
  auto exponentiate = [&](int r) {
    // exp2(-inf - -inf) would be NaN: a row still at -inf keeps base 0.
    const float base = mx[r] == -INFINITY ? 0.0f : mx[r] * a.mul_out;
#pragma unroll
    for (int i = 0; i < kRow; ++i) {
      float& x = s[row_score(r, i)];
      x = exp2_approx(fmaf(x, a.mul_out, -base));
    }
  };
  bool moved = false;
  if constexpr (Mod::kRowByRow) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      modify(r);
      moved |= update_max(r);
      exponentiate(r);
    }
  } else {
    modify(0);
    modify(1);
    moved = update_max(0);
    moved |= update_max(1);
    exponentiate(0);
    exponentiate(1);
  }
  return __any_sync(0xffffffffu, moved);
}

// BiasTileScores: adds a consumer group's bias tile (BiasRing, at `tile`) times mul to this
// thread's scores s of the block: one ldmatrix.x4 gives a thread its two rows' pairs of two
// 8-key chunks (blocks: rows 0-7 / 8-15 of the warp's 16, chunk j / j + 1), in the
// accumulator's layout; the rows are 128-byte swizzled (16-byte chunk c of row r at c ^ (r % 8)).
template <bool kBf16, int kN>
__device__ __forceinline__ void add_bias_tile(float (&s)[kN / 2], uint32_t tile, int warp, int lane,
                                              float mul) {
  const int row = 16 * warp + lane % 8 + 8 * (lane / 8 % 2);
#pragma unroll
  for (int j = 0; j < kN / 8; j += 2) {
    const int chunk = j + lane / 16;  // 8 keys of 16 bits
    uint32_t r[4];
    ldsm_x4(r, tile + (chunk / 8) * 8192 + row * 128 + (((chunk % 8) ^ (row % 8)) << 4));
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = 4 * (j + m / 2) + 2 * (m % 2);
      float lo, hi;
      if constexpr (kBf16) {
        lo = __uint_as_float(r[m] << 16), hi = __uint_as_float(r[m] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r[m]));
        lo = f.x, hi = f.y;
      }
      s[i] = fmaf(lo, mul, s[i]);
      s[i + 1] = fmaf(hi, mul, s[i + 1]);
    }
  }
}

// What the accumulator's rows take when their max moved from mx_old to mx (1 where it did
// not, 0 where nothing was seen before).
__device__ __forceinline__ void rescale_factors(const float (&mx)[2], const float (&mx_old)[2],
                                                float mul_out, float (&corr)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
    corr[r] = mx_old[r] == -INFINITY ? 0.0f : exp2_approx((mx_old[r] - mx[r]) * mul_out);
}

// S = Q_rows K^T: kD / 16 steps of 16 along the head dim; both operands K-major, 128-byte
// swizzled, each 64 columns a span of their own.
template <bool kBf16, class Dim>
__device__ __forceinline__ void issue_qk(float (&s)[Dim::kScores], uint32_t q_addr,
                                         uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < Dim::kSpans * 4; ++kk) {
    const uint32_t q = q_addr + (kk / 4) * Dim::kQSpanBytes + (kk % 4) * 32;
    const uint32_t k = k_addr + (kk / 4) * Dim::kKVSpanBytes + (kk % 4) * 32;
    if constexpr (Dim::kBlockN == 128)
      wgmma_ss_m64n128k16<kBf16>(s, desc_sw128(q, 16, 1024), desc_sw128(k, 16, 1024), kk > 0);
    else
      wgmma_ss_m64n64k16<kBf16>(s, desc_sw128(q, 16, 1024), desc_sw128(k, 16, 1024), kk > 0);
  }
  wgmma_commit();
}

// O += P V: kBlockN / 16 steps of 16 keys; V is MN-major (head dim contiguous): its
// 64-column spans are the leading-byte stride, 8-key groups the 1024-byte stride. Below head
// dim 256 each step reads 8 columns more, from the stage's span of ones: o[kD / 2 .. kD / 2
// + 3] gain P's row sums.
template <bool kBf16, class Dim>
__device__ __forceinline__ void issue_pv(float (&o)[Dim::kOutRegs], uint32_t (&p)[Dim::kScores / 2],
                                         uint32_t v_addr) {
#pragma unroll
  for (int kk = 0; kk < Dim::kBlockN / 16; ++kk) {
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    const uint64_t b = desc_sw128(v_addr + kk * 16 * 128, Dim::kKVSpanBytes, 1024);
    if constexpr (Dim::kSpans == 4)
      wgmma_rs_m64n256k16<kBf16>(o, a, b);
    else if constexpr (Dim::kSpans == 2)
      wgmma_rs_m64n136k16<kBf16>(o, a, b);
    else
      wgmma_rs_m64n72k16<kBf16>(o, a, b);
  }
  wgmma_commit();
}

// FA_HOPPER_PROFILE (dev/hopper_fwd/hopper_fwd_check.cu only): consumer thread 0 of each group
// adds the clock cycles of each phase of its loop to g_profile[16 * group + phase].
#ifdef FA_HOPPER_PROFILE
__device__ unsigned long long g_profile[48];
#define FA_PROFILE_PHASE(phase)      \
  do {                               \
    const long long now = clock64(); \
    prof[phase] += now - prof_last;  \
    prof_last = now;                 \
  } while (0)
#else
#define FA_PROFILE_PHASE(phase) \
  do {                          \
  } while (0)
#endif
enum ProfilePhase {
  kWaitKV, kWaitTurn, kIssue, kWaitS, kSoftmax, kWaitPV, kOther, kTileEnds, kWaitQ, kFirst, kLast
};

// A work tile: kBlockM query rows of one (batch, head) and the key blocks [n_begin, n_end) they
// see. The host keeps every query row's key range non-empty (flash_fwd_unsupported), so
// n_begin < n_end.
struct Tile {
  int m0, h, b, n_begin, n_end;
  int q_len, kv_len, diag, lo_diag;  // the sequence's lengths and band (FwdArgs)
  int q0, kv0;  // the sequence's first query and key in row b (THD; else 0)
  bool skip;    // no query of the sequence in the tile (THD)
};

// Tile order: (batch, head) pairs go in sections of a.section, whose K and V fit in L2
// together; inside a section the query blocks go last first (causal: the longest rows
// first), each across the section's pairs. The shortest blocks end the order.
template <bool kCausal, int kBlockM, int kBlockN, bool kBiasReads>
__device__ __forceinline__ Tile tile_at(const FwdArgs& a, int t, int num_m) {
  const int pairs = a.heads_q * a.batch * a.segments;
  const int sec = t / (a.section * num_m), base = sec * a.section;
  const int size = min(a.section, pairs - base), within = t - sec * a.section * num_m;
  const int pair = base + within % size;
  Tile tile;
  tile.m0 = (num_m - 1 - within / size) * kBlockM;
  tile.h = pair % a.heads_q;
  const int seq = pair / a.heads_q;
  tile.b = seq / a.segments;
  tile.q_len = a.seqlen_q, tile.kv_len = a.seqlen_kv;
  tile.q0 = 0, tile.kv0 = 0;
  if (a.seq_q_len) {  // lengths and tokens within the row (prepare_sequences clamps them)
    tile.q_len = a.seq_q_len[seq], tile.kv_len = a.seq_kv_len[seq];
    tile.q0 = a.seq_q_tok[seq] - tile.b * a.seqlen_q;
    tile.kv0 = a.seq_kv_tok[seq] - tile.b * a.seqlen_kv;
  } else if (a.q_lens) {
    const int i = tile.b * a.lens_stride;
    tile.q_len = min(max(a.q_lens[i], 0), a.seqlen_q);
    tile.kv_len = min(max(a.kv_lens[i], 0), a.seqlen_kv);
  }
  // Edges past +-2^30 keep the same keys as +-2^30 (extents are at most 2^30): int sums.
  const long long diag0 = a.bottom_right ? tile.kv_len - tile.q_len : 0;
  tile.diag = clamp_edge(diag0 + a.diag);
  tile.lo_diag = a.lo_diag == kNoEdge ? kNoEdge : clamp_edge(diag0 + a.lo_diag);
  // At least one key block a tile (the pipeline's counts assume it): a tile of rows that
  // keep nothing runs one block, all masked (out 0, lse -inf).
  tile.n_end = max(1, (tile.kv_len + kBlockN - 1) / kBlockN);
  if (kCausal) {
    const int last = tile.m0 + kBlockM - 1 + tile.diag;  // the tile's last kept key
    tile.n_end = max(1, min(tile.n_end, last < 0 ? 0 : last / kBlockN + 1));
  }
  tile.n_begin = min(max(0, tile.m0 + tile.lo_diag) / kBlockN, tile.n_end - 1);
  if (kBiasReads && a.ranges) {  // a dense mask: the key blocks it keeps too (none: the band's last, all masked)
    const int2 r = a.ranges[mask_table(a, tile.b, tile.h) * num_m + tile.m0 / kBlockM];
    const int lo = max(tile.n_begin, r.x), hi = min(tile.n_end, r.y);
    if (lo < hi) tile.n_begin = lo, tile.n_end = hi;
    else tile.n_begin = tile.n_end - 1;
  }
  tile.skip = a.seq_q_len && tile.m0 >= tile.q_len;
  return tile;
}

// Each thread block takes tile blockIdx.x first, then the next one the scheduler gives
// (FwdArgs::counter); the host launches one block a tile for causal calls, one an SM
// otherwise. The producer picks each tile (skipping those of no query), publishes it in
// sm.tile with Q's arrival, and ends the consumers with a tile of -1. The K / V ring's stage and phase run on
// across tiles (kv counts the blocks so far); Q has one buffer, refilled once all
// consumers' last Q K^T of the tile is done (q_empty), so the next tile's Q arrives during
// this one's last P V and epilogue.
template <class Mod, bool kCausal, bool kBf16, int kD, int kGroups>
__global__ void __launch_bounds__(Dims<kD, kGroups>::kThreads, 1)
    flash_fwd_kernel(const __grid_constant__ FwdArgs a) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kBiasTile = Mod::kBiasTile;
  using Dim = Dims<kD, kGroups, kBiasTile>;
  constexpr uint32_t kTileBytes = Dim::kTileBytes;
  constexpr int kOutRegs = Dim::kOutRegs;
  constexpr int kStages = Dim::kStages;
  constexpr int kBlockM = Dim::kBlockM, kBlockN = Dim::kBlockN, kConsumers = Dim::kConsumers;
  constexpr uint32_t kKVSpanBytes = Dim::kKVSpanBytes;
  constexpr uint32_t kConsumerThreads = 128 * kConsumers;
  extern __shared__ uint8_t smem_raw[];
  Smem<kD, kGroups, kBiasTile>& sm = *reinterpret_cast<Smem<kD, kGroups, kBiasTile>*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  const int num_m = (a.seqlen_q + kBlockM - 1) / kBlockM;
  const int num_n = (a.seqlen_kv + kBlockN - 1) / kBlockN;
  const int num_tiles = num_m * a.heads_q * a.batch * a.segments;
  const int group = threadIdx.x / 128, tid = threadIdx.x % 128;

  if (threadIdx.x == 0) {
    mbar_init(&sm.q_full, 1);
    mbar_init(&sm.q_empty, kConsumerThreads);  // every consumer thread releases
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&sm.k_full[st], 1);
      mbar_init(&sm.v_full[st], 1);
      mbar_init(&sm.k_empty[st], kConsumerThreads);
      mbar_init(&sm.v_empty[st], kConsumerThreads);
    }
    if constexpr (kBiasTile) {
      for (int st = 0; st < Dim::kBiasStages; ++st)
        for (int c = 0; c < kConsumers; ++c) {
          mbar_init(&sm.bias.full[st][c], 1);
          mbar_init(&sm.bias.empty[st][c], 128);  // the group's threads release
        }
    }
    mbar_init_fence();
  }
  if (Dim::kOnes && group > 0) {  // the consumers write the ones the tensor cores read
    const uint32_t one = kBf16 ? 0x3f803f80u : 0x3c003c00u;
    for (int i = threadIdx.x - 128; i < kStages * int(kKVSpanBytes / 4);
         i += kConsumerThreads)
      reinterpret_cast<uint32_t*>(sm.v[i / (kKVSpanBytes / 4)] + kTileBytes)[i % (kKVSpanBytes / 4)] =
          one;
    fence_proxy_async();
  }
  __syncthreads();

  if (group == 0) {  // producer
    regs_dec<Dim::kProducerRegs>();
    if (tid == 0) {
      tma_prefetch_map(&a.q);
      tma_prefetch_map(&a.k);
      tma_prefetch_map(&a.v);
      if constexpr (kBiasTile) tma_prefetch_map(&a.bias_map);
      uint32_t kv = 0;
      auto next = [&](int t) {
        return a.counter ? static_cast<int>(gridDim.x) + atomicAdd(a.counter, 1)
                         : t + static_cast<int>(gridDim.x);
      };
      for (int t = blockIdx.x, k = 0;; t = next(t), ++k) {
        while (t < num_tiles && tile_at<kCausal, kBlockM, kBlockN, Mod::kBiasReads>(a, t, num_m).skip) t = next(t);
        mbar_wait(&sm.q_empty, (k & 1) ^ 1);
        if (t >= num_tiles) {  // the consumers' last phase: no tile
          sm.tile[k & 1] = -1;
          mbar_arrive(&sm.q_full);
          break;
        }
        const Tile tile = tile_at<kCausal, kBlockM, kBlockN, Mod::kBiasReads>(a, t, num_m);
        const int h_kv = tile.h / a.heads_per_kv;
        sm.tile[k & 1] = t;
        mbar_expect_bytes(&sm.q_full, Dim::kSpans * Dim::kQSpanBytes);
#pragma unroll
        for (int sp = 0; sp < Dim::kSpans; ++sp)
          tma_load_4d(&a.q, &sm.q_full, sm.q + sp * Dim::kQSpanBytes, 64 * sp, tile.q0 + tile.m0,
                      tile.h, tile.b);
        for (int it = 0; it < tile.n_end - tile.n_begin; ++it, ++kv) {
          const int n = tile.n_end - 1 - it, st = kv % kStages;
          const uint32_t ph = (kv / kStages) & 1;
          mbar_wait(&sm.k_empty[st], ph ^ 1);
          mbar_expect_bytes(&sm.k_full[st], kTileBytes);
          const int row = tile.kv0 + n * kBlockN;
#pragma unroll
          for (int sp = 0; sp < Dim::kSpans; ++sp)
            tma_load_4d(&a.k, &sm.k_full[st], sm.k[st] + sp * kKVSpanBytes, 64 * sp, row, h_kv,
                        tile.b);
          mbar_wait(&sm.v_empty[st], ph ^ 1);
          mbar_expect_bytes(&sm.v_full[st], kTileBytes);
#pragma unroll
          for (int sp = 0; sp < Dim::kSpans; ++sp)
            tma_load_4d(&a.v, &sm.v_full[st], sm.v[st] + sp * kKVSpanBytes, 64 * sp, row, h_kv,
                        tile.b);
          if constexpr (kBiasTile) {  // each group's rows of the block's bias (past Sq or Skv: 0)
            const int bst = kv % Dim::kBiasStages;
            const uint32_t bph = (kv / Dim::kBiasStages) & 1;
            const int bh = a.bias_heads > 1 ? tile.h : 0, bb = a.bias_b ? tile.b : 0;
            for (int c = 0; c < kConsumers; ++c) {
              mbar_wait(&sm.bias.empty[bst][c], bph ^ 1);
              mbar_expect_bytes(&sm.bias.full[bst][c], Dim::kBiasBytes);
#pragma unroll
              for (int sp = 0; sp < kBlockN / 64; ++sp)
                tma_load_4d(&a.bias_map, &sm.bias.full[bst][c], sm.bias.tile[bst][c] + sp * 8192,
                            n * kBlockN + 64 * sp, tile.m0 + 64 * c, bh, bb);
            }
          }
        }
      }
    }
    return;
  }

  regs_inc<Dim::kConsumerRegs>();
  const int c = group - 1;  // consumer c: rows 64c..64c+63 of a tile
  const int next_turn = 1 + (c + 1) % kConsumers;  // the named barrier of the next group's turn
  const int warp = tid / 32, lane = tid % 32;
  const uint32_t q_addr = smem_addr(sm.q) + c * 64 * 128;  // 64 rows of 128-byte spans
  constexpr int kScores = Dim::kScores;
  float o[kOutRegs], s[kScores];
  uint32_t p[kScores / 2];
  uint32_t kv = 0;  // K / V blocks so far (wraps consistently: kStages divides 2^32)
#ifdef FA_HOPPER_PROFILE
  long long prof[16] = {}, prof_last = clock64();
#endif
  // Turns at the tensor cores go round the groups (0, 1, .., 0, ...) across tiles too: the
  // last group's signal after a tile's last block is group 0's first turn of the next tile.
  // (A signal a tile, given at its start and taken at its end, let the last group signal
  // the next tile's first turn before group 0 took the last one: the barrier then counted
  // the last group's two signals as one round.)
  if (c == kConsumers - 1) named_arrive(1);  // consumer 0 takes the first turn
  for (int k = 0;; ++k) {  // Q's phases
    FA_PROFILE_PHASE(kTileEnds);
    mbar_wait(&sm.q_full, k & 1);
    const int t = sm.tile[k & 1];
    if (t < 0) {
      if (c == 0) named_sync(1);  // takes the last group's last signal: the counts balance
      break;
    }
    const Tile tile = tile_at<kCausal, kBlockM, kBlockN, Mod::kBiasReads>(a, t, num_m);
    const int n_end = tile.n_end, blocks = n_end - tile.n_begin;
    const int row0 = tile.m0 + 64 * c + 16 * warp + lane / 4;  // this thread's rows: +0, +8
#pragma unroll
    for (int i = 0; i < kOutRegs; ++i) o[i] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY};
    float mx_old[2];
    float mx_all[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};  // without the ones (head dim 256): this thread's part of the row sums
    bool rescale = false;  // whether o needs rescale_factors before the next P V
    const float slope = a.slopes ? a.slopes[tile.h * a.slope_stride] * a.slope_mul : 0.0f;
    // S's softmax for the tile's block it (key block n = n_end - 1 - it): the bias tile
    // (BiasTileScores), modify, mask where the block needs it, max, exp2.
    auto softmax = [&](int it) {
      const int n = n_end - 1 - it;
      const int col0 = n * kBlockN + 2 * (lane % 4);
      if constexpr (kBiasTile) {
        const uint32_t idx = kv + it;
        const int bst = idx % Dim::kBiasStages;
        mbar_wait(&sm.bias.full[bst][c], (idx / Dim::kBiasStages) & 1);
        add_bias_tile<kBf16, kBlockN>(s, smem_addr(sm.bias.tile[bst][c]), warp, lane, a.bias_mul);
        mbar_arrive(&sm.bias.empty[bst][c]);
      }
      // (The mask's addresses are worked out here, not kept: registers are short.)
      const int cls = !Mod::kBiasReads || !a.bias ? 1 : !a.tiles ? 4
                      : a.tiles[(size_t(mask_table(a, tile.b, tile.h)) * num_m + tile.m0 / kBlockM) *
                                num_n + n];
      // A block the band or the sequence's end cuts (the mask type's tests on every score);
      // a dense mask's bits drop the keys past Skv already.
      const bool edge = (n + 1) * kBlockN > tile.kv_len ||
                        (kCausal && (n + 1) * kBlockN - 1 > tile.m0 + tile.diag) ||
                        n * kBlockN < tile.m0 + kBlockM - 1 + tile.lo_diag;
      if (cls & 4) {  // a bias to add (or no classes)
        const BiasRow br{a.bias + tile.b * a.bias_b + tile.h * a.bias_h + int64_t{row0} * a.bias_s,
                         a.bias_s};
        rescale = softmax_step<Mod, kCausal, true, kBlockN, 2, kBf16>(
            s, mx, mx_old, mx_all, a, row0, col0, slope, tile.kv_len, tile.diag, tile.lo_diag, br);
      } else if (cls != 1) {  // keys dropped (or none kept): the rows' bits
        constexpr int kWords = kBlockN / 32;
        using Words = std::conditional_t<kWords == 4, uint4, uint2>;
        const uint32_t* w = a.keep_bits +
                            (size_t(mask_table(a, tile.b, tile.h)) * num_m * kBlockM + row0) *
                                a.words_per_row + n * kWords;
        uint32_t keep[2][kWords];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const Words x = *reinterpret_cast<const Words*>(w + 8 * r * a.words_per_row);
          memcpy(keep[r], &x, sizeof(x));
#pragma unroll
          for (int k = 0; k < kWords; ++k) keep[r][k] >>= 2 * (lane % 4);
        }
        // Inside the band the bits alone (the type's tests cost the mixed tiles of a dense
        // window 0.20 -> 0.27 ms at head dim 128, dense_groups_time, H200, session 40).
        if (edge)
          rescale = softmax_step<Mod, kCausal, true, kBlockN, 1, kBf16>(
              s, mx, mx_old, mx_all, a, row0, col0, slope, tile.kv_len, tile.diag, tile.lo_diag, {},
              keep);
        else
          rescale = softmax_step<Mod, kCausal, false, kBlockN, 1, kBf16>(
              s, mx, mx_old, mx_all, a, row0, col0, slope, tile.kv_len, tile.diag, tile.lo_diag, {},
              keep);
      } else if (edge)
        rescale = softmax_step<Mod, kCausal, true, kBlockN>(s, mx, mx_old, mx_all, a, row0, col0, slope,
                                                            tile.kv_len, tile.diag, tile.lo_diag);
      else
        rescale = softmax_step<Mod, kCausal, false, kBlockN>(s, mx, mx_old, mx_all, a, row0, col0, slope,
                                                             tile.kv_len, tile.diag, tile.lo_diag);
      if constexpr (!Dim::kOnes) {  // the sums to the new max, then this block's P added
        if (rescale) {
          float corr[2];
          rescale_factors(mx, mx_old, a.mul_out, corr);
          l[0] *= corr[0], l[1] *= corr[1];
        }
#pragma unroll
        for (int i = 0; i < kScores; ++i) l[(i / 2) % 2] += s[i];
      }
    };
    // Before a P V: the accumulator to the max that P was taken at, where a row's moved.
    auto rescale_to_max = [&] {
      if (rescale) {
        float corr[2];
        rescale_factors(mx, mx_old, a.mul_out, corr);
#pragma unroll
        for (int i = 0; i < kOutRegs; ++i) o[i] *= corr[(i / 2) % 2];
      }
    };

    FA_PROFILE_PHASE(kWaitQ);
    {  // the first block (the last keys): no P V yet
      const int st = kv % kStages;
      mbar_wait(&sm.k_full[st], (kv / kStages) & 1);
      named_sync(1 + c);  // this group's turn at the tensor cores
      fence_regs(s);
      wgmma_fence();
      issue_qk<kBf16, Dim>(s, q_addr, smem_addr(sm.k[st]));
      named_arrive(next_turn);  // the next group's turn
      wgmma_wait<0>();
      fence_regs(s);
      mbar_arrive(&sm.k_empty[st]);
      if (blocks == 1) mbar_arrive(&sm.q_empty);
      softmax(0);
#pragma unroll
      for (int i = 0; i < kScores / 2; ++i) p[i] = pack2<kBf16>(s[2 * i], s[2 * i + 1]);
    }
    FA_PROFILE_PHASE(kFirst);
    for (int it = 1; it < blocks; ++it) {
      const int st = (kv + it) % kStages, prev = (kv + it - 1) % kStages;
      FA_PROFILE_PHASE(kOther);
      mbar_wait(&sm.k_full[st], ((kv + it) / kStages) & 1);
      FA_PROFILE_PHASE(kWaitKV);
      named_sync(1 + c);
      FA_PROFILE_PHASE(kWaitTurn);
      fence_regs(s);
      fence_regs(o);
      fence_regs(p);
      wgmma_fence();
      issue_qk<kBf16, Dim>(s, q_addr, smem_addr(sm.k[st]));
      rescale_to_max();  // of the previous P
      mbar_wait(&sm.v_full[prev], ((kv + it - 1) / kStages) & 1);
      wgmma_fence();  // o changed since the last fence
      issue_pv<kBf16, Dim>(o, p, smem_addr(sm.v[prev]));
      named_arrive(next_turn);
      FA_PROFILE_PHASE(kIssue);
      wgmma_wait<1>();  // S is ready; the previous P V may still run
      fence_regs(s);
      FA_PROFILE_PHASE(kWaitS);
      mbar_arrive(&sm.k_empty[st]);
      if (it == blocks - 1) mbar_arrive(&sm.q_empty);
      softmax(it);
      FA_PROFILE_PHASE(kSoftmax);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(p);
      FA_PROFILE_PHASE(kWaitPV);
      mbar_arrive(&sm.v_empty[prev]);
#pragma unroll
      for (int i = 0; i < kScores / 2; ++i) p[i] = pack2<kBf16>(s[2 * i], s[2 * i + 1]);
    }
    FA_PROFILE_PHASE(kOther);
    {  // the last P V
      const int st = (kv + blocks - 1) % kStages;
      rescale_to_max();
      mbar_wait(&sm.v_full[st], ((kv + blocks - 1) / kStages) & 1);
      fence_regs(o);
      fence_regs(p);
      wgmma_fence();
      issue_pv<kBf16, Dim>(o, p, smem_addr(sm.v[st]));
      wgmma_wait<0>();
      fence_regs(o);
      mbar_arrive(&sm.v_empty[st]);
    }
    FA_PROFILE_PHASE(kLast);
    kv += blocks;

    // Epilogue: O / sum straight from registers, and the log-sum-exp.
    using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
    if constexpr (!Dim::kOnes) {  // the row's 4 lanes' parts
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      }
    }
    // The extra logit of a softmax with a sink (log2 units; -inf: none).
    const float sink2 = a.sink == 0 ? -INFINITY
                        : a.sink == 1 ? 0.0f
                                      : a.sinks[(tile.b / a.sink_rows) * a.heads_q + tile.h] *
                                            1.4426950408889634f;
    if (a.max_logit) {  // the warp's 16 rows at once, then one atomic
      uint32_t key = 0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float sum = Dim::kOnes ? o[kOutRegs - 4 + 2 * r] : l[r];
        // A NaN among the kept scores: fmaxf passed it by, the sum has it.
        const float logit = sum != sum ? NAN : mx_all[r] * a.mul_out * 0.69314718055994531f;
        if (row0 + 8 * r < tile.q_len) key = max(key, max_logit_key(logit));
      }
      key = __reduce_max_sync(0xffffffffu, key);
      if (lane == 0 && key != 0)
        atomicMax(a.max_logit + tile.b * a.ml_b + tile.h * a.ml_h, key);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 8 * r;
      // THD: the sequence's rows only (the next ones are another sequence's).
      if (row >= (a.seq_q_len ? tile.q_len : a.seqlen_q)) continue;
      // A padded query keeps nothing, whatever its scores were (NaN included): sum 0.
      const bool pad = row >= tile.q_len;
      const float sum = Dim::kOnes ? o[kOutRegs - 4 + 2 * r] : l[r];  // ones: any of their columns
      const float l = pad ? 0.0f : sum;
      // l is 0 where the row kept nothing, NaN where it met a NaN score (fmaxf skips NaN
      // in the max, but exp2 of it poisons l): that NaN reaches out and lse.
      const float m = mx[r] * a.mul_out;  // l's base (log2 units)
      float inv, lse2;                     // out = o * inv; lse = lse2 ln 2
      if (pad || l == 0.0f) {  // no key kept: out 0, lse the extra logit (-inf: none)
        inv = 0.0f, lse2 = pad ? -INFINITY : sink2;
      } else if (!a.sink) {
        inv = 1.0f / l, lse2 = m + __log2f(l);
      } else if (sink2 == INFINITY) {  // the extra logit takes all the mass
        inv = 0.0f, lse2 = INFINITY;
      } else {  // the denominator gains exp2(sink2) (a NaN sink: NaN out and lse)
        const float top = fmaxf(m, sink2), e = exp2_approx(m - top);
        const float denom = fmaf(l, e, exp2_approx(sink2 - top));
        inv = e / denom, lse2 = top + __log2f(denom);
      }
      const int64_t token = tile.q0 + row;
      T* out = static_cast<T*>(a.out) + tile.b * a.o_b + token * a.o_s + tile.h * a.o_h;
      const bool zero = inv == 0.0f;  // 0 whatever o holds (a NaN value at a masked key)
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const float x0 = zero ? 0.0f : o[4 * j + 2 * r] * inv;
        const float x1 = zero ? 0.0f : o[4 * j + 2 * r + 1] * inv;
        *reinterpret_cast<uint32_t*>(out + 8 * j + 2 * (lane % 4)) = pack2<kBf16>(x0, x1);
      }
      if (a.lse && lane % 4 == 0)
        a.lse[tile.b * a.l_b + tile.h * a.l_h + token * a.l_s] = lse2 * 0.69314718055994531f;
    }
  }
#ifdef FA_HOPPER_PROFILE
  FA_PROFILE_PHASE(kTileEnds);
  if (tid == 0)
    for (int i = 0; i < 16; ++i) atomicAdd(&g_profile[16 * c + i], prof[i]);
#endif
#endif
}

}  // namespace fusedattn::cuda::hopper
