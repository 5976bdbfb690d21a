// XLA FFI handlers of the CPU small-seq kernels (shapes in ffi_decode.h):
//   fa_cpu_small_seq_fwd: q, k, v, q_seqlens, kv_seqlens, q_offsets, kv_offsets
//                         -> out [like q], probs [..., Tq, Hq, 1, W] f32, stats [..., Tq, Hq, 2] f32
//   fa_cpu_small_seq_bwd: q, k, v, out, dout, probs, stats, q_seqlens, kv_seqlens, q_offsets,
//                         kv_offsets -> dq, dk, dv
#include "fusedattn/small_seq/cpu/small_seq.h"
#include "fusedattn/small_seq/ffi_decode.h"

#include <cstring>

namespace fusedattn::ffi_glue {
namespace {

void poison(std::initializer_list<ffi::AnyBuffer*> bufs) {
  for (ffi::AnyBuffer* b : bufs) std::memset(b->untyped_data(), 0xff, b->size_bytes());
}

ffi::Error small_seq_fwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                             ffi::AnyBuffer q_lens, ffi::AnyBuffer kv_lens,
                             ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                             ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> probs,
                             ffi::Result<ffi::AnyBuffer> stats, SmallSeqAttrs attrs) {
  SmallSeqCall call;
  FA_RETURN_IF_ERROR(decode_small_seq(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, attrs, &call));
  FA_RETURN_IF_ERROR(expect_like("out", *out, q));
  FA_RETURN_IF_ERROR(expect_small_seq_aux(call, *probs, *stats));
  if (attrs.poison) poison({&*out, &*probs, &*stats});
  small_seq::FwdArgs a;
  a.q = q.untyped_data();
  a.k = k.untyped_data();
  a.v = v.untyped_data();
  a.seg = call.seg;
  a.out = out->untyped_data();
  a.probs = static_cast<float*>(probs->untyped_data());
  a.stats = static_cast<float*>(stats->untyped_data());
  a.save_aux = attrs.save_aux != 0;
  small_seq::cpu::small_seq_fwd(call.p, a);
  return ffi::Error::Success();
}

ffi::Error small_seq_bwd_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                             ffi::AnyBuffer out, ffi::AnyBuffer dout, ffi::AnyBuffer probs, ffi::AnyBuffer stats,
                             ffi::AnyBuffer q_lens, ffi::AnyBuffer kv_lens,
                             ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                             ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                             ffi::Result<ffi::AnyBuffer> dv, SmallSeqAttrs attrs) {
  SmallSeqCall call;
  FA_RETURN_IF_ERROR(decode_small_seq(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, attrs, &call));
  FA_RETURN_IF_ERROR(expect_like("out", out, q));
  FA_RETURN_IF_ERROR(expect_like("dout", dout, q));
  FA_RETURN_IF_ERROR(expect_small_seq_aux(call, probs, stats));
  FA_RETURN_IF_ERROR(expect_like("dq", *dq, q));
  FA_RETURN_IF_ERROR(expect_like("dk", *dk, k));
  FA_RETURN_IF_ERROR(expect_like("dv", *dv, v));
  if (attrs.poison) poison({&*dq, &*dk, &*dv});
  small_seq::BwdArgs a;
  a.q = q.untyped_data();
  a.k = k.untyped_data();
  a.v = v.untyped_data();
  a.out = out.untyped_data();
  a.dout = dout.untyped_data();
  a.probs = static_cast<const float*>(probs.untyped_data());
  a.stats = static_cast<const float*>(stats.untyped_data());
  a.seg = call.seg;
  a.dq = dq->untyped_data();
  a.dk = dk->untyped_data();
  a.dv = dv->untyped_data();
  small_seq::cpu::small_seq_bwd(call.p, a);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;
using fusedattn::ffi_glue::SmallSeqAttrs;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_small_seq_fwd, fusedattn::ffi_glue::small_seq_fwd_cpu,
                              ffi::Ffi::Bind()
                                  FA_SMALL_SEQ_BIND_FWD
                                  .Attrs<SmallSeqAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_small_seq_bwd, fusedattn::ffi_glue::small_seq_bwd_cpu,
                              ffi::Ffi::Bind()
                                  FA_SMALL_SEQ_BIND_BWD
                                  .Attrs<SmallSeqAttrs>());
