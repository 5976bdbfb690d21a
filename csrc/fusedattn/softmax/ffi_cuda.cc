// XLA FFI handlers of the CUDA softmax (argument layout in ffi_decode.h):
//   fa_cuda_softmax_fwd: logits [..., Sq, Skv] (+ mask bool [..., Sq|1, Skv]) -> y
//   fa_cuda_softmax_bwd: y, dy [..., Sq, Skv] -> dx
// Attributes: softmax_type, scale. The kernels run on XLA's stream. A call that
// choose_kernel() does not give to the CUDA kernel (Python sends those to the
// fallback) is an error here, not a silent wrong answer.
#include <cuda_runtime.h>

#include "fusedattn/softmax/cuda/softmax.h"
#include "fusedattn/softmax/validate.h"
#include "fusedattn/softmax/ffi_decode.h"

namespace fusedattn::ffi_glue {
namespace {

Status check_served(const SoftmaxParams& p) {
  const softmax::KernelChoice k = softmax::choose_kernel(p, FA_PLATFORM_CUDA, true);
  if (!k.status.ok()) return k.status;
  if (!k.available) return Status::Unimplemented("softmax on CUDA: " + k.reason);
  return Status::Ok();
}

ffi::Error softmax_fwd_cuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::RemainingArgs rest,
                            ffi::Result<ffi::AnyBuffer> y, int32_t softmax_type, float scale) {
  SoftmaxFwdCall c;
  FA_RETURN_IF_ERROR(decode_softmax_fwd(x, rest, *y, softmax_type, scale, &c));
  FA_RETURN_IF_ERROR(check_served(c.p));
  FA_RETURN_IF_ERROR(softmax::cuda_softmax_fwd(c.p, c.x, c.mask, c.y, stream));
  return ffi::Error::Success();
}

ffi::Error softmax_bwd_cuda(cudaStream_t stream, ffi::AnyBuffer y, ffi::AnyBuffer dy,
                            ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> dx,
                            int32_t softmax_type, float scale) {
  SoftmaxBwdCall c;
  FA_RETURN_IF_ERROR(decode_softmax_bwd(y, dy, rest, *dx, softmax_type, scale, &c));
  FA_RETURN_IF_ERROR(check_served(c.p));
  FA_RETURN_IF_ERROR(softmax::cuda_softmax_bwd(c.p, c.y, c.dy, c.dx, stream));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_softmax_fwd, fusedattn::ffi_glue::softmax_fwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // logits
                                  .RemainingArgs()        // [mask], [out_init]
                                  .Ret<ffi::AnyBuffer>()  // y
                                  .Attr<int32_t>("softmax_type")
                                  .Attr<float>("scale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_softmax_bwd, fusedattn::ffi_glue::softmax_bwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // y (softmax output)
                                  .Arg<ffi::AnyBuffer>()  // dy
                                  .RemainingArgs()        // [out_init]
                                  .Ret<ffi::AnyBuffer>()  // dx
                                  .Attr<int32_t>("softmax_type")
                                  .Attr<float>("scale"));
