// score_mod programs: straight-line float32 code that changes each attention score,
// lowered from a JAX function by python/fusedattn/score_mod.py (its docstring has the
// encoding). The engines run a program on one tile row at a time: every register is a
// row of up to kMaxLanes values, so the per-instruction dispatch is paid once per row.
//
// Packed attribute (one int32 array; floats travel as their bits):
//   [n_operands, shapes (4 int32 per operand),
//    fwd program, bwd program, n_operands operand-gradient programs]
// where a program is [n_words, words..., n_consts, const bits...] and its words are
//   [version, n_inputs, n_instr, out_reg, (op, a, b, c) * n_instr].
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusedattn/core/status.h"
#include "fusedattn/score_mod/opcodes.h"

namespace fusedattn {

// ScoreModOp and the format constants: opcodes.h (device code includes it alone).

struct ScoreModProgram {
  const int32_t* words = nullptr;  // header + instructions
  const float* consts = nullptr;
  int32_t n_consts = 0;
  int32_t n_inputs() const { return words[1]; }
  int32_t n_instr() const { return words[2]; }
  int32_t out_reg() const { return words[3]; }
  int32_t n_regs() const { return words[1] + words[2]; }
  const int32_t* instr(int32_t i) const { return words + 4 + 4 * i; }
};

// The decoded attribute. Shapes are the operands' [B|1, Hq|1, Sq|1, Skv|1].
struct ScoreMod {
  ScoreMod() = default;
  ScoreMod(const ScoreMod&) = delete;  // the programs point into const_storage
  ScoreMod& operator=(const ScoreMod&) = delete;

  int32_t n_operands = 0;
  int64_t shape[kMaxScoreModOperands][4] = {};
  ScoreModProgram fwd, bwd, grad[kMaxScoreModOperands];
  std::vector<float> const_storage;  // the constants, unpacked from their bits

  // Elements of operand i, and its offset in the concatenated operand buffer, where
  // each operand takes a multiple of kScoreModOperandAlign floats (score_mod.py's
  // concat_operands: 64-byte aligned starts, as GPU tensors want).
  int64_t size(int32_t i) const {
    return shape[i][0] * shape[i][1] * shape[i][2] * shape[i][3];
  }
  int64_t offset(int32_t i) const {
    int64_t o = 0;
    for (int32_t j = 0; j < i; ++j)
      o += (size(j) + kScoreModOperandAlign - 1) / kScoreModOperandAlign * kScoreModOperandAlign;
    return o;
  }
  int64_t total_size() const { return offset(n_operands); }
};

// Decodes and checks the packed attribute; extents are the call's (B, Hq, Sq, Skv).
// Every register index is checked here, so evaluation needs no checks.
Status decode_score_mod(const int32_t* data, int64_t n, const int64_t extents[4], ScoreMod* out);

// Runs `prog` on lanes [lo, hi) of one row. in[r] points to the row of input register
// r (kMaxLanes floats, lanes [lo, hi) read); regs is scratch of prog.n_regs() rows of
// kMaxLanes floats. Returns the row holding the result (inside regs or in).
constexpr int kMaxLanes = 64;
const float* eval_score_mod(const ScoreModProgram& prog, const float* const* in, float* regs,
                            int64_t lo, int64_t hi);

// Whether prog computes k1 * tanh(score * k2) (softcapping: k1 = c, k2 = 1 / c) with
// constants k1 > 0 and k2 != 0, written as JAX traces it: tanh of score * k2, k2 * score or
// score / (1 / k2), times k1 on either side. The Hopper forward runs this family natively.
bool match_softcap(const ScoreModProgram& prog, float* k1, float* k2);

// ALiBi: score + sign * slopes[h] * (kv - q), or with |kv - q| (abs), where slopes is the
// call's one array operand, of shape [1, Hq | 1, 1, 1]; written as JAX traces it (score
// - slopes * (q - kv), score + (kv - q) * slopes, score - slopes * |q - kv|, ...). The Hopper
// forward runs this family natively.
struct AlibiForm {
  float sign = 0.0f;  // +1 or -1
  bool abs = false;
};
bool match_alibi(const ScoreMod& sm, AlibiForm* form);

}  // namespace fusedattn
