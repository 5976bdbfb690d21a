// index_base (Extras::index_base): a shard of a call (some batch entries, some q heads,
// its own vmap slices) run with its global (batch_base, head_base) computes what the
// whole call computes there: dropout's keep mask and score_mod's batch / head inputs
// follow the global index, while score_mod's array operands are the shard's own slices.
//
// Shapes (float32, contiguous): q [B, S, Hq, D], k, v [B, S, Hkv, D], out [B, S, Hq, D],
// lse [B, Hq, S], score_mod operand [B, Hq, 1, 1]; a shard keeps batches `batches`
// (folded into `slices` vmap slices) and q heads [h0, h0 + nh) with their kv heads.
//
// Blocks (index_base [slices, 6]: batch_base, head_base, q_pos, kv_pos, q_extent,
// kv_extent): the blocks of a call cut along q and k/v, merged over k/v by their lse, give
// the whole call's out and lse, and their backward given the whole call's out and lse sums
// to its dq, dk, dv (and score_mod operand gradient). Block shapes: q [B, Sq, Hq, D], k, v
// [B, Skv, Hkv, D] with Sq, Skv the block's; the score_mod operand [1, 1, 1, Skv] is sliced
// to the block's keys. validate_index_base's errors.
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

// ---------------------------------------------------------------------------------
// Blocks of a bigger call (index_base with positions)

constexpr int64_t kBB = 2, kBSq = 96, kBSkv = 128, kBHq = 2, kBHkv = 1, kBD = 16;

// score + 0.05 (kv - q) + col[kv]: reads the q and kv inputs (global in a block) and an
// operand [1, 1, 1, Skv] indexed by the key (local in a block). Gradients: ds, and ds
// for the operand.
std::vector<int32_t> position_score_mod(int64_t Skv) {
  std::vector<int32_t> a = {1, 1, 1, 1, int32_t(Skv)};
  const auto fwd = program(6, {{SM_SUB, 4, 3, 0}, {SM_CONST, 0, 0, 0}, {SM_MUL, 6, 7, 0},
                               {SM_ADD, 0, 8, 0}, {SM_ADD, 9, 5, 0}},
                           {0.05f});
  const auto ident = program(7, {}, {}, /*out=*/6);
  for (const auto* p : {&fwd, &ident, &ident}) a.insert(a.end(), p->begin(), p->end());
  return a;
}

struct BlockCase {
  std::string name;
  int32_t mask;
  int64_t left = -1, right = -1;
  std::vector<int32_t> q_lens, kv_lens;  // [B]: the whole call's (padding masks)
  float dropout = 0.0f;
  bool score_mod = false;
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

// One engine call: q [B, Sq, Hq, D], k, v [B, Skv, Hkv, D], out [B, Sq, Hq, D], lse
// [B, Hq, Sq]; base: index_base [slices, 6] or empty; op: the score_mod operand.
struct BlockCall {
  AttnParams p{};
  std::vector<float> q, k, v, dout, op;
  std::vector<int32_t> q_lens, kv_lens, offs, base, sm_attr;
  std::vector<uint32_t> seed;
  std::vector<float> out, lse, dq, dk, dv, dop;

  Extras extras(ScoreMod* sm) {
    Extras x;
    x.seq = {q_lens.data(), kv_lens.data(), offs.data(), offs.data()};
    x.seed = seed.data();
    x.index_base = base.empty() ? nullptr : base.data();
    x.index_cols = 6;
    if (!sm_attr.empty()) {
      const int64_t ext[4] = {slice_batch(p), p.heads_q, p.seqlen_q, p.seqlen_kv};
      const Status st = decode_score_mod(sm_attr.data(), int64_t(sm_attr.size()), ext, sm);
      EXPECT_TRUE(st.ok()) << st.message;
      x.score_mod = sm;
      x.score_mod_operands = op.data();
    }
    return x;
  }
  void forward() {
    ScoreMod sm;
    const Extras x = extras(&sm);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    out.assign(p.batch * p.seqlen_q * p.heads_q * kBD, nan);
    lse.assign(p.batch * p.heads_q * p.seqlen_q, nan);
    const Strides sq = Strides::bshd(p.seqlen_q, p.heads_q, kBD);
    const Strides sk = Strides::bshd(p.seqlen_kv, p.heads_kv, kBD);
    attention_fwd(p, FwdArgs{q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr, sq,
                             sk, sk, sq, lse_strides(p), x});
  }
  // From out and lse as set (the forward's, or the whole call's rows).
  void backward() {
    ScoreMod sm;
    const Extras x = extras(&sm);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    dq.assign(q.size(), nan), dk.assign(k.size(), nan), dv.assign(v.size(), nan);
    dop.assign(op.size(), nan);
    const Strides sq = Strides::bshd(p.seqlen_q, p.heads_q, kBD);
    const Strides sk = Strides::bshd(p.seqlen_kv, p.heads_kv, kBD);
    BwdArgs a{q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
              dk.data(), dv.data(), nullptr, nullptr, sq, sk, sk, sq, sq, lse_strides(p), sq,
              sk, sk, x};
    a.dscore_mod_operands = sm_attr.empty() ? nullptr : dop.data();
    attention_bwd(p, a);
  }
};

AttnParams block_params(const BlockCase& c, int64_t B, int64_t slices, int64_t Sq, int64_t Skv) {
  AttnParams p = params(B, slices, kBHq, c.dropout);
  p.seqlen_q = Sq, p.seqlen_kv = Skv, p.heads_kv = kBHkv;
  p.mask_type = c.mask, p.window_left = c.left, p.window_right = c.right;
  return p;
}

// Rows [r0, r1) along dim 1 of x [B, S, H, kBD].
std::vector<float> rows(const std::vector<float>& x, int64_t S, int64_t H, int64_t r0,
                        int64_t r1) {
  std::vector<float> y;
  for (int64_t b = 0; b < int64_t(x.size()) / (S * H * kBD); ++b)
    y.insert(y.end(), x.begin() + (b * S + r0) * H * kBD, x.begin() + (b * S + r1) * H * kBD);
  return y;
}
// Rows [r0, r1) along the last dim of lse [B, H, S].
std::vector<float> lse_rows(const std::vector<float>& x, int64_t S, int64_t r0, int64_t r1) {
  std::vector<float> y;
  for (int64_t bh = 0; bh < int64_t(x.size()) / S; ++bh)
    y.insert(y.end(), x.begin() + bh * S + r0, x.begin() + bh * S + r1);
  return y;
}
// y[rows [r0, r1) of x [B, S, H, kBD]] += part [B, r1 - r0, H, kBD].
void add_rows(std::vector<float>& x, int64_t S, int64_t H, int64_t r0, int64_t r1,
              const std::vector<float>& part) {
  const int64_t n = (r1 - r0) * H * kBD;
  for (int64_t b = 0; b < int64_t(x.size()) / (S * H * kBD); ++b)
    for (int64_t e = 0; e < n; ++e) x[(b * S + r0) * H * kBD + e] += part[b * n + e];
}
std::vector<float> padded16(std::vector<float> x) {
  x.resize((x.size() + 15) / 16 * 16, 0.0f);
  return x;
}

// lse: -inf exactly where want is -inf, else within 1e-5 (relative above 1).
::testing::AssertionResult same_lse(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isinf(want[i]) ? got[i] == want[i]
                                        : std::fabs(got[i] - want[i]) <=
                                              1e-5 * std::max(1.0f, std::fabs(want[i]));
    if (!ok)
      return ::testing::AssertionFailure() << "row " << i << ": got " << got[i] << ", want "
                                           << want[i];
  }
  return ::testing::AssertionSuccess();
}

BlockCall whole_call(const BlockCase& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  auto randn = [&](int64_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  BlockCall w;
  w.p = block_params(c, kBB, 1, kBSq, kBSkv);
  EXPECT_TRUE(validate(w.p).ok());
  w.q = randn(kBB * kBSq * kBHq * kBD);
  w.k = randn(kBB * kBSkv * kBHkv * kBD);
  w.v = randn(kBB * kBSkv * kBHkv * kBD);
  w.dout = randn(kBB * kBSq * kBHq * kBD);
  w.q_lens = c.q_lens.empty() ? std::vector<int32_t>(kBB, kBSq) : c.q_lens;
  w.kv_lens = c.kv_lens.empty() ? std::vector<int32_t>(kBB, kBSkv) : c.kv_lens;
  for (int64_t b = 0; b < kBB; ++b) w.offs.insert(w.offs.end(), {0, 0});  // unread (BSHD)
  w.seed = {uint32_t(rng()), uint32_t(rng())};
  if (c.score_mod) {
    w.sm_attr = position_score_mod(kBSkv);
    w.op = padded16(randn(kBSkv));
  }
  w.forward();
  w.backward();
  return w;
}

// Block [q0, q1) x [kv0, kv1) of the whole call w (one vmap slice, batch_base 0).
BlockCall block_of(const BlockCase& c, const BlockCall& w, int64_t q0, int64_t q1, int64_t kv0,
                   int64_t kv1) {
  BlockCall b;
  b.p = block_params(c, kBB, 1, q1 - q0, kv1 - kv0);
  b.q = rows(w.q, kBSq, kBHq, q0, q1);
  b.k = rows(w.k, kBSkv, kBHkv, kv0, kv1);
  b.v = rows(w.v, kBSkv, kBHkv, kv0, kv1);
  b.dout = rows(w.dout, kBSq, kBHq, q0, q1);
  b.q_lens = w.q_lens, b.kv_lens = w.kv_lens, b.offs = w.offs, b.seed = w.seed;
  b.base = {0, 0, int32_t(q0), int32_t(kv0), int32_t(kBSq), int32_t(kBSkv)};
  if (c.score_mod) {
    b.sm_attr = position_score_mod(kv1 - kv0);
    b.op = padded16(std::vector<float>(w.op.begin() + kv0, w.op.begin() + kv1));
  }
  return b;
}

const std::vector<int64_t> kQCuts = {0, 40, 96}, kKvCuts = {0, 36, 100, 128};

class Blocks : public ::testing::TestWithParam<BlockCase> {};

TEST_P(Blocks, MergeToTheWholeCall) {
  const BlockCase& c = GetParam();
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name)));
  const BlockCall w = whole_call(c, rng);

  std::vector<float> out(w.out.size(), 0.0f), lse(w.lse.size());
  std::vector<float> dq(w.dq.size(), 0.0f), dk(w.dk.size(), 0.0f), dv(w.dv.size(), 0.0f);
  std::vector<float> dop(w.op.size(), 0.0f);
  for (size_t qi = 0; qi + 1 < kQCuts.size(); ++qi) {
    const int64_t q0 = kQCuts[qi], q1 = kQCuts[qi + 1], sq = q1 - q0;
    std::vector<BlockCall> parts;
    for (size_t ki = 0; ki + 1 < kKvCuts.size(); ++ki) {
      const int64_t kv0 = kKvCuts[ki], kv1 = kKvCuts[ki + 1];
      BlockCall b = block_of(c, w, q0, q1, kv0, kv1);
      ASSERT_TRUE(validate(b.p).ok());
      ASSERT_TRUE(validate_index_base(b.p, b.base.data(), 6).ok());
      b.forward();
      parts.push_back(b);
      b.out = rows(w.out, kBSq, kBHq, q0, q1);  // the backward given the whole call's
      b.lse = lse_rows(w.lse, kBSq, q0, q1);
      b.backward();
      add_rows(dq, kBSq, kBHq, q0, q1, b.dq);
      add_rows(dk, kBSkv, kBHkv, kv0, kv1, b.dk);
      add_rows(dv, kBSkv, kBHkv, kv0, kv1, b.dv);
      for (int64_t j = 0; j < kv1 - kv0 && c.score_mod; ++j) dop[kv0 + j] += b.dop[j];
    }
    // Merge over the key blocks, in double: lse = log sum exp(lse_b), out = sum_b
    // exp(lse_b - lse) out_b.
    for (int64_t bh = 0; bh < kBB * kBHq; ++bh)
      for (int64_t i = 0; i < sq; ++i) {
        double m = -INFINITY;
        for (const auto& b : parts) m = std::max(m, double(b.lse[bh * sq + i]));
        double l = 0.0;
        for (const auto& b : parts) l += m == -INFINITY ? 0.0 : std::exp(b.lse[bh * sq + i] - m);
        const double total = m == -INFINITY ? m : m + std::log(l);
        lse[bh * kBSq + q0 + i] = float(total);
        const int64_t bb = bh / kBHq, h = bh % kBHq;
        for (int64_t d = 0; d < kBD; ++d) {
          double o = 0.0;
          for (const auto& b : parts) {
            const double lb = b.lse[bh * sq + i];
            if (lb == -INFINITY) continue;
            o += std::exp(lb - total) * b.out[((bb * sq + i) * kBHq + h) * kBD + d];
          }
          out[((bb * kBSq + q0 + i) * kBHq + h) * kBD + d] = float(o);
        }
      }
  }
  EXPECT_TRUE(same(out, w.out, 1e-5)) << "out";
  EXPECT_TRUE(same_lse(lse, w.lse)) << "lse";
  EXPECT_TRUE(same(dq, w.dq, 2e-5)) << "dq";
  EXPECT_TRUE(same(dk, w.dk, 2e-5)) << "dk";
  EXPECT_TRUE(same(dv, w.dv, 2e-5)) << "dv";
  if (c.score_mod) {
    const std::vector<float> want(w.dop.begin(), w.dop.begin() + kBSkv);
    EXPECT_TRUE(same(std::vector<float>(dop.begin(), dop.begin() + kBSkv), want, 2e-5))
        << "dscore_mod_operands";
  }

  // Without its positions a block computes something else (the test is not vacuous).
  BlockCall b = block_of(c, w, 40, 96, 36, 100), local = b;
  local.base.clear();
  b.forward(), local.forward();
  EXPECT_FALSE(same(local.out, b.out, 1e-3)) << "the block ignores its positions";
}

const std::vector<int32_t> kQLens = {70, 96}, kKvLens = {90, 128};

INSTANTIATE_TEST_SUITE_P(
    Cases, Blocks,
    ::testing::Values(
        BlockCase{"causal", FA_CAUSAL_MASK},
        BlockCase{"causal_bottom_right", FA_CAUSAL_BOTTOM_RIGHT_MASK},
        BlockCase{"window", FA_NO_MASK, 24, 8},
        BlockCase{"padding_causal", FA_PADDING_CAUSAL_MASK, -1, -1, kQLens, kKvLens},
        BlockCase{"padding_bottom_right_window", FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 30, -1,
                  kQLens, kKvLens},
        // lengths past the extents count as the extents; an empty sequence is all padding
        BlockCase{"padding_clamped", FA_PADDING_MASK, -1, -1, {500, 0}, {80, 1000}},
        BlockCase{"dropout", FA_CAUSAL_MASK, -1, -1, {}, {}, 0.3f},
        BlockCase{"dropout_window", FA_NO_MASK, 40, 40, {}, {}, 0.2f},
        BlockCase{"score_mod", FA_CAUSAL_BOTTOM_RIGHT_MASK, -1, -1, {}, {}, 0.0f, true},
        BlockCase{"score_mod_dropout", FA_NO_MASK, -1, -1, {}, {}, 0.2f, true}),
    [](const auto& info) { return info.param.name; });

// Two blocks stacked as vmap slices (one batch entry each): each reads its own index_base
// row (batch_base and positions) and equals its rows of the whole call.
TEST(BlocksVmap, SlicesTakeTheirOwnPositions) {
  const BlockCase c{"vmap", FA_CAUSAL_BOTTOM_RIGHT_MASK, -1, -1, {}, {}, 0.3f};
  std::mt19937 rng(7);
  const BlockCall w = whole_call(c, rng);
  const int64_t sq = kBSq / 2;
  BlockCall b;
  b.p = block_params(c, kBB, /*slices=*/kBB, sq, kBSkv);
  ASSERT_TRUE(validate(b.p).ok());
  std::vector<float> want_out, want_lse;
  for (int64_t s = 0; s < kBB; ++s) {  // slice s: batch entry s, query rows [s sq, (s + 1) sq)
    const int64_t q0 = s * sq;
    auto part = [&](const std::vector<float>& x, int64_t S, int64_t H, int64_t r0, int64_t r1) {
      const std::vector<float> all = rows(x, S, H, r0, r1);
      const int64_t n = (r1 - r0) * H * kBD;
      return std::vector<float>(all.begin() + s * n, all.begin() + (s + 1) * n);
    };
    for (auto [dst, src] : {std::pair{&b.q, part(w.q, kBSq, kBHq, q0, q0 + sq)},
                            std::pair{&b.k, part(w.k, kBSkv, kBHkv, 0, kBSkv)},
                            std::pair{&b.v, part(w.v, kBSkv, kBHkv, 0, kBSkv)},
                            std::pair{&want_out, part(w.out, kBSq, kBHq, q0, q0 + sq)}})
      dst->insert(dst->end(), src.begin(), src.end());
    for (int64_t h = 0; h < kBHq; ++h)
      want_lse.insert(want_lse.end(), w.lse.begin() + (s * kBHq + h) * kBSq + q0,
                      w.lse.begin() + (s * kBHq + h) * kBSq + q0 + sq);
    b.base.insert(b.base.end(), {int32_t(s), 0, int32_t(q0), 0, int32_t(kBSq), int32_t(kBSkv)});
    b.seed.insert(b.seed.end(), w.seed.begin(), w.seed.end());
  }
  b.q_lens = w.q_lens, b.kv_lens = w.kv_lens, b.offs = w.offs;
  ASSERT_TRUE(validate_index_base(b.p, b.base.data(), 6).ok());
  b.forward();
  EXPECT_TRUE(same(b.out, want_out, 1e-6)) << "out";
  EXPECT_TRUE(same_lse(b.lse, want_lse)) << "lse";
}

// validate_index_base: the message names index_base, the slice, the values, what is allowed.
TEST(BlocksValidate, BadPositionsAreRefused) {
  AttnParams p = block_params(BlockCase{"v", FA_CAUSAL_MASK}, 2, 2, 48, 64);
  ASSERT_TRUE(validate(p).ok());
  auto message = [&](std::vector<int32_t> base, int64_t cols = 6) {
    const Status st = validate_index_base(p, base.data(), cols);
    return st.ok() ? std::string("ok") : st.message;
  };
  const std::vector<int32_t> ok = {0, 0, 0, 0, 96, 128, 1, 0, 48, 64, 96, 128};
  EXPECT_EQ(message(ok), "ok");
  EXPECT_EQ(message({0, 0, 0, 0, 96, 128, 1, 0, 49, 64, 96, 128}),
            "index_base: got (q_pos 49, kv_pos 64, q_extent 96, kv_extent 128) in vmap slice 1 "
            "for a block of 48 queries and 64 keys; allowed: q_pos, kv_pos >= 0, q_pos + 48 <= "
            "q_extent and kv_pos + 64 <= kv_extent");
  EXPECT_NE(message({0, 0, -4, 0, 96, 128, 1, 0, 48, 64, 96, 128}).find("got (q_pos -4"),
            std::string::npos);
  EXPECT_NE(message({0, 0, 0, 0, 96, 63, 1, 0, 48, 64, 96, 128}).find("kv_extent 63)"),
            std::string::npos);
  EXPECT_EQ(message({0, -1, 0, 0, 96, 128, 1, 0, 48, 64, 96, 128}),
            "index_base: got (batch_base 0, head_base -1) in vmap slice 0; both must be >= 0");
  // 2 columns carry no positions: (0, 0, ...) is a plain base there
  EXPECT_EQ(message({0, 0, 1, 0}, 2), "ok");

  const std::vector<int32_t> odd = {0, 0, 0, 0, 96, 128, 1, 0, 48, 62, 96, 128};
  EXPECT_EQ(message(odd), "ok");  // kv_pos % 4 matters under dropout only
  p.dropout = 0.1f;
  EXPECT_EQ(message(odd),
            "index_base: got kv_pos 62 in vmap slice 1 with dropout; dropout's Philox counter "
            "groups 4 keys, so a block's kv_pos must be a multiple of 4");

  p.dropout = 0.0f;
  p.layout = FA_THD_THD_THD, p.mask_type = FA_PADDING_CAUSAL_MASK;
  ASSERT_TRUE(validate(p).ok());
  EXPECT_EQ(message(ok), "ok");  // THD blocks: test_index_base_stripes.cc
  EXPECT_EQ(message({0, 0, 1, 0}, 2), "ok");
}

}  // namespace
}  // namespace fusedattn::cpu
