// The CPU small-seq kernels against a naive double-precision reference, and the
// small-seq validation rules.
//
// The reference follows the definitions (segments.h), not the kernels' code: segment s
// of a THD tensor owns rows [off[s], off[s+1]) (clamped to the tensor, never ending
// before it starts) and uses the first min(len, slot) of them; query row r of a segment
// keeps the keys j < hi(r) (no causal mask: kv_len; top-left: r + 1; bottom-right:
// r + 1 + kv_len - q_len, clamped); weights are the softmax of scale * q.k over the kept
// keys; rows no segment uses have output 0, P 0 and statistics -inf, and gradient 0.
// Inputs are random normals rounded to the storage dtype and read back in double; the
// kernels' outputs are poisoned with NaN before each call, so every element must be
// written. The backward's delta is the exact sum_j P_j dP_j here (the kernels use
// dout . out, which equals it up to the rounding of out).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fusedattn/small_seq/cpu/small_seq.h"
#include "fusedattn/small_seq/validate.h"

namespace fusedattn::small_seq {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// n elements of one storage dtype, written as rounded floats and read back as doubles.
class Tensor {
 public:
  Tensor(int32_t dtype, int64_t n) : dtype_(dtype), n_(n), bytes_(n * (dtype == FA_FLOAT32 ? 4 : 2) + 16) {}
  void* data() { return bytes_.data(); }
  int64_t size() const { return n_; }
  double get(int64_t i) const {
    if (dtype_ == FA_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes_[4 * i], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes_[2 * i], 2);
    if (dtype_ == FA_FLOAT16) {
      _Float16 x;
      std::memcpy(&x, &h, 2);
      return static_cast<double>(x);
    }
    const uint32_t u = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  void set(int64_t i, float x) {
    if (dtype_ == FA_FLOAT32) {
      std::memcpy(&bytes_[4 * i], &x, 4);
    } else if (dtype_ == FA_FLOAT16) {
      const _Float16 h = static_cast<_Float16>(x);
      std::memcpy(&bytes_[2 * i], &h, 2);
    } else {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u += 0x7fffu + ((u >> 16) & 1u);
      const uint16_t h = uint16_t(u >> 16);
      std::memcpy(&bytes_[2 * i], &h, 2);
    }
  }
  void poison() { std::memset(bytes_.data(), 0xff, bytes_.size()); }
  void fill_normal(std::mt19937& rng) {
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < n_; ++i) set(i, normal(rng));
  }

 private:
  int32_t dtype_;
  int64_t n_;
  std::vector<unsigned char> bytes_;
};

struct Problem {
  SmallSeqParams p{};
  std::vector<int32_t> q_off, kv_off, q_len, kv_len;  // empty lengths: whole slots
};

// THD segments: kv lengths as given, one query each unless q_lens says otherwise; every
// slot has `pad` extra rows and `tail` rows follow the last slot.
Problem thd(int32_t dtype, int32_t mask, std::vector<int32_t> kv_lens, int64_t width,
            int64_t hq, int64_t hkv, int64_t d, std::vector<int32_t> q_lens = {}, int pad = 1,
            int tail = 2) {
  Problem pr;
  const int64_t n = static_cast<int64_t>(kv_lens.size());
  if (q_lens.empty()) q_lens.assign(n, 1);
  pr.q_off.push_back(0);
  pr.kv_off.push_back(0);
  for (int64_t s = 0; s < n; ++s) {
    pr.q_off.push_back(pr.q_off.back() + q_lens[s] + (s % 2 ? pad : 0));
    pr.kv_off.push_back(pr.kv_off.back() + kv_lens[s] + pad);
  }
  pr.q_len = q_lens;
  pr.kv_len = kv_lens;
  SmallSeqParams& p = pr.p;
  p.packs = 1;
  p.num_segments = n;
  p.tokens_q = pr.q_off.back() + tail;
  p.tokens_kv = pr.kv_off.back() + tail;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim_qk = p.head_dim_v = d;
  p.max_seqlen_q = 1;
  p.max_seqlen_kv = width;
  p.window_left = p.window_right = -1;
  p.dtype = dtype;
  p.layout = FA_THD_THD_THD;
  p.mask_type = mask;
  p.is_training = 1;
  p.has_q_seqlens = p.has_kv_seqlens = p.has_offsets = 1;
  p.scale = float(1.0 / std::sqrt(double(d)));
  return pr;
}

struct Seg {
  int64_t begin, len;
};

Seg segment(const std::vector<int32_t>& off, const std::vector<int32_t>& len, int64_t s,
            int64_t tokens) {
  const int64_t start = std::clamp<int64_t>(off[s], 0, tokens);
  const int64_t next = std::clamp<int64_t>(off[s + 1], start, tokens);
  return {start, len.empty() ? next - start : std::clamp<int64_t>(len[s], 0, next - start)};
}

int64_t hi(int32_t mask, int64_t r, int64_t ql, int64_t kl) {
  if (mask == FA_PADDING_CAUSAL_MASK || mask == FA_CAUSAL_MASK)
    return std::min(kl, r + 1);
  if (mask == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK || mask == FA_CAUSAL_BOTTOM_RIGHT_MASK)
    return std::clamp<int64_t>(r + 1 + kl - ql, 0, kl);
  return kl;
}

struct Expected {
  std::vector<double> out, probs, stats, dq, dk, dv;
};

Expected reference(const Problem& pr, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& dout) {
  const SmallSeqParams& p = pr.p;
  const int64_t Hq = p.heads_q, Hkv = p.heads_kv, g = Hq / Hkv, D = p.head_dim_qk;
  const int64_t W = p.max_seqlen_kv;
  Expected e;
  e.out.assign(p.tokens_q * Hq * D, 0.0);
  e.dq.assign(p.tokens_q * Hq * D, 0.0);
  e.probs.assign(p.tokens_q * Hq * W, 0.0);
  e.stats.assign(p.tokens_q * Hq * 2, -kInf);
  e.dk.assign(p.tokens_kv * Hkv * D, 0.0);
  e.dv.assign(p.tokens_kv * Hkv * D, 0.0);
  for (int64_t s = 0; s < p.num_segments; ++s) {
    const Seg qs = segment(pr.q_off, pr.q_len, s, p.tokens_q);
    const Seg ks = segment(pr.kv_off, pr.kv_len, s, p.tokens_kv);
    for (int64_t r = 0; r < qs.len; ++r) {
      const int64_t t = qs.begin + r, n = hi(p.mask_type, r, qs.len, ks.len);
      for (int64_t h = 0; h < Hq; ++h) {
        if (n == 0) continue;
        const int64_t hk = h / g, qi = (t * Hq + h) * D;
        std::vector<double> sc(n), dp(n);
        double m = -kInf;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ki = ((ks.begin + j) * Hkv + hk) * D;
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += q.get(qi + d) * k.get(ki + d);
          sc[j] = p.scale * acc;
          m = std::max(m, sc[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < n; ++j) l += std::exp(sc[j] - m);
        double delta = 0;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t vi = ((ks.begin + j) * Hkv + hk) * D;
          const double pj = std::exp(sc[j] - m) / l;
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) {
            e.out[qi + d] += pj * v.get(vi + d);
            acc += dout.get(qi + d) * v.get(vi + d);
          }
          dp[j] = acc;
          delta += pj * acc;
          if (j < W) e.probs[(t * Hq + h) * W + j] = pj;
        }
        e.stats[(t * Hq + h) * 2] = m;
        e.stats[(t * Hq + h) * 2 + 1] = m + std::log(l);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ki = ((ks.begin + j) * Hkv + hk) * D;
          const double pj = std::exp(sc[j] - m) / l, ds = pj * (dp[j] - delta);
          for (int64_t d = 0; d < D; ++d) {
            e.dq[qi + d] += p.scale * ds * k.get(ki + d);
            e.dk[ki + d] += p.scale * ds * q.get(qi + d);
            e.dv[ki + d] += pj * dout.get(qi + d);
          }
        }
      }
    }
  }
  return e;
}

// |got - want| <= tol * max(1, max |want|), and no NaN (an unwritten, poisoned element).
template <class Get>
void expect_close(const char* name, int64_t n, Get got, const std::vector<double>& want,
                  double tol) {
  double scale = 1.0;
  for (double w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(w));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = got(i);
    const bool ok = std::isinf(want[i]) ? x == want[i] : std::abs(x - want[i]) <= tol * scale;
    if (!ok && bad++ < 3)
      ADD_FAILURE() << name << "[" << i << "] = " << x << ", expected " << want[i];
  }
  EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << n << " elements off";
}

void run(const Problem& pr, uint32_t seed) {
  const SmallSeqParams& p = pr.p;
  ASSERT_TRUE(validate(p).ok()) << validate(p).message;
  const int32_t dt = p.dtype;
  const int64_t nq = p.tokens_q * p.heads_q * p.head_dim_qk;
  const int64_t nk = p.tokens_kv * p.heads_kv * p.head_dim_qk;
  std::mt19937 rng(seed);
  Tensor q(dt, nq), k(dt, nk), v(dt, nk), dout(dt, nq), out(dt, nq), dq(dt, nq), dk(dt, nk),
      dv(dt, nk);
  q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng), dout.fill_normal(rng);
  std::vector<float> probs(p.tokens_q * p.heads_q * p.max_seqlen_kv,
                           std::numeric_limits<float>::quiet_NaN());
  std::vector<float> stats(p.tokens_q * p.heads_q * 2, std::numeric_limits<float>::quiet_NaN());
  out.poison(), dq.poison(), dk.poison(), dv.poison();

  const Segments seg = make_segments(p, pr.q_len.empty() ? nullptr : pr.q_len.data(),
                                     pr.kv_len.empty() ? nullptr : pr.kv_len.data(),
                                     pr.q_off.data(), pr.kv_off.data());
  FwdArgs f{q.data(), k.data(), v.data(), seg, out.data(), probs.data(), stats.data(), true};
  cpu::small_seq_fwd(p, f);
  BwdArgs b{q.data(), k.data(), v.data(), out.data(), dout.data(), probs.data(), stats.data(),
            seg, dq.data(), dk.data(), dv.data()};
  cpu::small_seq_bwd(p, b);

  const Expected e = reference(pr, q, k, v, dout);
  // Storage rounding of the outputs (and, in the backward, of out inside delta).
  const double tol = dt == FA_FLOAT32 ? 2e-5 : dt == FA_BFLOAT16 ? 2e-2 : 3e-3;
  expect_close("out", nq, [&](int64_t i) { return out.get(i); }, e.out, tol);
  expect_close("probs", probs.size(), [&](int64_t i) { return double(probs[i]); }, e.probs, 2e-6);
  expect_close("stats", stats.size(), [&](int64_t i) { return double(stats[i]); }, e.stats, 2e-5);
  expect_close("dq", nq, [&](int64_t i) { return dq.get(i); }, e.dq, tol);
  expect_close("dk", nk, [&](int64_t i) { return dk.get(i); }, e.dk, tol);
  expect_close("dv", nk, [&](int64_t i) { return dv.get(i); }, e.dv, tol);
}

class SmallSeqCpu : public ::testing::TestWithParam<int32_t> {};

TEST_P(SmallSeqCpu, EveryKvLengthTo16) {
  std::vector<int32_t> lens;
  for (int32_t i = 16; i >= 0; --i) lens.push_back(i);
  run(thd(GetParam(), FA_PADDING_MASK, lens, 16, 4, 2, 64), 1);
}

TEST_P(SmallSeqCpu, HeadDims) {
  for (int64_t d : {128, 256, 512}) run(thd(GetParam(), FA_PADDING_MASK, {3, 0, 5}, 8, 2, 1, d), 2);
}

TEST_P(SmallSeqCpu, Masks) {
  for (int32_t mask : {FA_PADDING_CAUSAL_MASK, FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK})
    run(thd(GetParam(), mask, {4, 1, 0, 6}, 8, 2, 2, 64), 3);
}

TEST_P(SmallSeqCpu, BrokenPromisesStayExact) {
  // Keys past the width of P and more than one query per segment.
  run(thd(GetParam(), FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, {9, 2, 13, 0}, 4, 3, 1, 64,
          {2, 1, 3, 1}),
      4);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SmallSeqCpu,
                         ::testing::Values(FA_FLOAT32, FA_BFLOAT16, FA_FLOAT16),
                         [](const auto& info) {
                           return std::string(info.param == FA_FLOAT32    ? "f32"
                                              : info.param == FA_BFLOAT16 ? "bf16"
                                                                          : "f16");
                         });

TEST(SmallSeqCpu, OffsetsPastTheTensorsAreClamped) {
  Problem pr = thd(FA_FLOAT32, FA_PADDING_MASK, {3, 4, 2}, 4, 2, 2, 64);
  pr.q_off.back() = 1000;
  pr.kv_off.back() = 1 << 30;
  pr.kv_len = {7, 9, 50};
  pr.q_len = {1, 1, 20};
  run(pr, 5);
}

TEST(SmallSeqCpu, WholeSlotsWithoutLengths) {
  Problem pr = thd(FA_BFLOAT16, FA_PADDING_MASK, {3, 4, 2}, 8, 2, 2, 64);
  pr.q_len.clear();
  pr.kv_len.clear();
  pr.p.has_q_seqlens = pr.p.has_kv_seqlens = 0;
  run(pr, 6);
}

// --- validation ------------------------------------------------------------------

SmallSeqParams valid() { return thd(FA_BFLOAT16, FA_PADDING_MASK, {3, 2}, 16, 8, 2, 128).p; }

void expect_error(SmallSeqParams p, int32_t code, const std::string& what) {
  const Status s = validate(p);
  EXPECT_EQ(s.code, code) << s.message;
  EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
}

TEST(SmallSeqValidate, AcceptsTheWorkload) { EXPECT_TRUE(validate(valid()).ok()); }

TEST(SmallSeqValidate, Rejections) {
  SmallSeqParams p = valid();
  p.head_dim_qk = p.head_dim_v = 96;
  expect_error(p, FA_UNIMPLEMENTED, "allowed 64, 128, 256 or 512");
  p = valid();
  p.max_seqlen_kv = 65;
  expect_error(p, FA_INVALID_ARGUMENT, "max_segment_seqlen_kv: got 65");
  p = valid();
  p.max_seqlen_q = 2;
  expect_error(p, FA_INVALID_ARGUMENT, "one query per segment");
  p = valid();
  p.mask_type = FA_NO_MASK;
  expect_error(p, FA_INVALID_ARGUMENT, "padding mask");
  p = valid();
  p.bias_type = FA_POST_SCALE_BIAS;
  expect_error(p, FA_UNIMPLEMENTED, "attn_bias_type");
  p = valid();
  p.dropout = 0.1f;
  expect_error(p, FA_UNIMPLEMENTED, "dropout_probability");
  p = valid();
  p.heads_q = 7;
  expect_error(p, FA_INVALID_ARGUMENT, "multiple");
  p = valid();
  p.has_offsets = 0;
  expect_error(p, FA_INVALID_ARGUMENT, "offsets");
  p = valid();
  p.layout = FA_BS3HD;
  expect_error(p, FA_UNIMPLEMENTED, "BSHD_BSHD_BSHD or THD_THD_THD");
  p = valid();
  p.window_left = 3;
  expect_error(p, FA_UNIMPLEMENTED, "window_size");
  p = valid();
  p.tokens_kv = int64_t{1} << 32;
  expect_error(p, FA_INVALID_ARGUMENT, "k/v tokens");
}

TEST(SmallSeqValidate, EligibilityNamesThePlatform) {
  EXPECT_TRUE(eligibility(valid(), FA_PLATFORM_CPU, false).served);
  const Eligibility e = eligibility(valid(), FA_PLATFORM_CUDA, false);
  EXPECT_FALSE(e.served);
  EXPECT_NE(e.reason.find("no CUDA"), std::string::npos) << e.reason;
  EXPECT_TRUE(eligibility(valid(), FA_PLATFORM_CUDA, true).served);
}

}  // namespace
}  // namespace fusedattn::small_seq
