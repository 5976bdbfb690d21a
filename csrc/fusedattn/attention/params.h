// AttnParams: the one struct that describes an attention call, from the FFI
// handler (or the Python query API) down to the kernel.
//
// It is a plain C struct on purpose: Python mirrors it with ctypes to ask
// validate() and select_backend() the same questions the FFI handlers ask, so
// the two sides can never disagree. Enum values are part of that ABI; Python
// checks them against fa_enum_value() in its tests.
#pragma once

#include <stdint.h>

#include "fusedattn/core/codes.h"  // FaDType, FaPlatform, FaStatus

#ifdef __cplusplus
extern "C" {
#endif

enum FaQKVLayout {
  FA_BS3HD = 0,
  FA_BSHD_BS2HD = 1,
  FA_BSHD_BSHD_BSHD = 2,
  FA_T3HD = 3,
  FA_THD_T2HD = 4,
  FA_THD_THD_THD = 5,
};

enum FaMaskType {
  FA_NO_MASK = 0,
  FA_PADDING_MASK = 1,
  FA_CAUSAL_MASK = 2,
  FA_PADDING_CAUSAL_MASK = 3,
  FA_CAUSAL_BOTTOM_RIGHT_MASK = 4,
  FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5,
};

enum FaBiasType { FA_NO_BIAS = 0, FA_PRE_SCALE_BIAS = 1, FA_POST_SCALE_BIAS = 2 };

enum FaSoftmaxType {
  FA_VANILLA_SOFTMAX = 0,
  FA_OFF_BY_ONE_SOFTMAX = 1,
  FA_LEARNABLE_SOFTMAX = 2,
};

enum FaBackend {
  FA_BACKEND_NONE = 0,
  FA_BACKEND_CPU_FLASH = 1,      // attention/cpu: tiled online-softmax attention
  FA_BACKEND_XLA_REFERENCE = 2,  // the plain-JAX reference, compiled by XLA
  FA_BACKEND_CUDNN = 3,          // attention/cudnn: a cuDNN SDPA graph
  FA_BACKEND_HOPPER_FWD = 4,     // attention/hopper: the sm_90 flash forward (softcap, ALiBi)
  FA_BACKEND_CUDA_FLASH = 5,     // attention/cuda: the generic CUDA flash kernels (sm_80+)
  FA_BACKEND_HOPPER_BWD = 6,     // attention/hopper: the sm_90 flash backward (dense masks)
};

// Shapes are the logical ones: q [B, Sq, Hq, Dqk], k [B, Skv, Hkv, Dqk],
// v [B, Skv, Hkv, Dv], out [B, Sq, Hq, Dv] (packed layouts are views of these).
// `batch` counts every leading dimension: vmap adds leading dimensions and the
// kernels fold them into B. `num_slices` says how many independent calls that
// folding stacked (1 without vmap): folded batch entry b belongs to slice
// b / (batch / num_slices), whose seed, softmax_offset and (broadcast) bias it reads.
//
// THD layouts (THD_THD_THD, T3HD, THD_T2HD) keep the [B, S, H, D] shapes, but each
// row b holds up to `max_segments` sequences, described by seqlens [B, M] and
// token offsets [B, M + 1] (see reference.py for the semantics).
typedef struct FaAttnParams {
  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_kv;
  int64_t heads_q;
  int64_t heads_kv;
  int64_t head_dim_qk;
  int64_t head_dim_v;
  int64_t window_left;   // -1: unbounded
  int64_t window_right;  // -1: unbounded
  int64_t max_segments;  // segments per row: 1 for BSHD layouts, M for THD layouts
  int64_t bias_batch;    // 0 without bias, else the bias's batch extent: 1 or batch / num_slices
  int64_t bias_heads;    // 0 without bias, else the bias's head extent: 1 or heads_q
  int64_t num_slices;    // vmap slices folded into batch (>= 1, divides batch)
  int32_t dtype;         // FaDType of q, k, v, out and bias
  int32_t layout;        // FaQKVLayout
  int32_t mask_type;     // FaMaskType
  int32_t bias_type;     // FaBiasType
  int32_t softmax_type;  // FaSoftmaxType
  int32_t is_training;
  float scale;
  float dropout;
} FaAttnParams;

#ifdef __cplusplus
}  // extern "C"

namespace fusedattn {

using AttnParams = FaAttnParams;

// The CPU engine takes any head dim up to this; the GPU kernels have their own limits
// (backend.h), and the reference serves what they decline.
constexpr int64_t kMaxHeadDim = 512;

inline bool has_padding(int32_t mask) {
  return mask == FA_PADDING_MASK || mask == FA_PADDING_CAUSAL_MASK ||
         mask == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
inline bool is_causal_top_left(int32_t mask) {
  return mask == FA_CAUSAL_MASK || mask == FA_PADDING_CAUSAL_MASK;
}
inline bool is_causal_bottom_right(int32_t mask) {
  return mask == FA_CAUSAL_BOTTOM_RIGHT_MASK || mask == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
inline bool is_causal(int32_t mask) { return is_causal_top_left(mask) || is_causal_bottom_right(mask); }
inline bool is_thd(int32_t layout) {
  return layout == FA_T3HD || layout == FA_THD_T2HD || layout == FA_THD_THD_THD;
}
// q, k and v in one tensor [B, S, 3, H, D]
inline bool is_qkv_packed(int32_t layout) { return layout == FA_BS3HD || layout == FA_T3HD; }
// k and v in one tensor [B, S, 2, H, D]
inline bool is_kv_packed(int32_t layout) { return layout == FA_BSHD_BS2HD || layout == FA_THD_T2HD; }
// Dropout is applied only while training with a positive probability.
inline bool has_dropout(const FaAttnParams& p) { return p.is_training && p.dropout > 0.0f; }
// Batch entries per vmap slice.
inline int64_t slice_batch(const FaAttnParams& p) { return p.batch / p.num_slices; }

const char* layout_name(int32_t layout);
const char* mask_name(int32_t mask);
const char* bias_name(int32_t bias);
const char* softmax_name(int32_t softmax);
const char* backend_name(int32_t backend);

}  // namespace fusedattn
#endif
