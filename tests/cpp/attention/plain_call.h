// The attention tests' starting points: a valid plain call (BSHD, no mask, bias, sink or
// dropout; tests set what they vary) and the H100 the backend tests decide for.
#pragma once

#include <cstdint>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/params.h"

namespace fusedattn::test {

inline AttnParams plain_call(int64_t B, int64_t Sq, int64_t Skv, int64_t Hq, int64_t Hkv,
                             int64_t D, int64_t Dv, float scale, int32_t dtype = FA_BFLOAT16) {
  AttnParams p{};
  p.batch = B;
  p.seqlen_q = Sq;
  p.seqlen_kv = Skv;
  p.heads_q = Hq;
  p.heads_kv = Hkv;
  p.head_dim_qk = D;
  p.head_dim_v = Dv;
  p.window_left = p.window_right = -1;
  p.dtype = dtype;
  p.layout = FA_BSHD_BSHD_BSHD;
  p.mask_type = FA_NO_MASK;
  p.bias_type = FA_NO_BIAS;
  p.softmax_type = FA_VANILLA_SOFTMAX;
  p.scale = scale;
  p.dropout = 0.0f;
  p.max_segments = 1;
  p.num_slices = 1;
  return p;
}

inline PlatformInfo h100() {
  PlatformInfo info;
  info.cuda_built = true;
  info.cudnn_version = 91900;
  info.sm = 90;
  info.smem_optin = 232448;  // 227 KB
  return info;
}

}  // namespace fusedattn::test
