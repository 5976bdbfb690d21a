// The CUDA softmax kernels instantiated for float (one dtype per file: the
// instantiations compile in parallel and their errors stay local).
#include "fusedattn/softmax/cuda/launch.cuh"

namespace fusedattn::softmax::cuda {
template Status launch_fwd<float>(const FwdArgs& a, cudaStream_t stream);
template Status launch_bwd<float>(const BwdArgs& a, cudaStream_t stream);
}  // namespace fusedattn::softmax::cuda
