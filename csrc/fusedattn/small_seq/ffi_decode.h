// Turns the FFI buffers and attributes of a small-seq call into a SmallSeqParams
// and the segment tables, checking every shape against every other one. Shared by
// the CPU and CUDA handlers (ffi_cpu.cc, ffi_cuda.cc).
//
//   THD_THD_THD:    q [..., Tq, Hq, D], k/v [..., Tkv, Hkv, D], q/kv_offsets [..., N + 1],
//                   q/kv_seqlens [..., N] or [..., 0] (absent); leading dims are packs.
//   BSHD_BSHD_BSHD: q [..., B, 1, Hq, D], k/v [..., B, Skv, Hkv, D], offsets [..., 0],
//                   q/kv_seqlens [..., B] or [..., 0]; leading dims fold into B.
//   probs [..., Tq, Hq, 1, W] f32 and stats [..., Tq, Hq, 2] f32 (BSHD: Tq = B).
#pragma once

#include <cstdint>

#include "fusedattn/small_seq/args.h"
#include "fusedattn/small_seq/params.h"
#include "fusedattn/ffi/common.h"

namespace fusedattn::ffi_glue {

struct SmallSeqAttrs {
  int32_t layout;
  int32_t mask_type;
  float scale;
  int64_t max_seqlen_kv;  // W: THD's promise; BSHD passes Skv
  int32_t save_aux;       // forward: write probs and stats (the backward needs them)
  // Tests only: fill the outputs with NaN bits before the kernel runs, so an element a
  // kernel fails to write shows. Never changes a result the kernels compute.
  int32_t poison;
};

struct SmallSeqCall {
  SmallSeqParams p;
  small_seq::Segments seg;
  ffi::AnyBuffer::Dimensions q_dims;  // q's dimensions: out, dout and dq have them too
};

Status decode_small_seq(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                        const ffi::AnyBuffer& q_lens, const ffi::AnyBuffer& kv_lens,
                        const ffi::AnyBuffer& q_offsets, const ffi::AnyBuffer& kv_offsets,
                        const SmallSeqAttrs& attrs, SmallSeqCall* call);

// Checks probs [..., Tq, Hq, 1, W] and stats [..., Tq, Hq, 2] (f32).
Status expect_small_seq_aux(const SmallSeqCall& call, const ffi::AnyBuffer& probs,
                            const ffi::AnyBuffer& stats);

// Checks a tensor that has q's shape and dtype (out, dout, dq) or k's (dk, dv).
Status expect_like(const char* name, const ffi::AnyBuffer& buf, const ffi::AnyBuffer& like);

}  // namespace fusedattn::ffi_glue

// The handlers' argument lists after their contexts (the CPU and CUDA handlers share them):
// Ffi::Bind() [contexts] FA_SMALL_SEQ_BIND_FWD .Attrs<SmallSeqAttrs>()
#define FA_SMALL_SEQ_BIND_FWD                           \
  .Arg<::xla::ffi::AnyBuffer>()     /* q */             \
      .Arg<::xla::ffi::AnyBuffer>() /* k */             \
      .Arg<::xla::ffi::AnyBuffer>() /* v */             \
      .Arg<::xla::ffi::AnyBuffer>() /* q_seqlens */     \
      .Arg<::xla::ffi::AnyBuffer>() /* kv_seqlens */    \
      .Arg<::xla::ffi::AnyBuffer>() /* q_offsets */     \
      .Arg<::xla::ffi::AnyBuffer>() /* kv_offsets */    \
      .Ret<::xla::ffi::AnyBuffer>() /* out */           \
      .Ret<::xla::ffi::AnyBuffer>() /* probs */         \
      .Ret<::xla::ffi::AnyBuffer>() /* stats */
#define FA_SMALL_SEQ_BIND_BWD                           \
  .Arg<::xla::ffi::AnyBuffer>()     /* q */             \
      .Arg<::xla::ffi::AnyBuffer>() /* k */             \
      .Arg<::xla::ffi::AnyBuffer>() /* v */             \
      .Arg<::xla::ffi::AnyBuffer>() /* out */           \
      .Arg<::xla::ffi::AnyBuffer>() /* dout */          \
      .Arg<::xla::ffi::AnyBuffer>() /* probs */         \
      .Arg<::xla::ffi::AnyBuffer>() /* stats */         \
      .Arg<::xla::ffi::AnyBuffer>() /* q_seqlens */     \
      .Arg<::xla::ffi::AnyBuffer>() /* kv_seqlens */    \
      .Arg<::xla::ffi::AnyBuffer>() /* q_offsets */     \
      .Arg<::xla::ffi::AnyBuffer>() /* kv_offsets */    \
      .Ret<::xla::ffi::AnyBuffer>() /* dq */            \
      .Ret<::xla::ffi::AnyBuffer>() /* dk */            \
      .Ret<::xla::ffi::AnyBuffer>() /* dv */

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(fusedattn::ffi_glue::SmallSeqAttrs,
                                      ::xla::ffi::StructMember<int32_t>("layout"),
                                      ::xla::ffi::StructMember<int32_t>("mask_type"),
                                      ::xla::ffi::StructMember<float>("scale"),
                                      ::xla::ffi::StructMember<int64_t>("max_seqlen_kv"),
                                      ::xla::ffi::StructMember<int32_t>("save_aux"),
                                      ::xla::ffi::StructMember<int32_t>("poison"));
