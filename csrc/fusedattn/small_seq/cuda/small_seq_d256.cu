// Small-seq CUDA kernels of head dim 256 (all dtypes and chunk sizes): one file per
// head dim so the instantiations compile in parallel.
#include "fusedattn/small_seq/cuda/launch.cuh"

namespace fusedattn::small_seq::cuda {

Status launch_d256(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream) {
  return launch_head_dim<256>(dtype, a, backward, stream);
}

}  // namespace fusedattn::small_seq::cuda
