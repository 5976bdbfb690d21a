// Small-seq CUDA kernels of head dim 128 (all dtypes and chunk sizes): one file per
// head dim so the instantiations compile in parallel.
#include "fusedattn/small_seq/cuda/launch.cuh"

namespace fusedattn::small_seq::cuda {

Status launch_d128(int32_t dtype, const KernelArgs& a, bool backward, cudaStream_t stream) {
  return launch_head_dim<128>(dtype, a, backward, stream);
}

}  // namespace fusedattn::small_seq::cuda
