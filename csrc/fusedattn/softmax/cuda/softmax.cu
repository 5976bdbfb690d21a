// Host entry of the CUDA softmax: SoftmaxParams -> kernel arguments -> the
// launcher of the dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fusedattn/softmax/cuda/softmax.h"
#include "fusedattn/softmax/cuda/kernels.cuh"

namespace fusedattn::softmax {
namespace cuda {
// The launchers of one dtype (launch.cuh), each dtype instantiated in a translation unit of
// its own, generated from instance.cu.in by the list in CMakeLists.txt; a dtype dispatched
// here and missing there fails the link.
template <class T>
Status launch_fwd(const FwdArgs& a, cudaStream_t stream);
template <class T>
Status launch_bwd(const BwdArgs& a, cudaStream_t stream);
}  // namespace cuda

namespace {

template <class F>
Status dispatch(int32_t dtype, F&& f) {
  switch (dtype) {
    case FA_FLOAT32:
      return f(float{});
    case FA_BFLOAT16:
      return f(__nv_bfloat16{});
    case FA_FLOAT16:
      return f(__half{});
  }
  return Status::Invalid("dtype: got code " + std::to_string(dtype) +
                         "; logits must be float32, bfloat16 or float16");
}

}  // namespace

Status cuda_softmax_fwd(const SoftmaxParams& p, const void* x, const uint8_t* mask, void* y,
                        cudaStream_t stream) {
  const cuda::FwdArgs a = cuda::make_fwd_args(p, x, mask, y);
  return dispatch(p.dtype, [&](auto t) { return cuda::launch_fwd<decltype(t)>(a, stream); });
}

Status cuda_softmax_bwd(const SoftmaxParams& p, const void* y, const void* dy, void* dx,
                        cudaStream_t stream) {
  const cuda::BwdArgs a = cuda::make_bwd_args(p, y, dy, dx);
  return dispatch(p.dtype, [&](auto t) { return cuda::launch_bwd<decltype(t)>(a, stream); });
}

}  // namespace fusedattn::softmax
