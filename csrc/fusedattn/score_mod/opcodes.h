// The score_mod program's opcodes and format constants (program.h has the format).
// Only <stdint.h>: CUDA device code (device_program.h) includes this header too.
#pragma once

#include <stdint.h>

namespace fusedattn {

enum ScoreModOp : int32_t {
  SM_CONST = 0, SM_ADD, SM_SUB, SM_MUL, SM_DIV, SM_MAX, SM_MIN, SM_NEG, SM_ABS, SM_EXP,
  SM_LOG, SM_TANH, SM_SIGMOID, SM_LT, SM_LE, SM_GT, SM_GE, SM_EQ, SM_NE, SM_SELECT,
  SM_SQRT, SM_RSQRT, SM_SIGN, SM_LOG1P, SM_EXPM1, SM_POW, SM_FLOOR, SM_CEIL, SM_TRUNC,
  SM_REM, SM_EXP2, SM_SIN, SM_COS, SM_ERF, SM_NUM_OPS
};

constexpr int32_t kScoreModVersion = 1;
constexpr int kScoreModIndexInputs = 5;  // score, batch, head, q, kv
constexpr int kMaxScoreModOperands = 16;
constexpr int kMaxScoreModInstr = 4096;
constexpr int64_t kScoreModOperandAlign = 16;  // floats

}  // namespace fusedattn
