// The per-element score_mod interpreter of CUDA kernels (device_program.h), run on the
// host: bitwise what the CPU engine's row interpreter (eval_score_mod) gives, for every
// opcode, hand-written and random programs, on inputs with negatives, large values,
// subnormals, +-0, +-inf and NaN; and the packing's layout and limits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/platform/cpu/fast_math.h"
#include "fusedattn/score_mod/device_program.h"
#include "fusedattn/score_mod/device_program_host.h"
#include "fusedattn/score_mod/program.h"
#include "programs.h"

namespace fusedattn {
namespace {

using test::program;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

const int64_t kExt[4] = {2, 4, 8, 8};
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// The attribute [n_operands, shapes, fwd, bwd, grads...].
std::vector<int32_t> attr_of(const std::vector<std::vector<int32_t>>& shapes,
                             const std::vector<std::vector<int32_t>>& programs) {
  std::vector<int32_t> a = {int32_t(shapes.size())};
  for (const auto& s : shapes) a.insert(a.end(), s.begin(), s.end());
  for (const auto& p : programs) a.insert(a.end(), p.begin(), p.end());
  return a;
}

// Values that reach every branch of the ops: small and large, exp's and tanh's edges,
// subnormals, signed zeros, infinities, NaN, integers (indices, ties of the comparisons).
float edge_value(std::mt19937& rng) {
  static const float kEdges[] = {0.0f,   -0.0f,  1.0f,    -1.0f,   0.5f,     -0.5f,
                                 2.0f,   3.0f,   -3.0f,   7.0f,    0.49999f, 44.0f,
                                 -87.0f, -87.5f, 88.0f,   88.5f,   88.7229f, 88.8f,
                                 -88.8f, 1e-40f, -1e-40f, 1e30f,   -1e30f,   3.4e38f,
                                 kInf,   -kInf,  kNaN,    -kNaN,   1e-7f,    100.0f};
  std::uniform_int_distribution<int> kind(0, 5), pick(0, int(std::size(kEdges)) - 1);
  std::uniform_real_distribution<float> u(-10.0f, 10.0f), w(-200.0f, 200.0f);
  switch (kind(rng)) {
    case 0: return kEdges[pick(rng)];
    case 1: return u(rng);
    case 2: return w(rng);
    case 3: return float(std::uniform_int_distribution<int>(-4, 8)(rng));
    case 4: return from_bits(uint32_t(rng()));  // any bit pattern
    default: return u(rng) * 0.05f;
  }
}

int n_args(int32_t op) {
  const bool binary = (op >= SM_ADD && op <= SM_MIN) || (op >= SM_LT && op <= SM_NE) ||
                      op == SM_POW || op == SM_REM;
  return op == SM_CONST ? 0 : op == SM_SELECT ? 3 : binary ? 2 : 1;
}

// Equal bits, or both NaN: a NaN's sign and payload are not kept by either interpreter
// (g++ folds -x and x != x ? x : ... of a NaN differently in different inlining contexts:
// fast_sigmoid(NaN) gives either sign), so they are not compared.
::testing::AssertionResult same_bits(float want, float got) {
  if (bits(want) == bits(got) || (want != want && got != got))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "row interpreter " << want << " (0x" << std::hex
                                       << bits(want) << "), element interpreter " << got
                                       << " (0x" << bits(got) << ")";
}

// Runs every program of attr on random input rows through eval_score_mod (lanes [lo, hi)
// for a few lane ranges: the vectorized and the scalar loops) and element by element
// through the packed DeviceScoreMod; returns the number of mismatches (the first few
// are reported).
int compare_all(const std::vector<int32_t>& attr, std::mt19937& rng, const std::string& what,
                int rounds = 4) {
  ScoreMod sm;
  const Status d = decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm);
  EXPECT_TRUE(d.ok()) << what << ": " << d.message;
  if (!d.ok()) return 1;
  auto dev = std::make_unique<DeviceScoreMod>();
  const Status s = pack_device_score_mod(sm, dev.get());
  EXPECT_TRUE(s.ok()) << what << ": " << s.message;
  if (!s.ok()) return 1;

  std::vector<std::pair<const ScoreModProgram*, const DeviceProgram*>> progs = {
      {&sm.fwd, &dev->fwd}, {&sm.bwd, &dev->bwd}};
  for (int32_t k = 0; k < sm.n_operands; ++k) progs.push_back({&sm.grad[k], &dev->grad[k]});
  int bad = 0;
  const int64_t ranges[][2] = {{0, kMaxLanes}, {3, 61}, {5, 6}, {1, 17}};
  for (size_t j = 0; j < progs.size(); ++j) {
    const ScoreModProgram& p = *progs[j].first;
    const DeviceProgram& dp = *progs[j].second;
    EXPECT_EQ(dp.n_inputs, p.n_inputs());
    EXPECT_EQ(dp.n_instr, p.n_instr());
    EXPECT_EQ(dp.out_reg, p.out_reg());
    std::vector<float> in_rows(size_t(p.n_inputs()) * kMaxLanes);
    std::vector<float> scratch(size_t(p.n_regs()) * kMaxLanes);
    std::vector<const float*> in(p.n_inputs());
    for (int32_t r = 0; r < p.n_inputs(); ++r) in[r] = in_rows.data() + r * kMaxLanes;
    for (int round = 0; round < rounds; ++round) {
      for (float& v : in_rows) v = edge_value(rng);
      // Some lanes repeat another input's value, so that == and the ties of <= / max meet.
      for (int c = 0; c < kMaxLanes; c += 3)
        in_rows[size_t(rng() % p.n_inputs()) * kMaxLanes + c] =
            in_rows[size_t(rng() % p.n_inputs()) * kMaxLanes + c];
      for (const auto& lh : ranges) {
        const float* row = eval_score_mod(p, in.data(), scratch.data(), lh[0], lh[1]);
        for (int64_t c = lh[0]; c < lh[1]; ++c) {
          float inputs[kDevMaxInputs];
          float regs[kDevMaxRegs];
          for (int32_t r = 0; r < p.n_inputs(); ++r) inputs[r] = in[r][c];
          const float got = eval_program_element(*dev, dp, inputs, regs);
          const auto same = same_bits(row[c], got);
          if (!same && ++bad <= 5) {
            std::string ins;
            for (int32_t r = 0; r < p.n_inputs(); ++r) ins += std::to_string(inputs[r]) + " ";
            ADD_FAILURE() << what << ", program " << j << ", lanes [" << lh[0] << ", " << lh[1]
                          << "), lane " << c << ": " << same.message() << "; inputs " << ins;
          }
        }
      }
    }
  }
  return bad;
}

// Every opcode alone, forward (inputs score, b, h, q, kv) and backward (+ dscore).
TEST(DeviceProgram, EveryOpcodeMatchesTheRowInterpreter) {
  std::mt19937 rng(1);
  for (int32_t op = 0; op < SM_NUM_OPS; ++op) {
    std::vector<std::vector<int32_t>> fwd, bwd;
    if (op == SM_CONST) {
      fwd = {{SM_CONST, 1, 0, 0}};
      bwd = {{SM_CONST, 0, 0, 0}, {SM_CONST, 2, 0, 0}, {SM_ADD, 6, 7, 0}};
    } else {
      const int n = n_args(op);
      fwd = {{op, 0, n > 1 ? 4 : 0, n > 2 ? 3 : 0}};
      bwd = {{op, 5, 0, n > 2 ? 4 : 0}};
    }
    const std::vector<float> consts = {-2.5f, 0.75f, kNaN};
    const auto attr = attr_of({}, {program(5, fwd, consts), program(6, bwd, consts)});
    EXPECT_EQ(compare_all(attr, rng, "opcode " + std::to_string(op), 64), 0) << "opcode " << op;
  }
}

// The programs of test_program.cc: softcap (tanh), ALiBi (an operand).
TEST(DeviceProgram, HandWrittenProgramsMatchTheRowInterpreter) {
  std::mt19937 rng(2);
  const auto softcap = attr_of(
      {}, {program(5, {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0},
                       {SM_MUL, 7, 5, 0}}, {50.0f}),
           program(6, {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 6, 0}, {SM_TANH, 7, 0, 0},
                       {SM_MUL, 8, 8, 0}, {SM_CONST, 1, 0, 0}, {SM_SUB, 10, 9, 0},
                       {SM_MUL, 5, 11, 0}}, {50.0f, 1.0f})});
  EXPECT_EQ(compare_all(softcap, rng, "softcap", 16), 0);
  // s - slopes * |q - kv|; its gradients: ds, and -|q - kv| * ds for the slopes.
  const auto alibi = attr_of(
      {{1, 4, 1, 1}},
      {program(6, {{SM_SUB, 3, 4, 0}, {SM_ABS, 6, 0, 0}, {SM_MUL, 5, 7, 0}, {SM_SUB, 0, 8, 0}},
               {}),
       program(7, {{SM_ADD, 6, 6, 0}, {SM_SUB, 7, 6, 0}}, {}),
       program(7, {{SM_SUB, 3, 4, 0}, {SM_ABS, 7, 0, 0}, {SM_NEG, 8, 0, 0}, {SM_MUL, 9, 6, 0}},
               {})});
  EXPECT_EQ(compare_all(alibi, rng, "alibi", 16), 0);
  // A sigmoid gate with an exp and a select on a [B, 1, Sq, Skv] bias and a [1, Hq, 1, 1] scale.
  const auto gate = attr_of(
      {{2, 1, 8, 8}, {1, 4, 1, 1}},
      {program(7, {{SM_ADD, 0, 5, 0}, {SM_SIGMOID, 7, 0, 0}, {SM_MUL, 8, 6, 0}, {SM_LT, 3, 4, 0},
                   {SM_EXP, 9, 0, 0}, {SM_SELECT, 10, 11, 9}}, {}),
       program(8, {{SM_MUL, 7, 6, 0}}, {}), program(8, {{SM_MUL, 7, 0, 0}}, {}),
       program(8, {{SM_MUL, 7, 5, 0}}, {})});
  EXPECT_EQ(compare_all(gate, rng, "gate", 16), 0);
}

// Random straight-line programs over every opcode, with operands, constants (NaN and inf
// among them) and outputs anywhere (an input too).
std::vector<int32_t> random_program(std::mt19937& rng, int32_t n_inputs, int n_instr) {
  std::vector<std::vector<int32_t>> instr;
  std::vector<float> consts;
  const int n_consts = 1 + int(rng() % 4);
  for (int i = 0; i < n_consts; ++i) consts.push_back(edge_value(rng));
  for (int i = 0; i < n_instr; ++i) {
    const int32_t op = int32_t(rng() % SM_NUM_OPS);
    const int32_t self = n_inputs + i;
    std::vector<int32_t> ins = {op, 0, 0, 0};
    if (op == SM_CONST) ins[1] = int32_t(rng() % n_consts);
    for (int a = 0; a < n_args(op); ++a) ins[1 + a] = int32_t(rng() % self);
    instr.push_back(ins);
  }
  const int32_t n_regs = n_inputs + n_instr;
  const int32_t out = rng() % 8 == 0 ? int32_t(rng() % n_regs) : n_regs - 1;
  return program(n_inputs, instr, consts, out);
}

TEST(DeviceProgram, RandomProgramsMatchTheRowInterpreter) {
  std::mt19937 rng(3);
  int bad = 0;
  for (int t = 0; t < 300 && bad == 0; ++t) {
    const int n_ops = int(rng() % 4);
    std::vector<std::vector<int32_t>> shapes;
    for (int k = 0; k < n_ops; ++k) {
      std::vector<int32_t> s(4);
      for (int d = 0; d < 4; ++d) s[d] = rng() % 2 ? int32_t(kExt[d]) : 1;
      shapes.push_back(s);
    }
    const int32_t n_in = kScoreModIndexInputs + n_ops;
    std::vector<std::vector<int32_t>> progs = {random_program(rng, n_in, 1 + int(rng() % 40)),
                                               random_program(rng, n_in + 1, 1 + int(rng() % 40))};
    for (int k = 0; k < n_ops; ++k) progs.push_back(random_program(rng, n_in + 1, 1 + int(rng() % 20)));
    bad += compare_all(attr_of(shapes, progs), rng, "random attribute " + std::to_string(t), 2);
  }
  EXPECT_EQ(bad, 0);
}

// Shapes, offsets, the pool's slices and constants (each distinct value once), and the
// operand gather.
TEST(DeviceProgram, PacksTheLayout) {
  const auto attr = attr_of(
      {{2, 1, 8, 8}, {1, 4, 1, 1}, {1, 1, 1, 8}},
      {program(8, {{SM_CONST, 0, 0, 0}, {SM_MUL, 0, 8, 0}}, {2.0f}),
       program(9, {{SM_CONST, 0, 0, 0}, {SM_CONST, 1, 0, 0}, {SM_ADD, 9, 10, 0}}, {2.0f, -0.0f}),
       program(9, {{SM_CONST, 0, 0, 0}}, {0.0f}), program(9, {{SM_NEG, 8, 0, 0}}, {}),
       program(9, {{SM_CONST, 0, 0, 0}}, {2.0f})});
  ScoreMod sm;
  ASSERT_TRUE(decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm).ok());
  auto dev = std::make_unique<DeviceScoreMod>();
  ASSERT_TRUE(pack_device_score_mod(sm, dev.get()).ok());
  EXPECT_EQ(dev->n_operands, 3);
  for (int k = 0; k < 3; ++k) {
    for (int d = 0; d < 4; ++d) EXPECT_EQ(dev->shape[k][d], sm.shape[k][d]);
    EXPECT_EQ(dev->offset[k], sm.offset(k));
  }
  EXPECT_EQ(dev->offset[1], 128);  // 2 * 8 * 8
  EXPECT_EQ(dev->offset[2], 144);  // 4, aligned to 16
  EXPECT_EQ(dev->total, 160);
  EXPECT_EQ(dev->fwd.start, 0);
  EXPECT_EQ(dev->bwd.start, 2);
  EXPECT_EQ(dev->grad[0].start, 5);
  EXPECT_EQ(dev->grad[1].start, 6);
  EXPECT_EQ(dev->grad[2].start, 7);
  EXPECT_EQ(dev->n_instr, 8);
  EXPECT_EQ(dev->max_regs, 12);
  // 2.0 (three times), -0.0 and 0.0 (distinct bits): three constants.
  EXPECT_EQ(dev->n_consts, 3);
  EXPECT_EQ(dev->instr[0].a, dev->instr[7].a);
  EXPECT_EQ(dev->consts[dev->instr[3].a], 0.0f);
  EXPECT_TRUE(std::signbit(dev->consts[dev->instr[3].a]));
  EXPECT_FALSE(std::signbit(dev->consts[dev->instr[5].a]));
  // operand_element: ScoreModRows' broadcast index, plus the offset.
  EXPECT_EQ(operand_element(*dev, 0, 1, 3, 5, 6), 1 * 64 + 5 * 8 + 6);
  EXPECT_EQ(operand_element(*dev, 1, 1, 3, 5, 6), 128 + 3);
  EXPECT_EQ(operand_element(*dev, 2, 1, 3, 5, 6), 144 + 6);
  // Unused operand slots are empty.
  EXPECT_EQ(dev->grad[3].n_instr, 0);
  EXPECT_EQ(dev->shape[3][0], 0);
}

// The closed forms the kernels run compiled (DeviceScoreMod::form): softcap and ALiBi when
// the backward and gradient programs are the family's derivatives; a custom derivative
// (score_mod_bprop) that differs keeps the interpreter.
int32_t form_of(const std::vector<int32_t>& attr, DeviceScoreMod* dev) {
  ScoreMod sm;
  EXPECT_TRUE(decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm).ok());
  EXPECT_TRUE(pack_device_score_mod(sm, dev).ok());
  return dev->form;
}

TEST(DeviceProgram, ClosedFormsOnlyWithTheirDerivatives) {
  auto dev = std::make_unique<DeviceScoreMod>();
  // 50 tanh(s / 50); ds (1 - t^2) (ds: register 5)
  const auto cap = program(5, {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0},
                               {SM_MUL, 7, 5, 0}}, {50.0f});
  const auto dcap = program(6, {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 6, 0}, {SM_TANH, 7, 0, 0},
                                {SM_MUL, 8, 8, 0}, {SM_CONST, 1, 0, 0}, {SM_SUB, 10, 9, 0},
                                {SM_MUL, 5, 11, 0}}, {50.0f, 1.0f});
  EXPECT_EQ(form_of(attr_of({}, {cap, dcap}), dev.get()), kDevFormSoftcap);
  EXPECT_EQ(dev->form_a, 50.0f);
  EXPECT_FLOAT_EQ(dev->form_b, 0.02f);
  const auto straight = program(6, {{SM_NEG, 5, 0, 0}}, {}, 5);  // ds itself
  EXPECT_EQ(form_of(attr_of({}, {cap, straight}), dev.get()), kDevFormNone);
  // s - slopes * (q - kv); ds; -ds (q - kv) (slopes: register 5, ds: 6)
  const auto alibi = program(6, {{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0}}, {});
  const auto ident = program(7, {{SM_NEG, 6, 0, 0}}, {}, 6);
  const auto dslope = program(7, {{SM_SUB, 3, 4, 0}, {SM_MUL, 6, 7, 0}, {SM_NEG, 8, 0, 0}}, {});
  EXPECT_EQ(form_of(attr_of({{1, 4, 1, 1}}, {alibi, ident, dslope}), dev.get()), kDevFormAlibi);
  EXPECT_EQ(dev->form_a, 1.0f);
  EXPECT_EQ(dev->form_abs, 0);
  const auto wrong = program(7, {{SM_SUB, 3, 4, 0}, {SM_MUL, 6, 7, 0}}, {});  // sign lost
  EXPECT_EQ(form_of(attr_of({{1, 4, 1, 1}}, {alibi, ident, wrong}), dev.get()), kDevFormNone);
  const auto twice = program(7, {{SM_ADD, 6, 6, 0}}, {});
  EXPECT_EQ(form_of(attr_of({{1, 4, 1, 1}}, {alibi, twice, dslope}), dev.get()), kDevFormNone);
  // Neither family: the interpreter.
  EXPECT_EQ(form_of(attr_of({}, {program(5, {{SM_NEG, 0, 0, 0}}, {}), straight}), dev.get()),
            kDevFormNone);
}

// Limits: a program's registers, the instruction pool, the constant pool; at the limit
// it packs.
std::vector<std::vector<int32_t>> negs(int32_t n_inputs, int n) {
  std::vector<std::vector<int32_t>> v;
  for (int i = 0; i < n; ++i) v.push_back({SM_NEG, n_inputs + i - 1, 0, 0});
  return v;
}

Status pack(const std::vector<int32_t>& attr, std::string* why = nullptr) {
  ScoreMod sm;
  const Status d = decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm);
  EXPECT_TRUE(d.ok()) << d.message;
  auto dev = std::make_unique<DeviceScoreMod>();
  const Status s = pack_device_score_mod(sm, dev.get());
  std::string w;
  EXPECT_EQ(device_score_mod_fits(sm, &w), s.ok());
  EXPECT_EQ(w, s.ok() ? "" : s.message);
  if (why) *why = w;
  return s;
}

TEST(DeviceProgram, RejectsProgramsPastTheLimits) {
  const auto one = program(6, {{SM_NEG, 5, 0, 0}}, {});
  // 5 inputs + 123 instructions = kDevMaxRegs: packs; one more does not.
  EXPECT_TRUE(pack(attr_of({}, {program(5, negs(5, 123), {}), one})).ok());
  Status s = pack(attr_of({}, {program(5, negs(5, 124), {}), one}));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("the forward program needs 129 registers (5 inputs + 124 "
                           "instructions)"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("kDevMaxRegs = 128"), std::string::npos) << s.message;
  s = pack(attr_of({{1, 1, 1, 1}}, {program(6, {{SM_NEG, 0, 0, 0}}, {}),
                                     program(7, {{SM_NEG, 0, 0, 0}}, {}),
                                     program(7, negs(7, 122), {})}));
  EXPECT_NE(s.message.find("the operand 0 gradient program needs 129 registers"),
            std::string::npos) << s.message;

  // The pool: 10 operands, every program 100 instructions: 1200 > 1024. 1024 exactly packs.
  std::vector<std::vector<int32_t>> shapes(10, {1, 1, 1, 1});
  std::vector<std::vector<int32_t>> progs = {program(15, negs(15, 100), {}),
                                             program(16, negs(16, 100), {})};
  for (int k = 0; k < 10; ++k) progs.push_back(program(16, negs(16, 100), {}));
  std::string why;
  s = pack(attr_of(shapes, progs), &why);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("1200 instructions together (forward 100, backward 100, operand 0 "
                           "gradient 100"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("kDevMaxInstr = 1024"), std::string::npos) << s.message;
  EXPECT_EQ(why, s.message);
  progs[10] = program(16, negs(16, 12), {});  // 10 * 100 + 2 * 12 = 1024
  progs[11] = program(16, negs(16, 12), {});
  EXPECT_TRUE(pack(attr_of(shapes, progs)).ok());

  // Constants: 129 distinct ones do not pack, 128 do, and repeats count once.
  auto consts_attr = [](int n_fwd, int n_bwd, bool distinct) {
    std::vector<std::vector<int32_t>> f, b;
    std::vector<float> cf, cb;
    for (int i = 0; i < n_fwd; ++i) f.push_back({SM_CONST, i, 0, 0}), cf.push_back(distinct ? float(i) : 1.0f);
    for (int i = 0; i < n_bwd; ++i) b.push_back({SM_CONST, i, 0, 0}), cb.push_back(distinct ? float(1000 + i) : 1.0f);
    return attr_of({}, {program(5, f, cf), program(6, b, cb)});
  };
  s = pack(consts_attr(100, 29, true));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("129 distinct constants"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("kDevMaxConsts = 128"), std::string::npos) << s.message;
  EXPECT_TRUE(pack(consts_attr(100, 28, true)).ok());
  EXPECT_TRUE(pack(consts_attr(120, 120, false)).ok());
  // Constants a program carries but never reads take no room.
  EXPECT_TRUE(pack(attr_of({}, {program(5, {{SM_NEG, 0, 0, 0}}, std::vector<float>(500, 1.5f)),
                                one})).ok());
}

}  // namespace
}  // namespace fusedattn
