// The CUDA softmax kernels instantiated for __nv_bfloat16 (one dtype per file: the
// instantiations compile in parallel and their errors stay local).
#include "fusedattn/softmax/cuda/launch.cuh"

namespace fusedattn::softmax::cuda {
template Status launch_fwd<__nv_bfloat16>(const FwdArgs& a, cudaStream_t stream);
template Status launch_bwd<__nv_bfloat16>(const BwdArgs& a, cudaStream_t stream);
}  // namespace fusedattn::softmax::cuda
