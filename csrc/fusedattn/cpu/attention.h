// The CPU flash-attention engine: tiled, online softmax, float32 accumulation,
// O(S) extra memory, parallel over (batch, head, tile).
//
//   q [B, Sq, Hq, Dqk], k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv]
//   out [B, Sq, Hq, Dv] (q's dtype), lse [B, Hq, Sq] f32, max_logit [B, Hq] f32
//   q_lens, kv_lens [B] int32 (read only by the padding masks)
// Element type is p.dtype for q, k, v, out, dout, dq, dk, dv.
#pragma once

#include <cstdint>

#include "../params.h"

namespace fusedattn::cpu {

// Element strides of a [B, S, H, D] tensor whose last dimension is contiguous.
struct Strides {
  int64_t b, s, h;
  static Strides bshd(int64_t S, int64_t H, int64_t D) { return {S * H * D, H * D, D}; }
};

struct FwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* q_lens;
  const int32_t* kv_lens;
  void* out;
  float* lse;
  float* max_logit;  // may be null
  Strides sq, sk, sv, so;
};

struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* out;
  const void* dout;
  const float* lse;
  const int32_t* q_lens;
  const int32_t* kv_lens;
  void* dq;
  void* dk;
  void* dv;
  Strides sq, sk, sv, so, sdo, sdq, sdk, sdv;
};

// p must have passed validate().
void attention_fwd(const AttnParams& p, const FwdArgs& a);
void attention_bwd(const AttnParams& p, const BwdArgs& a);

}  // namespace fusedattn::cpu
