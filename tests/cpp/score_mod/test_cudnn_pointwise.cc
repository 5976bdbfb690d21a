// The cuDNN pointwise form of score_mod programs (cudnn_pointwise.h) computes what
// the program interpreter does: every opcode, the expansions of the ones cuDNN has no
// node for, booleans used as numbers and numbers used as conditions, on random inputs
// and the edge values (0, negative, NaN); dead code makes no nodes; every node's first
// input is computed (cuDNN's rule), constants and operands in either place.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusedattn/score_mod/program.h"
#include "fusedattn/score_mod/cudnn_pointwise.h"
#include "programs.h"

namespace fusedattn {
namespace {

constexpr int32_t kInputs = kScoreModIndexInputs;  // score, batch, head, q, kv
constexpr int32_t kMaxOperands = 2;                 // scalar operands, registers 5, 6

using Instrs = std::vector<std::vector<int32_t>>;

// Decodes a forward program of 5 inputs and n_operands scalar operands with trivial
// backward programs, or with a given backward program (no operands; dscore is register 5).
class Program {
 public:
  Program(const Instrs& instr, const std::vector<float>& consts, int32_t out = -1,
          int32_t n_operands = 0) {
    attr_ = {n_operands};
    for (int32_t i = 0; i < n_operands * 4; ++i) attr_.push_back(1);
    const int32_t n_in = kInputs + n_operands;
    append(n_in, instr, consts, out);
    for (int32_t i = 0; i <= n_operands; ++i) append(n_in + 1, {}, {}, n_in);  // dscore as is
    decode();
  }
  Program(const Instrs& fwd, const std::vector<float>& fwd_consts, const Instrs& bwd,
          const std::vector<float>& bwd_consts) {
    attr_ = {0};
    append(kInputs, fwd, fwd_consts, -1);
    append(kInputs + 1, bwd, bwd_consts, -1);
    decode();
  }
  const Status& status() const { return status_; }
  const ScoreModProgram& fwd() const { return sm_.fwd; }
  const ScoreModProgram& bwd() const { return sm_.bwd; }
  int32_t n_operands() const { return sm_.n_operands; }

 private:
  void append(int32_t n_in, const std::vector<std::vector<int32_t>>& instr,
              const std::vector<float>& consts, int32_t out) {
    const std::vector<int32_t> p = test::program(n_in, instr, consts, out);
    attr_.insert(attr_.end(), p.begin(), p.end());
  }
  void decode() {
    const int64_t ext[4] = {2, 4, 8, 8};
    status_ = decode_score_mod(attr_.data(), int64_t(attr_.size()), ext, &sm_);
  }
  std::vector<int32_t> attr_;
  ScoreMod sm_;
  Status status_;
};

// Lowers p and compares it with the interpreter on `points` inputs (lanes of one row).
void expect_same(const Program& p, const std::vector<std::vector<float>>& points,
                 const char* what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(p.status().ok()) << p.status().message;
  PwProgram pw;
  const Status s = lower_to_pointwise(p.fwd(), p.n_operands(), &pw);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_FALSE(pw.nodes[pw.out].boolean);
  for (const PwNode& n : pw.nodes) {
    const int32_t first = first_input(n);
    if (first >= 0) EXPECT_TRUE(pw.nodes[first].computed) << "op " << int(n.op);
  }
  constexpr int32_t kRegs = kInputs + kMaxOperands;
  std::vector<float> rows(kRegs * kMaxLanes, 0.0f), regs(p.fwd().n_regs() * kMaxLanes);
  const float* in[kRegs];
  for (int r = 0; r < kRegs; ++r) in[r] = rows.data() + r * kMaxLanes;
  const int64_t n = int64_t(points.size());
  ASSERT_LE(n, kMaxLanes);
  for (int64_t c = 0; c < n; ++c)
    for (int r = 0; r < kRegs; ++r) rows[r * kMaxLanes + c] = points[c][r];
  const float* want = eval_score_mod(p.fwd(), in, regs.data(), 0, n);
  for (int64_t c = 0; c < n; ++c) {
    const float got = eval_pointwise(pw, points[c].data());
    if (got == want[c]) continue;  // infinities too
    if (std::isnan(want[c])) {
      EXPECT_TRUE(std::isnan(got)) << "point " << c << ": got " << got;
    } else {
      EXPECT_NEAR(got, want[c], 2e-6f * std::max(1.0f, std::fabs(want[c])))
          << "point " << c << " (s=" << points[c][0] << ", q=" << points[c][3] << ")";
    }
  }
}

// Random (score, batch, head, q, kv, operand 0, operand 1) and the edge values of the
// score.
std::vector<std::vector<float>> points() {
  std::mt19937 rng(7);
  std::normal_distribution<float> score(0.0f, 3.0f);
  std::uniform_int_distribution<int> idx(0, 9);
  std::vector<std::vector<float>> p;
  for (float s : {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, -2.5f, 7.0f, -7.0f, NAN})
    p.push_back({s, 1.0f, 2.0f, 3.0f, 5.0f, 0.5f, -2.0f});
  while (p.size() < 48)
    p.push_back({score(rng), float(idx(rng)), float(idx(rng)), float(idx(rng)), float(idx(rng)),
                 score(rng), score(rng)});
  return p;
}

TEST(ScoreModPointwise, EveryUnaryOpcode) {
  // op(s * 0.3 + 1.5): inputs of log/sqrt mostly positive, some negative (NaN both ways).
  for (int32_t op : {SM_NEG, SM_ABS, SM_EXP, SM_LOG, SM_TANH, SM_SIGMOID, SM_SQRT, SM_RSQRT,
                     SM_SIGN, SM_LOG1P, SM_EXPM1, SM_FLOOR, SM_CEIL, SM_TRUNC, SM_EXP2, SM_SIN,
                     SM_COS, SM_ERF}) {
    Program p({{SM_CONST, 0, 0, 0}, {SM_CONST, 1, 0, 0}, {SM_MUL, 0, 5, 0}, {SM_ADD, 7, 6, 0},
               {op, 8, 0, 0}},
              {0.3f, 1.5f});
    expect_same(p, points(), ("opcode " + std::to_string(op)).c_str());
  }
  // sign and trunc on the raw score too (0, -0, NaN, negative halves)
  for (int32_t op : {SM_SIGN, SM_TRUNC, SM_FLOOR, SM_CEIL})
    expect_same(Program({{op, 0, 0, 0}}, {}), points(), ("raw opcode " + std::to_string(op)).c_str());
}

TEST(ScoreModPointwise, EveryBinaryOpcode) {
  for (int32_t op : {SM_ADD, SM_SUB, SM_MUL, SM_DIV, SM_MAX, SM_MIN, SM_POW, SM_REM, SM_LT, SM_LE,
                     SM_GT, SM_GE, SM_EQ, SM_NE}) {
    // op(s, q - kv): a comparison's 0/1 comes back as a number
    Program p({{SM_SUB, 3, 4, 0}, {op, 0, 5, 0}}, {});
    expect_same(p, points(), ("opcode " + std::to_string(op)).c_str());
  }
}

TEST(ScoreModPointwise, BooleansAndConditions) {
  // causal as a score_mod: select(q >= kv, s, -inf)
  expect_same(Program({{SM_GE, 3, 4, 0}, {SM_CONST, 0, 0, 0}, {SM_SELECT, 5, 0, 6}},
                      {-INFINITY}),
              points(), "select on a comparison");
  // a number as the condition (nonzero: true), and a comparison used in arithmetic
  expect_same(Program({{SM_SUB, 3, 4, 0}, {SM_SELECT, 5, 0, 3}}, {}), points(),
              "select on a number");
  expect_same(Program({{SM_LT, 0, 3, 0}, {SM_MUL, 5, 0, 0}, {SM_ADD, 6, 5, 0}}, {}), points(),
              "a comparison as 0 / 1");
  // a comparison as a select branch, and the output itself a comparison
  expect_same(Program({{SM_GT, 0, 4, 0}, {SM_LT, 0, 3, 0}, {SM_SELECT, 6, 5, 0}}, {}), points(),
              "a comparison as a branch");
  expect_same(Program({{SM_GT, 0, 4, 0}}, {}), points(), "a comparison as the output");
}

TEST(ScoreModPointwise, ConstantsAndOperandsComeSecond) {
  // op(c, s), op(operand, s), op(operand, c) for every binary opcode: symmetric ones swap,
  // the others read the constant / operand through the computed zero
  for (int32_t op : {SM_ADD, SM_SUB, SM_MUL, SM_DIV, SM_MAX, SM_MIN, SM_POW, SM_REM, SM_LT, SM_LE,
                     SM_GT, SM_GE, SM_EQ, SM_NE}) {
    const std::string name = "opcode " + std::to_string(op);
    expect_same(Program({{SM_CONST, 0, 0, 0}, {op, 5, 0, 0}}, {1.5f}), points(),
                (name + " (constant, score)").c_str());
    expect_same(Program({{op, 5, 0, 0}}, {}, -1, 1), points(), (name + " (operand, score)").c_str());
    expect_same(Program({{SM_CONST, 0, 0, 0}, {op, 5, 7, 0}, {SM_ADD, 8, 0, 0}}, {0.75f}, -1, 2),
                points(), (name + " (operand, constant) + score").c_str());
  }
  // unary on an operand; select with constant / operand branches; an operand as condition
  expect_same(Program({{SM_EXP, 5, 0, 0}, {SM_MUL, 0, 6, 0}}, {}, -1, 1), points(),
              "exp(operand) * s");
  expect_same(Program({{SM_CONST, 0, 0, 0}, {SM_GT, 0, 3, 0}, {SM_SELECT, 8, 7, 5}}, {2.0f}, -1, 2),
              points(), "select(s > q, 2, operand)");
  expect_same(Program({{SM_SELECT, 6, 5, 0}}, {}, -1, 2), points(),
              "select(operand 1, operand 0, s)");
}

TEST(ScoreModPointwise, TheScoreComesBeforeIndexTerms) {
  // (kv - q) * operand + s and (kv - q) - s: both inputs computed, only the second from the
  // score; the score goes first (cuDNN's backward miscomputed dS otherwise)
  for (int32_t op : {SM_ADD, SM_SUB, SM_MUL, SM_MAX}) {
    const Program p({{SM_SUB, 4, 3, 0}, {SM_MUL, 6, 5, 0}, {op, 7, 0, 0}}, {}, -1, 1);
    expect_same(p, points(), ("(kv - q) * operand, then opcode " + std::to_string(op)).c_str());
    PwProgram pw;
    ASSERT_TRUE(lower_to_pointwise(p.fwd(), p.n_operands(), &pw).ok());
    for (const PwNode& n : pw.nodes)
      if (n.scored && n.b >= 0) EXPECT_TRUE(pw.nodes[first_input(n)].scored) << "op " << op;
  }
}

TEST(ScoreModPointwise, DivisionByAConstantMultiplies) {
  for (float c : {2.5f, -3.0f, 0.0f, 1e-39f}) {  // 0 and a denormal stay divisions
    Program p({{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}}, {c});
    expect_same(p, points(), ("s / " + std::to_string(c)).c_str());
    PwProgram pw;
    ASSERT_TRUE(lower_to_pointwise(p.fwd(), 0, &pw).ok());
    EXPECT_EQ(pw.nodes[pw.out].op, std::isnormal(c) ? PwOp::kMul : PwOp::kDiv) << c;
  }
}

TEST(ScoreModPointwise, IdentityAndDeadCode) {
  Program identity({}, {}, 0);
  PwProgram pw;
  ASSERT_TRUE(identity.status().ok());
  ASSERT_TRUE(lower_to_pointwise(identity.fwd(), 0, &pw).ok());
  ASSERT_EQ(pw.nodes.size(), 1u);
  EXPECT_EQ(pw.nodes[0].op, PwOp::kInput);
  EXPECT_TRUE(pw.reads_input(0));
  // exp(batch) is computed but unused: no node reads the batch index
  Program dead({{SM_EXP, 1, 0, 0}, {SM_TANH, 0, 0, 0}}, {});
  ASSERT_TRUE(lower_to_pointwise(dead.fwd(), 0, &pw).ok());
  EXPECT_EQ(pw.nodes.size(), 2u);
  EXPECT_FALSE(pw.reads_input(1));
  expect_same(dead, points(), "dead code");
}

// Node k's value at one point (the program with k as its output).
float node_value(PwProgram p, int32_t k, const float* in) {
  p.out = k;
  return eval_pointwise(p, in);
}

TEST(ScoreModPointwise, BackwardSharesTheForwardsNodes) {
  // softcap tanh(s / 50) * 50 and its derivative as JAX writes it (make_score_mod):
  // ds * (u + u * t) / 50 with u = (1 * 50) * (1 - t), t = tanh(s / 50) (s: register 0,
  // dscore: 5)
  const Program p({{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0}, {SM_MUL, 7, 5, 0}},
                  {50.0f},
                  {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 6, 0}, {SM_TANH, 7, 0, 0}, {SM_CONST, 1, 0, 0},
                   {SM_SUB, 9, 8, 0}, {SM_MUL, 9, 6, 0}, {SM_MUL, 11, 10, 0}, {SM_MUL, 12, 8, 0},
                   {SM_ADD, 12, 13, 0}, {SM_DIV, 14, 6, 0}, {SM_MUL, 5, 15, 0}},
                  {50.0f, 1.0f});
  ASSERT_TRUE(p.status().ok()) << p.status().message;
  PwProgram fwd, bwd;
  ASSERT_TRUE(lower_to_pointwise(p.fwd(), 0, &fwd).ok());
  ASSERT_TRUE(lower_to_pointwise(p.bwd(), 0, &bwd).ok());
  const std::vector<int32_t> same = same_nodes(fwd, bwd);
  ASSERT_EQ(same.size(), bwd.nodes.size());
  int tanh_shared = 0;
  for (size_t i = 0; i < bwd.nodes.size(); ++i) {
    const PwNode& n = bwd.nodes[i];
    if (n.op == PwOp::kTanh) {
      ASSERT_GE(same[i], 0) << "the backward's tanh is the forward's";
      ++tanh_shared;
    }
    if (same[i] < 0) continue;
    EXPECT_EQ(fwd.nodes[same[i]].op, n.op) << "node " << i;
    EXPECT_FALSE(n.op == PwOp::kInput && n.input == kInputs) << "dscore has no forward node";
    for (const auto& pt : points()) {  // the shared pair has one value everywhere
      float in[kInputs + 1];
      std::copy(pt.begin(), pt.begin() + kInputs + 1, in);  // dscore: the operand 0 column
      const float want = node_value(bwd, int32_t(i), in), got = node_value(fwd, same[i], in);
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << "node " << i;
      else EXPECT_EQ(got, want) << "node " << i;
    }
  }
  EXPECT_EQ(tanh_shared, 1);
  // 50 * (1 - t) * (1 + t) / 50 as JAX writes it multiplies 1 by 50: folded, so no node
  // computes from constants only (nor needs the computed zero, which reads the q index).
  for (const PwNode& n : bwd.nodes)
    if (n.op != PwOp::kInput && n.op != PwOp::kConst)
      EXPECT_FALSE(bwd.nodes[n.a].op == PwOp::kConst &&
                   (n.b < 0 || bwd.nodes[n.b].op == PwOp::kConst))
          << "op " << int(n.op);
  EXPECT_FALSE(bwd.reads_input(3));
  // Nodes that read dscore are the backward's own.
  std::vector<bool> reads_ds(bwd.nodes.size(), false);
  for (size_t i = 0; i < bwd.nodes.size(); ++i) {
    const PwNode& n = bwd.nodes[i];
    reads_ds[i] = (n.op == PwOp::kInput && n.input == kInputs) ||
                  (n.a >= 0 && reads_ds[n.a]) || (n.b >= 0 && reads_ds[n.b]) ||
                  (n.c >= 0 && reads_ds[n.c]);
    if (reads_ds[i]) EXPECT_EQ(same[i], -1) << "node " << i;
  }
  EXPECT_TRUE(reads_ds[bwd.out]);

  // A different constant makes a different value: tanh(s / 25) is not tanh(s / 50).
  const Program q({{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0}}, {50.0f},
                  {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 6, 0}, {SM_TANH, 7, 0, 0}, {SM_MUL, 5, 8, 0}},
                  {25.0f});
  ASSERT_TRUE(q.status().ok()) << q.status().message;
  ASSERT_TRUE(lower_to_pointwise(q.fwd(), 0, &fwd).ok());
  ASSERT_TRUE(lower_to_pointwise(q.bwd(), 0, &bwd).ok());
  const std::vector<int32_t> none = same_nodes(fwd, bwd);
  for (size_t i = 0; i < bwd.nodes.size(); ++i)
    if (bwd.nodes[i].op != PwOp::kInput) EXPECT_EQ(none[i], -1) << "node " << i;
}

TEST(ScoreModPointwise, WhereTheBackwardIsZeroWithDscore) {
  // Backward programs of the identity forward (dscore: register 5, score: 0, q: 3, kv: 4).
  struct Case {
    const char* what;
    Instrs bwd;
    std::vector<float> consts;
    bool zero;
  };
  const std::vector<Case> cases = {
      {"ds", {{SM_ADD, 5, 5, 0}}, {}, true},
      {"ds * (1 - tanh(s)^2)",
       {{SM_TANH, 0, 0, 0}, {SM_MUL, 6, 6, 0}, {SM_CONST, 0, 0, 0}, {SM_SUB, 8, 7, 0},
        {SM_MUL, 5, 9, 0}},
       {1.0f}, true},
      {"ds * sigmoid(s) / 4", {{SM_SIGMOID, 0, 0, 0}, {SM_MUL, 5, 6, 0}, {SM_CONST, 0, 0, 0},
                               {SM_DIV, 7, 8, 0}}, {4.0f}, true},
      {"ds * (q - kv)", {{SM_SUB, 3, 4, 0}, {SM_MUL, 6, 5, 0}}, {}, true},
      {"s > 0 ? ds : 0", {{SM_CONST, 0, 0, 0}, {SM_GT, 0, 6, 0}, {SM_SELECT, 7, 5, 6}}, {0.0f},
       true},
      {"ds * exp(s)", {{SM_EXP, 0, 0, 0}, {SM_MUL, 5, 6, 0}}, {}, false},
      {"ds * s", {{SM_MUL, 5, 0, 0}}, {}, false},
      {"ds / s", {{SM_DIV, 5, 0, 0}}, {}, false},
      {"ds / 0", {{SM_CONST, 0, 0, 0}, {SM_DIV, 5, 6, 0}}, {0.0f}, false},
      {"ds + 1", {{SM_CONST, 0, 0, 0}, {SM_ADD, 5, 6, 0}}, {1.0f}, false},
      {"s > 0 ? ds : 1", {{SM_CONST, 0, 0, 0}, {SM_CONST, 1, 0, 0}, {SM_GT, 0, 6, 0},
                          {SM_SELECT, 8, 5, 7}}, {0.0f, 1.0f}, false},
      {"ds * (q * 1e30 * 1e30)", {{SM_CONST, 0, 0, 0}, {SM_MUL, 3, 6, 0}, {SM_MUL, 7, 6, 0},
                                  {SM_MUL, 5, 8, 0}}, {1e30f}, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Program p({}, {}, c.bwd, c.consts);
    ASSERT_TRUE(p.status().ok()) << p.status().message;
    PwProgram bwd;
    ASSERT_TRUE(lower_to_pointwise(p.bwd(), 0, &bwd).ok());
    EXPECT_EQ(zero_where_dscore_is(bwd, kInputs), c.zero);
    if (!c.zero) continue;
    for (auto pt : points()) {  // what it claims: 0 at dscore = 0, every finite input
      if (std::isnan(pt[0])) continue;
      pt[kInputs] = 0.0f;
      for (float s : {pt[0], 1e30f, -1e30f, INFINITY, -INFINITY}) {
        pt[0] = s;
        EXPECT_EQ(eval_pointwise(bwd, pt.data()), 0.0f) << "s=" << s;
      }
    }
  }
}

}  // namespace
}  // namespace fusedattn
