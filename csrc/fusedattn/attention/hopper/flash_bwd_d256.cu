// Head dim 256's variants of the Hopper flash backward (bwd_launch.cuh), compiled apart from
// flash_bwd.cu's so that the two translation units build in parallel.
#include "fusedattn/attention/hopper/bwd_launch.cuh"

#include <type_traits>

namespace fusedattn::cuda::hopper {

Status launch_bwd_d256(const BwdArgs& a, dim3 grid, bool causal, bool bf16, bool dense, int mod,
                       cudaStream_t stream) {
  auto launch = [&](auto c_tag, auto h_tag) {
    constexpr bool c = decltype(c_tag)::value, h = decltype(h_tag)::value;
    if (mod == kBwdAlibi || mod == kBwdAlibiAbs)
      return launch_bwd_d256_alibi(a, grid, c, h, dense, mod == kBwdAlibiAbs, stream);
    if (mod == kBwdSoftcap)  // (dense: a bias beside it, its values from global memory)
      return dense ? launch_bwd<c, h, true, 256, kBwdSoftcap>(a, grid, stream)
                   : launch_bwd<c, h, false, 256, kBwdSoftcap>(a, grid, stream);
    if (mod == kBwdDbias) return launch_bwd<c, h, true, 256, kBwdDbias>(a, grid, stream);
    return dense ? launch_bwd<c, h, true, 256>(a, grid, stream) : launch_bwd<c, h, false, 256>(a, grid, stream);
  };
  using T = std::true_type;
  using F = std::false_type;
  return causal ? (bf16 ? launch(T{}, T{}) : launch(T{}, F{})) : (bf16 ? launch(F{}, T{}) : launch(F{}, F{}));
}

}  // namespace fusedattn::cuda::hopper
