// XLA FFI handlers of the CPU softmax (argument layout in ffi_decode.h):
//   fa_cpu_softmax_fwd: logits [..., Sq, Skv] (+ mask bool [..., Sq|1, Skv]) -> y
//   fa_cpu_softmax_bwd: y, dy [..., Sq, Skv] -> dx
// Attributes: softmax_type (SoftmaxFusionType code), scale.
#include "fusedattn/softmax/cpu/softmax.h"
#include "fusedattn/softmax/ffi_decode.h"

namespace fusedattn::ffi_glue {
namespace {

ffi::Error softmax_fwd_cpu(ffi::AnyBuffer x, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> y,
                           int32_t softmax_type, float scale) {
  SoftmaxFwdCall c;
  FA_RETURN_IF_ERROR(decode_softmax_fwd(x, rest, *y, softmax_type, scale, &c));
  softmax::cpu_softmax_fwd(c.p, c.x, c.mask, c.y);
  return ffi::Error::Success();
}

ffi::Error softmax_bwd_cpu(ffi::AnyBuffer y, ffi::AnyBuffer dy, ffi::RemainingArgs rest,
                           ffi::Result<ffi::AnyBuffer> dx, int32_t softmax_type, float scale) {
  SoftmaxBwdCall c;
  FA_RETURN_IF_ERROR(decode_softmax_bwd(y, dy, rest, *dx, softmax_type, scale, &c));
  softmax::cpu_softmax_bwd(c.p, c.y, c.dy, c.dx);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_softmax_fwd, fusedattn::ffi_glue::softmax_fwd_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // logits
                                  .RemainingArgs()        // [mask], [out_init]
                                  .Ret<ffi::AnyBuffer>()  // y
                                  .Attr<int32_t>("softmax_type")
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cpu_softmax_bwd, fusedattn::ffi_glue::softmax_bwd_cpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // y (softmax output)
                                  .Arg<ffi::AnyBuffer>()  // dy
                                  .RemainingArgs()        // [out_init]
                                  .Ret<ffi::AnyBuffer>()  // dx
                                  .Attr<int32_t>("softmax_type")
                                  .Attr<float>("scale"));
