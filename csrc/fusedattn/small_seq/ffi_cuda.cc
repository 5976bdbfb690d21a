// XLA FFI handlers of the small-seq CUDA kernels; same buffers and attributes as the
// CPU handlers (ffi_cpu.cc, shapes in ffi_decode.h), on XLA's stream:
//   fa_cuda_small_seq_fwd: q, k, v, q_seqlens, kv_seqlens, q_offsets, kv_offsets
//                          -> out, probs [..., Tq, Hq, 1, W] f32, stats [..., Tq, Hq, 2] f32
//   fa_cuda_small_seq_bwd: q, k, v, out, dout, probs, stats, q_seqlens, kv_seqlens,
//                          q_offsets, kv_offsets -> dq, dk, dv
// Only shapes are checked here: lengths and offsets stay on the device, and the
// kernels clamp them (segments.h), so no value can make them read out of bounds.
#include <cuda_runtime.h>

#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/small_seq/cuda/small_seq.h"
#include "fusedattn/small_seq/ffi_decode.h"

namespace fusedattn::ffi_glue {
namespace {

Status poison(cudaStream_t stream, std::initializer_list<ffi::AnyBuffer*> bufs) {
  for (ffi::AnyBuffer* b : bufs)
    FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(b->untyped_data(), 0xff, b->size_bytes(), stream));
  return Status::Ok();
}

ffi::Error small_seq_fwd_cuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                              ffi::AnyBuffer v, ffi::AnyBuffer q_lens, ffi::AnyBuffer kv_lens,
                              ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                              ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> probs,
                              ffi::Result<ffi::AnyBuffer> stats, SmallSeqAttrs attrs) {
  SmallSeqCall call;
  FA_RETURN_IF_ERROR(decode_small_seq(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, attrs, &call));
  FA_RETURN_IF_ERROR(expect_like("out", *out, q));
  FA_RETURN_IF_ERROR(expect_small_seq_aux(call, *probs, *stats));
  if (attrs.poison) FA_RETURN_IF_ERROR(poison(stream, {&*out, &*probs, &*stats}));
  small_seq::FwdArgs a;
  a.q = q.untyped_data();
  a.k = k.untyped_data();
  a.v = v.untyped_data();
  a.seg = call.seg;
  a.out = out->untyped_data();
  a.probs = static_cast<float*>(probs->untyped_data());
  a.stats = static_cast<float*>(stats->untyped_data());
  a.save_aux = attrs.save_aux != 0;
  FA_RETURN_IF_ERROR(small_seq::cuda::small_seq_fwd(call.p, a, stream));
  return ffi::Error::Success();
}

ffi::Error small_seq_bwd_cuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                              ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer dout,
                              ffi::AnyBuffer probs, ffi::AnyBuffer stats, ffi::AnyBuffer q_lens,
                              ffi::AnyBuffer kv_lens, ffi::AnyBuffer q_offsets,
                              ffi::AnyBuffer kv_offsets, ffi::Result<ffi::AnyBuffer> dq,
                              ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                              SmallSeqAttrs attrs) {
  SmallSeqCall call;
  FA_RETURN_IF_ERROR(decode_small_seq(q, k, v, q_lens, kv_lens, q_offsets, kv_offsets, attrs, &call));
  FA_RETURN_IF_ERROR(expect_like("out", out, q));
  FA_RETURN_IF_ERROR(expect_like("dout", dout, q));
  FA_RETURN_IF_ERROR(expect_small_seq_aux(call, probs, stats));
  FA_RETURN_IF_ERROR(expect_like("dq", *dq, q));
  FA_RETURN_IF_ERROR(expect_like("dk", *dk, k));
  FA_RETURN_IF_ERROR(expect_like("dv", *dv, v));
  if (attrs.poison) FA_RETURN_IF_ERROR(poison(stream, {&*dq, &*dk, &*dv}));
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
  FA_RETURN_IF_ERROR(small_seq::cuda::small_seq_bwd(call.p, a, stream));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;
using fusedattn::ffi_glue::SmallSeqAttrs;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_small_seq_fwd, fusedattn::ffi_glue::small_seq_fwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  FA_SMALL_SEQ_BIND_FWD
                                  .Attrs<SmallSeqAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_small_seq_bwd, fusedattn::ffi_glue::small_seq_bwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  FA_SMALL_SEQ_BIND_BWD
                                  .Attrs<SmallSeqAttrs>());
