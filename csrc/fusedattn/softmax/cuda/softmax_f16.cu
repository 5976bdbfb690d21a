// The CUDA softmax kernels instantiated for __half (one dtype per file: the
// instantiations compile in parallel and their errors stay local).
#include "fusedattn/softmax/cuda/launch.cuh"

namespace fusedattn::softmax::cuda {
template Status launch_fwd<__half>(const FwdArgs& a, cudaStream_t stream);
template Status launch_bwd<__half>(const BwdArgs& a, cudaStream_t stream);
}  // namespace fusedattn::softmax::cuda
