// index_base (Extras::index_base): a shard of a call (some batch entries, some q heads,
// its own vmap slices) run with its global (batch_base, head_base) computes what the
// whole call computes there: dropout's keep mask and score_mod's batch / head inputs
// follow the global index, while score_mod's array operands are the shard's own slices.
//
// Shapes (float32, contiguous): q [B, S, Hq, D], k, v [B, S, Hkv, D], out [B, S, Hq, D],
// lse [B, Hq, S], score_mod operand [B, Hq, 1, 1]; a shard keeps batches `batches`
// (folded into `slices` vmap slices) and q heads [h0, h0 + nh) with their kv heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/attention/validate.h"
#include "score_mod/programs.h"

namespace fusedattn::cpu {
namespace {

using fusedattn::test::program;

constexpr int64_t kB = 4, kS = 70, kHq = 4, kHkv = 2, kD = 16, kG = kHq / kHkv;

// score * (1 + 0.1 batch + 0.05 head) + op[batch, head]: the batch and head inputs
// change the softmax (a per-row factor on the scores), the operand shifts each row.
// Backward: ds * (1 + 0.1 batch + 0.05 head); the operand's gradient: ds.
std::vector<int32_t> index_score_mod(int64_t batch, int64_t heads) {
  std::vector<int32_t> a = {1, int32_t(batch), int32_t(heads), 1, 1};
  const auto fwd = program(6, {{SM_CONST, 0, 0, 0}, {SM_MUL, 1, 6, 0}, {SM_CONST, 1, 0, 0},
                               {SM_MUL, 2, 8, 0}, {SM_ADD, 7, 9, 0}, {SM_CONST, 2, 0, 0},
                               {SM_ADD, 10, 11, 0}, {SM_MUL, 0, 12, 0}, {SM_ADD, 13, 5, 0}},
                           {0.1f, 0.05f, 1.0f});
  const auto bwd = program(7, {{SM_CONST, 0, 0, 0}, {SM_MUL, 1, 7, 0}, {SM_CONST, 1, 0, 0},
                               {SM_MUL, 2, 9, 0}, {SM_ADD, 8, 10, 0}, {SM_CONST, 2, 0, 0},
                               {SM_ADD, 11, 12, 0}, {SM_MUL, 6, 13, 0}},
                           {0.1f, 0.05f, 1.0f});
  const auto grad = program(7, {}, {}, /*out=*/6);
  for (const auto* p : {&fwd, &bwd, &grad}) a.insert(a.end(), p->begin(), p->end());
  return a;
}

// One call's inputs and results (float32 throughout).
struct Call {
  AttnParams p{};
  std::vector<float> q, k, v, dout, smo;      // smo: score_mod operand [slices, total]
  std::vector<int32_t> lens, offs, index_base;  // lens [B, 1], offs [B, 2], base [slices, 2]
  std::vector<uint32_t> seed;                   // [slices, 2]
  std::vector<int32_t> sm_attr;
  std::vector<float> out, lse, dq, dk, dv, dsmo;

  void run(bool with_base) {
    const int64_t B = p.batch, H = p.heads_q, Hk = p.heads_kv;
    Extras x;
    x.seq = {lens.data(), lens.data(), offs.data(), offs.data()};
    x.seed = seed.data();
    x.index_base = with_base ? index_base.data() : nullptr;
    ScoreMod sm;
    if (!sm_attr.empty()) {
      const int64_t ext[4] = {slice_batch(p), H, kS, kS};
      const Status st = decode_score_mod(sm_attr.data(), int64_t(sm_attr.size()), ext, &sm);
      ASSERT_TRUE(st.ok()) << st.message;
      x.score_mod = &sm;
      x.score_mod_operands = smo.data();
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    out.assign(B * kS * H * kD, nan);
    lse.assign(B * H * kS, nan);
    const Strides sq = Strides::bshd(kS, H, kD), sk = Strides::bshd(kS, Hk, kD);
    attention_fwd(p, FwdArgs{q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr, sq,
                             sk, sk, sq, lse_strides(p), x});
    dq.assign(q.size(), nan), dk.assign(k.size(), nan), dv.assign(v.size(), nan);
    dsmo.assign(smo.size(), nan);
    BwdArgs a{q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
              dk.data(), dv.data(), nullptr, nullptr, sq, sk, sk, sq, sq, lse_strides(p), sq,
              sk, sk, x};
    a.dscore_mod_operands = sm_attr.empty() ? nullptr : dsmo.data();
    attention_bwd(p, a);
  }
};

AttnParams params(int64_t B, int64_t slices, int64_t Hq, float dropout) {
  AttnParams p{};
  p.batch = B, p.num_slices = slices, p.seqlen_q = p.seqlen_kv = kS;
  p.heads_q = Hq, p.heads_kv = Hq / kG, p.head_dim_qk = p.head_dim_v = kD;
  p.max_segments = 1, p.dtype = FA_FLOAT32, p.layout = FA_BSHD_BSHD_BSHD;
  p.mask_type = FA_CAUSAL_MASK, p.bias_type = FA_NO_BIAS, p.softmax_type = FA_VANILLA_SOFTMAX;
  p.is_training = 1, p.dropout = dropout, p.scale = 0.25f, p.window_left = p.window_right = -1;
  return p;
}

// Copies rows [B, S, H, D] of batches `bs` and heads [h0, h0 + nh) out of x [B, S, Hx, D].
std::vector<float> take(const std::vector<float>& x, int64_t Hx, const std::vector<int64_t>& bs,
                        int64_t h0, int64_t nh) {
  std::vector<float> y;
  for (int64_t b : bs)
    for (int64_t i = 0; i < kS; ++i)
      for (int64_t h = h0; h < h0 + nh; ++h)
        for (int64_t d = 0; d < kD; ++d) y.push_back(x[((b * kS + i) * Hx + h) * kD + d]);
  return y;
}

// max |got - want| <= tol * max |want| (exact when tol is 0).
::testing::AssertionResult same(const std::vector<float>& got, const std::vector<float>& want,
                                double tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  double err = 0.0, mag = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - want[i]);
    err = e == e ? std::max(err, e) : INFINITY;
    mag = std::max(mag, std::fabs(double(want[i])));
  }
  if (err <= tol * mag) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err << ", max |want| " << mag;
}

struct Case {
  std::string name;
  float dropout;
  bool score_mod;
  std::vector<int64_t> batches;  // the shard's batch entries, slice after slice
  int64_t slices, h0, nh;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

void check(const Case& c) {
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name)));
  std::normal_distribution<float> normal;
  auto randn = [&](int64_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  const std::vector<uint32_t> seed = {uint32_t(rng()), uint32_t(rng())};

  Call full;
  full.p = params(kB, 1, kHq, c.dropout);
  ASSERT_TRUE(validate(full.p).ok());
  full.q = randn(kB * kS * kHq * kD);
  full.k = randn(kB * kS * kHkv * kD);
  full.v = randn(kB * kS * kHkv * kD);
  full.dout = randn(kB * kS * kHq * kD);
  full.lens.assign(kB, int32_t(kS));
  for (int64_t b = 0; b < kB; ++b) full.offs.insert(full.offs.end(), {0, int32_t(kS)});
  full.seed = seed;
  std::vector<float> op = randn(kB * kHq);  // the score_mod operand [B, Hq, 1, 1]
  if (c.score_mod) {
    full.sm_attr = index_score_mod(kB, kHq);
    full.smo = op;
    full.smo.resize((op.size() + 15) / 16 * 16, 0.0f);
  }
  full.run(true);

  const int64_t nb = int64_t(c.batches.size()), bs = nb / c.slices, nh = c.nh;
  Call shard;
  shard.p = params(nb, c.slices, nh, c.dropout);
  ASSERT_TRUE(validate(shard.p).ok());
  shard.q = take(full.q, kHq, c.batches, c.h0, nh);
  shard.k = take(full.k, kHkv, c.batches, c.h0 / kG, nh / kG);
  shard.v = take(full.v, kHkv, c.batches, c.h0 / kG, nh / kG);
  shard.dout = take(full.dout, kHq, c.batches, c.h0, nh);
  shard.lens.assign(nb, int32_t(kS));
  for (int64_t b = 0; b < nb; ++b) shard.offs.insert(shard.offs.end(), {0, int32_t(kS)});
  const int64_t total = (bs * nh + 15) / 16 * 16;
  for (int64_t s = 0; s < c.slices; ++s) {
    shard.seed.insert(shard.seed.end(), seed.begin(), seed.end());
    shard.index_base.insert(shard.index_base.end(), {int32_t(c.batches[s * bs]), int32_t(c.h0)});
    if (!c.score_mod) continue;
    for (int64_t b = s * bs; b < (s + 1) * bs; ++b)
      for (int64_t h = c.h0; h < c.h0 + nh; ++h) shard.smo.push_back(op[c.batches[b] * kHq + h]);
    shard.smo.resize((s + 1) * total, 0.0f);
  }
  if (c.score_mod) shard.sm_attr = index_score_mod(bs, nh);
  shard.run(true);

  // The forward of one (batch, head) is the same arithmetic in both calls: bitwise equal.
  EXPECT_TRUE(same(shard.out, take(full.out, kHq, c.batches, c.h0, nh), 0.0)) << "out";
  std::vector<float> lse;
  for (int64_t b : c.batches)
    for (int64_t h = c.h0; h < c.h0 + nh; ++h)
      lse.insert(lse.end(), full.lse.begin() + (b * kHq + h) * kS,
                 full.lse.begin() + (b * kHq + h + 1) * kS);
  EXPECT_TRUE(same(shard.lse, lse, 0.0)) << "lse";
  // The backward sums dq over tasks dealt to chunks: the order may differ.
  const double tol = 1e-5;
  EXPECT_TRUE(same(shard.dq, take(full.dq, kHq, c.batches, c.h0, nh), tol)) << "dq";
  EXPECT_TRUE(same(shard.dk, take(full.dk, kHkv, c.batches, c.h0 / kG, nh / kG), tol)) << "dk";
  EXPECT_TRUE(same(shard.dv, take(full.dv, kHkv, c.batches, c.h0 / kG, nh / kG), tol)) << "dv";
  if (c.score_mod) {
    std::vector<float> got, want;
    for (int64_t s = 0; s < c.slices; ++s)
      for (int64_t b = s * bs; b < (s + 1) * bs; ++b)
        for (int64_t h = 0; h < nh; ++h) {
          got.push_back(shard.dsmo[s * total + (b - s * bs) * nh + h]);
          want.push_back(full.dsmo[c.batches[b] * kHq + c.h0 + h]);
        }
    EXPECT_TRUE(same(got, want, tol)) << "dscore_mod_operands";
  }

  // Without its base the shard computes something else (the test is not vacuous).
  if (c.batches[0] != 0 || c.h0 != 0) {
    Call local = shard;
    local.run(false);
    EXPECT_FALSE(same(local.out, shard.out, 1e-3)) << "the shard ignores index_base";
  }
}

class IndexBase : public ::testing::TestWithParam<Case> {};
TEST_P(IndexBase, ShardMatchesTheWholeCall) { check(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Shards, IndexBase,
    ::testing::Values(
        Case{"dropout_batch_slice", 0.3f, false, {2, 3}, 1, 0, kHq},
        Case{"dropout_head_slice", 0.3f, false, {0, 1, 2, 3}, 1, 2, 2},
        Case{"dropout_batch_and_heads", 0.3f, false, {1, 2}, 1, 2, 2},
        Case{"dropout_vmap_slices", 0.3f, false, {1, 3}, 2, 2, 2},
        Case{"score_mod_batch_and_heads", 0.0f, true, {1, 2}, 1, 2, 2},
        Case{"score_mod_vmap_slices", 0.0f, true, {1, 3}, 2, 2, 2},
        Case{"score_mod_dropout", 0.2f, true, {3}, 1, 2, 2},
        Case{"zero_base", 0.3f, true, {0, 1}, 1, 0, 2}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace fusedattn::cpu
