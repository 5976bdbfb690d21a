// kRequestAverageEmptyRows on the CPU engine (cpu/empty_rows.h), float32 and float64: a
// folded mask (the engine drops its keys) that empties some rows, under a padding mask with
// GQA. Forward: the empty rows below their q length hold the kv head's average of all Skv
// values, rows past it stay 0, every other row is the engine's own result bit for bit.
// Backward: dq and dk are those of the plain backward given a dout that is 0 on the empty
// rows (bit for bit: the rows' P is 0 either way), and dv those plus dout / Skv summed over
// the empty rows of the kv head. And validate_average_empty_rows' refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fusedattn/attention/cpu/empty_rows.h"
#include "fusedattn/attention/cpu/score_ops.h"
#include "fusedattn/attention/validate.h"
#include "plain_call.h"

namespace fusedattn::cpu {
namespace {

constexpr int64_t B = 2, Sq = 37, Skv = 29, Hq = 4, Hkv = 2, D = 16, G = Hq / Hkv;

template <class T>
struct Problem {
  AttnParams p = test::plain_call(B, Sq, Skv, Hq, Hkv, D, D, 0.25f, std::is_same_v<T, double> ? FA_FLOAT64 : FA_FLOAT32);
  std::vector<T> q, k, v, dout, bias;  // bias [1, 1, Sq, Skv]: a folded mask
  std::vector<int32_t> q_lens{30, 37}, kv_lens{29, 29};
  std::vector<bool> empty;  // [B, Hq, Sq]: rows the mask empties, below their q length

  Problem() {
    std::mt19937 rng(5);
    std::normal_distribution<double> n;
    for (auto* x : {&q, &dout}) x->resize(B * Sq * Hq * D);
    for (auto* x : {&k, &v}) x->resize(B * Skv * Hkv * D);
    for (auto* x : {&q, &k, &v, &dout})
      for (T& e : *x) e = static_cast<T>(n(rng));
    p.mask_type = FA_PADDING_MASK;
    p.bias_type = FA_POST_SCALE_BIAS;
    p.bias_batch = p.bias_heads = 1;
    bias.assign(Sq * Skv, T(0));
    const T mv = static_cast<T>(masked_bias<T>());
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t j = 0; j < Skv; ++j)
        if (i % 5 == 3 || (i % 3 == 0 && j % 2 == 0)) bias[i * Skv + j] = mv;  // rows 3, 8, ..: none
    empty.assign(B * Hq * Sq, false);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < q_lens[b]; ++i) empty[(b * Hq + h) * Sq + i] = i % 5 == 3;
  }

  Extras extras() const {
    Extras x;
    x.seq.q_lens = q_lens.data();
    x.seq.kv_lens = kv_lens.data();
    x.bias = bias.data();
    x.sbias = BiasStrides::dense(p);
    x.mask_bias = true;
    x.scale64 = p.scale;
    return x;
  }
};

template <class T>
void forward_and_backward() {
  constexpr bool kF64 = std::is_same_v<T, double>;
  using A = std::conditional_t<kF64, double, float>;
  Problem<T> pr;
  const AttnParams& p = pr.p;
  const double threshold = 0.5 * masked_bias<T>();
  const Strides so = Strides::bshd(Sq, Hq, D), sk = Strides::bshd(Skv, Hkv, D);
  std::vector<T> plain, out;  // outputs poisoned (NaN)
  std::vector<A> lse, lse2, ml, ml2;
  plain.assign(pr.q.size(), T(NAN)), out.assign(pr.q.size(), T(NAN));
  lse.assign(B * Hq * Sq, A(NAN)), lse2.assign(B * Hq * Sq, A(NAN));
  ml.assign(B * Hq, A(NAN)), ml2.assign(B * Hq, A(NAN));
  FwdArgs a{pr.q.data(), pr.k.data(), pr.v.data(), plain.data(), lse.data(), ml.data(),
            so, sk, sk, so, lse_strides(p), pr.extras()};
  attention_fwd(p, a);
  a.out = out.data(), a.lse = lse2.data(), a.max_logit = ml2.data();
  attention_fwd(p, a);
  average_empty_rows_fwd(p, a, threshold);
  int64_t n_empty = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const bool e = pr.empty[(b * Hq + h) * Sq + i];
        n_empty += e;
        for (int64_t d = 0; d < D; ++d) {
          const int64_t at = b * so.b + i * so.s + h * so.h + d;
          if (!e) {
            ASSERT_EQ(std::memcmp(&out[at], &plain[at], sizeof(T)), 0) << b << " " << h << " " << i;
            continue;
          }
          double mean = 0;
          for (int64_t j = 0; j < Skv; ++j) mean += static_cast<double>(pr.v[b * sk.b + j * sk.s + (h / G) * sk.h + d]);
          mean /= Skv;
          ASSERT_NEAR(static_cast<double>(out[at]), mean, kF64 ? 1e-14 : 1e-6);
        }
      }
  EXPECT_EQ(n_empty, (6 + 7) * Hq);  // rows 3, 8, .., 28 below q length 30; .., 33 below 37
  // Backward: around the engine, against the plain backward with dout 0 on the empty rows.
  std::vector<T> zeroed = pr.dout;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i)
        if (pr.empty[(b * Hq + h) * Sq + i])
          for (int64_t d = 0; d < D; ++d) zeroed[b * so.b + i * so.s + h * so.h + d] = T(0);
  auto backward = [&](const std::vector<T>& dout, bool around, std::vector<T>* dq, std::vector<T>* dk,
                      std::vector<T>* dv) {
    dq->assign(pr.q.size(), T(NAN)), dk->assign(pr.k.size(), T(NAN)), dv->assign(pr.v.size(), T(NAN));
    BwdArgs g{pr.q.data(), pr.k.data(), pr.v.data(), out.data(), dout.data(), lse2.data(),
              dq->data(), dk->data(), dv->data(), nullptr, nullptr,
              so, sk, sk, so, so, lse_strides(p), so, sk, sk, pr.extras()};
    if (!around) return attention_bwd(p, g);
    const EmptyRowsBwd empty(p, g, threshold);
    g.lse = empty.lse();
    g.slse = empty.lse_strides();
    attention_bwd(p, g);
    empty.finish(p, g);
  };
  std::vector<T> dq, dk, dv, dq0, dk0, dv0;
  backward(pr.dout, true, &dq, &dk, &dv);
  backward(zeroed, false, &dq0, &dk0, &dv0);
  EXPECT_EQ(std::memcmp(dq.data(), dq0.data(), dq.size() * sizeof(T)), 0) << "dq";
  EXPECT_EQ(std::memcmp(dk.data(), dk0.data(), dk.size() * sizeof(T)), 0) << "dk";
  for (int64_t b = 0; b < B; ++b)
    for (int64_t kh = 0; kh < Hkv; ++kh)
      for (int64_t d = 0; d < D; ++d) {
        double sum = 0;
        for (int64_t h = kh * G; h < (kh + 1) * G; ++h)
          for (int64_t i = 0; i < Sq; ++i)
            if (pr.empty[(b * Hq + h) * Sq + i]) sum += static_cast<double>(pr.dout[b * so.b + i * so.s + h * so.h + d]);
        for (int64_t j = 0; j < Skv; ++j) {
          const int64_t at = b * sk.b + j * sk.s + kh * sk.h + d;
          ASSERT_NEAR(static_cast<double>(dv[at]), static_cast<double>(dv0[at]) + sum / Skv,
                      kF64 ? 1e-13 : 1e-5)
              << b << " " << kh << " " << j << " " << d;
        }
      }
}

TEST(EmptyRows, Float32) { forward_and_backward<float>(); }
TEST(EmptyRows, Float64) { forward_and_backward<double>(); }

TEST(EmptyRows, RefusesWhatItsRuleDoesNotCover) {
  const AttnParams plain = test::plain_call(2, 64, 64, 4, 2, 32, 32, 0.2f);
  EXPECT_TRUE(validate_average_empty_rows(plain, 0).ok());
  EXPECT_TRUE(validate_average_empty_rows(plain, 2).ok());
  auto refused = [](AttnParams p, int64_t cols, const char* what) {
    const Status s = validate_average_empty_rows(p, cols);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
    EXPECT_NE(s.message.find("backend_flags"), std::string::npos) << s.message;
  };
  AttnParams p = plain;
  p.layout = FA_THD_THD_THD;
  refused(p, 0, "THD");
  p = plain;
  p.softmax_type = FA_OFF_BY_ONE_SOFTMAX;
  refused(p, 0, "softmax offset");
  p = plain;
  p.is_training = 1, p.dropout = 0.1f;
  refused(p, 0, "dropout");
  refused(plain, 6, "block");
}

}  // namespace
}  // namespace fusedattn::cpu
