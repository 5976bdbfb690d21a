// Small kernels around the cuDNN SDPA graphs: they turn fusedattn's sequence
// descriptors into cuDNN's, and give every backend the same answers on the rows
// cuDNN leaves alone (padding, THD gaps, rows whose mask keeps no key). Segments and
// kept keys are those of attention/mask.h (AttnMask), the rule every backend follows.
//
//   seqlens [B, M] i32, offsets [B, M + 1] i32 (token offsets within a row)
//   flat seqlens [B * M] i32, ragged offsets [B * M + 1] i32 (in elements)
//   out [B, Sq, Hq, Dv] (strided), lse / max / sum_exp f32 (strided like lse),
//   max_logit [B, Hq] f32
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace fusedattn::cuda {

// Element strides of a [batch, seq, heads] addressing (dim stride 1).
struct Strides3 {
  int64_t b, s, h;
};

// cuDNN's sequence tensors for B rows of M segments: clamped flat lengths and, for
// THD, ragged offsets of each token tensor (token index * token stride of that tensor).
struct SequenceArgs {
  int64_t rows;                // B
  int32_t* seq_q;              // [B * M]
  int32_t* seq_kv;
  int32_t* ragged[5];          // [B * M + 1] each, or null; for q, k, v, o, lse
  int64_t token_stride[5];     // q, k, v: query/key tokens; o, lse: query tokens
  bool ragged_is_kv[5];        // offsets from kv_offsets (k, v) or q_offsets (q, o, lse)
};
Status prepare_sequences(const AttnMask& mask, const SequenceArgs& a, cudaStream_t stream);

// After the forward graph: rows that keep no key get out 0 and lse = the extra logit
// (sink[h], or 0 for off-by-one; -inf under vanilla); padding rows (THD gaps, beyond a
// sequence's length) get out 0 and lse -inf. With max and
// sum_exp (max_logit requested) lse = max + log(sum_exp) and max_logit[b, h] = the max of
// `max` over rows that keep a key (-inf when none does).
struct FinalizeArgs {
  int64_t batch, heads;
  int32_t dtype;                 // of out
  int64_t head_dim_v;
  void* out;
  Strides3 so;
  float* lse;
  Strides3 slse;                 // also the strides of max and sum_exp
  const float* max;              // null unless max_logit is requested
  const float* sum_exp;
  float* max_logit;              // [B, Hq] or null
  int32_t softmax_type;
  const float* sink;             // [Hq] per slice, or null
  int64_t rows_per_slice;        // folded batch entries per sink slice
};
Status finalize_forward(const AttnMask& mask, const FinalizeArgs& a, cudaStream_t stream);

// The lse the backward graph reads: -inf (a row that keeps nothing) becomes +inf, so
// such rows get probabilities exp(s - inf) = 0 and zero gradients. n floats, contiguous.
Status backward_lse(const float* lse, float* out, int64_t n, cudaStream_t stream);

}  // namespace fusedattn::cuda
