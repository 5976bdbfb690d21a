// Striped blocks (index_base [slices, 8]: batch_base, head_base, q_pos, kv_pos, q_extent,
// kv_extent, stripe, stride) and THD blocks. Context parallelism deals a row's T tokens to
// cp devices in stripes of `stripe` tokens: device r holds the stripes whose index is r mod
// cp, in order, so its local token t is global token r stripe + (t / stripe) cp stripe +
// t % stripe (q_pos = kv_pos = r stripe, stride = cp stripe). The blocks of every (q device,
// kv device) pair, merged over the kv devices by their lse, give the whole call's out and
// lse, and their backward given the whole call's out and lse sums to its dq, dk, dv and
// score_mod operand gradient: BSHD calls and THD calls of several segments per row (the
// descriptor the whole call's), padding, causal, bottom-right, windows, dropout, a
// score_mod of q_idx / kv_idx. The same blocks read as contiguous ones (6 columns) give
// other results. mask.h's stripe map and its inverse; validate_index_base's messages.
//
// Shapes (float32): the whole call q [B, T, Hq, D], k, v [B, T, Hkv, D], out [B, T, Hq, D],
// lse [B, Hq, T] (BSHD) or [B, T, Hq] (THD); a block: q [B, n_q, Hq, D], k, v [B, n_kv,
// Hkv, D] (its devices' tokens); score_mod operand (ALiBi slopes) [1, Hq, 1, 1].
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/validate.h"
#include "score_mod/programs.h"

namespace fusedattn::cpu {
namespace {

using fusedattn::test::program;

constexpr int64_t kB = 2, kHq = 2, kHkv = 1, kD = 16, kM = 3;

struct StripeCase {
  std::string name;
  int32_t layout, mask;
  int64_t left = -1, right = -1;
  int64_t T = 96, cp = 2, stripe = 4;
  float dropout = 0.0f;
  bool score_mod = false;
};
void PrintTo(const StripeCase& c, std::ostream* os) { *os << c.name; }

bool thd(const StripeCase& c) { return is_thd(c.layout); }

// ALiBi: score - op[head] |kv - q|: the q and kv inputs (positions in the segment) decide
// which keys a row favours, so a wrong q or kv index shows. Gradients: ds, and
// -|kv - q| ds for the operand [1, Hq, 1, 1].
std::vector<int32_t> alibi_score_mod() {
  std::vector<int32_t> a = {1, 1, int32_t(kHq), 1, 1};
  const auto fwd = program(6, {{SM_SUB, 4, 3, 0}, {SM_ABS, 6, 0, 0}, {SM_MUL, 7, 5, 0},
                               {SM_SUB, 0, 8, 0}},
                           {});
  const auto ident = program(7, {}, {}, /*out=*/6);
  const auto grad = program(7, {{SM_SUB, 4, 3, 0}, {SM_ABS, 7, 0, 0}, {SM_MUL, 8, 6, 0},
                                {SM_NEG, 9, 0, 0}},
                            {});
  for (const auto* p : {&fwd, &ident, &grad}) a.insert(a.end(), p->begin(), p->end());
  return a;
}

// One engine call (either layout): q [B, Sq, Hq, D], k, v [B, Skv, Hkv, D]; base:
// index_base [slices, cols] or empty.
struct Call {
  AttnParams p{};
  std::vector<float> q, k, v, dout, op;
  std::vector<int32_t> q_lens, kv_lens, q_offs, kv_offs, base, sm_attr;
  int64_t cols = 8;
  std::vector<uint32_t> seed;
  std::vector<float> out, lse, dq, dk, dv, dop;

  Extras extras(ScoreMod* sm) const {
    Extras x;
    x.seq = {q_lens.data(), kv_lens.data(), q_offs.data(), kv_offs.data()};
    x.seed = seed.data();
    x.index_base = base.empty() ? nullptr : base.data();
    x.index_cols = cols;
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
    out.assign(p.batch * p.seqlen_q * p.heads_q * kD, nan);
    lse.assign(p.batch * p.heads_q * p.seqlen_q, nan);
    const Strides sq = Strides::bshd(p.seqlen_q, p.heads_q, kD);
    const Strides sk = Strides::bshd(p.seqlen_kv, p.heads_kv, kD);
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
    const Strides sq = Strides::bshd(p.seqlen_q, p.heads_q, kD);
    const Strides sk = Strides::bshd(p.seqlen_kv, p.heads_kv, kD);
    BwdArgs a{q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(), dq.data(),
              dk.data(), dv.data(), nullptr, nullptr, sq, sk, sk, sq, sq, lse_strides(p), sq,
              sk, sk, x};
    a.dscore_mod_operands = sm_attr.empty() ? nullptr : dop.data();
    attention_bwd(p, a);
  }
};

AttnParams params(const StripeCase& c, int64_t B, int64_t slices, int64_t Sq, int64_t Skv) {
  AttnParams p{};
  p.batch = B, p.num_slices = slices, p.seqlen_q = Sq, p.seqlen_kv = Skv;
  p.heads_q = kHq, p.heads_kv = kHkv, p.head_dim_qk = p.head_dim_v = kD;
  p.max_segments = thd(c) ? kM : 1, p.dtype = FA_FLOAT32, p.layout = c.layout;
  p.mask_type = c.mask, p.bias_type = FA_NO_BIAS, p.softmax_type = FA_VANILLA_SOFTMAX;
  p.is_training = 1, p.dropout = c.dropout, p.scale = 0.25f;
  p.window_left = c.left, p.window_right = c.right;
  return p;
}

// The global tokens device r holds, in order: the stripes of index r mod cp.
std::vector<int64_t> tokens_of(const StripeCase& c, int64_t r) {
  std::vector<int64_t> t;
  for (int64_t g = 0; g < c.T; ++g)
    if ((g / c.stripe) % c.cp == r) t.push_back(g);
  return t;
}

// Tokens `tok` of x [B, S, H, kD] -> [B, tok.size(), H, kD].
std::vector<float> take(const std::vector<float>& x, int64_t S, int64_t H,
                        const std::vector<int64_t>& tok) {
  std::vector<float> y;
  for (int64_t b = 0; b < int64_t(x.size()) / (S * H * kD); ++b)
    for (int64_t g : tok)
      y.insert(y.end(), x.begin() + (b * S + g) * H * kD, x.begin() + (b * S + g + 1) * H * kD);
  return y;
}
// x [B, S, H, kD] at tokens `tok` += part [B, tok.size(), H, kD].
void add(std::vector<float>& x, int64_t S, int64_t H, const std::vector<int64_t>& tok,
         const std::vector<float>& part) {
  const int64_t n = int64_t(tok.size());
  for (int64_t b = 0; b < int64_t(x.size()) / (S * H * kD); ++b)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < H * kD; ++e)
        x[(b * S + tok[t]) * H * kD + e] += part[(b * n + t) * H * kD + e];
}
// Element (b, h, i) of an lse of S rows: [B, Hq, S] (BSHD) or [B, S, Hq] (THD).
int64_t lse_index(const StripeCase& c, int64_t S, int64_t b, int64_t h, int64_t i) {
  return thd(c) ? (b * S + i) * kHq + h : (b * kHq + h) * S + i;
}
std::vector<float> take_lse(const StripeCase& c, const std::vector<float>& lse,
                            const std::vector<int64_t>& tok) {
  const int64_t n = int64_t(tok.size());
  std::vector<float> y(kB * kHq * n);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kHq; ++h)
      for (int64_t t = 0; t < n; ++t) y[lse_index(c, n, b, h, t)] = lse[lse_index(c, c.T, b, h, tok[t])];
  return y;
}

// max |got - want| <= tol * max |want|.
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

// The whole call: descriptors of the global row (THD: 3 segments per row, padding
// between and after them, an empty one), its forward and its own backward.
Call whole_call(const StripeCase& c, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  auto randn = [&](int64_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng);
    return x;
  };
  Call w;
  w.p = params(c, kB, 1, c.T, c.T);
  EXPECT_TRUE(validate(w.p).ok());
  w.q = randn(kB * c.T * kHq * kD);
  w.k = randn(kB * c.T * kHkv * kD);
  w.v = randn(kB * c.T * kHkv * kD);
  w.dout = randn(kB * c.T * kHq * kD);
  const int32_t T = int32_t(c.T);
  if (thd(c)) {
    w.q_offs = w.kv_offs = {0, 30, 70, T, 0, 41, 41, T};
    w.q_lens = {25, 40, 20, 41, 0, 55};
    w.kv_lens = {28, 36, 26, 38, 0, 55};
  } else {
    w.q_lens = {T - 11, T};
    w.kv_lens = {T - 5, T - 20};
    w.q_offs = w.kv_offs = {0, 0, 0, 0};  // unread (BSHD)
  }
  w.seed = {uint32_t(rng()), uint32_t(rng())};
  if (c.score_mod) {
    w.sm_attr = alibi_score_mod();
    w.op = {0.1f, 0.05f};  // the slopes
    w.op.resize(16, 0.0f);
  }
  w.forward();
  w.backward();
  return w;
}

// The block of q device rq and kv device rk of the whole call w, its index_base with
// `cols` columns (8: the stripe map; 6: read as contiguous blocks at the same q_pos, kv_pos).
Call block(const StripeCase& c, const Call& w, int64_t rq, int64_t rk, int64_t cols) {
  const std::vector<int64_t> qt = tokens_of(c, rq), kt = tokens_of(c, rk);
  Call b;
  b.p = params(c, kB, 1, int64_t(qt.size()), int64_t(kt.size()));
  b.q = take(w.q, c.T, kHq, qt), b.dout = take(w.dout, c.T, kHq, qt);
  b.k = take(w.k, c.T, kHkv, kt), b.v = take(w.v, c.T, kHkv, kt);
  b.q_lens = w.q_lens, b.kv_lens = w.kv_lens, b.q_offs = w.q_offs, b.kv_offs = w.kv_offs;
  b.seed = w.seed, b.sm_attr = w.sm_attr, b.op = w.op;
  b.cols = cols;
  b.base = {0, 0, int32_t(rq * c.stripe), int32_t(rk * c.stripe), int32_t(c.T), int32_t(c.T)};
  if (cols == 8) b.base.insert(b.base.end(), {int32_t(c.stripe), int32_t(c.cp * c.stripe)});
  return b;
}

// Every block's forward merged over the kv devices (in double), and every block's
// backward given w's out and lse summed; shaped as w's.
struct Merged {
  std::vector<float> out, lse, dq, dk, dv, dop;
};
Merged merged_blocks(const StripeCase& c, const Call& w, int64_t cols) {
  Merged m{std::vector<float>(w.out.size(), 0.0f), std::vector<float>(w.lse.size()),
           std::vector<float>(w.q.size(), 0.0f),   std::vector<float>(w.k.size(), 0.0f),
           std::vector<float>(w.v.size(), 0.0f),   std::vector<float>(w.op.size(), 0.0f)};
  for (int64_t rq = 0; rq < c.cp; ++rq) {
    const std::vector<int64_t> qt = tokens_of(c, rq);
    const int64_t nq = int64_t(qt.size());
    std::vector<Call> parts;
    for (int64_t rk = 0; rk < c.cp; ++rk) {
      Call b = block(c, w, rq, rk, cols);
      EXPECT_TRUE(validate(b.p).ok());
      if (cols == 8) {
        const Status st = validate_index_base(b.p, b.base.data(), 8);
        EXPECT_TRUE(st.ok()) << st.message;
      }
      b.forward();
      parts.push_back(b);
      b.out = take(w.out, c.T, kHq, qt);
      b.lse = take_lse(c, w.lse, qt);
      b.backward();
      const std::vector<int64_t> kt = tokens_of(c, rk);
      add(m.dq, c.T, kHq, qt, b.dq);
      add(m.dk, c.T, kHkv, kt, b.dk);
      add(m.dv, c.T, kHkv, kt, b.dv);
      for (size_t e = 0; e < b.dop.size(); ++e) m.dop[e] += b.dop[e];
    }
    // lse = log sum exp(lse_b), out = sum_b exp(lse_b - lse) out_b.
    for (int64_t bb = 0; bb < kB; ++bb)
      for (int64_t h = 0; h < kHq; ++h)
        for (int64_t t = 0; t < nq; ++t) {
          double mx = -INFINITY;
          for (const auto& b : parts) mx = std::max(mx, double(b.lse[lse_index(c, nq, bb, h, t)]));
          double l = 0.0;
          for (const auto& b : parts)
            l += mx == -INFINITY ? 0.0 : std::exp(b.lse[lse_index(c, nq, bb, h, t)] - mx);
          const double total = mx == -INFINITY ? mx : mx + std::log(l);
          m.lse[lse_index(c, c.T, bb, h, qt[t])] = float(total);
          for (int64_t d = 0; d < kD; ++d) {
            double o = 0.0;
            for (const auto& b : parts) {
              const double lb = b.lse[lse_index(c, nq, bb, h, t)];
              if (lb != -INFINITY)
                o += std::exp(lb - total) * b.out[((bb * nq + t) * kHq + h) * kD + d];
            }
            m.out[((bb * c.T + qt[t]) * kHq + h) * kD + d] = float(o);
          }
        }
  }
  return m;
}

class Stripes : public ::testing::TestWithParam<StripeCase> {};

TEST_P(Stripes, MergeToTheWholeCall) {
  const StripeCase& c = GetParam();
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name)));
  const Call w = whole_call(c, rng);
  const Merged m = merged_blocks(c, w, 8);
  EXPECT_TRUE(same(m.out, w.out, 1e-5)) << "out";
  EXPECT_TRUE(same_lse(m.lse, w.lse)) << "lse";
  EXPECT_TRUE(same(m.dq, w.dq, 2e-5)) << "dq";
  EXPECT_TRUE(same(m.dk, w.dk, 2e-5)) << "dk";
  EXPECT_TRUE(same(m.dv, w.dv, 2e-5)) << "dv";
  if (c.score_mod) {
    const auto head = [](const std::vector<float>& x) {
      return std::vector<float>(x.begin(), x.begin() + kHq);
    };
    EXPECT_TRUE(same(head(m.dop), head(w.dop), 2e-5)) << "dscore_mod_operands";
  }

  // The same blocks read as contiguous ones compute something else (not vacuous).
  const Merged contiguous = merged_blocks(c, w, 6);
  EXPECT_FALSE(same(contiguous.out, w.out, 1e-3)) << "the blocks ignore their stripes";
}

constexpr int32_t kBshd = FA_BSHD_BSHD_BSHD, kThd = FA_THD_THD_THD;

INSTANTIATE_TEST_SUITE_P(
    Cases, Stripes,
    ::testing::Values(
        StripeCase{"bshd_causal", kBshd, FA_CAUSAL_MASK},
        StripeCase{"bshd_causal_cp4", kBshd, FA_CAUSAL_MASK, -1, -1, 96, 4, 8},
        // T = 100: the last stripe is short and device 0 holds 4 tokens more
        StripeCase{"bshd_padding_bottom_right_window", kBshd, FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
                   20, -1, 100, 2, 8},
        StripeCase{"bshd_dropout_score_mod", kBshd, FA_CAUSAL_MASK, -1, -1, 96, 2, 4, 0.2f, true},
        StripeCase{"thd_padding", kThd, FA_PADDING_MASK},
        StripeCase{"thd_causal_cp4", kThd, FA_PADDING_CAUSAL_MASK, -1, -1, 96, 4, 8},
        StripeCase{"thd_bottom_right_window", kThd, FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 12, -1,
                   96, 4, 4},
        StripeCase{"thd_window_uneven", kThd, FA_PADDING_MASK, 10, 3, 100, 2, 8},
        StripeCase{"thd_dropout", kThd, FA_PADDING_CAUSAL_MASK, -1, -1, 96, 2, 4, 0.2f},
        StripeCase{"thd_score_mod", kThd, FA_PADDING_CAUSAL_MASK, -1, -1, 96, 4, 4, 0.0f, true},
        StripeCase{"thd_window_dropout_score_mod", kThd, FA_PADDING_MASK, 16, 16, 100, 2, 8,
                   0.2f, true}),
    [](const auto& info) { return info.param.name; });

// Two vmap slices (one batch entry each) of different q devices: each reads its own
// 8-column index_base row, and equals the same block called alone.
TEST(StripesVmap, SlicesTakeTheirOwnStripes) {
  const StripeCase c{"vmap", kThd, FA_PADDING_CAUSAL_MASK, -1, -1, 96, 4, 8, 0.2f};
  std::mt19937 rng(11);
  const Call w = whole_call(c, rng);
  Call stacked = block(c, w, 0, 1, 8);
  stacked.p.num_slices = kB;
  std::vector<float> want_out, want_lse;
  stacked.q.clear(), stacked.base.clear(), stacked.seed.clear();
  for (int64_t s = 0; s < kB; ++s) {  // slice s: batch entry s of q device 2 s + 1
    Call one = block(c, w, 2 * s + 1, 1, 8);
    one.p.batch = 1;
    auto entry = [&](const std::vector<float>& x) {
      const size_t n = x.size() / kB;
      return std::vector<float>(x.begin() + s * n, x.begin() + (s + 1) * n);
    };
    one.q = entry(one.q), one.k = entry(one.k), one.v = entry(one.v);
    for (auto* x : {&one.q_lens, &one.kv_lens}) *x = {(*x)[s * kM], (*x)[s * kM + 1], (*x)[s * kM + 2]};
    for (auto* x : {&one.q_offs, &one.kv_offs})
      *x = std::vector<int32_t>(x->begin() + s * (kM + 1), x->begin() + (s + 1) * (kM + 1));
    one.base[0] = int32_t(s);  // batch_base: the dropout counter's batch entry
    ASSERT_TRUE(validate(one.p).ok());
    one.forward();
    want_out.insert(want_out.end(), one.out.begin(), one.out.end());
    want_lse.insert(want_lse.end(), one.lse.begin(), one.lse.end());
    stacked.q.insert(stacked.q.end(), one.q.begin(), one.q.end());
    stacked.base.insert(stacked.base.end(), one.base.begin(), one.base.end());
    stacked.seed.insert(stacked.seed.end(), w.seed.begin(), w.seed.end());
  }
  ASSERT_TRUE(validate(stacked.p).ok());
  ASSERT_TRUE(validate_index_base(stacked.p, stacked.base.data(), 8).ok());
  stacked.forward();
  EXPECT_TRUE(same(stacked.out, want_out, 0.0)) << "out";
  EXPECT_TRUE(same_lse(stacked.lse, want_lse)) << "lse";
}

// global_token and its inverse first_local against a scan, for contiguous and striped maps.
TEST(StripeMapTest, FirstLocalInvertsGlobalToken) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t stripe = 1 + rng() % 9, stride = stripe * (1 + rng() % 5);
    const StripeMap m{int64_t(rng() % 20), stripe, trial % 7 == 0 ? stripe : stride};
    const int64_t n = rng() % 40;
    std::vector<int64_t> g(n);
    for (int64_t t = 0; t < n; ++t) {
      g[t] = global_token(m, t);
      ASSERT_EQ(g[t], m.pos + (t / m.stripe) * m.stride + t % m.stripe);
      if (t) ASSERT_GT(g[t], g[t - 1]);
    }
    for (int64_t x = -3; x < m.pos + (n / m.stripe + 2) * m.stride; ++x) {
      const int64_t want = std::lower_bound(g.begin(), g.end(), x) - g.begin();
      ASSERT_EQ(first_local(m, x, n), want) << "pos " << m.pos << " stripe " << m.stripe
                                             << " stride " << m.stride << " n " << n << " g " << x;
    }
  }
}

// validate_index_base with 8 columns: the message names index_base, the values, what is
// allowed.
TEST(StripesValidate, BadStripesAreRefused) {
  const StripeCase c{"v", kBshd, FA_CAUSAL_MASK};
  AttnParams p = params(c, 2, 1, 24, 24);  // cp 4, stripe 8 of T = 96: 24 tokens a device
  ASSERT_TRUE(validate(p).ok());
  auto message = [&](std::vector<int32_t> base) {
    const Status st = validate_index_base(p, base.data(), 8);
    return st.ok() ? std::string("ok") : st.message;
  };
  EXPECT_EQ(message({0, 0, 8, 16, 96, 96, 8, 32}), "ok");
  EXPECT_EQ(message({0, 0, 0, 0, 96, 96, 0, 32}),
            "index_base: got (stripe 0, stride 32); allowed: stripe >= 1 and stride a multiple "
            "of stripe (local token t is global token pos + (t / stripe) * stride + t % stripe)");
  EXPECT_NE(message({0, 0, 0, 0, 96, 96, 8, 20}).find("got (stripe 8, stride 20)"),
            std::string::npos);
  EXPECT_NE(message({0, 0, 0, 0, 96, 96, 8, 4}).find("got (stripe 8, stride 4)"),
            std::string::npos);
  EXPECT_EQ(message({0, 0, 32, 0, 96, 96, 8, 32}),
            "index_base: got (q_pos 32, kv_pos 0, q_extent 96, kv_extent 96, stripe 8, stride 32) "
            "for a block of 24 queries and 24 keys, whose last query is global token 103 and "
            "last key global token 71; allowed: q_pos, kv_pos >= 0, 103 < q_extent and 71 < "
            "kv_extent");
  EXPECT_NE(message({0, 0, 0, -8, 96, 96, 8, 32}).find("kv_pos -8"), std::string::npos);
  EXPECT_EQ(message({0, 0, 0, 6, 96, 96, 6, 12}), "ok");
  EXPECT_EQ(message({0, 0, 5, 0, 96, 96, 24, 24}), "ok");  // contiguous, any stripe

  p.dropout = 0.1f;
  EXPECT_EQ(message({0, 0, 6, 0, 96, 96, 6, 12}),
            "index_base: got stripe 6 (stride 12) with dropout; dropout's Philox counter groups "
            "4 keys, so a striped block's stripe must be a multiple of 4");
  EXPECT_EQ(message({0, 0, 0, 6, 96, 96, 6, 12}),
            "index_base: got kv_pos 6 with dropout; dropout's Philox counter groups 4 keys, so a "
            "block's kv_pos must be a multiple of 4");
  EXPECT_EQ(message({0, 0, 5, 0, 96, 96, 6, 6}), "ok");  // contiguous: kv_pos alone matters
  EXPECT_EQ(message({0, 0, 8, 16, 96, 96, 8, 32}), "ok");

  // THD layouts take blocks (6 or 8 columns) too
  p.dropout = 0.0f;
  p.layout = kThd, p.mask_type = FA_PADDING_CAUSAL_MASK, p.max_segments = kM;
  ASSERT_TRUE(validate(p).ok());
  EXPECT_EQ(message({0, 0, 8, 16, 96, 96, 8, 32}), "ok");
  const std::vector<int32_t> six = {0, 0, 40, 36, 96, 96};
  EXPECT_TRUE(validate_index_base(p, six.data(), 6).ok());
}

}  // namespace
}  // namespace fusedattn::cpu
