// SmallSeqParams: the one struct that describes a small-sequence cross-attention
// call (one query per segment, a handful of keys), from the FFI handler or the
// Python query API down to the kernels.
//
// Tensors (every leading dimension of a THD tensor is a "pack": vmap adds them;
// BSHD folds them into the batch):
//   THD_THD_THD:    q [packs, Tq, Hq, D], k/v [packs, Tkv, Hkv, D]; segment s of a pack
//                   has its q rows at q_offsets[s] .. + q_len and its kv rows likewise.
//   BSHD_BSHD_BSHD: q [B, 1, Hq, D], k/v [B, Skv, Hkv, D]; segment = batch entry.
//   out [like q]; probs P [packs, Tq, Hq, 1, W] f32 (the attention weights saved for the
//   backward, W = max_seqlen_kv); stats [packs, Tq, Hq, 2] f32 (row max of the scaled
//   logits, log-sum-exp; -inf for a row that keeps no key).
//
// A plain C struct on purpose: Python mirrors it with ctypes to ask the same
// validation and eligibility questions the FFI handlers ask.
#pragma once

#include <stdint.h>

#include "fusedattn/attention/params.h"  // FaDType, FaQKVLayout, FaMaskType, ... codes

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FaSmallSeqParams {
  int64_t packs;          // product of the leading (vmap) dims of a THD call; 1 for BSHD
  int64_t num_segments;   // segments per pack (BSHD: every batch entry, vmap dims included)
  int64_t tokens_q;       // q rows per pack (BSHD: num_segments * 1)
  int64_t tokens_kv;      // kv rows per pack (BSHD: num_segments * Skv)
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim_qk;
  int64_t head_dim_v;
  int64_t max_seqlen_q;   // promised q rows per segment (BSHD: Sq); the backend serves 1
  int64_t max_seqlen_kv;  // promised kv rows per segment (BSHD: Skv): the width W of P
  int64_t window_left;    // -1: unbounded (the only value served)
  int64_t window_right;
  int32_t dtype;          // FaDType of q, k, v, out
  int32_t layout;         // FaQKVLayout: BSHD_BSHD_BSHD or THD_THD_THD
  int32_t mask_type;      // FaMaskType
  int32_t bias_type;      // FaBiasType (only NO_BIAS is served)
  int32_t softmax_type;   // FaSoftmaxType (only VANILLA_SOFTMAX is served)
  int32_t is_training;
  int32_t has_q_seqlens;  // per-segment q lengths given (else: the whole slot)
  int32_t has_kv_seqlens;
  int32_t has_offsets;    // q/kv offsets [packs, num_segments + 1] given (THD needs them)
  float scale;
  float dropout;
} FaSmallSeqParams;

#ifdef __cplusplus
}  // extern "C"

namespace fusedattn {

using SmallSeqParams = FaSmallSeqParams;

namespace small_seq {

// The widest P (kv rows per segment) the kernels keep in registers; longer
// segments are still served, by a slower per-segment path.
constexpr int64_t kMaxWidth = 64;
// Keeps a block's shared memory (one float per q head of a kv group and warp) small.
constexpr int64_t kMaxHeads = 1024;
// Offsets and lengths are int32.
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 2;
// Work items (segments x heads): the CUDA kernels count them in int32 with headroom.
constexpr int64_t kMaxWorkItems = int64_t{1} << 30;

inline bool head_dim_supported(int64_t d) { return d == 64 || d == 128 || d == 256 || d == 512; }

}  // namespace small_seq
}  // namespace fusedattn
#endif
