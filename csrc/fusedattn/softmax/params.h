// SoftmaxParams: the one struct that describes a fused softmax call, from the FFI
// handler (or the Python query API) down to the kernels.
//
// A plain C struct, like AttnParams: Python mirrors it with ctypes to ask the same
// validate() / kernel-availability questions the FFI handlers ask.
//
// Semantics (the softmax runs over the last axis, kv):
//   y[..., i, j] = exp(s x[..., i, j] - m) / sum_j' exp(s x[..., i, j'] - m)  over kept j,
//   y = 0 where j is not kept, and y = 0 on a whole row that keeps nothing.
// SCALED keeps every j; SCALED_MASKED keeps j where mask[..., i, j] is false
// (True = masked out, TransformerEngine's convention); SCALED_UPPER_TRIANG_MASKED
// keeps j <= i (top-left causal, i the query index: the second-to-last axis).
// Backward: dx = s * y * (dy - sum_j y dy), from the forward output y.
#pragma once

#include <stdint.h>

#include "fusedattn/core/codes.h"  // FaDType, FaStatus, FaPlatform

#ifdef __cplusplus
extern "C" {
#endif

enum FaSoftmaxFusionType {
  FA_SOFTMAX_SCALED = 0,
  FA_SOFTMAX_SCALED_MASKED = 1,
  FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED = 2,
};

#define FA_SOFTMAX_MAX_RANK 8

// logits (and y, dy, dx) have shape dims[0:rank]: [..., Sq, Skv]. The mask, when
// has_mask, has shape mask_dims[0:rank]: each dimension 1 (broadcast) or the
// logits' one, the last (Skv) equal. dtype is an FaDType, or -1 for a floating
// type the kernels do not take (Python asks availability for those too).
typedef struct FaSoftmaxParams {
  int64_t dims[FA_SOFTMAX_MAX_RANK];
  int64_t mask_dims[FA_SOFTMAX_MAX_RANK];
  int32_t rank;
  int32_t has_mask;
  int32_t softmax_type;  // FaSoftmaxFusionType
  int32_t dtype;         // FaDType of logits, y, dy and dx
  float scale;
} FaSoftmaxParams;

#ifdef __cplusplus
}  // extern "C"

namespace fusedattn {

using SoftmaxParams = FaSoftmaxParams;

// The CUDA kernels hold a whole row in registers (one pass over memory): rows of
// up to this many bytes, i.e. 16384 float32 or 32768 bf16/fp16 elements (past
// 16384 the 2-byte rows need kv_seqlen % 8 == 0; validate.cc, choose_kernel).
constexpr int64_t kCudaSoftmaxMaxRowBytes = 65536;

inline int64_t softmax_kv(const SoftmaxParams& p) { return p.dims[p.rank - 1]; }
inline int64_t softmax_q(const SoftmaxParams& p) { return p.dims[p.rank - 2]; }
// Rows of the softmax: every dimension but the last.
inline int64_t softmax_rows(const SoftmaxParams& p) {
  int64_t n = 1;
  for (int i = 0; i + 1 < p.rank; ++i) n *= p.dims[i];
  return n;
}
inline int64_t dtype_bytes(int32_t dtype) { return dtype == FA_FLOAT32 ? 4 : 2; }

const char* softmax_type_name(int32_t type);

}  // namespace fusedattn
#endif
