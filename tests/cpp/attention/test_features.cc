// The feature set of the CPU engine against a naive double-precision reference
// written from the definitions (reference.py's docstring), not from mask.cc:
// THD segments (several per row, with gaps, length 0 and 1), sliding windows,
// PRE/POST_SCALE_BIAS with broadcasting and dbias, OFF_BY_ONE / LEARNABLE
// softmax with d softmax_offset, dropout (the keep rule of philox.h), and
// vmap slices (per-slice seed, softmax_offset and bias); float64 cases at 1e-12 (the
// engine in double: softmax_offset, lse, max_logit and d softmax_offset in float64).
//
// Shapes: q [B, Sq, Hq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv] contiguous;
// bias [slices, bB, bH, Sq, Skv]; lse [B, Hq, Sq] (BSHD) or [B, Sq, Hq] (THD).
// Outputs are poisoned with NaN before every call.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "harness.h"
#include "fusedattn/attention/cpu/attention.h"
#include "fusedattn/core/philox.h"
#include "fusedattn/attention/validate.h"

namespace fusedattn::cpu {
namespace {

using namespace fusedattn::testing;
using Segs = std::vector<std::vector<int32_t>>;  // [B][M]

struct Case {
  std::string name;
  int32_t dtype, layout, mask;
  int64_t B, Sq, Skv, Hq, Hkv, D, Dv;
  Segs q_lens, kv_lens, q_offs, kv_offs;  // THD: [B][M] and [B][M + 1]; BSHD padding: [B][1]
  int64_t left = -1, right = -1;
  int32_t bias_type = FA_NO_BIAS;
  int64_t bias_b = 0, bias_h = 0;
  int32_t softmax = FA_VANILLA_SOFTMAX;
  float dropout = 0.0f;
  int64_t slices = 1;
  bool neg_inf_bias = false;  // some bias entries -inf, and one query row all -inf
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Problem {
  Case c;
  AttnParams p;
  std::vector<int32_t> q_lens, kv_lens, q_offs, kv_offs;  // flattened [B, M], [B, M + 1]
  std::vector<double> bias;                               // [slices, bB, bH, Sq, Skv]
  std::vector<double> offset;                             // [slices, Hq]
  std::vector<uint32_t> seed;                             // [slices, 2]
  int64_t M = 1;

  int64_t bs() const { return c.B / c.slices; }
  double bias_at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t bb = c.bias_b == 1 ? 0 : b % bs(), bh = c.bias_h == 1 ? 0 : h;
    return bias[((((b / bs()) * c.bias_b + bb) * c.bias_h + bh) * c.Sq + i) * c.Skv + j];
  }
  int64_t bias_index(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t bb = c.bias_b == 1 ? 0 : b % bs(), bh = c.bias_h == 1 ? 0 : h;
    return ((((b / bs()) * c.bias_b + bb) * c.bias_h + bh) * c.Sq + i) * c.Skv + j;
  }
  int64_t lse_index(int64_t b, int64_t h, int64_t i) const {
    return is_thd(c.layout) ? (b * c.Sq + i) * c.Hq + h : (b * c.Hq + h) * c.Sq + i;
  }

  // The segment of query i of row b (-1: padding) and whether it keeps key j.
  int64_t q_segment(int64_t b, int64_t i) const {
    int64_t found = -1;
    for (int64_t s = 0; s < M; ++s) {
      const int64_t lo = is_thd(c.layout) ? q_offs[b * (M + 1) + s] : 0;
      const int64_t len = has_padding(c.mask) ? q_lens[b * M + s] : c.Sq;
      if (i >= lo && i < lo + len) found = s;
    }
    return found;
  }
  bool keep(int64_t b, int64_t i, int64_t j) const {
    const int64_t s = q_segment(b, i);
    if (s < 0) return false;
    const int64_t qlo = is_thd(c.layout) ? q_offs[b * (M + 1) + s] : 0;
    const int64_t klo = is_thd(c.layout) ? kv_offs[b * (M + 1) + s] : 0;
    const int64_t qlen = has_padding(c.mask) ? q_lens[b * M + s] : c.Sq;
    const int64_t klen = has_padding(c.mask) ? kv_lens[b * M + s] : c.Skv;
    const int64_t li = i - qlo, lj = j - klo;
    if (lj < 0 || lj >= klen) return false;
    const int64_t diag = is_causal_bottom_right(c.mask) ? klen - qlen : 0;
    const int64_t right = is_causal(c.mask) ? 0 : c.right;
    if (c.left >= 0 && lj < li + diag - c.left) return false;
    if (right >= 0 && lj > li + diag + right) return false;
    return true;
  }
  // Dropout factor z(b, h, i, j), from the documented counter layout.
  double z(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (c.dropout == 0.0f) return 1.0;
    const uint32_t* s = &seed[2 * (b / bs())];
    const Philox4 w = philox4x32_10(
        Philox4{{uint32_t(j / 4), uint32_t(i), uint32_t(h), uint32_t(b % bs())}}, s[0], s[1]);
    const double thr = std::floor(double(c.dropout) * 4294967296.0);
    return w.v[j % 4] >= thr ? 1.0 / (1.0 - double(c.dropout)) : 0.0;
  }
  double sink(int64_t b, int64_t h) const {
    if (c.softmax == FA_OFF_BY_ONE_SOFTMAX) return 0.0;
    if (c.softmax == FA_LEARNABLE_SOFTMAX) return offset[(b / bs()) * c.Hq + h];
    return -kInf;
  }
};

Problem make(const Case& c, std::mt19937& rng) {
  Problem pr;
  pr.c = c;
  AttnParams& p = pr.p;
  p = AttnParams{};
  p.batch = c.B, p.seqlen_q = c.Sq, p.seqlen_kv = c.Skv, p.heads_q = c.Hq, p.heads_kv = c.Hkv;
  p.head_dim_qk = c.D, p.head_dim_v = c.Dv, p.window_left = c.left, p.window_right = c.right;
  pr.M = c.q_lens.empty() ? 1 : int64_t(c.q_lens[0].size());
  p.max_segments = pr.M, p.num_slices = c.slices;
  p.bias_batch = c.bias_b, p.bias_heads = c.bias_h, p.bias_type = c.bias_type;
  p.dtype = c.dtype, p.layout = c.layout, p.mask_type = c.mask, p.softmax_type = c.softmax;
  p.is_training = 1, p.dropout = c.dropout, p.scale = float(1.0 / std::sqrt(double(c.D)));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t s = 0; s < pr.M; ++s) {
      pr.q_lens.push_back(c.q_lens.empty() ? int32_t(c.Sq) : c.q_lens[b][s]);
      pr.kv_lens.push_back(c.kv_lens.empty() ? int32_t(c.Skv) : c.kv_lens[b][s]);
    }
    for (int64_t s = 0; s <= pr.M; ++s) {
      pr.q_offs.push_back(c.q_offs.empty() ? 0 : c.q_offs[b][s]);
      pr.kv_offs.push_back(c.kv_offs.empty() ? 0 : c.kv_offs[b][s]);
    }
  }
  std::normal_distribution<float> normal;
  if (c.bias_type != FA_NO_BIAS) {
    pr.bias.resize(c.slices * c.bias_b * c.bias_h * c.Sq * c.Skv);
    for (size_t i = 0; i < pr.bias.size(); ++i) {
      pr.bias[i] = normal(rng);
      if (c.neg_inf_bias && (i % 7 == 3 || i / c.Skv == 5)) pr.bias[i] = -kInf;  // row 5: all -inf
    }
  }
  for (int64_t i = 0; i < c.slices * c.Hq; ++i) pr.offset.push_back(normal(rng));
  for (int64_t i = 0; i < 2 * c.slices; ++i) pr.seed.push_back(uint32_t(rng()));
  return pr;
}

struct Ref {
  std::vector<double> out, out_mag, lse, max_logit, dq, dq_mag, dk, dk_mag, dv, dv_mag, dbias,
      dbias_mag, dsink, dsink_mag;
};

Ref reference(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
              const std::vector<double>& v, const std::vector<double>& dout) {
  const Case& c = pr.c;
  const int64_t g = c.Hq / c.Hkv;
  const double scale = pr.p.scale, bmul = c.bias_type == FA_PRE_SCALE_BIAS ? scale : 1.0;
  Ref r;
  r.out.assign(c.B * c.Sq * c.Hq * c.Dv, 0.0);
  r.out_mag = r.out;
  r.lse.assign(c.B * c.Sq * c.Hq, -kInf);
  r.max_logit.assign(c.B * c.Hq, -kInf);
  r.dq.assign(c.B * c.Sq * c.Hq * c.D, 0.0);
  r.dq_mag = r.dq;
  r.dk.assign(c.B * c.Skv * c.Hkv * c.D, 0.0);
  r.dk_mag = r.dk;
  r.dv.assign(c.B * c.Skv * c.Hkv * c.Dv, 0.0);
  r.dv_mag = r.dv;
  r.dbias.assign(pr.bias.size(), 0.0);
  r.dbias_mag = r.dbias;
  r.dsink.assign(c.B * c.Hq, 0.0);
  r.dsink_mag = r.dsink;
  auto Q = [&](int64_t b, int64_t i, int64_t h, int64_t d) { return ((b * c.Sq + i) * c.Hq + h) * c.D + d; };
  auto K = [&](int64_t b, int64_t j, int64_t h, int64_t d) { return ((b * c.Skv + j) * c.Hkv + h) * c.D + d; };
  auto V = [&](int64_t b, int64_t j, int64_t h, int64_t d) { return ((b * c.Skv + j) * c.Hkv + h) * c.Dv + d; };
  auto O = [&](int64_t b, int64_t i, int64_t h, int64_t d) { return ((b * c.Sq + i) * c.Hq + h) * c.Dv + d; };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / g;
      const double sink = pr.sink(b, h);
      for (int64_t i = 0; i < c.Sq; ++i) {
        if (pr.q_segment(b, i) < 0) continue;  // padding: out 0, lse -inf, no gradient
        std::vector<double> s(c.Skv, -kInf);
        double m = sink;
        for (int64_t j = 0; j < c.Skv; ++j) {
          if (!pr.keep(b, i, j)) continue;
          double dot = 0.0;
          for (int64_t d = 0; d < c.D; ++d) dot += q[Q(b, i, h, d)] * k[K(b, j, hk, d)];
          s[j] = scale * dot + (c.bias_type != FA_NO_BIAS ? bmul * pr.bias_at(b, h, i, j) : 0.0);
          r.max_logit[b * c.Hq + h] = std::max(r.max_logit[b * c.Hq + h], s[j]);
          m = std::max(m, s[j]);
        }
        if (m == -kInf) continue;  // VANILLA with nothing kept: out 0, lse -inf
        double l = sink > -kInf ? std::exp(sink - m) : 0.0;
        for (int64_t j = 0; j < c.Skv; ++j) l += s[j] > -kInf ? std::exp(s[j] - m) : 0.0;
        const double lse = m + std::log(l);
        r.lse[pr.lse_index(b, h, i)] = lse;
        std::vector<double> P(c.Skv, 0.0), Z(c.Skv, 0.0);
        for (int64_t j = 0; j < c.Skv; ++j) {
          if (s[j] == -kInf) continue;
          P[j] = std::exp(s[j] - lse);
          Z[j] = pr.z(b, h, i, j);
          for (int64_t d = 0; d < c.Dv; ++d) {
            r.out[O(b, i, h, d)] += Z[j] * P[j] * v[V(b, j, hk, d)];
            r.out_mag[O(b, i, h, d)] += Z[j] * P[j] * std::fabs(v[V(b, j, hk, d)]);
          }
        }
        double delta = 0.0;
        for (int64_t d = 0; d < c.Dv; ++d) delta += dout[O(b, i, h, d)] * r.out[O(b, i, h, d)];
        double delta_mag = 0.0;
        for (int64_t d = 0; d < c.Dv; ++d) delta_mag += std::fabs(dout[O(b, i, h, d)] * r.out[O(b, i, h, d)]);
        if (sink > -kInf) {
          r.dsink[b * c.Hq + h] -= std::exp(sink - lse) * delta;
          r.dsink_mag[b * c.Hq + h] += std::exp(sink - lse) * delta_mag;
        }
        for (int64_t j = 0; j < c.Skv; ++j) {
          if (P[j] == 0.0) continue;
          double dp = 0.0;
          for (int64_t d = 0; d < c.Dv; ++d) dp += dout[O(b, i, h, d)] * v[V(b, j, hk, d)];
          const double ds = P[j] * (Z[j] * dp - delta);
          const double ds_mag = P[j] * (Z[j] * std::fabs(dp) + std::fabs(delta));
          for (int64_t d = 0; d < c.Dv; ++d) {
            r.dv[V(b, j, hk, d)] += Z[j] * P[j] * dout[O(b, i, h, d)];
            r.dv_mag[V(b, j, hk, d)] += Z[j] * P[j] * std::fabs(dout[O(b, i, h, d)]);
          }
          for (int64_t d = 0; d < c.D; ++d) {
            r.dq[Q(b, i, h, d)] += scale * ds * k[K(b, j, hk, d)];
            r.dk[K(b, j, hk, d)] += scale * ds * q[Q(b, i, h, d)];
            r.dq_mag[Q(b, i, h, d)] += scale * ds_mag * std::fabs(k[K(b, j, hk, d)]);
            r.dk_mag[K(b, j, hk, d)] += scale * ds_mag * std::fabs(q[Q(b, i, h, d)]);
          }
          if (c.bias_type != FA_NO_BIAS) {
            r.dbias[pr.bias_index(b, h, i, j)] += bmul * ds;
            r.dbias_mag[pr.bias_index(b, h, i, j)] += std::fabs(bmul) * ds_mag;
          }
        }
      }
    }
  return r;
}

void check(const Case& c) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(uint32_t(std::hash<std::string>{}(c.name)));
  const Problem pr = make(c, rng);
  const Status st = validate(pr.p);
  ASSERT_TRUE(st.ok()) << st.message;
  Tensor q(c.dtype, c.B * c.Sq * c.Hq * c.D), k(c.dtype, c.B * c.Skv * c.Hkv * c.D);
  Tensor v(c.dtype, c.B * c.Skv * c.Hkv * c.Dv), dout(c.dtype, c.B * c.Sq * c.Hq * c.Dv);
  Tensor bias(c.dtype, int64_t(pr.bias.size()));
  q.fill_normal(rng), k.fill_normal(rng), v.fill_normal(rng), dout.fill_normal(rng);
  for (size_t i = 0; i < pr.bias.size(); ++i) bias.set(int64_t(i), pr.bias[i]);
  Problem rounded = pr;  // the reference reads the bias as stored
  rounded.bias = bias.values();
  const Ref ref = reference(rounded, q.values(), k.values(), v.values(), dout.values());

  const int32_t sdt = stat_dtype(c.dtype);
  Tensor offset(sdt, int64_t(pr.offset.size()));
  for (size_t i = 0; i < pr.offset.size(); ++i) offset.set(int64_t(i), pr.offset[i]);
  Extras x;
  x.seq = {pr.q_lens.data(), pr.kv_lens.data(), pr.q_offs.data(), pr.kv_offs.data()};
  x.bias = c.bias_type != FA_NO_BIAS ? bias.data() : nullptr;
  x.sbias = BiasStrides::dense(pr.p);
  x.softmax_offset = offset.data();
  x.seed = pr.seed.data();
  x.scale64 = pr.p.scale, x.dropout64 = pr.p.dropout;
  const Strides sq = Strides::bshd(c.Sq, c.Hq, c.D), sk = Strides::bshd(c.Skv, c.Hkv, c.D);
  const Strides sv = Strides::bshd(c.Skv, c.Hkv, c.Dv), so = Strides::bshd(c.Sq, c.Hq, c.Dv);
  Tensor out(c.dtype, c.B * c.Sq * c.Hq * c.Dv);
  out.poison();
  Tensor lse(sdt, c.B * c.Sq * c.Hq), max_logit(sdt, c.B * c.Hq);
  lse.poison(), max_logit.poison();
  attention_fwd(pr.p, FwdArgs{q.data(), k.data(), v.data(), out.data(), lse.data(), max_logit.data(),
                              sq, sk, sv, so, lse_strides(pr.p), x});
  const Tol tol = tol_for(c.dtype);
  EXPECT_TRUE(close(out.values(), ref.out, ref.out_mag, tol)) << "out";
  EXPECT_TRUE(close_logits(lse.values(), ref.lse, logit_tol(c.dtype))) << "lse";
  EXPECT_TRUE(close_logits(max_logit.values(), ref.max_logit, logit_tol(c.dtype))) << "max_logit";

  Tensor dq(c.dtype, q.size()), dk(c.dtype, k.size()), dv(c.dtype, v.size()), dbias(c.dtype, bias.size());
  dq.poison(), dk.poison(), dv.poison(), dbias.poison();
  Tensor dsink(sdt, c.B * c.Hq);
  dsink.poison();
  const bool learnable = c.softmax == FA_LEARNABLE_SOFTMAX;
  attention_bwd(pr.p, BwdArgs{q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(),
                              dq.data(), dk.data(), dv.data(), x.bias ? dbias.data() : nullptr,
                              learnable ? dsink.data() : nullptr, sq, sk, sv, so, so,
                              lse_strides(pr.p), sq, sk, sv, x});
  // The engine's backward starts from its own (rounded) out; in low precision
  // that alone moves the gradients by about the forward's tolerance.
  EXPECT_TRUE(close(dq.values(), ref.dq, ref.dq_mag, tol)) << "dq";
  EXPECT_TRUE(close(dk.values(), ref.dk, ref.dk_mag, tol)) << "dk";
  EXPECT_TRUE(close(dv.values(), ref.dv, ref.dv_mag, tol)) << "dv";
  if (x.bias) EXPECT_TRUE(close(dbias.values(), ref.dbias, ref.dbias_mag, tol)) << "dbias";
  if (learnable) EXPECT_TRUE(close(dsink.values(), ref.dsink, ref.dsink_mag, tol)) << "dsoftmax_offset";
}

class Features : public ::testing::TestWithParam<Case> {};
TEST_P(Features, ForwardAndBackwardMatchReference) { check(GetParam()); }

// THD rows with several segments: gaps between segments, lengths 0 and 1, a
// segment whose queries see no keys, and padding tokens at the row's end.
const Segs kThdQLens{{40, 0, 1, 70}, {150, 0, 0, 0}}, kThdKvLens{{50, 3, 1, 0}, {120, 9, 0, 0}};
const Segs kThdQOffs{{0, 45, 45, 50, 120}, {0, 150, 150, 150, 150}};
const Segs kThdKvOffs{{10, 60, 63, 64, 64}, {0, 121, 130, 130, 130}};

Case thd(std::string name, int32_t dtype, int32_t mask) {
  Case c{name, dtype, FA_THD_THD_THD, mask, 2, 150, 140, 4, 2, 32, 24,
         kThdQLens, kThdKvLens, kThdQOffs, kThdKvOffs};
  return c;
}

Case bshd(std::string name, int32_t dtype, int32_t mask, int64_t Sq = 90, int64_t Skv = 110) {
  Case c{name, dtype, FA_BSHD_BSHD_BSHD, mask, 2, Sq, Skv, 4, 2, 32, 32, {}, {}, {}, {}};
  if (has_padding(mask)) c.q_lens = {{int32_t(Sq / 2)}, {int32_t(Sq)}}, c.kv_lens = {{int32_t(Skv)}, {1}};
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back(thd("thd_padding_f32", FA_FLOAT32, FA_PADDING_MASK));
  v.push_back(thd("thd_causal_gqa_bf16", FA_BFLOAT16, FA_PADDING_CAUSAL_MASK));
  v.push_back(thd("thd_bottom_right_f16", FA_FLOAT16, FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK));
  Case w = thd("thd_window_both_sides_f32", FA_FLOAT32, FA_PADDING_MASK);
  w.left = 3, w.right = 5;
  v.push_back(w);
  w = thd("thd_causal_window_dropout_f32", FA_FLOAT32, FA_PADDING_CAUSAL_MASK);
  w.left = 16, w.dropout = 0.25f;
  v.push_back(w);
  w = thd("thd_everything_bf16", FA_BFLOAT16, FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK);
  w.left = 20, w.dropout = 0.1f, w.softmax = FA_LEARNABLE_SOFTMAX;
  w.bias_type = FA_POST_SCALE_BIAS, w.bias_b = 1, w.bias_h = 4;
  v.push_back(w);
  for (int32_t bt : {FA_POST_SCALE_BIAS, FA_PRE_SCALE_BIAS})
    for (auto [bb, bh] : {std::pair<int64_t, int64_t>{1, 1}, {2, 1}, {1, 4}, {2, 4}}) {
      Case c = bshd(std::string(bias_name(bt)) + "_" + std::to_string(bb) + "x" + std::to_string(bh),
                    bb == bh ? FA_FLOAT32 : FA_BFLOAT16, FA_PADDING_CAUSAL_MASK);
      c.bias_type = bt, c.bias_b = bb, c.bias_h = bh;
      v.push_back(c);
    }
  Case c = bshd("neg_inf_bias_f32", FA_FLOAT32, FA_CAUSAL_MASK);
  c.bias_type = FA_POST_SCALE_BIAS, c.bias_b = 2, c.bias_h = 1, c.neg_inf_bias = true;
  v.push_back(c);
  c = bshd("off_by_one_br_sq_gt_skv_f32", FA_FLOAT32, FA_CAUSAL_BOTTOM_RIGHT_MASK, 130, 60);
  c.softmax = FA_OFF_BY_ONE_SOFTMAX;
  v.push_back(c);
  c = bshd("learnable_padding_f16", FA_FLOAT16, FA_PADDING_MASK);
  c.softmax = FA_LEARNABLE_SOFTMAX;
  v.push_back(c);
  c = bshd("sliding_window_sink_f32", FA_FLOAT32, FA_CAUSAL_MASK, 200, 200);
  c.left = 40, c.softmax = FA_LEARNABLE_SOFTMAX;
  v.push_back(c);
  c = bshd("window_no_mask_sq_lt_skv_bf16", FA_BFLOAT16, FA_NO_MASK, 70, 190);
  c.left = 0, c.right = 70;
  v.push_back(c);
  c = bshd("dropout_causal_gqa_f32", FA_FLOAT32, FA_CAUSAL_MASK);
  c.dropout = 0.4f;
  v.push_back(c);
  c = bshd("dropout_bias_f16", FA_FLOAT16, FA_PADDING_MASK);
  c.dropout = 0.2f, c.bias_type = FA_PRE_SCALE_BIAS, c.bias_b = 1, c.bias_h = 1;
  v.push_back(c);
  c = bshd("mla_head_dims_f32", FA_FLOAT32, FA_CAUSAL_MASK);
  c.D = 48, c.Dv = 16;
  v.push_back(c);
  // vmap: B = 4 in 2 slices, each with its own seed, softmax_offset and bias.
  c = bshd("vmap_slices_f32", FA_FLOAT32, FA_PADDING_CAUSAL_MASK, 70, 70);
  c.B = 4, c.slices = 2, c.q_lens = {{30}, {70}, {0}, {5}}, c.kv_lens = {{70}, {1}, {20}, {70}};
  c.dropout = 0.3f, c.softmax = FA_LEARNABLE_SOFTMAX;
  c.bias_type = FA_POST_SCALE_BIAS, c.bias_b = 1, c.bias_h = 4;
  v.push_back(c);
  // float64: the double engine, every feature at 1e-12 (cases above, in double).
  const std::vector<Case> lowp = v;
  for (const char* name : {"thd_everything_bf16", "thd_window_both_sides_f32", "POST_SCALE_BIAS_2x1",
                           "PRE_SCALE_BIAS_1x4", "neg_inf_bias_f32", "off_by_one_br_sq_gt_skv_f32",
                           "dropout_bias_f16", "sliding_window_sink_f32", "vmap_slices_f32"})
    for (Case f : lowp)
      if (f.name == name) f.name += "_as_f64", f.dtype = FA_FLOAT64, v.push_back(f);
  c = bshd("head_dim_384_gqa_learnable_f64", FA_FLOAT64, FA_CAUSAL_MASK, 70, 80);
  c.D = 384, c.Dv = 384, c.softmax = FA_LEARNABLE_SOFTMAX;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, Features, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace fusedattn::cpu
