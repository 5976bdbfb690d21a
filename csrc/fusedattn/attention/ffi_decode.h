// The one place where FFI buffers and attributes become an AttnParams
// (validated) and an AttnTensors (platform-neutral pointers and strides). The
// CPU handlers and the CUDA ones build their kernel arguments from these.
//
// Operands, in order (every leading dimension L... is batch; vmap adds some):
//   q, k, v      separate:  q [L, Sq, Hq, D], k [L, Skv, Hkv, D], v [L, Skv, Hkv, Dv]
//                BS3HD/T3HD:       q = qkv [L, S, 3, H, D], k and v empty
//                BSHD_BS2HD/THD_T2HD: q [L, Sq, Hq, D], k = kv [L, Skv, 2, Hkv, D], v empty
//   bias            [V, 1|B, 1|Hq, Sq, Skv] q's dtype, or empty   (V = L minus its last dim)
//   softmax_offset  [V, Hq] f32 (f64 for float64 q, k, v) (LEARNABLE_SOFTMAX), or empty
//   seed            [V, 2] u32 (read only with dropout), or empty
//   q_seqlens, kv_seqlens [L, M] int32;  q_offsets, kv_offsets [L, M + 1] int32
//   index_base      [V, 2] int32 (batch_base, head_base) >= 0, or empty (0, 0): the
//                   global index of this call's batch entry 0 and q head 0 when the call
//                   is one device's shard of a bigger one. Dropout's Philox counter and
//                   the score_mod program's batch / head inputs use the global index.
//                   Or [V, 6] (batch_base, head_base, q_pos, kv_pos, q_extent, kv_extent)
//                   or [V, 8] (.., stripe, stride): the call is also a block of a bigger
//                   one along the sequence (context parallelism), any layout: local query
//                   t is global token q_pos + (t / stripe) * stride + t % stripe of a row
//                   of q_extent queries, local key t the same from kv_pos of kv_extent keys
//                   (6 columns: stripe = stride = 1, contiguous). The sequence descriptor
//                   is the whole call's (THD: offsets into the global packed row). The mask
//                   (mask.h: block_keys), dropout's counter (kv_pos % 4 == 0, and a striped
//                   block's stripe) and the score_mod program's q / kv inputs use global
//                   positions; arrays (bias, score_mod operands) are the block's own, and a
//                   THD block's score_mod operands have no sequence dim (check_index_base).
//                   The CUDA handlers refuse positions.
// "Empty" is any zero-size array (Python passes shape (0,); vmap may add dims).
// Forward results: out [L, Sq, Hq, Dv], lse f32 [L, Hq, Sq] (THD: [L, Sq, Hq]),
// max_logit f32 [L, Hq]. Backward: the 11 operands, then out, dout, lse ->
// dq, dk, dv, dbias (each the shape of its operand; empty for empty),
// dsoftmax_offset f32 [L, Hq] (empty without softmax_offset).
// float64 q, k, v (the CPU engine's double form; the CUDA handlers refuse them: Python
// runs float64 as float32 on the GPU) take every f32 above (softmax_offset, lse,
// max_logit, dsoftmax_offset) in f64: stat_dtype.
#pragma once

#include <cstdint>
#include <string>

#include "fusedattn/attention/params.h"
#include "fusedattn/attention/tensors.h"
#include "fusedattn/score_mod/program.h"
#include "fusedattn/core/status.h"
#include "fusedattn/ffi/common.h"

// c_api.cc: the bias a folded boolean mask holds at the keys it drops (cpu::masked_bias).
extern "C" float fa_masked_bias_value(int dtype);

namespace fusedattn::ffi_glue {

// The attributes every attention handler takes (Python passes them by name).
struct AttnAttrs {
  int32_t layout;
  int32_t mask_type;
  int32_t bias_type;
  int32_t softmax_type;
  int32_t is_training;
  // In double: a float64 call reads them so (cpu::Extras::scale64); AttnParams holds
  // them rounded to float32.
  double scale;
  double dropout;
  int64_t window_left;
  int64_t window_right;
  // Which forward results the caller reads (a backend may skip the others): the lse
  // (returned, or saved for the backward) and max_logit. The CPU engine makes both always.
  int32_t want_lse;
  int32_t want_max_logit;
  // BackendRequest's flags (backend.h: kRequestIndexBase, kRequestCudnnRejected) of the
  // decision Python made with select_backend(), so the CUDA handler makes the same one.
  int32_t backend_flags;
};

// AttnAttrs plus a score_mod program attribute (score_mod.h's packed form).
struct AttnScoreModAttrs {
  int32_t layout;
  int32_t mask_type;
  int32_t bias_type;
  int32_t softmax_type;
  int32_t is_training;
  double scale;
  double dropout;
  int64_t window_left;
  int64_t window_right;
  int32_t want_lse;
  int32_t want_max_logit;
  int32_t backend_flags;
  ffi::Span<const int32_t> score_mod;
  AttnAttrs base() const {
    return {layout, mask_type, bias_type, softmax_type, is_training, scale, dropout,
            window_left, window_right, want_lse, want_max_logit, backend_flags};
  }
};


// The eleven operands every attention call starts with.
struct AttnOperands {
  const ffi::AnyBuffer* q;
  const ffi::AnyBuffer* k;
  const ffi::AnyBuffer* v;
  const ffi::AnyBuffer* bias;
  const ffi::AnyBuffer* softmax_offset;
  const ffi::AnyBuffer* seed;
  const ffi::AnyBuffer* q_seqlens;
  const ffi::AnyBuffer* kv_seqlens;
  const ffi::AnyBuffer* q_offsets;
  const ffi::AnyBuffer* kv_offsets;
  const ffi::AnyBuffer* index_base;
};

// The dtype of the statistics (softmax_offset, lse, max_logit, dsoftmax_offset): f32,
// f64 for a float64 call.
ffi::DataType stat_dtype(const AttnParams& p);

// Shapes -> AttnParams (then validate()) and the input pointers of t. Reads no
// buffer's contents (the CUDA handlers' buffers live on the device).
Status decode_operands(const AttnOperands& in, const AttnAttrs& attrs, AttnParams* p,
                       AttnTensors* t);

// index_base's values, read on the host (CPU handlers): validate_index_base (validate.h);
// and a THD block's score_mod (sm, null: none) reads no operand along the sequence.
Status check_index_base(const AttnParams& p, const AttnTensors& t, const ScoreMod* sm);

// kRequestAverageEmptyRows (backend.h): a row is empty when its lse is at most this, half
// the value a folded mask holds at its dropped keys in dtype.
double empty_row_threshold(int32_t dtype);

// The forward results: out, lse, max_logit.
Status decode_fwd_results(const AttnParams& p, const AttnOperands& in, ffi::AnyBuffer* out,
                          ffi::AnyBuffer* lse, ffi::AnyBuffer* max_logit, AttnTensors* t);

// The backward's extra inputs (out, dout, lse) and its results.
Status decode_bwd_buffers(const AttnParams& p, const AttnOperands& in, const ffi::AnyBuffer& out,
                          const ffi::AnyBuffer& dout, const ffi::AnyBuffer& lse,
                          ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv,
                          ffi::AnyBuffer* dbias, ffi::AnyBuffer* dsoftmax_offset, AttnTensors* t);

// The score_mod pieces of a call (attributes and operand buffer), decoded and checked:
// the operands are float32 [total] or [slices, total] (vmap), total = sm.total_size();
// doperands (null: none) is their gradient result, of the same shape.
struct ScoreModCall {
  ScoreMod sm;
  const float* operands = nullptr;
  float* doperands = nullptr;
};

Status decode_score_mod_call(const AttnParams& p, ffi::Span<const int32_t> program,
                             const ffi::AnyBuffer& operands, ffi::AnyBuffer* doperands,
                             ScoreModCall* c);

}  // namespace fusedattn::ffi_glue

// The binding of the eleven operands (AttnOperands' order) that every attention handler,
// CPU and CUDA, starts its argument list with: Ffi::Bind() [contexts] FA_ATTN_BIND_OPERANDS
// [more operands] .Ret<...>() ...
#define FA_ATTN_BIND_OPERANDS                                  \
  .Arg<::xla::ffi::AnyBuffer>()     /* q */                    \
      .Arg<::xla::ffi::AnyBuffer>() /* k */                    \
      .Arg<::xla::ffi::AnyBuffer>() /* v */                    \
      .Arg<::xla::ffi::AnyBuffer>() /* bias */                 \
      .Arg<::xla::ffi::AnyBuffer>() /* softmax_offset */       \
      .Arg<::xla::ffi::AnyBuffer>() /* seed */                 \
      .Arg<::xla::ffi::AnyBuffer>() /* q_seqlens */            \
      .Arg<::xla::ffi::AnyBuffer>() /* kv_seqlens */           \
      .Arg<::xla::ffi::AnyBuffer>() /* q_offsets */            \
      .Arg<::xla::ffi::AnyBuffer>() /* kv_offsets */           \
      .Arg<::xla::ffi::AnyBuffer>() /* index_base */

// The other pieces of the handlers' argument lists, in their order (a CUDA handler adds
// its contexts before and a workspace result after; the score_mod variants insert
// FA_ATTN_BIND_SM_OPERANDS after the eleven operands):
//   forward:  FA_ATTN_BIND_OPERANDS [sm] FA_ATTN_BIND_FWD_RESULTS
//   backward: FA_ATTN_BIND_OPERANDS [sm] FA_ATTN_BIND_BWD_INPUTS FA_ATTN_BIND_BWD_RESULTS
#define FA_ATTN_BIND_SM_OPERANDS .Arg<::xla::ffi::AnyBuffer>() /* score_mod_operands */
#define FA_ATTN_BIND_FWD_RESULTS                             \
  .Ret<::xla::ffi::AnyBuffer>()     /* out */                \
      .Ret<::xla::ffi::AnyBuffer>() /* softmax_aux (lse) */  \
      .Ret<::xla::ffi::AnyBuffer>() /* max_logit */
#define FA_ATTN_BIND_BWD_INPUTS                              \
  .Arg<::xla::ffi::AnyBuffer>()     /* out */                \
      .Arg<::xla::ffi::AnyBuffer>() /* dout */               \
      .Arg<::xla::ffi::AnyBuffer>() /* softmax_aux (lse) */
#define FA_ATTN_BIND_BWD_RESULTS                             \
  .Ret<::xla::ffi::AnyBuffer>()     /* dq */                 \
      .Ret<::xla::ffi::AnyBuffer>() /* dk */                 \
      .Ret<::xla::ffi::AnyBuffer>() /* dv */                 \
      .Ret<::xla::ffi::AnyBuffer>() /* dbias */              \
      .Ret<::xla::ffi::AnyBuffer>() /* dsoftmax_offset */

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    fusedattn::ffi_glue::AttnAttrs, ::xla::ffi::StructMember<int32_t>("layout"),
    ::xla::ffi::StructMember<int32_t>("mask_type"), ::xla::ffi::StructMember<int32_t>("bias_type"),
    ::xla::ffi::StructMember<int32_t>("softmax_type"),
    ::xla::ffi::StructMember<int32_t>("is_training"), ::xla::ffi::StructMember<double>("scale"),
    ::xla::ffi::StructMember<double>("dropout"), ::xla::ffi::StructMember<int64_t>("window_left"),
    ::xla::ffi::StructMember<int64_t>("window_right"), ::xla::ffi::StructMember<int32_t>("want_lse"),
    ::xla::ffi::StructMember<int32_t>("want_max_logit"),
    ::xla::ffi::StructMember<int32_t>("backend_flags"));

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    fusedattn::ffi_glue::AttnScoreModAttrs, ::xla::ffi::StructMember<int32_t>("layout"),
    ::xla::ffi::StructMember<int32_t>("mask_type"), ::xla::ffi::StructMember<int32_t>("bias_type"),
    ::xla::ffi::StructMember<int32_t>("softmax_type"),
    ::xla::ffi::StructMember<int32_t>("is_training"), ::xla::ffi::StructMember<double>("scale"),
    ::xla::ffi::StructMember<double>("dropout"), ::xla::ffi::StructMember<int64_t>("window_left"),
    ::xla::ffi::StructMember<int64_t>("window_right"), ::xla::ffi::StructMember<int32_t>("want_lse"),
    ::xla::ffi::StructMember<int32_t>("want_max_logit"),
    ::xla::ffi::StructMember<int32_t>("backend_flags"),
    ::xla::ffi::StructMember<::xla::ffi::Span<const int32_t>>("score_mod"));
