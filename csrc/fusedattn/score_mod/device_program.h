// score_mod programs for CUDA kernels: a fixed-size copy of a decoded ScoreMod that a
// kernel takes by value (`const __grid_constant__ DeviceScoreMod sm`), and a per-element
// interpreter a thread runs inside its tile. Plain C++ that nvcc compiles for host and
// device; the host packing (ScoreMod -> DeviceScoreMod) is in device_program_host.h.
//
// Layout: every program's instructions live in one pool (DeviceScoreMod::instr), each
// program a [start, start + n_instr) slice of it, and every constant in one pool too
// (SM_CONST's a field is re-pointed at the pool at packing; equal constants are stored
// once). An instruction is 4 bytes: op, a, b, c. Registers are numbered as in program.h:
// [0, n_inputs) the inputs, n_inputs + i the result of instruction i.
//
// Limits (pack_device_score_mod names the one a program exceeds):
//   kDevMaxRegs   128   per program: n_inputs + n_instr (the scratch a thread holds)
//   kDevMaxInstr  1024  all programs' instructions together (fwd, bwd, every grad)
//   kDevMaxConsts 128   distinct constants of all programs together
// sizeof(DeviceScoreMod) is 5576 bytes (static_assert below): well under the 32764
// bytes of kernel parameters CUDA 12.1+ allows on sm_70+.
//
// Semantics: eval_program_element computes what eval_score_mod (program.cc) computes,
// op by op, in float32. On the host the results are bitwise equal to eval_score_mod's
// (tests/cpp/score_mod/test_device_program.cc): the same libm calls, and exp / tanh /
// sigmoid are core/fast_math.h's, the CPU engine's own. A NaN result is NaN in both, but its sign and payload are not specified (g++
// folds -x of a NaN differently in different inlining contexts: sigmoid(NaN) has either
// sign). On the device:
//   - exact (bitwise equal to the host): + - * / (nvcc's default -prec-div=true), sqrt and
//     rsqrt (1.0f / sqrtf: -prec-sqrt=true), max, min, neg, abs, the comparisons, select,
//     sign, floor, ceil, trunc, rem (fmodf), const;
//   - exp, tanh, sigmoid: the same polynomial code; nvcc contracts its a * b + c into FMAs
//     (as g++ -march=x86-64-v3 does on the host), results within ~1 ulp of the host's;
//   - log, log1p, expm1, pow, exp2, sin, cos, erf: CUDA's libdevice (1-2 ulp of the
//     correctly rounded result; powf up to ~4 ulp for large arguments), where glibc is
//     within ~1 ulp. Flush-to-zero or --use_fast_math builds change every op that meets
//     subnormals and the libm ones more: do not build kernels that use this with them.
#pragma once

#include <stdint.h>
#include <string.h>

#include <math.h>

#include "fusedattn/core/fast_math.h"
#include "fusedattn/core/host_device.h"
#include "fusedattn/score_mod/opcodes.h"

namespace fusedattn {

constexpr int kDevMaxRegs = 128;
constexpr int kDevMaxInstr = 1024;
constexpr int kDevMaxConsts = 128;
// score, batch, head, q, kv, the operands, dscore (bwd / grad programs)
constexpr int kDevMaxInputs = kScoreModIndexInputs + kMaxScoreModOperands + 1;
static_assert(kDevMaxRegs <= 256 && kDevMaxConsts <= 256, "register / constant index is a byte");

struct DeviceInstr {
  uint8_t op, a, b, c;  // SM_CONST: a is the pool constant; unused fields are 0
};

// One program: a slice of the pool.
struct DeviceProgram {
  int32_t n_inputs = 0, n_instr = 0, out_reg = 0;
  int32_t start = 0;  // first instruction in DeviceScoreMod::instr
  FA_HOST_DEVICE int32_t n_regs() const { return n_inputs + n_instr; }
};

// Program families the kernels run as compiled code instead of interpreting them:
// pack_device_score_mod sets DeviceScoreMod::form when the forward program matches the
// family (program.h's match_softcap / match_alibi) and its backward and gradient programs
// compute the family's derivatives (checked on probe inputs: a custom score_mod_bprop that
// differs keeps the interpreter).
//   kDevFormSoftcap  fn(s) = form_a * tanh(form_b * s); ds_raw = ds * a * b * (1 - tanh^2)
//   kDevFormAlibi    fn(s) = s + form_a * slope * d, d = kv - q (|kv - q| with form_abs),
//                    slope = operand 0 ([1, Hq | 1, 1, 1]), form_a = +-1; ds_raw = ds,
//                    d slope = sum of ds * form_a * d
enum : int32_t { kDevFormNone = 0, kDevFormSoftcap = 1, kDevFormAlibi = 2 };

struct DeviceScoreMod {
  int32_t n_operands = 0;
  int32_t form = kDevFormNone;
  float form_a = 0.0f, form_b = 0.0f;
  int32_t form_abs = 0;
  int32_t n_instr = 0;   // of the pool in use
  int32_t n_consts = 0;  // of the pool in use
  int32_t max_regs = 0;  // the largest n_regs() of the programs: the scratch a thread needs
  int64_t shape[kMaxScoreModOperands][4] = {};  // [B|1, Hq|1, Sq|1, Skv|1]
  int64_t offset[kMaxScoreModOperands] = {};    // in the concatenated operand buffer (floats)
  int64_t total = 0;  // floats of the concatenated operands (ScoreMod::total_size)
  DeviceProgram fwd, bwd, grad[kMaxScoreModOperands];
  DeviceInstr instr[kDevMaxInstr] = {};
  float consts[kDevMaxConsts] = {};
};
static_assert(sizeof(DeviceScoreMod) == 5576, "update the size in the comment above");
static_assert(sizeof(DeviceScoreMod) <= 16384, "a kernel parameter: keep it small");

// The element of operand k read at (b, h, q, kv) (broadcast over its size-1 dims), as an
// index into one slice's concatenated operand buffer (offset included): ScoreModRows'
// operand_index (attention/cpu/score_ops.h) with the offset added.
FA_HOST_DEVICE FA_INLINE int64_t operand_element(const DeviceScoreMod& sm, int k, int64_t b,
                                                 int64_t h, int64_t q, int64_t kv) {
  const int64_t* s = sm.shape[k];
  const int64_t bb = s[0] == 1 ? 0 : b, hh = s[1] == 1 ? 0 : h;
  const int64_t qq = s[2] == 1 ? 0 : q, jj = s[3] == 1 ? 0 : kv;
  return sm.offset[k] + ((bb * s[1] + hh) * s[2] + qq) * s[3] + jj;
}

// NaN and infinity as constants of host and device code.
namespace sm_math {

FA_HOST_DEVICE FA_INLINE float quiet_nan() { return bits_to_float(0x7fc00000u); }
FA_HOST_DEVICE FA_INLINE float infinity() { return bits_to_float(0x7f800000u); }

}  // namespace sm_math

// One opcode on one element: eval_score_mod's expression for it. x, y, z are the
// instruction's operand registers (SM_CONST: x is the constant).
FA_HOST_DEVICE FA_INLINE float score_mod_op(int32_t op, float x, float y, float z) {
  switch (op) {
    case SM_CONST: return x;
    case SM_ADD: return x + y;
    case SM_SUB: return x - y;
    case SM_MUL: return x * y;
    case SM_DIV: return x / y;
    // std::max / std::min after the NaN check: (x < y ? y : x), (y < x ? y : x)
    case SM_MAX: return x != x || y != y ? sm_math::quiet_nan() : (x < y ? y : x);
    case SM_MIN: return x != x || y != y ? sm_math::quiet_nan() : (y < x ? y : x);
    case SM_NEG: return -x;
    case SM_ABS: return fabsf(x);
    case SM_EXP: return exact_edges_exp(x);
    case SM_LOG: return logf(x);
    case SM_TANH: return fast_tanh(x);
    case SM_SIGMOID: return fast_sigmoid(x);
    case SM_LT: return x < y ? 1.0f : 0.0f;
    case SM_LE: return x <= y ? 1.0f : 0.0f;
    case SM_GT: return x > y ? 1.0f : 0.0f;
    case SM_GE: return x >= y ? 1.0f : 0.0f;
    case SM_EQ: return x == y ? 1.0f : 0.0f;
    case SM_NE: return x != y ? 1.0f : 0.0f;
    case SM_SELECT: return x != 0.0f ? y : z;
    case SM_SQRT: return sqrtf(x);
    case SM_RSQRT: return 1.0f / sqrtf(x);
    case SM_SIGN: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x;
    case SM_LOG1P: return log1pf(x);
    case SM_EXPM1: return expm1f(x);
    case SM_POW: return powf(x, y);
    case SM_FLOOR: return floorf(x);
    case SM_CEIL: return ceilf(x);
    case SM_TRUNC: return truncf(x);
    case SM_REM: return fmodf(x, y);
    case SM_EXP2: return exp2f(x);
    case SM_SIN: return sinf(x);
    case SM_COS: return cosf(x);
    case SM_ERF: return erff(x);
    default: return sm_math::quiet_nan();  // packing copies only decoded (valid) opcodes
  }
}

// Runs prog on one element whose inputs are already in regs[0, prog.n_inputs); fills
// regs[n_inputs, n_regs()) and returns the output register. regs: kDevMaxRegs floats
// (or sm.max_regs) of scratch per thread.
FA_HOST_DEVICE FA_INLINE float eval_program_regs(const DeviceScoreMod& sm,
                                                 const DeviceProgram& prog, float* regs) {
  const DeviceInstr* code = sm.instr + prog.start;
  float* out = regs + prog.n_inputs;
  for (int32_t i = 0; i < prog.n_instr; ++i) {
    const DeviceInstr ins = code[i];
    // Unused operand fields are 0: register 0, always written.
    const float x = ins.op == SM_CONST ? sm.consts[ins.a] : regs[ins.a];
    out[i] = score_mod_op(ins.op, x, regs[ins.b], regs[ins.c]);
  }
  return regs[prog.out_reg];
}

// Runs prog on one element: inputs holds its prog.n_inputs values (score, batch, head,
// q, kv, the operands' elements at operand_element, then dscore for sm.bwd / sm.grad[k]);
// regs is scratch of kDevMaxRegs floats (or sm.max_regs).
FA_HOST_DEVICE FA_INLINE float eval_program_element(const DeviceScoreMod& sm,
                                                    const DeviceProgram& prog,
                                                    const float* inputs, float* regs) {
  for (int32_t r = 0; r < prog.n_inputs; ++r) regs[r] = inputs[r];
  return eval_program_regs(sm, prog, regs);
}

}  // namespace fusedattn
