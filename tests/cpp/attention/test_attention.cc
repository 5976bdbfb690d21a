// The CPU flash-attention engine against a naive double-precision reference.
//
// The reference materializes every score and follows the definitions, not the
// engine's tiling: s = scale * q.k, row i of batch b keeps key j when
//   i < q_len(b), j < kv_len(b)                 (padding masks; lengths clamped to [0, S])
//   j <= i                                      (top-left causal)
//   j <= i + kv_len(b) - q_len(b)               (bottom-right causal)
// q head h reads kv head h / (Hq / Hkv); a row that keeps nothing has out 0,
// lse -inf and zero gradients; max_logit[b, h] is the largest kept score.
//
// Inputs are random normals rounded to the storage dtype; the reference reads
// those rounded values back (with decoders written here, not the engine's),
// so the only differences are the engine's float32 (float64: double) arithmetic and the
// rounding of its outputs. Outputs are poisoned with NaN before each call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "harness.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/attention/validate.h"

namespace fusedattn::cpu {
namespace {

using namespace fusedattn::testing;

// --- problems ------------------------------------------------------------------

struct Shape {
  int64_t B, Sq, Skv, Hq, Hkv, D, Dv;
  float scale;                            // 0: 1 / sqrt(D)
  std::vector<std::pair<int, int>> lens;  // (q_len, kv_len) per batch; empty: a default pattern

  Shape(int64_t B_, int64_t Sq_, int64_t Skv_, int64_t Hq_, int64_t Hkv_, int64_t D_, int64_t Dv_,
        float scale_ = 0.0f, std::vector<std::pair<int, int>> lens_ = {})
      : B(B_), Sq(Sq_), Skv(Skv_), Hq(Hq_), Hkv(Hkv_), D(D_), Dv(Dv_), scale(scale_),
        lens(std::move(lens_)) {}
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B" << s.B << " Sq" << s.Sq << " Skv" << s.Skv << " Hq" << s.Hq << " Hkv" << s.Hkv << " D"
      << s.D << " Dv" << s.Dv;
}

struct Problem {
  AttnParams p;
  std::vector<int32_t> q_lens, kv_lens;  // [B, 1]: always passed; read only by the padding masks

  Extras extras() const {
    Extras x;
    x.seq.q_lens = q_lens.data();
    x.seq.kv_lens = kv_lens.data();
    x.scale64 = p.scale, x.dropout64 = p.dropout;  // float64 calls read these
    return x;
  }

  int64_t B() const { return p.batch; }
  int64_t Sq() const { return p.seqlen_q; }
  int64_t Skv() const { return p.seqlen_kv; }
  int64_t Hq() const { return p.heads_q; }
  int64_t Hkv() const { return p.heads_kv; }
  int64_t D() const { return p.head_dim_qk; }
  int64_t Dv() const { return p.head_dim_v; }
  int64_t n_q() const { return B() * Sq() * Hq() * D(); }
  int64_t n_k() const { return B() * Skv() * Hkv() * D(); }
  int64_t n_v() const { return B() * Skv() * Hkv() * Dv(); }
  int64_t n_o() const { return B() * Sq() * Hq() * Dv(); }
  int64_t n_lse() const { return B() * Hq() * Sq(); }

  // Whether row i of batch b keeps key j, straight from the mask definitions.
  bool keep(int64_t b, int64_t i, int64_t j) const {
    int64_t ql = Sq(), kl = Skv();
    if (has_padding(p.mask_type)) {
      ql = std::clamp<int64_t>(q_lens[b], 0, Sq());
      kl = std::clamp<int64_t>(kv_lens[b], 0, Skv());
    }
    if (i >= ql || j >= kl) return false;
    if (is_causal_top_left(p.mask_type)) return j <= i;
    if (is_causal_bottom_right(p.mask_type)) return j <= i + (kl - ql);
    return true;
  }
};

Problem make_problem(int32_t dtype, int32_t mask, const Shape& s) {
  Problem pr;
  AttnParams& p = pr.p;
  p = AttnParams{};
  p.batch = s.B;
  p.seqlen_q = s.Sq;
  p.seqlen_kv = s.Skv;
  p.heads_q = s.Hq;
  p.heads_kv = s.Hkv;
  p.head_dim_qk = s.D;
  p.head_dim_v = s.Dv;
  p.window_left = p.window_right = -1;
  p.dtype = dtype;
  p.layout = FA_BSHD_BSHD_BSHD;
  p.mask_type = mask;
  p.bias_type = FA_NO_BIAS;
  p.softmax_type = FA_VANILLA_SOFTMAX;
  p.is_training = 1;
  p.scale = s.scale != 0.0f ? s.scale : float(1.0 / std::sqrt(double(s.D)));
  p.dropout = 0.0f;
  p.max_segments = 1;
  p.num_slices = 1;
  for (int64_t b = 0; b < s.B; ++b) {
    if (!s.lens.empty()) {
      pr.q_lens.push_back(s.lens[b].first);
      pr.kv_lens.push_back(s.lens[b].second);
    } else if (b % 2 == 0) {  // short q and kv, lengths that are not tile multiples
      pr.q_lens.push_back(int32_t(s.Sq - s.Sq / 3));
      pr.kv_lens.push_back(int32_t(s.Skv - s.Skv / 5));
    } else {  // full q, half kv
      pr.q_lens.push_back(int32_t(s.Sq));
      pr.kv_lens.push_back(int32_t(s.Skv - s.Skv / 2));
    }
  }
  return pr;
}

// Index of [b, s, h, d] in a contiguous [B, S, H, D] tensor.
inline int64_t at(int64_t b, int64_t s, int64_t h, int64_t d, int64_t S, int64_t H, int64_t D) {
  return ((b * S + s) * H + h) * D + d;
}

// --- reference -----------------------------------------------------------------

// Each result comes with its magnitude: the same sum taken over absolute values
// of the terms. Where terms cancel (a single key makes dq and dk exactly 0)
// float32 rounding is relative to the magnitude, not to the result.
struct RefFwd {
  std::vector<double> out, lse, max_logit;
  std::vector<double> out_mag;
};

struct RefBwd {
  std::vector<double> dq, dk, dv;
  std::vector<double> dq_mag, dk_mag, dv_mag;
};

// Scaled scores of row (b, h, i) against every key; -inf where masked.
std::vector<double> ref_scores(const Problem& pr, const std::vector<double>& q,
                               const std::vector<double>& k, int64_t b, int64_t h, int64_t i) {
  const int64_t Sq = pr.Sq(), Skv = pr.Skv(), Hq = pr.Hq(), Hkv = pr.Hkv(), D = pr.D();
  const int64_t hk = h / (Hq / Hkv);
  std::vector<double> s(Skv, -kInf);
  for (int64_t j = 0; j < Skv; ++j) {
    if (!pr.keep(b, i, j)) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += q[at(b, i, h, d, Sq, Hq, D)] * k[at(b, j, hk, d, Skv, Hkv, D)];
    s[j] = double(pr.p.scale) * dot;
  }
  return s;
}

RefFwd ref_forward(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                   const std::vector<double>& v) {
  const int64_t B = pr.B(), Sq = pr.Sq(), Skv = pr.Skv(), Hq = pr.Hq(), Hkv = pr.Hkv(), Dv = pr.Dv();
  const int64_t hk_of = Hq / Hkv;
  RefFwd r{std::vector<double>(pr.n_o(), 0.0), std::vector<double>(pr.n_lse(), -kInf),
           std::vector<double>(B * Hq, -kInf), std::vector<double>(pr.n_o(), 0.0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const std::vector<double> s = ref_scores(pr, q, k, b, h, i);
        const double m = *std::max_element(s.begin(), s.end());
        if (m == -kInf) continue;  // nothing kept: out 0, lse -inf
        double l = 0.0;
        for (int64_t j = 0; j < Skv; ++j) l += std::exp(s[j] - m);
        for (int64_t j = 0; j < Skv; ++j) {
          const double w = std::exp(s[j] - m) / l;
          if (w == 0.0) continue;
          for (int64_t d = 0; d < Dv; ++d) {
            const double vj = v[at(b, j, h / hk_of, d, Skv, Hkv, Dv)];
            r.out[at(b, i, h, d, Sq, Hq, Dv)] += w * vj;
            r.out_mag[at(b, i, h, d, Sq, Hq, Dv)] += w * std::fabs(vj);
          }
        }
        r.lse[(b * Hq + h) * Sq + i] = m + std::log(l);
        r.max_logit[b * Hq + h] = std::max(r.max_logit[b * Hq + h], m);
      }
  return r;
}

// Gradients of sum(out * dout) with out the exact (double) forward output.
RefBwd ref_backward(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout, const RefFwd& f) {
  const int64_t B = pr.B(), Sq = pr.Sq(), Skv = pr.Skv(), Hq = pr.Hq(), Hkv = pr.Hkv();
  const int64_t D = pr.D(), Dv = pr.Dv(), hk_of = Hq / Hkv;
  const double scale = pr.p.scale;
  RefBwd g{std::vector<double>(pr.n_q(), 0.0), std::vector<double>(pr.n_k(), 0.0),
           std::vector<double>(pr.n_v(), 0.0),      std::vector<double>(pr.n_q(), 0.0),
           std::vector<double>(pr.n_k(), 0.0),      std::vector<double>(pr.n_v(), 0.0)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / hk_of;
      for (int64_t i = 0; i < Sq; ++i) {
        const double lse = f.lse[(b * Hq + h) * Sq + i];
        if (lse == -kInf) continue;
        const std::vector<double> s = ref_scores(pr, q, k, b, h, i);
        double delta = 0.0;
        for (int64_t d = 0; d < Dv; ++d)
          delta += dout[at(b, i, h, d, Sq, Hq, Dv)] * f.out[at(b, i, h, d, Sq, Hq, Dv)];
        for (int64_t j = 0; j < Skv; ++j) {
          if (s[j] == -kInf) continue;
          const double pij = std::exp(s[j] - lse);
          double dp = 0.0;
          for (int64_t d = 0; d < Dv; ++d)
            dp += dout[at(b, i, h, d, Sq, Hq, Dv)] * v[at(b, j, hk, d, Skv, Hkv, Dv)];
          const double ds = pij * (dp - delta);
          const double ds_mag = pij * (std::fabs(dp) + std::fabs(delta));
          for (int64_t d = 0; d < Dv; ++d) {
            const double g_o = dout[at(b, i, h, d, Sq, Hq, Dv)];
            g.dv[at(b, j, hk, d, Skv, Hkv, Dv)] += pij * g_o;
            g.dv_mag[at(b, j, hk, d, Skv, Hkv, Dv)] += pij * std::fabs(g_o);
          }
          for (int64_t d = 0; d < D; ++d) {
            const double kj = k[at(b, j, hk, d, Skv, Hkv, D)], qi = q[at(b, i, h, d, Sq, Hq, D)];
            g.dq[at(b, i, h, d, Sq, Hq, D)] += scale * ds * kj;
            g.dk[at(b, j, hk, d, Skv, Hkv, D)] += scale * ds * qi;
            g.dq_mag[at(b, i, h, d, Sq, Hq, D)] += std::fabs(scale * ds_mag * kj);
            g.dk_mag[at(b, j, hk, d, Skv, Hkv, D)] += std::fabs(scale * ds_mag * qi);
          }
        }
      }
    }
  return g;
}

// Rows that keep no key must be exactly zero in `got` ([B, S, H, width] with the
// row's key mask given by keeps(b, s)).
template <class Keeps>
::testing::AssertionResult zero_where_masked(const std::vector<double>& got, int64_t B, int64_t S,
                                             int64_t H, int64_t width, Keeps keeps) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      if (keeps(b, s)) continue;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < width; ++d) {
          const double x = got[at(b, s, h, d, S, H, width)];
          if (x != 0.0)
            return ::testing::AssertionFailure()
                   << "batch " << b << " position " << s << " head " << h << " dim " << d
                   << " keeps no key but holds " << x;
        }
    }
  return ::testing::AssertionSuccess();
}

// --- running the engine ------------------------------------------------------------

struct Inputs {
  Tensor q, k, v, dout;
};

Inputs make_inputs(const Problem& pr, uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in{Tensor(pr.p.dtype, pr.n_q()), Tensor(pr.p.dtype, pr.n_k()), Tensor(pr.p.dtype, pr.n_v()),
            Tensor(pr.p.dtype, pr.n_o())};
  in.q.fill_normal(rng);
  in.k.fill_normal(rng);
  in.v.fill_normal(rng);
  in.dout.fill_normal(rng);
  return in;
}

struct EngineFwd {
  Tensor out, lse, max_logit;  // lse, max_logit: float32 (float64 for float64 calls)
};

struct EngineBwd {
  Tensor dq, dk, dv;
};

EngineFwd run_forward(const Problem& pr, const Inputs& in, bool with_max_logit = true) {
  const int32_t st = stat_dtype(pr.p.dtype);
  EngineFwd f{Tensor(pr.p.dtype, pr.n_o()), Tensor(st, pr.n_lse()), Tensor(st, pr.B() * pr.Hq())};
  f.out.poison(), f.lse.poison(), f.max_logit.poison();
  FwdArgs a{in.q.data(), in.k.data(), in.v.data(), f.out.data(), f.lse.data(),
            with_max_logit ? f.max_logit.data() : nullptr,
            Strides::bshd(pr.Sq(), pr.Hq(), pr.D()), Strides::bshd(pr.Skv(), pr.Hkv(), pr.D()),
            Strides::bshd(pr.Skv(), pr.Hkv(), pr.Dv()), Strides::bshd(pr.Sq(), pr.Hq(), pr.Dv()),
            lse_strides(pr.p), pr.extras()};
  attention_fwd(pr.p, a);
  return f;
}

EngineBwd run_backward(const Problem& pr, const Inputs& in, const EngineFwd& f) {
  EngineBwd g{Tensor(pr.p.dtype, pr.n_q()), Tensor(pr.p.dtype, pr.n_k()), Tensor(pr.p.dtype, pr.n_v())};
  g.dq.poison();
  g.dk.poison();
  g.dv.poison();
  const Strides sq = Strides::bshd(pr.Sq(), pr.Hq(), pr.D());
  const Strides sk = Strides::bshd(pr.Skv(), pr.Hkv(), pr.D());
  const Strides sv = Strides::bshd(pr.Skv(), pr.Hkv(), pr.Dv());
  const Strides so = Strides::bshd(pr.Sq(), pr.Hq(), pr.Dv());
  BwdArgs a{in.q.data(), in.k.data(), in.v.data(), f.out.data(), in.dout.data(), f.lse.data(),
            g.dq.data(), g.dk.data(), g.dv.data(), nullptr, nullptr,
            sq, sk, sv, so, so, lse_strides(pr.p), sq, sk, sv, pr.extras()};
  attention_bwd(pr.p, a);
  return g;
}

std::string describe(const Problem& pr) {
  std::ostringstream os;
  os << short_name(pr.p.dtype) << " " << mask_name(pr.p.mask_type) << " B" << pr.B() << " Sq"
     << pr.Sq() << " Skv" << pr.Skv() << " Hq" << pr.Hq() << " Hkv" << pr.Hkv() << " D" << pr.D()
     << " Dv" << pr.Dv() << " scale " << pr.p.scale << " lens";
  for (int64_t b = 0; b < pr.B(); ++b) os << " (" << pr.q_lens[b] << "," << pr.kv_lens[b] << ")";
  return os.str();
}

// Runs forward and backward and checks both against the reference.
void check_problem(const Problem& pr, uint32_t seed) {
  SCOPED_TRACE(describe(pr) + " seed " + std::to_string(seed));
  ASSERT_TRUE(validate(pr.p).ok()) << validate(pr.p).message;
  const Inputs in = make_inputs(pr, seed);
  const std::vector<double> q = in.q.values(), k = in.k.values(), v = in.v.values();
  const std::vector<double> dout = in.dout.values();
  const Tol tol = tol_for(pr.p.dtype);

  const RefFwd ref = ref_forward(pr, q, k, v);
  const EngineFwd f = run_forward(pr, in);
  const std::vector<double> out = f.out.values();
  EXPECT_TRUE(close(out, ref.out, ref.out_mag, tol)) << "out";
  EXPECT_TRUE(close_logits(f.lse.values(), ref.lse, logit_tol(pr.p.dtype))) << "lse";
  EXPECT_TRUE(close_logits(f.max_logit.values(), ref.max_logit, logit_tol(pr.p.dtype))) << "max_logit";

  // Which query rows keep any key, and which keys any row keeps (the mask does
  // not depend on the head).
  std::vector<char> row_keeps(pr.B() * pr.Sq(), 0), key_kept(pr.B() * pr.Skv(), 0);
  for (int64_t b = 0; b < pr.B(); ++b)
    for (int64_t i = 0; i < pr.Sq(); ++i)
      for (int64_t j = 0; j < pr.Skv(); ++j)
        if (pr.keep(b, i, j)) row_keeps[b * pr.Sq() + i] = key_kept[b * pr.Skv() + j] = 1;
  auto row = [&](int64_t b, int64_t i) { return row_keeps[b * pr.Sq() + i] != 0; };
  auto key = [&](int64_t b, int64_t j) { return key_kept[b * pr.Skv() + j] != 0; };
  EXPECT_TRUE(zero_where_masked(out, pr.B(), pr.Sq(), pr.Hq(), pr.Dv(), row)) << "out";

  const RefBwd gref = ref_backward(pr, q, k, v, dout, ref);
  const EngineBwd g = run_backward(pr, in, f);
  const std::vector<double> dq = g.dq.values(), dk = g.dk.values(), dv = g.dv.values();
  EXPECT_TRUE(close(dq, gref.dq, gref.dq_mag, tol)) << "dq";
  EXPECT_TRUE(close(dk, gref.dk, gref.dk_mag, tol)) << "dk";
  EXPECT_TRUE(close(dv, gref.dv, gref.dv_mag, tol)) << "dv";
  EXPECT_TRUE(zero_where_masked(dq, pr.B(), pr.Sq(), pr.Hq(), pr.D(), row)) << "dq";
  EXPECT_TRUE(zero_where_masked(dk, pr.B(), pr.Skv(), pr.Hkv(), pr.D(), key)) << "dk";
  EXPECT_TRUE(zero_where_masked(dv, pr.B(), pr.Skv(), pr.Hkv(), pr.Dv(), key)) << "dv";
}

// --- the grid --------------------------------------------------------------------

constexpr int32_t kDtypes[] = {FA_FLOAT32, FA_BFLOAT16, FA_FLOAT16, FA_FLOAT64};
constexpr int32_t kMasks[] = {FA_NO_MASK,
                              FA_PADDING_MASK,
                              FA_CAUSAL_MASK,
                              FA_PADDING_CAUSAL_MASK,
                              FA_CAUSAL_BOTTOM_RIGHT_MASK,
                              FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK};

using GridParam = std::tuple<int32_t, int32_t, Shape>;

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto& [dtype, mask, s] = info.param;
  std::ostringstream os;
  os << short_name(dtype) << "_" << mask_name(mask) << "_B" << s.B << "_Sq" << s.Sq << "_Skv" << s.Skv
     << "_H" << s.Hq << "x" << s.Hkv << "_D" << s.D << "x" << s.Dv;
  if (s.scale != 0.0f) os << "_scale" << (s.scale < 0 ? "m" : "") << int(std::fabs(s.scale) * 100);
  if (!s.lens.empty()) os << "_lens" << info.index;
  return os.str();
}

class AttentionGrid : public ::testing::TestWithParam<GridParam> {};

TEST_P(AttentionGrid, ForwardAndBackwardMatchReference) {
  const auto& [dtype, mask, shape] = GetParam();
  const Problem pr = make_problem(dtype, mask, shape);
  // A fixed seed per problem: reproducible, and different across the grid.
  const std::string name = describe(pr);
  const uint32_t seed = uint32_t(std::hash<std::string>{}(name));
  check_problem(pr, seed);
}

const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 64, 64},          // one query, one key
    {2, 37, 37, 2, 2, 24, 24},        // one partial tile, head dim 24
    {2, 130, 130, 4, 2, 64, 64},      // three tiles, GQA
    {1, 37, 130, 4, 1, 128, 128},     // Sq < Skv, MQA, head dim 128
    {2, 130, 37, 2, 1, 64, 64},       // Sq > Skv (bottom-right: leading rows see nothing)
    {1, 65, 200, 2, 2, 256, 256},     // head dim 256, one row past a tile
    {2, 64, 64, 2, 2, 1, 1, 1.0f},    // head dim 1, exact tile
    {1, 100, 77, 4, 2, 64, 32},       // Dv < Dqk
    {2, 129, 1, 2, 1, 32, 48},        // a single key, Dv > Dqk
    {1, 1, 150, 2, 1, 16, 16, 0.7f},  // decoding: one query, many keys
    {1, 70, 50, 2, 1, 16, 16, -0.5f},  // a negative scale is valid too
};

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGrid,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::ValuesIn(kMasks),
                                            ::testing::ValuesIn(kShapes)),
                         grid_name);

// Near one-hot rows: score gaps far past fast_exp's clamp at -87. float32
// only: there the gradients are small differences dP - delta, and delta is
// computed from the stored out (as in every FlashAttention-style backward), so
// in bf16 the rounding of out alone moves them by more than 1%.
INSTANTIATE_TEST_SUITE_P(LargeScale, AttentionGrid,
                         ::testing::Combine(::testing::Values(FA_FLOAT32), ::testing::ValuesIn(kMasks),
                                            ::testing::Values(Shape{1, 70, 70, 2, 2, 16, 16, 8.0f})),
                         grid_name);

// Padding with empty and out-of-range lengths: rows and keys past the lengths
// are fully masked (out 0, lse -inf, gradients exactly 0) and lengths outside
// [0, S] are clamped.
const Shape kPaddingShapes[] = {
    {4, 70, 45, 2, 1, 32, 32, 0.0f, {{0, 45}, {70, 0}, {0, 0}, {5, 7}}},
    {3, 33, 90, 2, 2, 16, 8, 0.0f, {{33, 90}, {0, 90}, {20, 0}}},
    {2, 50, 40, 1, 1, 8, 8, 0.0f, {{-3, 500}, {90, -1}}},
    {2, 50, 40, 2, 2, 8, 8, 0.0f, {{80, 17}, {13, 100}}},
};

INSTANTIATE_TEST_SUITE_P(EmptyAndClampedLengths, AttentionGrid,
                         ::testing::Combine(::testing::ValuesIn(kDtypes),
                                            ::testing::Values(FA_PADDING_MASK, FA_PADDING_CAUSAL_MASK,
                                                              FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK),
                                            ::testing::ValuesIn(kPaddingShapes)),
                         grid_name);

// The one long case: five query and five key tiles, causal masks with partial diagonal tiles.
INSTANTIATE_TEST_SUITE_P(Long, AttentionGrid,
                         ::testing::Combine(::testing::Values(FA_FLOAT32, FA_BFLOAT16),
                                            ::testing::Values(FA_PADDING_CAUSAL_MASK,
                                                              FA_CAUSAL_BOTTOM_RIGHT_MASK),
                                            ::testing::Values(Shape{2, 300, 290, 2, 1, 64, 64})),
                         grid_name);

// --- properties that do not need the reference ------------------------------------------

Problem small_problem(int32_t dtype, int32_t mask) {
  return make_problem(dtype, mask, Shape{2, 150, 140, 4, 2, 32, 24});
}

class AttentionProperties : public ::testing::TestWithParam<int32_t> {};

// Tensors inside larger buffers: q, k, v packed as [B, S, 3, H, D], out and the
// gradients in rows with gaps. Results must equal the contiguous ones bit for
// bit, and the gaps must stay untouched.
TEST_P(AttentionProperties, StridedTensorsMatchContiguous) {
  const int32_t dtype = GetParam();
  const Problem pr = make_problem(dtype, FA_PADDING_CAUSAL_MASK, Shape{2, 97, 97, 2, 2, 40, 40});
  const int64_t B = pr.B(), S = pr.Sq(), H = pr.Hq(), D = pr.D();
  const Inputs in = make_inputs(pr, 7);
  const EngineFwd f = run_forward(pr, in);
  const EngineBwd g = run_backward(pr, in, f);

  // Packed qkv [B, S, 3, H, D] and dout copied in.
  Tensor qkv(dtype, B * S * 3 * H * D), dout(dtype, B * S * H * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t src = at(b, s, h, d, S, H, D);
          qkv.set((((b * S + s) * 3 + 0) * H + h) * D + d, in.q.get(src));
          qkv.set((((b * S + s) * 3 + 1) * H + h) * D + d, in.k.get(src));
          qkv.set((((b * S + s) * 3 + 2) * H + h) * D + d, in.v.get(src));
          dout.set(src, in.dout.get(src));
        }
  const int64_t es = elem_size(dtype);
  auto at_elem = [&](Tensor& t, int64_t i) {
    return static_cast<void*>(static_cast<unsigned char*>(t.data()) + i * es);
  };
  const Strides packed{S * 3 * H * D, 3 * H * D, D};
  const Strides gapped{S * (H * D + 5) + 3, H * D + 5, D};  // 5 spare elements per row, 3 per batch
  const int64_t n_gapped = B * gapped.b;

  Tensor out(dtype, n_gapped), dq(dtype, n_gapped), dkv(dtype, B * S * 3 * H * D);
  out.poison();
  dq.poison();
  dkv.poison();
  Tensor lse(stat_dtype(dtype), pr.n_lse()), max_logit(stat_dtype(dtype), B * H);
  lse.poison(), max_logit.poison();
  FwdArgs fa{at_elem(qkv, 0), at_elem(qkv, H * D), at_elem(qkv, 2 * H * D), out.data(), lse.data(),
             max_logit.data(), packed, packed, packed, gapped, lse_strides(pr.p), pr.extras()};
  attention_fwd(pr.p, fa);
  BwdArgs ba{at_elem(qkv, 0), at_elem(qkv, H * D), at_elem(qkv, 2 * H * D), out.data(), dout.data(),
             lse.data(), dq.data(), at_elem(dkv, H * D), at_elem(dkv, 2 * H * D), nullptr, nullptr,
             packed, packed, packed, gapped, Strides::bshd(S, H, D), lse_strides(pr.p), gapped,
             packed, packed, pr.extras()};
  attention_bwd(pr.p, ba);

  // dq is compared to a tolerance only: its summation order depends on the
  // thread count (see DqIsDeterministic below).
  auto same_bits = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  int64_t mismatches = 0, gap_writes = 0;
  std::vector<double> dq_dense(pr.n_q());
  for (int64_t i = 0; i < n_gapped; ++i) {
    const int64_t b = i / gapped.b, r = i % gapped.b, s = r / gapped.s, c = r % gapped.s;
    const bool inside = s < S && c < H * D;
    if (!inside) {
      gap_writes += !std::isnan(out.get(i)) + !std::isnan(dq.get(i));
      continue;
    }
    const int64_t src = (b * S + s) * H * D + c;
    mismatches += !same_bits(out.get(i), f.out.get(src));
    dq_dense[src] = dq.get(i);
  }
  const std::vector<double> dq_contiguous = g.dq.values();
  EXPECT_TRUE(close(dq_dense, dq_contiguous, dq_contiguous, tol_for(dtype))) << "dq";
  for (int64_t i = 0; i < B * S * 3 * H * D; ++i) {
    const int64_t which = (i / (H * D)) % 3, rest = i % (H * D), bs = i / (3 * H * D);
    if (which == 0) {
      gap_writes += !std::isnan(dkv.get(i));
    } else {
      const Tensor& ref = which == 1 ? g.dk : g.dv;
      mismatches += !same_bits(dkv.get(i), ref.get(bs * H * D + rest));
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(gap_writes, 0) << "elements outside the tensors were written";
  EXPECT_EQ(lse.values(), f.lse.values());
  EXPECT_EQ(max_logit.values(), f.max_logit.values());
}

// max_logit is optional: a null pointer changes nothing else.
TEST_P(AttentionProperties, MaxLogitMayBeNull) {
  const Problem pr = small_problem(GetParam(), FA_CAUSAL_BOTTOM_RIGHT_MASK);
  const Inputs in = make_inputs(pr, 11);
  const EngineFwd with = run_forward(pr, in, true);
  const EngineFwd without = run_forward(pr, in, false);
  EXPECT_EQ(with.out.values(), without.out.values());
  EXPECT_EQ(with.lse.values(), without.lse.values());
  for (double x : without.max_logit.values()) EXPECT_TRUE(std::isnan(x)) << "max_logit written through null";
}

// Fixed thread count: the forward and dk, dv of the backward are deterministic.
TEST_P(AttentionProperties, RepeatedCallsAreBitwiseEqual) {
  const Problem pr = small_problem(GetParam(), FA_PADDING_CAUSAL_MASK);
  const Inputs in = make_inputs(pr, 13);
  const EngineFwd f = run_forward(pr, in);
  for (int rep = 0; rep < 3; ++rep) {
    const EngineFwd f2 = run_forward(pr, in);
    EXPECT_EQ(f.out.values(), f2.out.values());
    EXPECT_EQ(f.lse.values(), f2.lse.values());
    EXPECT_EQ(f.max_logit.values(), f2.max_logit.values());
  }
  const EngineBwd a = run_backward(pr, in, f);
  for (int rep = 0; rep < 3; ++rep) {
    const EngineBwd b = run_backward(pr, in, f);
    EXPECT_EQ(a.dk.values(), b.dk.values());
    EXPECT_EQ(a.dv.values(), b.dv.values());
  }
}

// attention_bwd.cc promises a bitwise deterministic backward for a fixed thread
// count: kv-tile tasks are dealt to dq accumulators by a fixed rule.
TEST_P(AttentionProperties, DqIsDeterministic) {
  const Problem pr = small_problem(GetParam(), FA_PADDING_CAUSAL_MASK);
  const Inputs in = make_inputs(pr, 13);
  const EngineFwd f = run_forward(pr, in);
  const EngineBwd a = run_backward(pr, in, f);
  for (int rep = 0; rep < 10; ++rep) {
    const EngineBwd b = run_backward(pr, in, f);
    ASSERT_EQ(a.dq.values(), b.dq.values()) << "call " << rep + 1 << " differs from the first";
  }
}

// The thread count changes no forward result and only the summation order of dq.
TEST_P(AttentionProperties, ThreadCountDoesNotChangeResults) {
  const Problem pr = small_problem(GetParam(), FA_NO_MASK);
  const Inputs in = make_inputs(pr, 17);
  set_num_threads(1);
  const EngineFwd f1 = run_forward(pr, in);
  const EngineBwd g1 = run_backward(pr, in, f1);
  set_num_threads(4);
  const EngineFwd f4 = run_forward(pr, in);
  const EngineBwd g4 = run_backward(pr, in, f1);
  set_num_threads(0);
  EXPECT_EQ(f1.out.values(), f4.out.values());
  EXPECT_EQ(f1.lse.values(), f4.lse.values());
  EXPECT_EQ(f1.max_logit.values(), f4.max_logit.values());
  EXPECT_EQ(g1.dk.values(), g4.dk.values());
  EXPECT_EQ(g1.dv.values(), g4.dv.values());
  const std::vector<double> dq1 = g1.dq.values();
  EXPECT_TRUE(close(g4.dq.values(), dq1, dq1, tol_for(GetParam())));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionProperties, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<int32_t>& d) {
                           return std::string(short_name(d.param));
                         });

}  // namespace
}  // namespace fusedattn::cpu
