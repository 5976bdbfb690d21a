// Head dim 256's ALiBi variants of the Hopper flash backward (bwd_launch.cuh): ALiBi and
// ALiBi with |kv - q|, with a bias beside them (dense: its values from global memory, dbias
// where wanted) or without; a translation unit apart from flash_bwd_d256.cu's so that the
// two build in parallel.
#include "fusedattn/attention/hopper/bwd_launch.cuh"

#include <type_traits>

namespace fusedattn::cuda::hopper {

Status launch_bwd_d256_alibi(const BwdArgs& a, dim3 grid, bool causal, bool bf16, bool dense, bool abs,
                             cudaStream_t stream) {
  auto launch = [&](auto c_tag, auto h_tag, auto m_tag) {
    constexpr bool c = decltype(c_tag)::value, h = decltype(h_tag)::value;
    constexpr int m = decltype(m_tag)::value;
    return dense ? launch_bwd<c, h, true, 256, m>(a, grid, stream) : launch_bwd<c, h, false, 256, m>(a, grid, stream);
  };
  auto by_mod = [&](auto c_tag, auto h_tag) {
    return abs ? launch(c_tag, h_tag, std::integral_constant<int, kBwdAlibiAbs>{})
               : launch(c_tag, h_tag, std::integral_constant<int, kBwdAlibi>{});
  };
  using T = std::true_type;
  using F = std::false_type;
  return causal ? (bf16 ? by_mod(T{}, T{}) : by_mod(T{}, F{})) : (bf16 ? by_mod(F{}, T{}) : by_mod(F{}, F{}));
}

}  // namespace fusedattn::cuda::hopper
