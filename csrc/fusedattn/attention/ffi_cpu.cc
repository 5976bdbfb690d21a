// XLA FFI handlers of the CPU attention engine (operands and results: ffi_decode.h):
//   fa_cpu_attn_fwd: q, k, v, bias, softmax_offset, seed, q_seqlens, kv_seqlens,
//                    q_offsets, kv_offsets, index_base -> out, softmax_aux (lse), max_logit
//   fa_cpu_attn_bwd: the same 11, out, dout, softmax_aux -> dq, dk, dv, dbias, dsoftmax_offset
// Each decodes one AttnParams (validated) and one AttnTensors, and calls the kernel (with
// jax's rows that keep nothing around it when asked: kRequestAverageEmptyRows).
#include <cstring>
#include <vector>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/attention/cpu/empty_rows.h"
#include "fusedattn/attention/cpu/score_ops.h"
#include "fusedattn/score_mod/program.h"
#include "fusedattn/attention/ffi_decode.h"
#include "fusedattn/attention/validate.h"

namespace fusedattn::ffi_glue {
namespace {

cpu::Strides strides(const ViewStrides& s) { return {s.b, s.s, s.h}; }

// The engine's extra inputs; the statistics' pointers come untyped from the buffers
// (float32, or float64 for a float64 call: ffi_decode.h's stat_dtype).
cpu::Extras extras(const AttnOperands& in, const AttnAttrs& attrs, const AttnTensors& t) {
  cpu::Extras x;
  x.seq = {t.q_seqlens, t.kv_seqlens, t.q_offsets, t.kv_offsets};
  x.bias = t.bias;
  x.sbias = {t.bias_slice, t.bias_b, t.bias_h, t.bias_s};
  x.softmax_offset = t.softmax_offset ? in.softmax_offset->untyped_data() : nullptr;
  x.seed = t.seed;
  x.index_base = t.index_base;
  x.index_cols = t.index_cols;
  x.mask_bias = (attrs.backend_flags & kRequestMaskBias) != 0;
  x.dropout_broadcast = (attrs.backend_flags & kRequestDropoutBroadcast) != 0;
  x.scale64 = attrs.scale;
  x.dropout64 = attrs.dropout;
  return x;
}

// kRequestMaskKeepOnly: t's keep mask (one byte a key) folded into q's dtype in storage, 0
// where it keeps the key and the masked value (cpu::masked_bias) where it drops it, as the
// CUDA handlers fold it for their kernels (cuda/keep_mask.h) and XLA's `where` did.
void fold_keep(const AttnParams& p, AttnTensors* t, std::vector<unsigned char>* storage) {
  if (!t->bias_keep) return;
  const int64_t n = p.num_slices * t->bias_slice;
  const auto* mask = static_cast<const uint8_t*>(t->bias);
  auto fill = [&](auto keep, auto drop) {
    using T = decltype(keep);
    storage->resize(static_cast<size_t>(n) * sizeof(T));
    T* out = reinterpret_cast<T*>(storage->data());
    for (int64_t i = 0; i < n; ++i) out[i] = mask[i] ? keep : drop;
  };
  switch (p.dtype) {
    case FA_FLOAT32: fill(0.0f, cpu::masked_bias<float>()); break;
    case FA_FLOAT64: fill(0.0, static_cast<double>(cpu::masked_bias<double>())); break;
    case FA_BFLOAT16:
      fill(cpu::from_float<cpu::bf16>(0.0f), cpu::from_float<cpu::bf16>(cpu::masked_bias<cpu::bf16>()));
      break;
    case FA_FLOAT16:
      fill(cpu::from_float<cpu::fp16>(0.0f), cpu::from_float<cpu::fp16>(cpu::masked_bias<cpu::fp16>()));
      break;
  }
  t->bias = storage->data();
  t->bias_keep = false;
}

// A float64 call with a score_mod: its interpreter computes in float32, so Python runs
// the reference in float64 (select_backend says so) and never sends one here.
Status check_score_mod_dtype(const AttnParams& p) {
  if (p.dtype != FA_FLOAT64) return Status::Ok();
  return Status::Unimplemented("dtype: float64 with a score_mod is not served by the CPU engine "
                               "(the score_mod interpreter computes in float32); fused_attn runs "
                               "such calls by the reference in float64");
}

ffi::Error run_fwd(const AttnOperands& in, const AttnAttrs& attrs, ffi::AnyBuffer* out,
                   ffi::AnyBuffer* lse, ffi::AnyBuffer* max_logit,
                   const ffi::Span<const int32_t>* program, const ffi::AnyBuffer* sm_operands) {
  AttnParams p;
  AttnTensors t;
  FA_RETURN_IF_ERROR(decode_operands(in, attrs, &p, &t));
  FA_RETURN_IF_ERROR(decode_fwd_results(p, in, out, lse, max_logit, &t));
  std::vector<unsigned char> folded;
  fold_keep(p, &t, &folded);
  ScoreModCall smc;
  if (program) FA_RETURN_IF_ERROR(check_score_mod_dtype(p));
  if (program) FA_RETURN_IF_ERROR(decode_score_mod_call(p, *program, *sm_operands, nullptr, &smc));
  FA_RETURN_IF_ERROR(check_index_base(p, t, program ? &smc.sm : nullptr));

  cpu::FwdArgs a;
  a.q = t.q;
  a.k = t.k;
  a.v = t.v;
  a.out = t.out;
  a.lse = lse->untyped_data();
  a.max_logit = max_logit->untyped_data();
  a.sq = strides(t.sq);
  a.sk = strides(t.sk);
  a.sv = strides(t.sv);
  a.so = strides(t.so);
  a.slse = strides(t.slse);
  a.x = extras(in, attrs, t);
  if (program) a.x.score_mod = &smc.sm, a.x.score_mod_operands = smc.operands;
  const bool empty_rows = (attrs.backend_flags & kRequestAverageEmptyRows) != 0;
  if (empty_rows) FA_RETURN_IF_ERROR(validate_average_empty_rows(p, t.index_base ? t.index_cols : 0));
  cpu::attention_fwd(p, a);
  if (empty_rows) cpu::average_empty_rows_fwd(p, a, empty_row_threshold(p.dtype));
  return ffi::Error::Success();
}

ffi::Error attn_fwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                        ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                        ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                        ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                        ffi::AnyBuffer index_base,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                        ffi::Result<ffi::AnyBuffer> max_logit, AttnAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  return run_fwd(in, attrs, &*out, &*lse, &*max_logit, nullptr, nullptr);
}

ffi::Error attn_fwd_sm_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::AnyBuffer bias, ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                           ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                           ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                           ffi::AnyBuffer index_base,
                           ffi::AnyBuffer sm_operands, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> max_logit,
                           AttnScoreModAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  return run_fwd(in, attrs.base(), &*out, &*lse, &*max_logit, &attrs.score_mod, &sm_operands);
}

ffi::Error run_bwd(const AttnOperands& in, const AttnAttrs& attrs, const ffi::AnyBuffer& out,
                   const ffi::AnyBuffer& dout, const ffi::AnyBuffer& lse, ffi::AnyBuffer* dq,
                   ffi::AnyBuffer* dk, ffi::AnyBuffer* dv, ffi::AnyBuffer* dbias,
                   ffi::AnyBuffer* dsoftmax_offset, const ffi::Span<const int32_t>* program,
                   const ffi::AnyBuffer* sm_operands, ffi::AnyBuffer* dsm_operands) {
  AttnParams p;
  AttnTensors t;
  FA_RETURN_IF_ERROR(decode_operands(in, attrs, &p, &t));
  FA_RETURN_IF_ERROR(decode_bwd_buffers(p, in, out, dout, lse, dq, dk, dv, dbias,
                                        dsoftmax_offset, &t));
  std::vector<unsigned char> folded;
  fold_keep(p, &t, &folded);
  ScoreModCall smc;
  if (program) FA_RETURN_IF_ERROR(check_score_mod_dtype(p));
  if (program)
    FA_RETURN_IF_ERROR(decode_score_mod_call(p, *program, *sm_operands, dsm_operands, &smc));
  FA_RETURN_IF_ERROR(check_index_base(p, t, program ? &smc.sm : nullptr));

  cpu::BwdArgs a;
  a.q = t.q;
  a.k = t.k;
  a.v = t.v;
  a.out = t.out;
  a.dout = t.dout;
  a.lse = lse.untyped_data();
  a.dq = t.dq;
  a.dk = t.dk;
  a.dv = t.dv;
  a.dbias = t.dbias;
  if (t.dbias && (attrs.backend_flags & kRequestNoDbias)) {  // not wanted (backend.h): zeros
    std::memset(t.dbias, 0, dbias->size_bytes());
    a.dbias = nullptr;
  }
  a.dsoftmax_offset = t.dsoftmax_offset ? dsoftmax_offset->untyped_data() : nullptr;
  a.sq = strides(t.sq);
  a.sk = strides(t.sk);
  a.sv = strides(t.sv);
  a.so = strides(t.so);
  a.sdo = strides(t.sdo);
  a.slse = strides(t.slse);
  a.sdq = strides(t.sdq);
  a.sdk = strides(t.sdk);
  a.sdv = strides(t.sdv);
  a.x = extras(in, attrs, t);
  if (program) {
    a.x.score_mod = &smc.sm;
    a.x.score_mod_operands = smc.operands;
    a.dscore_mod_operands = smc.doperands;
  }
  if (!(attrs.backend_flags & kRequestAverageEmptyRows)) {
    cpu::attention_bwd(p, a);
    return ffi::Error::Success();
  }
  FA_RETURN_IF_ERROR(validate_average_empty_rows(p, t.index_base ? t.index_cols : 0));
  const cpu::EmptyRowsBwd empty(p, a, empty_row_threshold(p.dtype));  // rows with lse +inf
  a.lse = empty.lse();
  a.slse = empty.lse_strides();
  cpu::attention_bwd(p, a);
  empty.finish(p, a);
  return ffi::Error::Success();
}

ffi::Error attn_bwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                        ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                        ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                        ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                        ffi::AnyBuffer index_base, ffi::AnyBuffer out,
                        ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                        ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                        ffi::Result<ffi::AnyBuffer> dbias,
                        ffi::Result<ffi::AnyBuffer> dsoftmax_offset, AttnAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  return run_bwd(in, attrs, out, dout, lse, &*dq, &*dk, &*dv, &*dbias, &*dsoftmax_offset, nullptr,
                 nullptr, nullptr);
}

ffi::Error attn_bwd_sm_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::AnyBuffer bias, ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                           ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                           ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                           ffi::AnyBuffer index_base,
                           ffi::AnyBuffer sm_operands, ffi::AnyBuffer out, ffi::AnyBuffer dout,
                           ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                           ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                           ffi::Result<ffi::AnyBuffer> dbias,
                           ffi::Result<ffi::AnyBuffer> dsoftmax_offset,
                           ffi::Result<ffi::AnyBuffer> dsm_operands, AttnScoreModAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  return run_bwd(in, attrs.base(), out, dout, lse, &*dq, &*dk, &*dv, &*dbias, &*dsoftmax_offset,
                 &attrs.score_mod, &sm_operands, &*dsm_operands);
}

}  // namespace
}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;
using fusedattn::ffi_glue::AttnAttrs;
using fusedattn::ffi_glue::AttnScoreModAttrs;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_attn_fwd, fusedattn::ffi_glue::attn_fwd_cpu,
                              ffi::Ffi::Bind() FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_FWD_RESULTS
                                  .Attrs<AttnAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_attn_bwd, fusedattn::ffi_glue::attn_bwd_cpu,
                              ffi::Ffi::Bind() FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_BWD_INPUTS
                                  FA_ATTN_BIND_BWD_RESULTS
                                  .Attrs<AttnAttrs>());

// score_mod variants: the eleven operands, then score_mod_operands (float32, the array
// operands concatenated); the backward also returns their gradient.
XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_attn_fwd_sm, fusedattn::ffi_glue::attn_fwd_sm_cpu,
                              ffi::Ffi::Bind() FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_SM_OPERANDS
                                  FA_ATTN_BIND_FWD_RESULTS
                                  .Attrs<AttnScoreModAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_attn_bwd_sm, fusedattn::ffi_glue::attn_bwd_sm_cpu,
                              ffi::Ffi::Bind() FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_SM_OPERANDS
                                  FA_ATTN_BIND_BWD_INPUTS
                                  FA_ATTN_BIND_BWD_RESULTS
                                  .Ret<ffi::AnyBuffer>()  // dscore_mod_operands
                                  .Attrs<AttnScoreModAttrs>());
