// XLA FFI handlers of the CPU attention engine:
//   fa_cpu_attn_fwd: q, k, v, q_seqlens, kv_seqlens -> out, lse [..., Hq, Sq], max_logit [..., Hq]
//   fa_cpu_attn_bwd: q, k, v, out, dout, lse, q_seqlens, kv_seqlens -> dq, dk, dv
// Each decodes one AttnParams, validates it, checks every buffer's shape, and
// calls the kernel. Shapes are [..., S, H, D] with all leading dims as batch.
#include "../cpu/attention.h"
#include "attn_decode.h"

namespace fusedattn::ffi_glue {
namespace {

using cpu::Strides;

ffi::Error attn_fwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                        ffi::AnyBuffer q_lens, ffi::AnyBuffer kv_lens,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                        ffi::Result<ffi::AnyBuffer> max_logit, AttnAttrs attrs) {
  AttnParams p;
  FA_RETURN_IF_ERROR(decode_params(q, k, v, q_lens, kv_lens, attrs, &p));
  const auto lead = q.dimensions().first(q.dimensions().size() - 3);
  FA_RETURN_IF_ERROR(expect_shape("out", *out, q.element_type(), lead, {p.seqlen_q, p.heads_q, p.head_dim_v}));
  FA_RETURN_IF_ERROR(expect_shape("softmax_aux", *lse, ffi::DataType::F32, lead, {p.heads_q, p.seqlen_q}));
  FA_RETURN_IF_ERROR(expect_shape("max_logit", *max_logit, ffi::DataType::F32, lead, {p.heads_q}));

  cpu::FwdArgs a;
  a.q = q.untyped_data();
  a.k = k.untyped_data();
  a.v = v.untyped_data();
  a.q_lens = static_cast<const int32_t*>(q_lens.untyped_data());
  a.kv_lens = static_cast<const int32_t*>(kv_lens.untyped_data());
  a.out = out->untyped_data();
  a.lse = static_cast<float*>(lse->untyped_data());
  a.max_logit = static_cast<float*>(max_logit->untyped_data());
  a.sq = Strides::bshd(p.seqlen_q, p.heads_q, p.head_dim_qk);
  a.sk = Strides::bshd(p.seqlen_kv, p.heads_kv, p.head_dim_qk);
  a.sv = Strides::bshd(p.seqlen_kv, p.heads_kv, p.head_dim_v);
  a.so = Strides::bshd(p.seqlen_q, p.heads_q, p.head_dim_v);
  cpu::attention_fwd(p, a);
  return ffi::Error::Success();
}

ffi::Error attn_bwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                        ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::AnyBuffer q_lens,
                        ffi::AnyBuffer kv_lens, ffi::Result<ffi::AnyBuffer> dq,
                        ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                        AttnAttrs attrs) {
  AttnParams p;
  FA_RETURN_IF_ERROR(decode_params(q, k, v, q_lens, kv_lens, attrs, &p));
  const auto lead = q.dimensions().first(q.dimensions().size() - 3);
  const auto dt = q.element_type();
  FA_RETURN_IF_ERROR(expect_shape("out", out, dt, lead, {p.seqlen_q, p.heads_q, p.head_dim_v}));
  FA_RETURN_IF_ERROR(expect_shape("dout", dout, dt, lead, {p.seqlen_q, p.heads_q, p.head_dim_v}));
  FA_RETURN_IF_ERROR(expect_shape("softmax_aux", lse, ffi::DataType::F32, lead, {p.heads_q, p.seqlen_q}));
  FA_RETURN_IF_ERROR(expect_shape("dq", *dq, dt, lead, {p.seqlen_q, p.heads_q, p.head_dim_qk}));
  FA_RETURN_IF_ERROR(expect_shape("dk", *dk, dt, lead, {p.seqlen_kv, p.heads_kv, p.head_dim_qk}));
  FA_RETURN_IF_ERROR(expect_shape("dv", *dv, dt, lead, {p.seqlen_kv, p.heads_kv, p.head_dim_v}));

  cpu::BwdArgs a;
  a.q = q.untyped_data();
  a.k = k.untyped_data();
  a.v = v.untyped_data();
  a.out = out.untyped_data();
  a.dout = dout.untyped_data();
  a.lse = static_cast<const float*>(lse.untyped_data());
  a.q_lens = static_cast<const int32_t*>(q_lens.untyped_data());
  a.kv_lens = static_cast<const int32_t*>(kv_lens.untyped_data());
  a.dq = dq->untyped_data();
  a.dk = dk->untyped_data();
  a.dv = dv->untyped_data();
  a.sq = a.sdq = Strides::bshd(p.seqlen_q, p.heads_q, p.head_dim_qk);
  a.sk = a.sdk = Strides::bshd(p.seqlen_kv, p.heads_kv, p.head_dim_qk);
  a.sv = a.sdv = Strides::bshd(p.seqlen_kv, p.heads_kv, p.head_dim_v);
  a.so = a.sdo = Strides::bshd(p.seqlen_q, p.heads_q, p.head_dim_v);
  cpu::attention_bwd(p, a);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;
using fusedattn::ffi_glue::AttnAttrs;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_attn_fwd, fusedattn::ffi_glue::attn_fwd_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // q_seqlens
                                  .Arg<ffi::AnyBuffer>()  // kv_seqlens
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // softmax_aux (lse)
                                  .Ret<ffi::AnyBuffer>()  // max_logit
                                  .Attrs<AttnAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_attn_bwd, fusedattn::ffi_glue::attn_bwd_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Arg<ffi::AnyBuffer>()  // softmax_aux (lse)
                                  .Arg<ffi::AnyBuffer>()  // q_seqlens
                                  .Arg<ffi::AnyBuffer>()  // kv_seqlens
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Attrs<AttnAttrs>());
