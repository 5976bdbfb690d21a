// Compile check of device_program.h for the device (not part of the CMake build):
//   nvcc -std=c++17 -arch=sm_90 -I csrc -c csrc/fusedattn/score_mod/device_program_check.cu
// One kernel evaluates a program of a DeviceScoreMod (taken by value, as the attention
// kernels take it) for n elements; inputs is [n, prog.n_inputs].
#include "fusedattn/score_mod/device_program.h"

namespace fusedattn {

// which: -2 forward, -1 backward, k >= 0 operand k's gradient.
__global__ void eval_score_mod_elements(const __grid_constant__ DeviceScoreMod sm, int which,
                                        const float* __restrict__ inputs, int64_t n,
                                        float* __restrict__ out) {
  const DeviceProgram& prog = which == -2 ? sm.fwd : which == -1 ? sm.bwd : sm.grad[which];
  float regs[kDevMaxRegs];
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    out[e] = eval_program_element(sm, prog, inputs + e * prog.n_inputs, regs);
}

// The operand gather a tile does: operand k's element of (b, h, q, kv).
__global__ void gather_operand(const __grid_constant__ DeviceScoreMod sm, int k,
                               const float* __restrict__ operands, int64_t b, int64_t h,
                               int64_t sq, int64_t skv, float* __restrict__ out) {
  const int64_t q = blockIdx.x, kv = threadIdx.x;
  if (q < sq && kv < skv) out[q * skv + kv] = operands[operand_element(sm, k, b, h, q, kv)];
}

}  // namespace fusedattn
