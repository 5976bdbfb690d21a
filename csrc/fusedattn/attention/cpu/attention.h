// The CPU flash-attention engine: tiled, online softmax, float32 accumulation (double
// for float64 storage: every score, sum, lse, max_logit and gradient in double), O(S)
// extra memory, parallel over (batch, head, tile).
//
//   q [B, Sq, Hq, Dqk], k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv]: strided views
//     (packed layouts point them into one tensor)
//   out [B, Sq, Hq, Dv] (q's dtype)
//   lse f32 (f64 for float64): [B, Hq, Sq] for BSHD layouts, [B, Sq, Hq] for THD ones
//     (strided view)
//   max_logit [B, Hq] f32 (f64 for float64; may be null)
//   bias [slices, 1|Bs, 1|Hq, Sq, Skv] in q's dtype (Bs = batch / slices; may be null)
//   softmax_offset [slices, Hq] f32 (f64 for float64; LEARNABLE_SOFTMAX only), seed
//     [slices, 2] u32 (dropout only), seqlens [B, M] and offsets [B, M + 1] int32
//     (attention/mask.h)
//   index_base [slices, 2] int32 (batch_base, head_base) >= 0, or [slices, 6] (batch_base,
//     head_base, q_pos, kv_pos, q_extent, kv_extent) or [slices, 8] (.., stripe, stride)
//     of a block of a bigger call (mask.h); may be null: (0, 0)
// Element type is p.dtype for q, k, v, out, dout, dq, dk, dv, bias, dbias. A float64 call
// takes no score_mod (its interpreter computes in float32: the reference serves those).
#pragma once

#include <cstdint>

#include "fusedattn/attention/params.h"
#include "fusedattn/score_mod/program.h"
#include "fusedattn/attention/cpu/row_ranges.h"

namespace fusedattn::cpu {

// Element strides of a [B, S, H, D] view whose last dimension is contiguous.
struct Strides {
  int64_t b, s, h;
  static Strides bshd(int64_t S, int64_t H, int64_t D) { return {S * H * D, H * D, D}; }
};

// Element strides of the bias [slices, 1|Bs, 1|Hq, Sq, Skv]: b and h are 0 on
// broadcast dimensions; rows (s) are contiguous in the key.
struct BiasStrides {
  int64_t slice, b, h, s;
  static BiasStrides dense(const AttnParams& p) {
    const int64_t s = p.seqlen_kv, h = p.seqlen_q * s, b = p.bias_heads * h;
    return {p.bias_batch * b, p.bias_batch > 1 ? b : 0, p.bias_heads > 1 ? h : 0, s};
  }
};

// Strides of lse for the layout: [B, Hq, Sq] or, for THD layouts, [B, Sq, Hq].
inline Strides lse_strides(const AttnParams& p) {
  return is_thd(p.layout) ? Strides{p.seqlen_q * p.heads_q, p.heads_q, 1}
                          : Strides{p.heads_q * p.seqlen_q, 1, p.seqlen_q};
}

// The inputs every pass reads besides q, k, v.
struct Extras {
  SeqArgs seq;
  const void* bias = nullptr;
  BiasStrides sbias{};
  const void* softmax_offset = nullptr;  // float32; double for float64
  const uint32_t* seed = nullptr;
  // The global index of batch entry 0 (within the slice) and q head 0, for a call that is
  // one device's shard of a bigger one: dropout's Philox counter and score_mod's batch and
  // head inputs count from there, so a shard computes what the whole call does there.
  // With 6 or 8 columns also the block's positions (mask.h: block_pos): the mask
  // (seq_args), dropout's query and key counters and score_mod's q / kv inputs are the
  // whole call's too.
  const int32_t* index_base = nullptr;
  int64_t index_cols = 2;  // index_base's columns: 2, or 6 / 8 with positions
  // score_mod (null: none) and its array operands [slices, score_mod->total_size()] f32.
  const ScoreMod* score_mod = nullptr;
  const float* score_mod_operands = nullptr;
  // The bias is a folded boolean mask (backend.h: kRequestMaskBias): its masked_bias<T>()
  // entries drop their keys, and tiles they fill are skipped.
  bool mask_bias = false;
  // One dropout mask for every batch entry and head (backend.h: kRequestDropoutBroadcast).
  bool dropout_broadcast = false;
  // A float64 call's scale and dropout probability in double (AttnParams holds them
  // rounded to float32): the float64 engine reads these, the float32 one p's.
  double scale64 = 0.0, dropout64 = 0.0;
};

inline bool is_block(const Extras& x) { return x.index_base && x.index_cols > 2; }

// x.seq, with the block of an index_base with positions (the mask's global positions).
inline SeqArgs seq_args(const Extras& x) {
  SeqArgs seq = x.seq;
  if (is_block(x)) seq.block = x.index_base, seq.block_cols = x.index_cols;
  return seq;
}

struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  void* lse;        // float32; double for float64 (so are max_logit's)
  void* max_logit;  // may be null
  Strides sq, sk, sv, so, slse;
  Extras x;
};

struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* dout;
  const void* lse;  // float32; double for float64 (so are dsoftmax_offset's)
  void* dq;
  void* dk;
  void* dv;
  void* dbias;             // bias's shape and strides; null: not computed
  void* dsoftmax_offset;  // [B, Hq]; null: not computed
  Strides sq, sk, sv, so, sdo, slse, sdq, sdk, sdv;
  Extras x;
  float* dscore_mod_operands = nullptr;  // [slices, score_mod total_size] f32; null: not computed
};

// p must have passed validate(); the pointers must match it (a bias when
// p.bias_type != NO_BIAS, softmax_offset for LEARNABLE_SOFTMAX, a seed when
// has_dropout(p)).
void attention_fwd(const AttnParams& p, const FwdArgs& a);
void attention_bwd(const AttnParams& p, const BwdArgs& a);

}  // namespace fusedattn::cpu
