// The Hopper flash backward (csrc/fusedattn/attention/hopper/flash_bwd.h) alone, on an sm_90
// GPU: each case against float32 reference kernels of this file (exact softmax; one thread a
// query row for the forward and dQ, one a key for dK and dV) on fresh random inputs, with
// dq, dk and dv poisoned (NaN) before the run so an unwritten element shows. Cases: full,
// causal top-left / bottom-right (rows that keep nothing among them), windows, GQA / MQA,
// BSHD and BHSD strides, ragged lengths, padding, learnable sinks (their gradient too),
// softcap, bf16 and fp16. Skipped without an sm_90 device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

#include "fusedattn/attention/hopper/flash_bwd.h"
#include "common.cuh"

namespace fusedattn::cuda::hopper {
namespace {

using namespace test_util;

template <class T>
__device__ float f(T x) { return static_cast<float>(x); }

// The call's rule for one (b, h, query i, key j): the band from the sequence's base diagonal,
// padding lengths.
struct Rule {
  FlashBwdParams p;
  __device__ void lens(int64_t b, int64_t* q_len, int64_t* kv_len) const {
    *q_len = p.seqlen_q, *kv_len = p.seqlen_kv;
    if (p.q_lens) {
      const int64_t ql = p.q_lens[b * p.lens_stride], kl = p.kv_lens[b * p.lens_stride];
      *q_len = ql < 0 ? 0 : ql > p.seqlen_q ? p.seqlen_q : ql;
      *kv_len = kl < 0 ? 0 : kl > p.seqlen_kv ? p.seqlen_kv : kl;
    }
  }
  __device__ float sink(int64_t b, int64_t h) const {  // -inf: none
    return p.sinks ? p.sinks[(b / p.sink_rows) * p.heads_q + h] : -INFINITY;
  }
  template <class T>
  __device__ float bias(int64_t b, int64_t h, int64_t i, int64_t j) const {  // the bias's or dense mask's value
    return p.bias ? f(static_cast<const T*>(p.bias)[b * p.bias_b + h * p.bias_h + i * p.bias_s + j]) : 0.0f;
  }
  template <class T>
  __device__ bool kept(int64_t b, int64_t h, int64_t i, int64_t j) const {
    int64_t q_len, kv_len;
    lens(b, &q_len, &kv_len);
    const int64_t base = p.bottom_right ? kv_len - q_len : 0;
    return i < q_len && j < kv_len && (!p.causal || j <= i + base + p.diag) &&
           (!p.left_bound || j >= i + base + p.lo_diag) && !(p.mask_bias && bias<T>(b, h, i, j) == p.mask_value);
  }
  template <class T>
  __device__ float score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t hk = h / (p.heads_q / p.heads_kv);
    const T* q = static_cast<const T*>(p.q) + b * p.q_b + i * p.q_s + h * p.q_h;
    const T* k = static_cast<const T*>(p.k) + b * p.k_b + j * p.k_s + hk * p.k_h;
    float d = 0.0f;
    for (int x = 0; x < p.head_dim; ++x) d += f(q[x]) * f(k[x]);
    // the bias (if any) joins the score before the modifier; post_bias_mul: a post-scale
    // bias joining the raw q.k times it
    const float bv = p.bias ? bias<T>(b, h, i, j) : 0.0f;
    d = p.pre_scale_bias          ? (d + bv) * p.scale
        : p.post_bias_mul != 0.0f ? (d + bv * p.post_bias_mul) * p.scale
                                  : d * p.scale + bv;
    if (p.softcap > 0.0f) return p.softcap * tanhf(d / p.softcap);
    if (p.alibi_slopes) {
      const float rel = static_cast<float>(j - i);
      return d + p.alibi_sign * p.alibi_slopes[h * p.alibi_stride] * (p.alibi_abs ? fabsf(rel) : rel);
    }
    return d;
  }
  // d score / d bias: the scale for a pre-scale bias, post_bias_mul scale or 1 for a post-scale one
  __device__ float dbias_mul() const {
    return p.pre_scale_bias ? p.scale : p.post_bias_mul != 0.0f ? p.post_bias_mul * p.scale : 1.0f;
  }
  // d score / d (scale q.k): softcap's 1 - tanh^2, else 1.
  template <class T>
  __device__ float dscore(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (p.softcap <= 0.0f) return 1.0f;
    const float t = score<T>(b, h, i, j) / p.softcap;
    return 1.0f - t * t;
  }
  template <class T>
  __device__ float dprob(int64_t b, int64_t h, int64_t i, int64_t j) const {  // dO_i . V_j
    const int64_t hk = h / (p.heads_q / p.heads_kv);
    const T* d = static_cast<const T*>(p.dout) + b * p.do_b + i * p.do_s + h * p.do_h;
    const T* v = static_cast<const T*>(p.v) + b * p.v_b + j * p.v_s + hk * p.v_h;
    float s = 0.0f;
    for (int x = 0; x < p.head_dim; ++x) s += f(d[x]) * f(v[x]);
    return s;
  }
};

// A row's forward: out (to p.out, rounded to T, as a forward would give it), lse (-inf: the
// row keeps nothing) and D = dO . out in float32.
template <class T>
__global__ void ref_forward(Rule r, float* lse, float* dsum) {
  const FlashBwdParams& p = r.p;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q) return;
  const int64_t i = idx % p.seqlen_q, h = idx / p.seqlen_q % p.heads_q, b = idx / (p.seqlen_q * p.heads_q);
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const float sink = r.sink(b, h);  // an extra logit with no value
  float m = sink;
  for (int64_t j = 0; j < p.seqlen_kv; ++j)
    if (r.kept<T>(b, h, i, j)) m = fmaxf(m, r.score<T>(b, h, i, j));
  float acc[256] = {}, l = sink == -INFINITY ? 0.0f : expf(sink - m);
  for (int64_t j = 0; j < p.seqlen_kv; ++j) {
    if (!r.kept<T>(b, h, i, j)) continue;
    const float e = expf(r.score<T>(b, h, i, j) - m);
    l += e;
    const T* v = static_cast<const T*>(p.v) + b * p.v_b + j * p.v_s + hk * p.v_h;
    for (int x = 0; x < p.head_dim; ++x) acc[x] += e * f(v[x]);
  }
  T* out = const_cast<T*>(static_cast<const T*>(p.out)) + b * p.o_b + i * p.o_s + h * p.o_h;
  const T* d = static_cast<const T*>(p.dout) + b * p.do_b + i * p.do_s + h * p.do_h;
  float ds = 0.0f;
  for (int x = 0; x < p.head_dim; ++x) {
    const float o = l > 0.0f ? acc[x] / l : 0.0f;
    out[x] = static_cast<T>(o);
    ds += o * f(d[x]);
  }
  lse[idx] = l > 0.0f ? m + logf(l) : -INFINITY;
  dsum[idx] = ds;
}

// d sink of (b, h): -sum_i exp(sink - lse_i) D_i.
__global__ void ref_dsink(Rule r, const float* lse, const float* dsum, float* dsink) {
  const FlashBwdParams& p = r.p;
  const int64_t bh = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (bh >= p.batch * p.heads_q) return;
  const float sink = r.sink(bh / p.heads_q, bh % p.heads_q);
  float acc = 0.0f;
  for (int64_t i = 0; i < p.seqlen_q; ++i)
    if (lse[bh * p.seqlen_q + i] != -INFINITY) acc += expf(sink - lse[bh * p.seqlen_q + i]) * dsum[bh * p.seqlen_q + i];
  dsink[bh] = -acc;
}

// dQ of a row: scale sum_j P_ij (dP_ij - D_i) K_j; with ALiBi and dslope non-null, the row's
// part of its slope's gradient, sum_j dS_ij g(j - i) (the sign applied by the caller), and
// of sum_j |dS_ij g(j - i)| (the scale of its rounding) in dslope_abs.
template <class T>
__global__ void ref_dq(Rule r, const float* lse, const float* dsum, float* dq, float* dslope = nullptr,
                       float* dslope_abs = nullptr) {
  const FlashBwdParams& p = r.p;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q) return;
  const int64_t i = idx % p.seqlen_q, h = idx / p.seqlen_q % p.heads_q, b = idx / (p.seqlen_q * p.heads_q);
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  float acc[256] = {}, gs = 0.0f, ga = 0.0f;
  for (int64_t j = 0; j < p.seqlen_kv; ++j) {
    if (!r.kept<T>(b, h, i, j)) continue;
    const float pr = expf(r.score<T>(b, h, i, j) - lse[idx]);
    const float ds = pr * (r.dprob<T>(b, h, i, j) - dsum[idx]) * r.dscore<T>(b, h, i, j);
    const T* k = static_cast<const T*>(p.k) + b * p.k_b + j * p.k_s + hk * p.k_h;
    for (int x = 0; x < p.head_dim; ++x) acc[x] += ds * f(k[x]);
    const float rel = static_cast<float>(j - i), g = p.alibi_abs ? fabsf(rel) : rel;
    gs += ds * g, ga += fabsf(ds * g);
  }
  for (int x = 0; x < p.head_dim; ++x) dq[idx * p.head_dim + x] = acc[x] * p.scale;
  if (dslope) dslope[idx] = gs, dslope_abs[idx] = ga;
}

// dbias of element (table, i, j) of the bias: sum of dS over the (b, h) that read it (softcap's
// 1 - t^2 in it), times Rule::dbias_mul.
template <class T>
__global__ void ref_dbias(Rule r, const float* lse, const float* dsum, float* dbias) {
  const FlashBwdParams& p = r.p;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= p.bias_batch * p.bias_heads * p.seqlen_q * p.seqlen_kv) return;
  const int64_t j = idx % p.seqlen_kv, i = idx / p.seqlen_kv % p.seqlen_q, tbl = idx / (p.seqlen_q * p.seqlen_kv);
  const int64_t bb = tbl / p.bias_heads, hh = tbl % p.bias_heads;
  float acc = 0.0f;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      if ((p.bias_batch > 1 && b != bb) || (p.bias_heads > 1 && h != hh) || !r.kept<T>(b, h, i, j)) continue;
      const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
      acc += expf(r.score<T>(b, h, i, j) - lse[row]) * (r.dprob<T>(b, h, i, j) - dsum[row]) *
             r.dscore<T>(b, h, i, j);
    }
  dbias[idx] = acc * r.dbias_mul();
}

// dK and dV of a key (b, kv head hk, j): sums over the group's heads and their rows.
template <class T>
__global__ void ref_dkv(Rule r, const float* lse, const float* dsum, float* dk, float* dv) {
  const FlashBwdParams& p = r.p;
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= p.batch * p.heads_kv * p.seqlen_kv) return;
  const int64_t j = idx % p.seqlen_kv, hk = idx / p.seqlen_kv % p.heads_kv, b = idx / (p.seqlen_kv * p.heads_kv);
  const int64_t g = p.heads_q / p.heads_kv;
  float ak[256] = {}, av[256] = {};
  for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
    for (int64_t i = 0; i < p.seqlen_q; ++i) {
      if (!r.kept<T>(b, h, i, j)) continue;
      const int64_t row = (b * p.heads_q + h) * p.seqlen_q + i;
      const float pr = expf(r.score<T>(b, h, i, j) - lse[row]);
      const float ds = pr * (r.dprob<T>(b, h, i, j) - dsum[row]) * r.dscore<T>(b, h, i, j);
      const T* q = static_cast<const T*>(p.q) + b * p.q_b + i * p.q_s + h * p.q_h;
      const T* d = static_cast<const T*>(p.dout) + b * p.do_b + i * p.do_s + h * p.do_h;
      for (int x = 0; x < p.head_dim; ++x) ak[x] += ds * f(q[x]), av[x] += pr * f(d[x]);
    }
  for (int x = 0; x < p.head_dim; ++x)
    dk[idx * p.head_dim + x] = ak[x] * p.scale, dv[idx * p.head_dim + x] = av[x];
}

struct Case {
  const char* name;
  bool bf16 = true, causal = false, bhsd = false, bottom_right = false;
  int D = 128;
  int B = 2, Sq = 256, Skv = 256, Hq = 4, Hkv = 4;
  int left = -1, right = -1;  // window sides (-1: none); causal sets right = 0
  std::vector<int> q_lens, kv_lens;
  float amp = 1.0f;
  int mask = 0;  // a dense mask (fill_mask's kind), [mask_b ? B : 1, mask_h ? Hq : 1, Sq, Skv]
  bool mask_b = false, mask_h = false, mask_values = false;
  // FlashBwdParams::mask_keep_only (head dim 64's 128-query dense variant); with mask_values
  // a broken claim: expect_nan, NaN in dq where a tile holds values.
  bool mask_keep_only = false, expect_nan = false;
  // With mask_keep_only: the kernel reads the mask as bytes (bias_keep; the reference the folded one).
  bool keep = false;
  bool out_unaligned = false;  // out 2 bytes past a 16-byte boundary: D's one-element loads
  bool dkv_unaligned = false;  // dk and dv 4 bytes past one: dK / dV's 4-byte stores
  bool deterministic = false;  // FlashBwdParams::deterministic: dq bitwise the same in 3 more calls
  int sink_slices = 0;  // learnable sinks [sink_slices, Hq] (0: none), dsinks [B, Hq] checked
  float softcap = 0.0f;  // FlashBwdParams::softcap (0: none)
  int alibi = 0;  // ALiBi: 1 slopes per head, 2 one slope; negative: |kv - q| (and sign -1)
  int bias = 0;  // a bias (values of fill's amplitude 2) instead of a mask: 1 post-scale, 2 pre-scale;
                 // the mask's extents (mask_b, mask_h)
  bool dbias = false;  // the bias's gradient too (FlashBwdParams::dbias), checked
  bool dslopes = false;  // with alibi: the slopes' gradient (FlashBwdParams::alibi_dslopes), checked
  float post_bias_mul = 0.0f;  // FlashBwdParams::post_bias_mul
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

template <class T>
void run_case(const Case& cs) {
  const int64_t D = cs.D;
  const int64_t nq = int64_t{cs.B} * cs.Sq * cs.Hq * D, nk = int64_t{cs.B} * cs.Skv * cs.Hkv * D;
  const int64_t rows = nq / D, keys = nk / D;
  T *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *dsum, *rq, *rk, *rv;
  for (T** t : {&q, &o, &dout, &dq}) CUDA_OK(cudaMalloc(t, nq * sizeof(T)));
  for (T** t : {&k, &v, &dk, &dv}) CUDA_OK(cudaMalloc(t, nk * sizeof(T)));
  CUDA_OK(cudaMalloc(&lse, rows * 4));
  CUDA_OK(cudaMalloc(&dsum, rows * 4));
  CUDA_OK(cudaMalloc(&rq, nq * 4));
  CUDA_OK(cudaMalloc(&rk, nk * 4));
  CUDA_OK(cudaMalloc(&rv, nk * 4));
  static uint32_t seed = 11;
  fill<<<1024, 256>>>(q, nq, seed++, cs.amp);
  fill<<<1024, 256>>>(k, nk, seed++, cs.amp);
  fill<<<1024, 256>>>(v, nk, seed++, 1.0f);
  fill<<<1024, 256>>>(dout, nq, seed++, 1.0f);
  for (T* t : {dq, dk, dv}) CUDA_OK(cudaMemset(t, 0xff, (t == dq ? nq : nk) * sizeof(T)));  // NaN

  FlashBwdParams p;
  if (cs.out_unaligned) {
    CUDA_OK(cudaFree(o));
    CUDA_OK(cudaMalloc(&o, (nq + 8) * sizeof(T)));
  }
  T* dk_at = dk;
  T* dv_at = dv;
  if (cs.dkv_unaligned) {
    for (T** t : {&dk, &dv}) {
      CUDA_OK(cudaFree(*t));
      CUDA_OK(cudaMalloc(t, (nk + 8) * sizeof(T)));
      CUDA_OK(cudaMemset(*t, 0xff, (nk + 8) * sizeof(T)));
    }
    dk_at = dk + 2, dv_at = dv + 2;
  }
  p.q = q, p.k = k, p.v = v, p.out = cs.out_unaligned ? o + 1 : o, p.dout = dout, p.lse = lse, p.dq = dq, p.dk = dk_at, p.dv = dv_at;
  auto strides = [&](int64_t S, int64_t H, int64_t* sb, int64_t* ss, int64_t* sh) {
    *sb = S * H * D;
    if (cs.bhsd) *sh = S * D, *ss = D; else *ss = H * D, *sh = D;
  };
  strides(cs.Sq, cs.Hq, &p.q_b, &p.q_s, &p.q_h);
  strides(cs.Sq, cs.Hq, &p.o_b, &p.o_s, &p.o_h);
  strides(cs.Sq, cs.Hq, &p.do_b, &p.do_s, &p.do_h);
  strides(cs.Sq, cs.Hq, &p.dq_b, &p.dq_s, &p.dq_h);
  strides(cs.Skv, cs.Hkv, &p.k_b, &p.k_s, &p.k_h);
  strides(cs.Skv, cs.Hkv, &p.v_b, &p.v_s, &p.v_h);
  strides(cs.Skv, cs.Hkv, &p.dk_b, &p.dk_s, &p.dk_h);
  strides(cs.Skv, cs.Hkv, &p.dv_b, &p.dv_s, &p.dv_h);
  p.l_b = int64_t{cs.Hq} * cs.Sq, p.l_h = cs.Sq, p.l_s = 1;
  p.batch = cs.B, p.seqlen_q = cs.Sq, p.seqlen_kv = cs.Skv, p.heads_q = cs.Hq, p.heads_kv = cs.Hkv;
  p.head_dim = D, p.bf16 = cs.bf16, p.scale = 1.0f / std::sqrt(float(D));
  p.softcap = cs.softcap;
  float* slopes = nullptr;
  if (cs.alibi) {
    std::vector<float> h(cs.Hq);
    for (int x = 0; x < cs.Hq; ++x) h[x] = std::exp2(-8.0f * (x + 1) / cs.Hq);
    CUDA_OK(cudaMalloc(&slopes, h.size() * 4));
    CUDA_OK(cudaMemcpy(slopes, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    p.alibi_slopes = slopes, p.alibi_stride = std::abs(cs.alibi) == 1 ? 1 : 0;
    p.alibi_abs = cs.alibi < 0, p.alibi_sign = cs.alibi < 0 ? -1.0f : 1.0f;
  }
  float *dslopes = nullptr, *rslope = nullptr, *rslope_abs = nullptr;
  const int64_t nslopes = p.alibi_stride ? cs.Hq : 1;
  if (cs.dslopes) {
    CUDA_OK(cudaMalloc(&dslopes, nslopes * 4));
    CUDA_OK(cudaMemset(dslopes, 0xff, nslopes * 4));  // NaN: flash_bwd zeroes, then adds
    CUDA_OK(cudaMalloc(&rslope, rows * 4));
    CUDA_OK(cudaMalloc(&rslope_abs, rows * 4));
    p.alibi_dslopes = dslopes;
  }
  const int right = cs.causal ? 0 : cs.right;
  p.causal = right >= 0, p.diag = right >= 0 ? right : 0;
  p.left_bound = cs.left >= 0, p.lo_diag = cs.left >= 0 ? -cs.left : 0;
  p.bottom_right = cs.bottom_right;
  int* lens = nullptr;
  if (!cs.q_lens.empty()) {
    std::vector<int> h(cs.q_lens);
    h.insert(h.end(), cs.kv_lens.begin(), cs.kv_lens.end());
    CUDA_OK(cudaMalloc(&lens, h.size() * 4));
    CUDA_OK(cudaMemcpy(lens, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    p.q_lens = lens, p.kv_lens = lens + cs.B, p.lens_stride = 1;
  }
  T* mask = nullptr;
  if (cs.mask || cs.bias) {
    const int64_t mb = cs.mask_b ? cs.B : 1, mh = cs.mask_h ? cs.Hq : 1;
    const int64_t n = mb * mh * cs.Sq * cs.Skv;
    CUDA_OK(cudaMalloc(&mask, n * sizeof(T)));
    p.mask_value = static_cast<float>(static_cast<T>(-0.7f * (cs.bf16 ? 3.3895313892515355e38f : 65504.0f)));
    if (cs.mask) fill_mask<<<1024, 256>>>(mask, mb * mh, cs.Sq, cs.Skv, cs.mask, cs.mask_values, p.mask_value, seed++);
    else fill<<<1024, 256>>>(mask, n, seed++, 2.0f);
    p.bias = mask, p.mask_bias = cs.mask != 0, p.pre_scale_bias = cs.bias == 2;
    p.post_bias_mul = cs.post_bias_mul;
    p.mask_keep_only = cs.mask_keep_only;
    p.bias_batch = mb, p.bias_heads = mh;
    p.bias_s = cs.Skv, p.bias_h = cs.mask_h ? int64_t{cs.Sq} * cs.Skv : 0;
    p.bias_b = cs.mask_b ? mh * cs.Sq * cs.Skv : 0;
  }
  float *sinks = nullptr, *dsinks = nullptr, *rsinks = nullptr;
  const int64_t bh = int64_t{cs.B} * cs.Hq;
  if (cs.sink_slices) {
    std::vector<float> h(int64_t{cs.sink_slices} * cs.Hq);
    for (size_t x = 0; x < h.size(); ++x) h[x] = -2.0f + 0.7f * float(x % 7);  // some above the scores
    CUDA_OK(cudaMalloc(&sinks, h.size() * 4));
    CUDA_OK(cudaMemcpy(sinks, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc(&dsinks, bh * 4));
    CUDA_OK(cudaMemset(dsinks, 0xff, bh * 4));  // NaN: written by the kernel
    CUDA_OK(cudaMalloc(&rsinks, bh * 4));
    p.sinks = sinks, p.dsinks = dsinks, p.sink_rows = cs.B / cs.sink_slices;
  }
  T* dbias = nullptr;
  float* rdbias = nullptr;
  const int64_t nbias = cs.dbias ? p.bias_batch * p.bias_heads * cs.Sq * cs.Skv : 0;
  if (cs.dbias) {
    CUDA_OK(cudaMalloc(&dbias, nbias * sizeof(T)));
    CUDA_OK(cudaMemset(dbias, 0xff, nbias * sizeof(T)));  // NaN: written by flash_bwd
    CUDA_OK(cudaMalloc(&rdbias, nbias * 4));
    p.dbias = dbias, p.want_dbias = true;
  }
  const Rule rule{p};
  uint8_t* keep = nullptr;
  if (cs.keep) {
    const int64_t n = p.bias_batch * p.bias_heads * cs.Sq * cs.Skv;
    CUDA_OK(cudaMalloc(&keep, n));
    keep_bytes<<<1024, 256>>>(mask, n, p.mask_value, keep);
    p.bias = keep, p.bias_keep = true;
  }
  ref_forward<T><<<(rows + 127) / 128, 128>>>(rule, lse, dsum);
  CUDA_OK(cudaGetLastError());
  void* ws = nullptr;
  p.deterministic = cs.deterministic;  // before the size: the counters are a part of it
  const int64_t ws_bytes = flash_bwd_workspace_bytes(p);
  CUDA_OK(cudaMalloc(&ws, ws_bytes));
  CUDA_OK(cudaMemset(ws, 0x55, ws_bytes));  // flash_bwd writes what it reads
  p.workspace = ws, p.workspace_bytes = ws_bytes;
  ASSERT_EQ(flash_bwd_unsupported(p, 90), "");
  const Status st = flash_bwd(p, 0);
  ASSERT_TRUE(st.ok()) << st.message;
  ref_dq<T><<<(rows + 127) / 128, 128>>>(rule, lse, dsum, rq, rslope, rslope_abs);
  ref_dkv<T><<<(keys + 127) / 128, 128>>>(rule, lse, dsum, rk, rv);
  if (sinks) ref_dsink<<<(bh + 127) / 128, 128>>>(rule, lse, dsum, rsinks);
  if (cs.dbias) ref_dbias<T><<<(nbias + 127) / 128, 128>>>(rule, lse, dsum, rdbias);
  CUDA_OK(cudaDeviceSynchronize());

  // Each gradient against its reference ([B, H, S, D] by row index; ours through the
  // strides): every element finite and within tol of the tensor's largest magnitude.
  const double tol = cs.bf16 ? 2e-2 : 4e-3;
  auto check = [&](const char* name, const T* dev, const float* ref, int64_t S, int64_t H,
                   int64_t sb, int64_t ss, int64_t sh) {
    const int64_t n = int64_t{cs.B} * S * H * D;
    std::vector<T> got(n);
    std::vector<float> want(n);
    ASSERT_EQ(cudaMemcpy(got.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(want.data(), ref, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double big = 0, err = 0;
    int64_t worst = 0, bad = 0;
    for (float x : want) big = std::max(big, double(std::fabs(x)));
    for (int64_t r = 0; r < n / D; ++r) {
      const int64_t i = r % S, h = r / S % H, b = r / (S * H);
      for (int64_t x = 0; x < D; ++x) {
        const double e = std::fabs(double(static_cast<float>(got[b * sb + i * ss + h * sh + x])) - want[r * D + x]);
        if (!(e <= err)) err = std::isnan(e) ? INFINITY : e, worst = r * D + x;
        if (!(e <= tol * big)) ++bad;
      }
    }
    EXPECT_EQ(bad, 0) << name << ": " << bad << " elements off by more than " << tol << " x " << big
                      << "; worst " << err << " at " << worst;
    printf("  %s: max err %.3g of max |ref| %.3g (%.2e)\n", name, err, big, big > 0 ? err / big : err);
  };
  if (cs.expect_nan) {
    std::vector<T> got(nq);
    ASSERT_EQ(cudaMemcpy(got.data(), dq, nq * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t nans = 0;
    for (const T& x : got) nans += std::isnan(static_cast<float>(x));
    EXPECT_GT(nans, 0) << "a keep-only mask with values: dq shows no NaN";
    printf("  dq: %lld NaN (expected)\n", static_cast<long long>(nans));
  } else {
    check("dq", dq, rq, cs.Sq, cs.Hq, p.dq_b, p.dq_s, p.dq_h);
    check("dk", dk_at, rk, cs.Skv, cs.Hkv, p.dk_b, p.dk_s, p.dk_h);
    check("dv", dv_at, rv, cs.Skv, cs.Hkv, p.dv_b, p.dv_s, p.dv_h);
  }
  if (sinks) {  // D from the stored (rounded) output against the reference's exact one: dq's rule
    std::vector<float> got(bh), want(bh);
    ASSERT_EQ(cudaMemcpy(got.data(), dsinks, bh * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(want.data(), rsinks, bh * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double big = 0, err = 0;
    for (float x : want) big = std::max(big, double(std::fabs(x)));
    for (int64_t x = 0; x < bh; ++x) {
      EXPECT_TRUE(std::isfinite(got[x])) << "dsink " << x;
      EXPECT_NEAR(got[x], want[x], tol * std::max(1.0, big)) << "dsink " << x;
      err = std::max(err, double(std::fabs(got[x] - want[x])));
    }
    printf("  dsink: max err %.3g of max |ref| %.3g\n", err, big);
  }
  if (cs.dbias) {  // dS from the stored (rounded) output's D: dq's rule, over the bias's elements
    std::vector<T> got(nbias);
    std::vector<float> want(nbias);
    ASSERT_EQ(cudaMemcpy(got.data(), dbias, nbias * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(want.data(), rdbias, nbias * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double big = 0, err = 0;
    int64_t bad = 0;
    for (float x : want) big = std::max(big, double(std::fabs(x)));
    for (int64_t x = 0; x < nbias; ++x) {
      const double e = std::fabs(double(static_cast<float>(got[x])) - want[x]);
      if (!(e <= tol * big)) ++bad;
      if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
    }
    EXPECT_EQ(bad, 0) << "dbias: " << bad << " elements off by more than " << tol << " x " << big;
    printf("  dbias: max err %.3g of max |ref| %.3g\n", err, big);
  }
  if (cs.dslopes) {  // each head's rows' parts summed (every head's with one slope), times the sign
    std::vector<float> got(nslopes), part(rows), part_abs(rows);
    ASSERT_EQ(cudaMemcpy(got.data(), dslopes, nslopes * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(part.data(), rslope, rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(part_abs.data(), rslope_abs, rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> want(nslopes), scale(nslopes);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = p.alibi_stride ? r / cs.Sq % cs.Hq : 0;
      want[h] += p.alibi_sign * part[r], scale[h] += part_abs[r];
    }
    for (int64_t h = 0; h < nslopes; ++h) {
      EXPECT_TRUE(std::isfinite(got[h])) << "dslopes " << h;
      EXPECT_NEAR(got[h], want[h], tol * scale[h]) << "dslopes " << h << " (sum |terms| " << scale[h] << ")";
      printf("  dslopes[%lld]: %.6g, reference %.6g (sum |terms| %.3g)\n", static_cast<long long>(h), got[h],
             want[h], scale[h]);
    }
  }
  if (cs.deterministic) {  // the same dq, bit for bit, from fresh scratch
    std::vector<T> first(nq), again(nq);
    ASSERT_EQ(cudaMemcpy(first.data(), dq, nq * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int r = 0; r < 3; ++r) {
      CUDA_OK(cudaMemset(ws, 0x55, ws_bytes));
      CUDA_OK(cudaMemset(dq, 0xff, nq * sizeof(T)));
      ASSERT_TRUE(flash_bwd(p, 0).ok());
      ASSERT_EQ(cudaMemcpy(again.data(), dq, nq * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t differ = 0;
      for (int64_t i = 0; i < nq; ++i) differ += std::memcmp(&first[i], &again[i], sizeof(T)) != 0;
      EXPECT_EQ(differ, 0) << "call " << r + 2 << ": dq values that differ from the first call's";
    }
  }
  for (void* t : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)dout, (void*)dq, (void*)dk, (void*)dv,
                  (void*)lse, (void*)dsum, (void*)rq, (void*)rk, (void*)rv, ws, (void*)lens, (void*)mask,
                  (void*)sinks, (void*)dsinks, (void*)rsinks, (void*)slopes, (void*)dbias, (void*)rdbias,
                  (void*)dslopes, (void*)rslope, (void*)rslope_abs, (void*)keep})
    cudaFree(t);
}

class HopperBwd : public ::testing::TestWithParam<Case> {};

TEST_P(HopperBwd, MatchesReference) {
  if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 GPU";
  const Case& cs = GetParam();
  if (cs.bf16) run_case<__nv_bfloat16>(cs);
  else run_case<__half>(cs);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  auto add = [&](Case x) { c.push_back(x); };
  add({.name = "full"});
  add({.name = "full_fp16", .bf16 = false});
  add({.name = "causal", .causal = true});
  add({.name = "causal_fp16_bhsd", .bf16 = false, .causal = true, .bhsd = true});
  add({.name = "causal_gqa", .causal = true, .Hq = 6, .Hkv = 2});
  add({.name = "full_mqa_ragged", .Sq = 300, .Skv = 200, .Hq = 4, .Hkv = 1});
  add({.name = "causal_ragged", .causal = true, .Sq = 333, .Skv = 333});
  add({.name = "causal_bottom_right_long_q", .causal = true, .bottom_right = true, .Sq = 320, .Skv = 200});
  add({.name = "causal_bottom_right_long_kv", .causal = true, .bottom_right = true, .Sq = 130, .Skv = 390});
  add({.name = "window_left", .causal = true, .Sq = 512, .Skv = 512, .left = 100});
  add({.name = "window_both", .Sq = 384, .Skv = 384, .left = 70, .right = 30});
  add({.name = "padding", .causal = true, .B = 3, .Sq = 256, .Skv = 256, .q_lens = {256, 100, 0},
       .kv_lens = {200, 256, 17}});
  add({.name = "large_scores", .causal = true, .amp = 4.0f});
  add({.name = "d64_full", .D = 64});
  add({.name = "d64_causal_gqa_fp16", .bf16 = false, .causal = true, .D = 64, .Sq = 300, .Skv = 300, .Hq = 6, .Hkv = 2});
  add({.name = "d64_window_bottom_right", .causal = true, .bottom_right = true, .D = 64, .Sq = 200, .Skv = 450,
       .left = 90});
  add({.name = "d64_mask_band_holes_values", .D = 64, .Sq = 520, .Skv = 600, .mask = 2, .mask_h = true,
       .mask_values = true});
  add({.name = "causal_ragged_out_unaligned", .causal = true, .Sq = 333, .Skv = 333, .out_unaligned = true});
  add({.name = "d64_ragged_out_unaligned", .D = 64, .Sq = 300, .Skv = 280, .out_unaligned = true});
  add({.name = "causal_gqa_ragged_dkv_unaligned", .causal = true, .Sq = 200, .Skv = 333, .Hq = 6, .Hkv = 2,
       .dkv_unaligned = true});
  add({.name = "d64_dkv_unaligned", .D = 64, .Sq = 256, .Skv = 190, .dkv_unaligned = true});
  add({.name = "long", .causal = true, .B = 1, .Sq = 1024, .Skv = 1024, .Hq = 2, .Hkv = 2});
  // Dense masks: causal written out; a band with holes and rows that keep nothing, per
  // batch row and head, with bias values; beside a mask type, GQA and padding.
  add({.name = "mask_causal", .Sq = 512, .Skv = 512, .mask = 1});
  add({.name = "mask_band_holes_per_head_values", .B = 2, .Sq = 700, .Skv = 640, .Hq = 4, .Hkv = 2,
       .mask = 2, .mask_b = true, .mask_h = true, .mask_values = true});
  add({.name = "mask_band_holes_fp16_gqa", .bf16 = false, .Sq = 512, .Skv = 512, .Hq = 6, .Hkv = 2, .mask = 2});
  add({.name = "mask_with_causal_type_and_padding", .causal = true, .B = 3, .Sq = 384, .Skv = 384,
       .q_lens = {384, 200, 50}, .kv_lens = {300, 384, 384}, .mask = 2, .mask_b = true});
  // Head dim 64's keep-only dense variant (128-query tiles and blocks): causal written out,
  // a band with holes and rows that keep nothing per head (GQA, fp16), beside a causal type
  // with padding, deterministic (ascending, and descending beside the causal type), and a
  // broken claim (values in the mask: NaN).
  add({.name = "d64_keep_causal", .D = 64, .Sq = 512, .Skv = 512, .mask = 1, .mask_keep_only = true});
  add({.name = "d64_keep_band_holes_gqa_fp16", .bf16 = false, .D = 64, .Sq = 520, .Skv = 600, .Hq = 6,
       .Hkv = 2, .mask = 2, .mask_h = true, .mask_keep_only = true});
  add({.name = "d64_keep_causal_type_padding", .causal = true, .D = 64, .B = 3, .Sq = 384, .Skv = 384,
       .q_lens = {384, 200, 50}, .kv_lens = {300, 384, 384}, .mask = 2, .mask_b = true,
       .mask_keep_only = true});
  add({.name = "det_d64_keep_holes", .D = 64, .Sq = 520, .Skv = 600, .mask = 2, .mask_h = true,
       .mask_keep_only = true, .deterministic = true});
  add({.name = "det_d64_keep_causal_type_gqa", .causal = true, .D = 64, .Sq = 640, .Skv = 640, .Hq = 6,
       .Hkv = 2, .mask = 2, .mask_keep_only = true, .deterministic = true});
  // A boolean keep mask's bytes (bias_keep): head dim 64's keep variant, 128's dense variants
  // (no bias map, no value read), keys in 16-key units or not, deterministic.
  add({.name = "d64_keep_bytes_band_holes_gqa", .D = 64, .Sq = 520, .Skv = 640, .Hq = 6, .Hkv = 2,
       .mask = 2, .mask_h = true, .mask_keep_only = true, .keep = true});
  add({.name = "keep_bytes_causal_keys_not_of_16", .Sq = 300, .Skv = 300, .mask = 1, .mask_keep_only = true,
       .keep = true});
  add({.name = "keep_bytes_band_per_batch_causal_type", .causal = true, .B = 2, .Sq = 384, .Skv = 512,
       .mask = 2, .mask_b = true, .mask_keep_only = true, .keep = true});
  add({.name = "det_d64_keep_bytes_causal", .D = 64, .Sq = 512, .Skv = 512, .mask = 1, .mask_keep_only = true,
       .keep = true, .deterministic = true});
  add({.name = "d64_keep_claim_broken", .D = 64, .Sq = 256, .Skv = 256, .mask = 2, .mask_values = true,
       .mask_keep_only = true, .expect_nan = true});
  // Deterministic dQ (a counter a 64-row block, parts added in key-block order): each
  // variant of the ordering (head dim 128's two column halves, 64's 128-query blocks, 64's
  // shared blocks with a dense mask), windows (the first key block reaching a query block),
  // masks' skipped tiles, padding, GQA and a long sequence.
  add({.name = "det_causal_gqa", .causal = true, .Hq = 6, .Hkv = 2, .deterministic = true});
  add({.name = "det_full_ragged", .Sq = 300, .Skv = 700, .deterministic = true});
  add({.name = "det_window_both", .Sq = 700, .Skv = 700, .left = 150, .right = 30, .deterministic = true});
  add({.name = "det_padding", .causal = true, .B = 3, .q_lens = {256, 100, 0}, .kv_lens = {200, 256, 17},
       .deterministic = true});
  add({.name = "det_d64_window", .causal = true, .D = 64, .Sq = 900, .Skv = 900, .left = 200,
       .deterministic = true});
  add({.name = "det_d64_mask_holes", .D = 64, .Sq = 520, .Skv = 600, .mask = 2, .mask_h = true,
       .deterministic = true});
  add({.name = "det_mask_band_holes_gqa", .Sq = 700, .Skv = 640, .Hq = 4, .Hkv = 2, .mask = 2, .mask_b = true,
       .mask_h = true, .deterministic = true});
  add({.name = "det_long", .causal = true, .B = 1, .Sq = 2048, .Skv = 2048, .Hq = 2, .Hkv = 2,
       .deterministic = true});
  // Learnable sinks: dQ, dK, dV from the lse that holds the sink, and its gradient; rows that
  // keep only the sink (padding, a bottom-right edge), per-slice sinks (vmap).
  add({.name = "sink_causal", .causal = true, .sink_slices = 1});
  add({.name = "sink_padding_gqa_slices", .causal = true, .B = 4, .Hq = 6, .Hkv = 2, .q_lens = {256, 100, 0, 77},
       .kv_lens = {200, 256, 17, 0}, .sink_slices = 2});
  add({.name = "sink_d64_bottom_right", .causal = true, .bottom_right = true, .D = 64, .Sq = 320, .Skv = 200,
       .sink_slices = 1});
  add({.name = "sink_det_mask", .Sq = 700, .Skv = 640, .mask = 2, .deterministic = true, .sink_slices = 1});
  // softcap (c tanh(s scale / c)): large scores so that tanh saturates (its derivative near
  // 0), a small cap, GQA, padding, head dim 64's 128-query blocks, deterministic, sinks.
  add({.name = "softcap_causal", .causal = true, .amp = 4.0f, .softcap = 5.0f});
  add({.name = "softcap_full_fp16_gqa", .bf16 = false, .Sq = 300, .Skv = 260, .Hq = 6, .Hkv = 2, .amp = 2.0f,
       .softcap = 1.5f});
  add({.name = "softcap_d64_padding", .causal = true, .D = 64, .B = 3, .q_lens = {256, 100, 0},
       .kv_lens = {200, 256, 17}, .amp = 4.0f, .softcap = 30.0f});
  add({.name = "softcap_d64_window_fp16", .bf16 = false, .causal = true, .D = 64, .Sq = 384, .Skv = 384,
       .left = 100, .amp = 3.0f, .softcap = 3.0f});
  add({.name = "softcap_det_sink", .causal = true, .Sq = 640, .Skv = 640, .amp = 4.0f, .deterministic = true,
       .sink_slices = 1, .softcap = 5.0f});
  // ALiBi (scale s + sign slope_h g(kv - q)): per-head slopes and one, signed and |kv - q|,
  // GQA, padding, bottom-right, head dim 64, deterministic.
  add({.name = "alibi_causal_gqa", .causal = true, .Hq = 6, .Hkv = 2, .alibi = 1, .dslopes = true});
  add({.name = "alibi_abs_full_fp16_ragged", .bf16 = false, .Sq = 300, .Skv = 260, .alibi = -1, .dslopes = true});
  add({.name = "alibi_one_slope_d64_bottom_right", .causal = true, .bottom_right = true, .D = 64, .Sq = 200,
       .Skv = 450, .alibi = 2, .dslopes = true});
  add({.name = "alibi_abs_d64_padding_det", .causal = true, .D = 64, .B = 3, .q_lens = {256, 100, 0},
       .kv_lens = {200, 256, 17}, .deterministic = true, .alibi = -2});
  // A bias (no dbias), post- and pre-scale: per head, per batch row, both; GQA, padding,
  // windows, head dim 64's dense variant, deterministic.
  add({.name = "bias_post_causal_per_head", .causal = true, .Sq = 384, .Skv = 384, .mask_h = true, .bias = 1});
  add({.name = "bias_pre_full_fp16_gqa_ragged", .bf16 = false, .Sq = 300, .Skv = 260, .Hq = 6, .Hkv = 2,
       .mask_b = true, .bias = 2});
  add({.name = "bias_pre_d64_padding_det", .causal = true, .D = 64, .B = 3, .q_lens = {256, 100, 0},
       .kv_lens = {200, 256, 17}, .mask_b = true, .mask_h = true, .deterministic = true, .bias = 2});
  add({.name = "bias_post_d64_window_bottom_right", .causal = true, .bottom_right = true, .D = 64, .Sq = 200,
       .Skv = 450, .left = 90, .bias = 1});
  // ALiBi with a bias (no dbias): the dense variants' bias stages, the bias joining the
  // score before the modifier.
  add({.name = "alibi_bias_post_causal", .causal = true, .Sq = 384, .Skv = 384, .mask_h = true, .alibi = 1,
       .bias = 1});
  add({.name = "alibi_abs_bias_pre_d64_gqa_fp16", .bf16 = false, .D = 64, .Sq = 300, .Skv = 264, .Hq = 6,
       .Hkv = 2, .mask_b = true, .alibi = -1, .bias = 2, .dslopes = true});
  // ALiBi with a bias's gradient: written per element (the call's extents), summed in float32
  // where it broadcasts (over the batch here), with the slopes' gradient
  add({.name = "alibi_bias_dbias_post_causal_dslopes", .causal = true, .Sq = 384, .Skv = 384, .mask_b = true,
       .mask_h = true, .alibi = 1, .bias = 1, .dbias = true, .dslopes = true});
  add({.name = "alibi_abs_bias_dbias_pre_d64_broadcast_fp16", .bf16 = false, .D = 64, .Sq = 300, .Skv = 264,
       .mask_h = true, .alibi = -2, .bias = 2, .dbias = true});
  // softcap with a bias: the dense variants' bias stages (global reads where rows are not
  // 16-byte units), the bias joining q.k before the tanh; dbias with softcap's 1 - t^2.
  add({.name = "softcap_bias_post_causal", .causal = true, .Sq = 384, .Skv = 384, .amp = 4.0f, .mask_h = true,
       .softcap = 5.0f, .bias = 1});
  add({.name = "softcap_bias_pre_odd_rows_gqa", .Sq = 300, .Skv = 260, .Hq = 6, .Hkv = 2, .amp = 2.0f,
       .mask_b = true, .softcap = 3.0f, .bias = 2});
  add({.name = "softcap_bias_dbias_pre_d64_gqa_fp16", .bf16 = false, .D = 64, .Sq = 300, .Skv = 264, .Hq = 6,
       .Hkv = 2, .amp = 2.0f, .mask_b = true, .mask_h = true, .softcap = 3.0f, .bias = 2, .dbias = true});
  add({.name = "softcap_bias_dbias_post_broadcast_window_mul", .causal = true, .Sq = 400, .Skv = 400,
       .left = 90, .amp = 3.0f, .mask_h = true, .softcap = 5.0f, .bias = 1, .dbias = true,
       .post_bias_mul = 0.4f});
  add({.name = "softcap_bias_dbias_post_d64_padding_det", .causal = true, .D = 64, .B = 3,
       .q_lens = {256, 100, 0}, .kv_lens = {200, 256, 17}, .amp = 3.0f, .mask_b = true, .mask_h = true,
       .deterministic = true, .softcap = 20.0f, .bias = 1, .dbias = true});
  add({.name = "d256_softcap_bias_dbias_post_causal_gqa", .causal = true, .D = 256, .Sq = 384, .Skv = 384,
       .Hq = 6, .Hkv = 2, .amp = 3.0f, .mask_b = true, .mask_h = true, .softcap = 5.0f, .bias = 1,
       .dbias = true});
  add({.name = "d256_softcap_bias_dbias_pre_odd_keys_sums_fp16", .bf16 = false, .D = 256, .Sq = 200,
       .Skv = 301, .amp = 2.0f, .mask_h = true, .softcap = 3.0f, .bias = 2, .dbias = true});
  add({.name = "d256_softcap_bias_window_det", .causal = true, .D = 256, .Sq = 400, .Skv = 400, .left = 90,
       .amp = 3.0f, .deterministic = true, .softcap = 20.0f, .bias = 1});
  // the slopes' gradient with padding rows and keys (P 0 there: no part) and a window
  add({.name = "alibi_dslopes_d64_padding_window", .causal = true, .D = 64, .B = 3, .Sq = 256, .Skv = 256,
       .left = 60, .q_lens = {256, 100, 0}, .kv_lens = {200, 256, 17}, .alibi = 1, .dslopes = true});
  add({.name = "alibi_one_slope_bias_post_window_det", .causal = true, .Sq = 400, .Skv = 400, .left = 90,
       .deterministic = true, .alibi = 2, .bias = 1});
  // dbias: written per element (the call's extents), summed in float32 where the bias
  // broadcasts over batch rows or heads (GQA's group of heads too), pre- and post-scale,
  // with a padding mask's rows and keys that keep nothing (0 there).
  add({.name = "dbias_post_causal_bh", .causal = true, .Sq = 384, .Skv = 384, .mask_b = true, .mask_h = true,
       .bias = 1, .dbias = true});
  add({.name = "dbias_pre_full_fp16_gqa_1h", .bf16 = false, .Sq = 300, .Skv = 260, .Hq = 6, .Hkv = 2,
       .mask_h = true, .bias = 2, .dbias = true});
  add({.name = "dbias_pre_d64_padding_11", .causal = true, .D = 64, .B = 3, .q_lens = {256, 100, 0},
       .kv_lens = {200, 256, 17}, .bias = 2, .dbias = true});
  // Odd Skv: pairs of keys cut at the end, rows not 4- / 8-byte aligned (one key a store).
  add({.name = "dbias_post_odd_keys_1h_sums", .Sq = 200, .Skv = 301, .mask_h = true, .bias = 1,
       .dbias = true});
  add({.name = "dbias_pre_odd_keys_bh_stores", .causal = true, .Sq = 130, .Skv = 257, .mask_b = true,
       .mask_h = true, .bias = 2, .dbias = true});
  add({.name = "dbias_post_d64_window_bh_det", .causal = true, .D = 64, .Sq = 384, .Skv = 384, .left = 100,
       .mask_b = true, .mask_h = true, .deterministic = true, .bias = 1, .dbias = true});
  // Head dim 256 (64-key blocks; S^T split by queries, P^T and dS^T through shared memory,
  // dQ by atomics): the band's kinds, GQA, padding, layouts and alignments, dense masks (bits,
  // values from global memory, a keep mask's bytes), a bias with and without dbias (stored,
  // summed), softcap, sinks.
  add({.name = "d256_full", .D = 256});
  add({.name = "d256_causal_fp16_bhsd", .bf16 = false, .causal = true, .bhsd = true, .D = 256});
  add({.name = "d256_causal_gqa_ragged", .causal = true, .D = 256, .Sq = 300, .Skv = 300, .Hq = 6, .Hkv = 2});
  add({.name = "d256_full_mqa_ragged", .D = 256, .Sq = 300, .Skv = 200, .Hq = 4, .Hkv = 1});
  add({.name = "d256_bottom_right_long_kv", .causal = true, .bottom_right = true, .D = 256, .Sq = 130, .Skv = 390});
  add({.name = "d256_window_both", .D = 256, .Sq = 384, .Skv = 384, .left = 70, .right = 30});
  add({.name = "d256_padding", .causal = true, .D = 256, .B = 3, .q_lens = {256, 100, 0}, .kv_lens = {200, 256, 17}});
  add({.name = "d256_large_scores_long", .causal = true, .D = 256, .B = 1, .Sq = 1024, .Skv = 1024, .Hq = 2,
       .Hkv = 2, .amp = 4.0f});
  add({.name = "d256_out_dkv_unaligned", .D = 256, .Sq = 200, .Skv = 190, .out_unaligned = true,
       .dkv_unaligned = true});
  add({.name = "d256_mask_causal", .D = 256, .Sq = 512, .Skv = 512, .mask = 1});
  add({.name = "d256_mask_band_holes_values_gqa", .D = 256, .Sq = 700, .Skv = 640, .Hq = 4, .Hkv = 2,
       .mask = 2, .mask_b = true, .mask_h = true, .mask_values = true});
  add({.name = "d256_mask_causal_type_padding_fp16", .bf16 = false, .causal = true, .D = 256, .B = 3, .Sq = 384,
       .Skv = 384, .q_lens = {384, 200, 50}, .kv_lens = {300, 384, 384}, .mask = 2, .mask_b = true});
  add({.name = "d256_keep_bytes_band_holes", .D = 256, .Sq = 520, .Skv = 600, .mask = 2, .mask_h = true,
       .mask_keep_only = true, .keep = true});
  add({.name = "d256_bias_pre_gqa_ragged", .D = 256, .Sq = 300, .Skv = 260, .Hq = 6, .Hkv = 2, .mask_b = true,
       .bias = 2});
  add({.name = "d256_dbias_post_causal_bh", .causal = true, .D = 256, .Sq = 384, .Skv = 384, .mask_b = true,
       .mask_h = true, .bias = 1, .dbias = true});
  add({.name = "d256_dbias_pre_odd_keys_1h_sums_fp16", .bf16 = false, .D = 256, .Sq = 200, .Skv = 301,
       .mask_h = true, .bias = 2, .dbias = true});
  add({.name = "d256_softcap_causal_gqa", .causal = true, .D = 256, .Hq = 6, .Hkv = 2, .amp = 4.0f,
       .softcap = 5.0f});
  add({.name = "d256_sink_padding", .causal = true, .D = 256, .B = 4, .Hq = 4, .Hkv = 2,
       .q_lens = {256, 100, 0, 77}, .kv_lens = {200, 256, 17, 0}, .sink_slices = 2});
  // ALiBi at head dim 256 (each group its 32 queries of the 64-key block's S^T): per-head
  // and one slope, signed and |kv - q|, the slopes' gradient, GQA, padding, bottom-right,
  // a window; with a bias (its values from global memory), dbias, deterministic.
  add({.name = "d256_alibi_causal_gqa_dslopes", .causal = true, .D = 256, .Hq = 6, .Hkv = 2, .alibi = 1,
       .dslopes = true});
  add({.name = "d256_alibi_abs_full_fp16_ragged", .bf16 = false, .D = 256, .Sq = 300, .Skv = 260, .alibi = -1,
       .dslopes = true});
  add({.name = "d256_alibi_one_slope_bottom_right_padding", .causal = true, .bottom_right = true, .D = 256,
       .B = 3, .Sq = 200, .Skv = 450, .q_lens = {200, 100, 0}, .kv_lens = {450, 256, 17}, .alibi = 2,
       .dslopes = true});
  add({.name = "d256_alibi_window_det", .causal = true, .D = 256, .Sq = 400, .Skv = 400, .left = 90,
       .deterministic = true, .alibi = 1});
  add({.name = "d256_alibi_bias_dbias_post_causal_dslopes", .causal = true, .D = 256, .Sq = 384, .Skv = 384,
       .mask_b = true, .mask_h = true, .alibi = 1, .bias = 1, .dbias = true, .dslopes = true});
  add({.name = "d256_alibi_abs_bias_dbias_pre_odd_keys_sums_gqa_fp16", .bf16 = false, .D = 256, .Sq = 200,
       .Skv = 301, .Hq = 6, .Hkv = 2, .mask_h = true, .alibi = -2, .bias = 2, .dbias = true});
  add({.name = "d256_alibi_bias_post_window_det", .causal = true, .D = 256, .Sq = 400, .Skv = 400, .left = 90,
       .deterministic = true, .alibi = 2, .bias = 1});
  // Head dim 256's deterministic dQ (its groups' additions in turns, 64-key blocks): causal
  // (descending), a window (ascending from its first block), a dense mask's skipped tiles
  // counted by their 128-key table blocks, padding, GQA, a long sequence, dbias.
  add({.name = "det_d256_causal_gqa", .causal = true, .D = 256, .Hq = 6, .Hkv = 2, .deterministic = true});
  add({.name = "det_d256_window_both_ragged", .D = 256, .Sq = 700, .Skv = 650, .left = 150, .right = 30,
       .deterministic = true});
  add({.name = "det_d256_mask_holes", .D = 256, .Sq = 520, .Skv = 600, .mask = 2, .mask_h = true,
       .deterministic = true});
  add({.name = "det_d256_mask_causal_type_padding", .causal = true, .D = 256, .B = 3, .Sq = 384, .Skv = 384,
       .q_lens = {384, 200, 50}, .kv_lens = {300, 384, 384}, .mask = 2, .mask_b = true, .deterministic = true});
  add({.name = "det_d256_long_dbias", .causal = true, .D = 256, .B = 1, .Sq = 1536, .Skv = 1536, .Hq = 2,
       .Hkv = 2, .mask_b = true, .mask_h = true, .deterministic = true, .bias = 1, .dbias = true});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, HopperBwd, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(HopperBwdChecks, NamesWhatItDeclines) {
  FlashBwdParams p;
  p.head_dim = 96;
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "head dims 64, 128 and 256 only");
  p.head_dim = 256;
  EXPECT_EQ(flash_bwd_unsupported(p, 80), "needs an sm_90 device");
  p.head_dim = 128, p.heads_q = p.heads_kv = 1, p.batch = p.seqlen_q = p.seqlen_kv = 1;
  int x[4];
  p.q = p.k = p.v = p.dout = p.dq = p.dk = p.dv = x;
  p.lse = reinterpret_cast<float*>(x), p.workspace = nullptr;
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "lse and the workspace are required");
  alignas(256) static char ws[256];
  p.workspace = ws, p.workspace_bytes = 1 << 20;
  // The workspace: a folded mask's bits and classes by mask_bias, before any pointer exists
  // (the FFI handler sizes it at trace time so, for any bias); a bias's classes alone by its
  // pointer.
  p.mask_bias = true;
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "mask_bias needs the bias (the folded mask)");
  p.seqlen_q = p.seqlen_kv = 1000;
  const int64_t sized = flash_bwd_workspace_bytes(p);
  p.bias = x, p.bias_s = 1000;
  EXPECT_EQ(flash_bwd_workspace_bytes(p), sized);
  // Head dim 64: sized alike with or without mask_keep_only (its 128-query tiles), at a
  // length where 128-row tiles need more bit rows (1000 -> 1024) and one where 64-row tiles
  // need more classes.
  p.head_dim = 64;
  for (int64_t s : {1000, 4096}) {
    p.seqlen_q = p.seqlen_kv = s;
    p.mask_keep_only = false;
    const int64_t rows64 = flash_bwd_workspace_bytes(p);
    p.mask_keep_only = true;
    EXPECT_EQ(flash_bwd_workspace_bytes(p), rows64) << s;
  }
  p.mask_keep_only = false, p.head_dim = 128, p.seqlen_q = p.seqlen_kv = 1000;
  p.mask_bias = false;
  const int64_t bias_sized = flash_bwd_workspace_bytes(p);
  EXPECT_LT(bias_sized, sized);
  p.bias = nullptr;
  EXPECT_LT(flash_bwd_workspace_bytes(p), bias_sized);
  p.dq_s = 3;  // dQ leaves in column pairs
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "strides of dq, dk and dv must be even");
  // A workspace sized before deterministic was set has no room for its counters.
  p.dq_s = 2, p.seqlen_q = p.seqlen_kv = 64;
  p.workspace_bytes = flash_bwd_workspace_bytes(p);
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "");
  p.deterministic = true;
  EXPECT_NE(flash_bwd_unsupported(p, 90).find("workspace_bytes"), std::string::npos) << flash_bwd_unsupported(p, 90);
  // softcap with a bias: no dense mask; post_bias_mul finite.
  p.deterministic = false, p.softcap = 5.0f, p.bias = x, p.bias_s = 64;
  p.workspace_bytes = flash_bwd_workspace_bytes(p);
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "");
  p.post_bias_mul = INFINITY;
  EXPECT_NE(flash_bwd_unsupported(p, 90).find("post_bias_mul"), std::string::npos);
  p.post_bias_mul = 0.0f, p.mask_bias = true;
  EXPECT_NE(flash_bwd_unsupported(p, 90).find("softcap takes a bias and no dense mask"), std::string::npos);
  p.mask_bias = false, p.head_dim = 256;
  p.workspace_bytes = flash_bwd_workspace_bytes(p);
  EXPECT_EQ(flash_bwd_unsupported(p, 90), "");
}

}  // namespace
}  // namespace fusedattn::cuda::hopper
