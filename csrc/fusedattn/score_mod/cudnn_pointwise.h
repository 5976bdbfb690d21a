// score_mod programs in the operations of cuDNN's pointwise nodes, for the cuDNN
// backend (attention/cudnn/sdpa_graph.cc turns every node into one graph node).
//
// The lowering expands what cuDNN has no node for (sign, log1p, expm1, exp2, trunc,
// rem) into nodes it has, and makes the types explicit: a comparison gives a boolean
// (cuDNN's CMP_* output), a select takes a boolean condition (BINARY_SELECT), and a
// boolean used as a number becomes select(b, 1, 0) (the programs treat comparisons
// as 0.0 / 1.0). cuDNN's fused attention takes a node's first input (a select's value
// if true) only from the score stream: a value computed in the graph, never a scalar or
// an operand in memory; the lowering swaps the inputs of symmetric nodes, makes c - x
// into -x + c, and otherwise adds the value to a computed zero (q index * 0). Where both
// inputs are computed and only the second depends on the score itself, it goes first the
// same way (cuDNN's backward miscomputed dS otherwise: cudnn_pointwise.cc). A
// division by a constant becomes a multiplication by its reciprocal (within 1.5 ulp). Pure C++: the lowering and its evaluator are tested on the CPU
// against the program interpreter (score_mod.h).
#pragma once

#include <cstdint>
#include <vector>

#include "fusedattn/score_mod/program.h"
#include "fusedattn/core/status.h"

namespace fusedattn {

enum class PwOp : int32_t {
  kInput,  // program input register `input` (score, batch, head, q, kv, operands, dscore)
  kConst,  // value
  kAdd, kSub, kMul, kDiv, kMax, kMin, kPow,                 // binary, float
  kNeg, kAbs, kExp, kLog, kTanh, kSigmoid, kSqrt, kRsqrt,  // unary, float
  kFloor, kCeil, kSin, kCos, kErf,
  kCmpLt, kCmpLe, kCmpGt, kCmpGe, kCmpEq, kCmpNe,          // binary, float -> boolean
  kSelect,                                                 // a (boolean) ? b : c
};

struct PwNode {
  PwOp op = PwOp::kConst;
  int32_t a = -1, b = -1, c = -1;  // earlier nodes
  int32_t input = -1;              // kInput: the program register
  float value = 0.0f;              // kConst
  bool boolean = false;            // the node's result is a boolean (comparisons)
  bool computed = false;           // a value of the score stream: not a constant, not an operand
  bool scored = false;             // depends on the score (or dscore) itself, not only indices
};

struct PwProgram {
  std::vector<PwNode> nodes;
  int32_t out = -1;  // a float node
  bool reads_input(int32_t reg) const {
    for (const PwNode& n : nodes)
      if (n.op == PwOp::kInput && n.input == reg) return true;
    return false;
  }
};

// The node's first input as cuDNN reads it (a select's: b), or -1 for inputs and constants.
int32_t first_input(const PwNode& n);

// The pointwise form of `prog` (decoded by decode_score_mod; its registers
// [kScoreModIndexInputs, kScoreModIndexInputs + n_operands) are the operands). Nodes
// appear in evaluation order; only the registers the output depends on are kept; every
// node's first input is computed. Fails, naming the operation, for what has no
// pointwise form.
Status lower_to_pointwise(const ScoreModProgram& prog, int32_t n_operands, PwProgram* out);

// For each node of `b`, a node of `a` that computes the same value from the same inputs
// (the same operation on nodes that are the same, the same constant or input), or -1.
// The backward graph of cuDNN runs the forward program and then the backward one on the
// same scores: the backward reads what they share from the forward's nodes (softcap's
// backward: 1 - tanh(s / c)^2 takes the forward's tanh instead of a second one).
std::vector<int32_t> same_nodes(const PwProgram& a, const PwProgram& b);

// Whether the backward program `p` (dscore: input register `dscore`) is 0 wherever dscore
// is 0 and no input is NaN, by the ranges of its nodes: dscore times or divided by
// something finite (softcap: ds * (1 - t * t)), dscore itself (ALiBi), sums and selects
// of such. Then cuDNN's backward needs no guard keeping dS = 0 at masked keys. Conservative:
// false where it cannot tell.
bool zero_where_dscore_is(const PwProgram& p, int32_t dscore);

// The program's value at one point: in[r] is input register r (the tests compare it
// with eval_score_mod).
float eval_pointwise(const PwProgram& p, const float* in);

}  // namespace fusedattn
