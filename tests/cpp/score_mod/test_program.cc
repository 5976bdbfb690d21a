// score_mod programs: decoding rejects malformed attributes (every register index is
// checked once, so evaluation needs no checks), and the interpreter computes what the
// program says on the lanes asked for.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fusedattn/score_mod/program.h"
#include "programs.h"

namespace fusedattn {
namespace {

using test::program;

// tanh(s / 2) * 2 forward; ds * 2 backward (not its true derivative: the test reads it).
std::vector<int32_t> softcap_attr() {
  std::vector<int32_t> a = {0};
  auto fwd = program(5, {{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0},
                         {SM_MUL, 7, 5, 0}}, {2.0f});
  auto bwd = program(6, {{SM_CONST, 0, 0, 0}, {SM_MUL, 5, 6, 0}}, {2.0f});
  a.insert(a.end(), fwd.begin(), fwd.end());
  a.insert(a.end(), bwd.begin(), bwd.end());
  return a;
}

const int64_t kExt[4] = {2, 4, 8, 8};

TEST(ScoreMod, DecodesAndEvaluates) {
  const auto attr = softcap_attr();
  ScoreMod sm;
  ASSERT_TRUE(decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm).ok());
  std::vector<float> in_rows(6 * kMaxLanes, 0.0f), regs(16 * kMaxLanes, 0.0f);
  const float* in[6];
  for (int r = 0; r < 6; ++r) in[r] = in_rows.data() + r * kMaxLanes;
  for (int c = 0; c < kMaxLanes; ++c) in_rows[c] = 0.1f * float(c - 32);
  const float* o = eval_score_mod(sm.fwd, in, regs.data(), 3, 40);
  for (int c = 3; c < 40; ++c) EXPECT_NEAR(o[c], std::tanh(in_rows[c] / 2.0f) * 2.0f, 1e-6f);
}

// The softcap family the Hopper forward runs natively, in the forms JAX traces, and
// programs that only look like it.
bool softcap_of(const std::vector<std::vector<int32_t>>& instr, const std::vector<float>& consts,
                float* k1, float* k2) {
  std::vector<int32_t> a = {0};
  const auto fwd = program(5, instr, consts);
  const auto bwd = program(6, {{SM_CONST, 0, 0, 0}}, {1.0f});
  a.insert(a.end(), fwd.begin(), fwd.end());
  a.insert(a.end(), bwd.begin(), bwd.end());
  ScoreMod sm;
  EXPECT_TRUE(decode_score_mod(a.data(), int64_t(a.size()), kExt, &sm).ok());
  return match_softcap(sm.fwd, k1, k2);
}

TEST(ScoreMod, MatchesSoftcap) {
  float k1 = 0, k2 = 0;
  // tanh(s / 50) * 50
  ASSERT_TRUE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0},
                          {SM_MUL, 7, 5, 0}}, {50.0f}, &k1, &k2));
  EXPECT_EQ(k1, 50.0f);
  EXPECT_FLOAT_EQ(k2, 0.02f);
  // 30 * tanh((1 / 30) * s)
  ASSERT_TRUE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_MUL, 5, 0, 0}, {SM_TANH, 6, 0, 0},
                          {SM_CONST, 1, 0, 0}, {SM_MUL, 8, 7, 0}}, {1.0f / 30, 30.0f}, &k1, &k2));
  EXPECT_EQ(k1, 30.0f);
  EXPECT_FLOAT_EQ(k2, 1.0f / 30);
  // Not softcap: a negative or zero cap, tanh of an index, no tanh, something after the
  // product, a division by zero, a computed (non-constant) factor.
  const std::vector<float> c = {50.0f, -50.0f, 0.0f};
  EXPECT_FALSE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_CONST, 1, 0, 0}, {SM_DIV, 0, 5, 0},
                           {SM_TANH, 7, 0, 0}, {SM_MUL, 8, 6, 0}}, c, &k1, &k2));
  EXPECT_FALSE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_CONST, 2, 0, 0}, {SM_DIV, 0, 5, 0},
                           {SM_TANH, 7, 0, 0}, {SM_MUL, 8, 6, 0}}, c, &k1, &k2));
  EXPECT_FALSE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_DIV, 3, 5, 0}, {SM_TANH, 6, 0, 0},
                           {SM_MUL, 7, 5, 0}}, c, &k1, &k2));
  EXPECT_FALSE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_MUL, 6, 5, 0}}, c, &k1,
                          &k2));
  EXPECT_FALSE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0},
                           {SM_MUL, 7, 5, 0}, {SM_ADD, 8, 5, 0}}, c, &k1, &k2));
  EXPECT_FALSE(softcap_of({{SM_CONST, 2, 0, 0}, {SM_DIV, 0, 5, 0}, {SM_TANH, 6, 0, 0},
                           {SM_CONST, 0, 0, 0}, {SM_MUL, 7, 8, 0}}, c, &k1, &k2));
  EXPECT_FALSE(softcap_of({{SM_CONST, 0, 0, 0}, {SM_MUL, 0, 0, 0}, {SM_TANH, 6, 0, 0},
                           {SM_MUL, 7, 5, 0}}, c, &k1, &k2));
}

// The ALiBi family (one [1, Hq | 1, 1, 1] operand: register 5; q, kv: registers 3, 4).
bool alibi_of(const std::vector<std::vector<int32_t>>& instr, AlibiForm* form,
              std::vector<int32_t> shape = {1, 4, 1, 1}) {
  std::vector<int32_t> a = {1};
  a.insert(a.end(), shape.begin(), shape.end());
  for (const auto& prog : {program(6, instr, {}), program(7, {{SM_CONST, 0, 0, 0}}, {1.0f}),
                           program(7, {{SM_CONST, 0, 0, 0}}, {0.0f})})
    a.insert(a.end(), prog.begin(), prog.end());
  ScoreMod sm;
  EXPECT_TRUE(decode_score_mod(a.data(), int64_t(a.size()), kExt, &sm).ok());
  return match_alibi(sm, form);
}

TEST(ScoreMod, MatchesAlibi) {
  AlibiForm f;
  // s - slopes * (q - kv): s + slopes * (kv - q)
  ASSERT_TRUE(alibi_of({{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0}}, &f));
  EXPECT_EQ(f.sign, 1.0f);
  EXPECT_FALSE(f.abs);
  // (kv - q) * slopes + s, one slope for all heads
  ASSERT_TRUE(alibi_of({{SM_SUB, 4, 3, 0}, {SM_MUL, 6, 5, 0}, {SM_ADD, 7, 0, 0}}, &f,
                       {1, 1, 1, 1}));
  EXPECT_EQ(f.sign, 1.0f);
  // s + slopes * (q - kv)
  ASSERT_TRUE(alibi_of({{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_ADD, 0, 7, 0}}, &f));
  EXPECT_EQ(f.sign, -1.0f);
  // s - slopes * |q - kv|
  ASSERT_TRUE(alibi_of({{SM_SUB, 3, 4, 0}, {SM_ABS, 6, 0, 0}, {SM_MUL, 5, 7, 0},
                        {SM_SUB, 0, 8, 0}}, &f));
  EXPECT_EQ(f.sign, -1.0f);
  EXPECT_TRUE(f.abs);
  // Not ALiBi: slopes that vary with the query, m - s, slopes * (q - q), slopes * slopes,
  // a batch index for q, something after the sum.
  EXPECT_FALSE(alibi_of({{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0}}, &f,
                        {1, 4, 8, 1}));
  EXPECT_FALSE(alibi_of({{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 7, 0, 0}}, &f));
  EXPECT_FALSE(alibi_of({{SM_SUB, 3, 3, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0}}, &f));
  EXPECT_FALSE(alibi_of({{SM_MUL, 5, 5, 0}, {SM_SUB, 0, 6, 0}}, &f));
  EXPECT_FALSE(alibi_of({{SM_SUB, 1, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0}}, &f));
  EXPECT_FALSE(alibi_of({{SM_SUB, 3, 4, 0}, {SM_MUL, 5, 6, 0}, {SM_SUB, 0, 7, 0},
                         {SM_MUL, 8, 8, 0}}, &f));
}

TEST(ScoreMod, RejectsMalformedPrograms) {
  ScoreMod sm;
  auto attr = softcap_attr();
  auto bad = attr;
  bad[3] = 7;  // an input count the call does not have
  EXPECT_FALSE(decode_score_mod(bad.data(), int64_t(bad.size()), kExt, &sm).ok());
  bad = attr;
  bad[12] = 9;  // DIV (attr[10..13]) reads register 9, written later
  Status s = decode_score_mod(bad.data(), int64_t(bad.size()), kExt, &sm);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("register index out of range"), std::string::npos) << s.message;
  bad = attr;
  bad[6] = 99;  // the first opcode
  EXPECT_FALSE(decode_score_mod(bad.data(), int64_t(bad.size()), kExt, &sm).ok());
  bad = attr;
  bad.pop_back();  // truncated
  EXPECT_FALSE(decode_score_mod(bad.data(), int64_t(bad.size()), kExt, &sm).ok());
}

TEST(ScoreMod, RejectsOperandShapesThatDoNotBroadcast) {
  std::vector<int32_t> attr = {1, 1, 3, 1, 1};  // one operand [1, 3, 1, 1]; Hq is 4
  ScoreMod sm;
  Status s = decode_score_mod(attr.data(), int64_t(attr.size()), kExt, &sm);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message.find("dimension Hq is 3"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace fusedattn
