// The Hopper flash forward (csrc/fusedattn/attention/hopper) alone, on an sm_90 GPU: each case
// against a float32 reference kernel of this file (one thread a query row, exact softmax) on
// fresh random inputs, with out and lse poisoned (NaN) before the run so an unwritten element
// shows. Cases: the score modifiers (none, softcap, ALiBi in its three forms), masks (none,
// causal top-left / bottom-right), sliding windows (left, right, both), GQA / MQA, the BSHD
// and BHSD strides, ragged lengths, padding (per-row lengths, rows of no keys, lengths out of
// range), THD (packed sequences with gaps, empty ones, cross lengths: the rows of no sequence
// must stay unwritten), persistent and one-block-a-tile grids, bf16 and fp16, head dims 128
// and 64 (the d64_ cases), dense masks (a folded boolean mask, with and without bias values,
// broadcast or per batch row and head, beside mask types and padding: the mask_ cases), and
// a bias (pre- or post-scale, broadcast or not, through the copy engine's tiles or a score at
// a time from global memory where its rows are not 16-byte units or bias_tile is 0: the bias_
// cases).
// Skipped without an sm_90 device (the build runs anywhere: FUSEDATTN_BUILD_CUDA_TESTS).
// The dev harness dev/hopper_fwd/hopper_fwd_check.cu keeps the timing sweeps.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedattn/attention/hopper/flash_fwd.h"
#include "fusedattn/attention/hopper/fwd_kernel.cuh"  // max_logit_key
#include "common.cuh"

namespace fusedattn::cuda::hopper {
namespace {

using namespace test_util;

template <class T>
__device__ float to_f(T x) { return static_cast<float>(x); }

// One thread per (b, h, query row): the exact softmax in float32 over the keys the row keeps
// (the band of p from the sequence's base diagonal: causal's right edge, the window's left
// edge; padding: the sequence's lengths). A row that keeps none, or a padded one: out 0,
// lse -inf. THD: the row's sequence, positions counted from its first token; a row of no
// sequence gets NaN (the kernel must leave it unwritten). A dense mask (p.bias, mask_bias)
// drops the keys of value p.mask_value and adds the others' bias; a bias (not mask_bias) is
// added after the scale, or to q.k before it (bias_pre_scale), and before softcap's tanh. rmax: the row's max kept logit
// (-inf: none), whose max over a (batch row, head)'s rows max_logit must be.
template <class T>
__global__ void reference(FlashFwdParams p, float* out, float* lse, float* rmax) {
  const int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (idx >= p.batch * p.heads_q * p.seqlen_q) return;
  const int D = static_cast<int>(p.head_dim);  // at most 256
  const int64_t token = idx % p.seqlen_q, h = idx / p.seqlen_q % p.heads_q,
                b = idx / (p.seqlen_q * p.heads_q);
  int64_t i = token, q_len = p.seqlen_q, kv_len = p.seqlen_kv, kv0 = 0;
  if (p.seq_q_len) {
    int64_t s = 0;
    for (; s < p.segments; ++s) {
      const int64_t t = b * p.segments + s, q0 = p.seq_q_tok[t] - b * p.seqlen_q;
      if (token >= q0 && token < q0 + p.seq_q_len[t]) break;
    }
    if (s == p.segments) {
      for (int x = 0; x < D; ++x) out[idx * D + x] = NAN;
      lse[idx] = NAN;
      rmax[idx] = -INFINITY;
      return;
    }
    const int64_t t = b * p.segments + s;
    i = token - (p.seq_q_tok[t] - b * p.seqlen_q);
    q_len = p.seq_q_len[t], kv_len = p.seq_kv_len[t];
    kv0 = p.seq_kv_tok[t] - b * p.seqlen_kv;
  } else if (p.q_lens) {
    const int64_t ql = p.q_lens[b * p.lens_stride], kl = p.kv_lens[b * p.lens_stride];
    q_len = ql < 0 ? 0 : ql > p.seqlen_q ? p.seqlen_q : ql;
    kv_len = kl < 0 ? 0 : kl > p.seqlen_kv ? p.seqlen_kv : kl;
  }
  const int64_t base = p.bottom_right ? kv_len - q_len : 0;
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const T* q = static_cast<const T*>(p.q) + b * p.q_b + token * p.q_s + h * p.q_h;
  auto score = [&](int64_t j) {
    const T* k = static_cast<const T*>(p.k) + b * p.k_b + (kv0 + j) * p.k_s + hk * p.k_h;
    float d = 0.0f;
    for (int x = 0; x < D; ++x) d += to_f(q[x]) * to_f(k[x]);
    const float bias =
        p.bias ? to_f(static_cast<const T*>(p.bias)[b * p.bias_b + h * p.bias_h + token * p.bias_s + j]) : 0.0f;
    // the bias, then the modifier (the engine's order); post_bias_mul: a post-scale bias
    // joining the raw q.k times it
    if (p.bias_pre_scale) d += bias;
    else if (p.post_bias_mul != 0.0f) d += bias * p.post_bias_mul;
    d *= p.scale;
    if (!p.bias_pre_scale && p.post_bias_mul == 0.0f) d += bias;
    if (p.softcap > 0.0f) d = p.softcap * tanhf(d / p.softcap);
    if (p.alibi_slopes) {
      const float rel = static_cast<float>(j - i);
      d += p.alibi_sign * p.alibi_slopes[h * p.alibi_stride] * (p.alibi_abs ? fabsf(rel) : rel);
    }
    return d;
  };
  auto kept = [&](int64_t j) {
    const bool dropped =
        p.mask_bias && to_f(static_cast<const T*>(p.bias)[b * p.bias_b + h * p.bias_h + token * p.bias_s + j]) ==
                      p.mask_value;
    return i < q_len && j < kv_len && (!p.causal || j <= i + base + p.diag) &&
           (!p.left_bound || j >= i + base + p.lo_diag) && !dropped;
  };
  float m = -INFINITY;
  for (int64_t j = 0; j < p.seqlen_kv; ++j)
    if (kept(j)) m = fmaxf(m, score(j));
  // A sink: one more logit in the denominator and lse (not in max_logit), no value.
  const float extra = p.sink == 0 ? -INFINITY : p.sink == 1 ? 0.0f
                      : p.sinks[(b / p.sink_rows) * p.heads_q + h];
  const float top = fmaxf(m, extra);
  float acc[256] = {}, l = extra == -INFINITY ? 0.0f : expf(extra - top);
  for (int64_t j = 0; j < p.seqlen_kv; ++j) {
    if (!kept(j)) continue;
    const float e = expf(score(j) - top);
    l += e;
    const T* v = static_cast<const T*>(p.v) + b * p.v_b + (kv0 + j) * p.v_s + hk * p.v_h;
    for (int x = 0; x < D; ++x) acc[x] += e * to_f(v[x]);
  }
  const bool pad = i >= q_len;
  for (int x = 0; x < D; ++x) out[idx * D + x] = m > -INFINITY ? acc[x] / l : 0.0f;
  lse[idx] = !pad && l > 0.0f ? top + logf(l) : -INFINITY;
  rmax[idx] = m;
}

struct Case {
  const char* name;
  bool bf16 = true, causal = false, bhsd = false;
  int D = 128;
  int B = 2, Sq = 256, Skv = 256, Hq = 4, Hkv = 4;
  bool bottom_right = false;
  int left = -1, right = -1;  // window sides (-1: none); causal sets right = 0
  float softcap = 0.0f, amp = 1.0f;
  int alibi = 0;        // 1: + slope_h (kv - q); 2: - slope_h |kv - q|; 3: one slope, - (kv - q)
  int persistent = -1;  // FlashFwdParams::persistent
  bool counter = true;  // FlashFwdParams::counter (false: the static schedule)
  int groups = 0;       // FlashFwdParams::groups (0: the rule)
  int sink = 0;         // FlashFwdParams::sink; 2: per-head sinks from -3 to 6
  std::vector<int> q_lens, kv_lens;  // padding: per batch row (empty: none)
  int segments = 0;                  // THD: sequences a row, and per (row, sequence):
  std::vector<int> segs;             // first query, queries, first key, keys (in the row)
  int mask = 0;  // a dense mask (fill_mask's kind), [mask_b ? B : 1, mask_h ? Hq : 1, Sq, Skv]
  bool mask_b = false, mask_h = false, mask_values = false;
  bool keep = false;  // the kernel reads the mask as bytes (bias_keep; the reference: the folded one)
  // A bias (1 post-scale, 2 pre-scale) [bias_b ? B : 1, bias_h ? Hq : 1, Sq, Skv], its rows
  // bias_pad elements longer than Skv; bias_tile: FlashFwdParams::bias_tile.
  int bias = 0;
  bool bias_b = false, bias_h = true;
  int bias_pad = 0, bias_tile = -1;
  float post_bias_mul = 0.0f;  // FlashFwdParams::post_bias_mul
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

template <class T>
void run_case(const Case& cs) {
  const int64_t D = cs.D, nq = int64_t{cs.B} * cs.Sq * cs.Hq * D,
                nk = int64_t{cs.B} * cs.Skv * cs.Hkv * D, rows = nq / D;
  T *q, *k, *v, *o;
  float *lse, *ref_o, *ref_lse, *ref_max, *max_logit, *slopes = nullptr;
  CUDA_OK(cudaMalloc(&q, nq * sizeof(T)));
  CUDA_OK(cudaMalloc(&k, nk * sizeof(T)));
  CUDA_OK(cudaMalloc(&v, nk * sizeof(T)));
  CUDA_OK(cudaMalloc(&o, nq * sizeof(T)));
  CUDA_OK(cudaMalloc(&lse, rows * 4));
  CUDA_OK(cudaMalloc(&ref_o, nq * 4));
  CUDA_OK(cudaMalloc(&ref_lse, rows * 4));
  CUDA_OK(cudaMalloc(&ref_max, rows * 4));
  CUDA_OK(cudaMalloc(&max_logit, cs.B * cs.Hq * 4));
  static uint32_t seed = 1;
  fill<<<1024, 256>>>(q, nq, seed++, cs.amp);
  fill<<<1024, 256>>>(k, nk, seed++, cs.amp);
  fill<<<1024, 256>>>(v, nk, seed++, 1.0f);
  CUDA_OK(cudaMemset(o, 0xff, nq * sizeof(T)));  // NaN
  CUDA_OK(cudaMemset(lse, 0xff, rows * 4));
  CUDA_OK(cudaMemset(max_logit, 0x7f, cs.B * cs.Hq * 4));  // 3.4e38: flash_fwd clears it
  FlashFwdParams p;
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse;
  p.max_logit = max_logit, p.ml_b = 1, p.ml_h = cs.B;  // [H, B]: strides of its own
  auto strides = [&](int64_t S, int64_t H, int64_t* sb, int64_t* ss, int64_t* sh) {
    *sb = S * H * D;
    if (cs.bhsd) *sh = S * D, *ss = D; else *ss = H * D, *sh = D;
  };
  strides(cs.Sq, cs.Hq, &p.q_b, &p.q_s, &p.q_h);
  strides(cs.Skv, cs.Hkv, &p.k_b, &p.k_s, &p.k_h);
  strides(cs.Skv, cs.Hkv, &p.v_b, &p.v_s, &p.v_h);
  strides(cs.Sq, cs.Hq, &p.o_b, &p.o_s, &p.o_h);
  p.l_b = int64_t{cs.Hq} * cs.Sq, p.l_h = cs.Sq, p.l_s = 1;
  p.batch = cs.B, p.seqlen_q = cs.Sq, p.seqlen_kv = cs.Skv, p.heads_q = cs.Hq,
  p.heads_kv = cs.Hkv, p.head_dim = D;
  p.bf16 = cs.bf16, p.scale = 1.0f / std::sqrt(static_cast<float>(D)), p.softcap = cs.softcap;
  p.persistent = cs.persistent, p.groups = cs.groups;
  int* counter = nullptr;
  if (cs.counter) {
    CUDA_OK(cudaMalloc(&counter, sizeof(int)));
    CUDA_OK(cudaMemset(counter, 0x7f, sizeof(int)));  // flash_fwd zeroes it
    p.counter = counter;
  }
  // The band as hopper/band.h sets it: the window's sides from each sequence's base diagonal.
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
  if (cs.segments) {
    const int n = cs.B * cs.segments;
    std::vector<int> h(4 * n);
    for (int t = 0; t < n; ++t) {
      const int b = t / cs.segments, *g = &cs.segs[4 * t];
      h[t] = g[1], h[n + t] = g[3], h[2 * n + t] = b * cs.Sq + g[0], h[3 * n + t] = b * cs.Skv + g[2];
    }
    CUDA_OK(cudaMalloc(&lens, h.size() * 4));
    CUDA_OK(cudaMemcpy(lens, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    p.seq_q_len = lens, p.seq_kv_len = lens + n, p.seq_q_tok = lens + 2 * n,
    p.seq_kv_tok = lens + 3 * n, p.segments = cs.segments;
  }
  float* sinks = nullptr;
  if (cs.sink) {
    p.sink = cs.sink;
    if (cs.sink == 2) {
      std::vector<float> h(cs.Hq);
      for (int i = 0; i < cs.Hq; ++i) h[i] = -3.0f + 9.0f * i / std::max(1, cs.Hq - 1);
      CUDA_OK(cudaMalloc(&sinks, cs.Hq * 4));
      CUDA_OK(cudaMemcpy(sinks, h.data(), cs.Hq * 4, cudaMemcpyHostToDevice));
      p.sinks = sinks, p.sink_rows = cs.B;
    }
  }
  if (cs.alibi) {
    std::vector<float> h(cs.Hq);
    for (int i = 0; i < cs.Hq; ++i) h[i] = std::exp2(-8.0f * (i + 1) / cs.Hq);
    CUDA_OK(cudaMalloc(&slopes, cs.Hq * 4));
    CUDA_OK(cudaMemcpy(slopes, h.data(), cs.Hq * 4, cudaMemcpyHostToDevice));
    p.alibi_slopes = slopes;
    p.alibi_stride = cs.alibi == 3 ? 0 : 1;
    p.alibi_sign = cs.alibi == 1 ? 1.0f : -1.0f;
    p.alibi_abs = cs.alibi == 2;
  }
  T* mask = nullptr;
  uint8_t* keep = nullptr;
  void* mask_tiles = nullptr;
  if (cs.mask) {
    const int64_t mb = cs.mask_b ? cs.B : 1, mh = cs.mask_h ? cs.Hq : 1;
    const int64_t n = mb * mh * cs.Sq * cs.Skv;
    CUDA_OK(cudaMalloc(&mask, n * sizeof(T)));
    // the folded mask's value, rounded to T (c_api.cc's fa_masked_bias_value)
    p.mask_value = static_cast<float>(static_cast<T>(-0.7f * (cs.bf16 ? 3.3895313892515355e38f : 65504.0f)));
    fill_mask<<<1024, 256>>>(mask, mb * mh, cs.Sq, cs.Skv, cs.mask, cs.mask_values, p.mask_value, seed++);
    p.bias = mask, p.mask_bias = true, p.bias_batch = mb, p.bias_heads = mh;
    p.bias_s = cs.Skv, p.bias_h = cs.mask_h ? int64_t{cs.Sq} * cs.Skv : 0;
    p.bias_b = cs.mask_b ? mh * cs.Sq * cs.Skv : 0;
    const int64_t bytes = mask_tiles_bytes(mb, mh, cs.Sq, cs.Skv);
    CUDA_OK(cudaMalloc(&mask_tiles, bytes));
    CUDA_OK(cudaMemset(mask_tiles, 0x55, bytes));  // flash_fwd writes every class it reads
    p.mask_tiles = mask_tiles;
    if (cs.keep) {
      CUDA_OK(cudaMalloc(&keep, n));
      keep_bytes<<<1024, 256>>>(mask, n, p.mask_value, keep);
    }
  }
  T* bias = nullptr;
  if (cs.bias) {
    const int64_t bb = cs.bias_b ? cs.B : 1, bh = cs.bias_h ? cs.Hq : 1, row = cs.Skv + cs.bias_pad;
    const int64_t n = bb * bh * cs.Sq * row;
    CUDA_OK(cudaMalloc(&bias, n * sizeof(T)));
    fill<<<1024, 256>>>(bias, n, seed++, cs.bias == 2 ? 12.0f : 2.0f);
    p.bias = bias, p.bias_pre_scale = cs.bias == 2, p.bias_batch = bb, p.bias_heads = bh;
    p.bias_s = row, p.bias_h = cs.bias_h ? int64_t{cs.Sq} * row : 0;
    p.bias_b = cs.bias_b ? bh * cs.Sq * row : 0;
    p.bias_tile = cs.bias_tile, p.post_bias_mul = cs.post_bias_mul;
  }
  FlashFwdParams run = p;  // the kernel's (a keep mask's bytes); the reference reads p's
  if (keep) run.bias = keep, run.bias_keep = true;
  ASSERT_EQ(flash_fwd_unsupported(run, 90), "");
  const Status st = flash_fwd(run, 0);
  ASSERT_TRUE(st.ok()) << st.message;
  reference<T><<<(rows + 127) / 128, 128>>>(p, ref_o, ref_lse, ref_max);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<T> ho(nq);
  std::vector<float> hr(nq), hl(rows), hrl(rows), hrm(rows), hm(cs.B * cs.Hq);
  CUDA_OK(cudaMemcpy(ho.data(), o, nq * sizeof(T), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hr.data(), ref_o, nq * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hl.data(), lse, rows * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hrl.data(), ref_lse, rows * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hrm.data(), ref_max, rows * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hm.data(), max_logit, hm.size() * 4, cudaMemcpyDeviceToHost));
  // max_logit: each (b, h)'s max over its rows' kept logits (-inf: none kept).
  std::vector<float> want_max(cs.B * cs.Hq, -INFINITY);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = r / cs.Sq % cs.Hq, b = r / (int64_t{cs.Sq} * cs.Hq);
    want_max[b * cs.Hq + h] = std::max(want_max[b * cs.Hq + h], hrm[r]);
  }
  for (int b = 0; b < cs.B; ++b)
    for (int h = 0; h < cs.Hq; ++h) {
      const float got = hm[h * cs.B + b], want = want_max[b * cs.Hq + h];
      EXPECT_TRUE(std::isinf(want) ? got == want
                                   : std::fabs(got - want) <= 1e-3 + 2e-3 * std::fabs(want))
          << "max_logit of batch row " << b << ", head " << h << ": " << got << ", want " << want;
    }
  // The reference is [B, H, S, D] by row index; ours through the strides. Every element
  // is compared (a NaN fails: the poison of an unwritten element included), except the
  // rows of no THD sequence, which must still hold the poison.
  int64_t bad = 0, first = -1;
  double err = 0, lerr = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % cs.Sq, h = r / cs.Sq % cs.Hq, b = r / (int64_t{cs.Sq} * cs.Hq);
    const T* row = ho.data() + b * p.o_b + i * p.o_s + h * p.o_h;
    if (std::isnan(hrl[r])) {  // no sequence's row: unwritten
      bool poisoned = std::isnan(hl[b * p.l_b + h * p.l_h + i]);
      for (int x = 0; x < D; ++x) poisoned &= std::isnan(static_cast<float>(row[x]));
      if (!poisoned) ++bad, first = first < 0 ? r : first;
      continue;
    }
    for (int x = 0; x < D; ++x) {
      const float ours = static_cast<float>(row[x]), want = hr[r * D + x];
      const double e = std::fabs(ours - want);
      if (!(e <= 1e-2 + 1e-2 * std::fabs(want))) ++bad, first = first < 0 ? r : first;
      if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
    }
    // lse's row sum adds up P as the tensor cores read it, rounded to T (fwd_kernel.cuh's
    // kOnes), so a row of few keys is off by up to log(1 + 2^-9) (bf16) or 2^-12 (fp16).
    const float got = hl[b * p.l_b + h * p.l_h + i], want = hrl[r];
    const double p_round = cs.bf16 ? 0x1p-9 : 0x1p-12;
    const bool same = std::isinf(want)
                          ? got == want
                          : std::fabs(got - want) <= 1e-3 + p_round + 1e-3 * std::fabs(want);
    if (!same) ++bad, first = first < 0 ? r : first;
    if (!std::isinf(want) && !(std::fabs(got - want) <= lerr))
      lerr = std::isnan(got) ? INFINITY : std::fabs(got - want);
  }
  EXPECT_EQ(bad, 0) << "max |out err| " << err << ", max |lse err| " << lerr
                    << ", first bad row " << first;
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)lse, (void*)ref_o,
                    (void*)ref_lse, (void*)ref_max, (void*)max_logit, (void*)slopes, (void*)lens,
                    (void*)counter, (void*)sinks, (void*)mask, mask_tiles, (void*)bias, (void*)keep})
    if (ptr) CUDA_OK(cudaFree(ptr));
}

class HopperMode : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!has_sm90()) GTEST_SKIP() << "needs an sm_90 GPU (H100, H200)";
  }
};

TEST_P(HopperMode, MatchesTheReference) {
  const Case& c = GetParam();
  if (c.bf16) run_case<__nv_bfloat16>(c); else run_case<__half>(c);
}

Case make(const char* name, void (*edit)(Case&)) {
  Case c;
  c.name = name;
  edit(c);
  return c;
}

const Case kCases[] = {
    make("plain", [](Case&) {}),
    make("plain_fp16_ragged", [](Case& c) { c.bf16 = false, c.Sq = 300, c.Skv = 777; }),
    make("causal_gqa", [](Case& c) { c.causal = true, c.Sq = c.Skv = 1000, c.Hkv = 2; }),
    make("causal_mqa_bhsd", [](Case& c) { c.causal = true, c.Hkv = 1, c.bhsd = true; }),
    make("bottom_right", [](Case& c) {
      c.causal = true, c.bottom_right = true, c.Sq = 200, c.Skv = 650; }),
    make("causal_persistent", [](Case& c) { c.causal = true, c.Sq = c.Skv = 700, c.persistent = 1; }),
    make("full_block_a_tile", [](Case& c) { c.Sq = 500, c.Skv = 900, c.persistent = 0; }),
    make("full_static_schedule", [](Case& c) { c.Sq = 1300, c.Skv = 900, c.counter = false; }),
    make("thd_static_schedule", [](Case& c) {
      c.causal = true, c.Sq = c.Skv = 700, c.segments = 2, c.counter = false;
      c.segs = {0, 300, 0, 300, 300, 400, 300, 400, 0, 129, 0, 129, 200, 400, 200, 400}; }),
    make("window_causal_256", [](Case& c) { c.causal = true, c.Sq = c.Skv = 1000, c.left = 256; }),
    make("window_causal_5", [](Case& c) { c.causal = true, c.Sq = c.Skv = 700, c.left = 5; }),
    make("window_both_sides", [](Case& c) { c.Sq = c.Skv = 700, c.left = 100, c.right = 37; }),
    make("window_right_only", [](Case& c) { c.Sq = 512, c.Skv = 900, c.right = 64; }),
    make("window_left_only", [](Case& c) { c.Sq = 600, c.Skv = 900, c.left = 130; }),
    make("window_bottom_right", [](Case& c) {
      c.causal = true, c.bottom_right = true, c.Sq = 300, c.Skv = 1000, c.left = 129; }),
    make("window_block_a_tile", [](Case& c) {
      c.causal = true, c.Sq = c.Skv = 1000, c.left = 300, c.persistent = 0; }),
    make("window_left_wider_than_rows", [](Case& c) { c.Sq = 400, c.Skv = 300, c.left = 200; }),
    make("softcap_causal", [](Case& c) {
      c.causal = true, c.Sq = c.Skv = 512, c.softcap = 20.0f, c.amp = 3.0f; }),
    make("softcap_window_fp16", [](Case& c) {
      c.bf16 = false, c.causal = true, c.Sq = c.Skv = 800, c.left = 200, c.softcap = 50.0f; }),
    make("padding", [](Case& c) {
      c.Sq = 512, c.Skv = 700, c.Hkv = 2, c.q_lens = {300, 512}, c.kv_lens = {700, 1}; }),
    make("padding_causal_empty_rows", [](Case& c) {
      c.causal = true, c.Sq = c.Skv = 640, c.q_lens = {640, 0}, c.kv_lens = {129, 640}; }),
    make("padding_bottom_right", [](Case& c) {
      c.causal = true, c.bottom_right = true, c.Sq = 400, c.Skv = 900, c.Hkv = 1,
      c.q_lens = {200, 400}, c.kv_lens = {850, 130}; }),
    make("padding_window_lengths_out_of_range", [](Case& c) {
      c.causal = true, c.Sq = c.Skv = 800, c.left = 100, c.q_lens = {-5, 9999},
      c.kv_lens = {800, 64}; }),
    make("thd_causal_gaps", [](Case& c) {  // row 1: a gap, a tail and an empty sequence
      c.causal = true, c.Sq = c.Skv = 700, c.segments = 3;
      c.segs = {0, 300, 0, 300, 300, 250, 300, 250, 550, 150, 550, 150,
                0, 129, 0, 129, 200, 400, 200, 400, 700, 0, 700, 0}; }),
    make("thd_cross_bottom_right_window_fp16", [](Case& c) {
      c.bf16 = false, c.causal = true, c.bottom_right = true, c.left = 64, c.Sq = 400,
      c.Skv = 900, c.Hkv = 1, c.segments = 2;
      c.segs = {0, 150, 0, 500, 150, 250, 500, 400, 10, 200, 0, 130, 260, 100, 130, 1}; }),
    make("thd_full_gqa_empty_sides", [](Case& c) {  // queries of no keys, keys of no queries
      c.Sq = 512, c.Skv = 600, c.Hkv = 2, c.segments = 3;
      c.segs = {0, 256, 0, 0, 256, 200, 0, 600, 456, 0, 600, 0,
                0, 512, 0, 300, 512, 0, 300, 300, 512, 0, 600, 0}; }),
    make("thd_softcap_block_a_tile", [](Case& c) {
      c.causal = true, c.Sq = c.Skv = 1000, c.softcap = 30.0f, c.amp = 3.0f, c.persistent = 0,
      c.segments = 2;
      c.segs = {0, 1000, 0, 1000, 1000, 0, 1000, 0, 5, 700, 5, 700, 705, 295, 705, 295}; }),
    make("alibi_plus", [](Case& c) { c.causal = true, c.Sq = c.Skv = 640, c.alibi = 1; }),
    make("alibi_abs_ragged", [](Case& c) { c.Sq = 300, c.Skv = 777, c.alibi = 2; }),
    make("alibi_one_slope", [](Case& c) {
      c.causal = true, c.bottom_right = true, c.Sq = 200, c.Skv = 650, c.alibi = 3, c.Hkv = 1; }),
    // Head dim 64: one copy box a tile, the m64n72 P V product.
    make("d64_plain_fp16_ragged", [](Case& c) { c.D = 64, c.bf16 = false, c.Sq = 300, c.Skv = 777; }),
    make("d64_causal_gqa", [](Case& c) { c.D = 64, c.causal = true, c.Sq = c.Skv = 1000, c.Hkv = 2; }),
    make("d64_bottom_right_bhsd", [](Case& c) {
      c.D = 64, c.causal = true, c.bottom_right = true, c.bhsd = true, c.Sq = 200, c.Skv = 650; }),
    make("d64_window_static_schedule", [](Case& c) {
      c.D = 64, c.causal = true, c.Sq = c.Skv = 1000, c.left = 256, c.counter = false; }),
    make("d64_softcap_block_a_tile", [](Case& c) {
      c.D = 64, c.causal = true, c.Sq = c.Skv = 512, c.softcap = 20.0f, c.amp = 3.0f,
      c.persistent = 0; }),
    make("d64_alibi_abs", [](Case& c) { c.D = 64, c.Sq = 300, c.Skv = 777, c.alibi = 2; }),
    make("d64_padding_causal_empty_rows", [](Case& c) {
      c.D = 64, c.causal = true, c.Sq = c.Skv = 640, c.q_lens = {640, 0}, c.kv_lens = {129, 640}; }),
    // More tiles than SMs: persistent blocks take tile after tile (the turns of the
    // consumer groups run on across tiles).
    make("causal_many_tiles", [](Case& c) {
      c.causal = true, c.B = 4, c.Hq = 16, c.Hkv = 4, c.Sq = c.Skv = 1500; }),
    make("d64_causal_many_tiles", [](Case& c) {
      c.D = 64, c.causal = true, c.B = 4, c.Hq = 16, c.Hkv = 4, c.Sq = c.Skv = 1500; }),
    make("d64_full_many_tiles_fp16", [](Case& c) {
      c.D = 64, c.bf16 = false, c.B = 4, c.Hq = 16, c.Sq = 1100, c.Skv = 1300; }),
    make("d64_window_many_tiles", [](Case& c) {
      c.D = 64, c.causal = true, c.left = 200, c.B = 4, c.Hq = 16, c.Sq = c.Skv = 1500; }),
    // Head dim 64's two kernels each where the rule would pick the other (groups forced).
    make("d64_causal_three_groups", [](Case& c) {
      c.D = 64, c.groups = 3, c.causal = true, c.B = 4, c.Hq = 16, c.Hkv = 2, c.Sq = c.Skv = 1500; }),
    make("d64_window_three_groups_fp16", [](Case& c) {
      c.D = 64, c.groups = 3, c.bf16 = false, c.causal = true, c.left = 129, c.Sq = c.Skv = 1000; }),
    make("d64_thd_three_groups", [](Case& c) {
      c.D = 64, c.groups = 3, c.causal = true, c.Sq = c.Skv = 700, c.segments = 3;
      c.segs = {0, 300, 0, 300, 300, 250, 300, 250, 550, 150, 550, 150,
                0, 129, 0, 129, 200, 400, 200, 400, 700, 0, 700, 0}; }),
    make("d64_full_two_groups", [](Case& c) {
      c.D = 64, c.groups = 2, c.B = 4, c.Hq = 16, c.Sq = 1100, c.Skv = 1300; }),
    make("d64_thd_causal_gaps", [](Case& c) {
      c.D = 64, c.causal = true, c.Sq = c.Skv = 700, c.segments = 3;
      c.segs = {0, 300, 0, 300, 300, 250, 300, 250, 550, 150, 550, 150,
                0, 129, 0, 129, 200, 400, 200, 400, 700, 0, 700, 0}; }),
    // Sinks (an extra logit: off-by-one 0, or one a head), with rows of no keys among them.
    make("sink_off_by_one_causal", [](Case& c) { c.sink = 1, c.causal = true, c.Sq = c.Skv = 700; }),
    make("sink_learnable_padding_rows_of_no_keys", [](Case& c) {  // row 0: lse = its sink
      c.sink = 2, c.causal = true, c.Sq = c.Skv = 640, c.q_lens = {640, 300}, c.kv_lens = {0, 640}; }),
    make("sink_learnable_thd_gaps_fp16", [](Case& c) {
      c.sink = 2, c.bf16 = false, c.causal = true, c.Sq = c.Skv = 700, c.segments = 3;
      c.segs = {0, 300, 0, 300, 300, 250, 300, 250, 550, 150, 550, 150,
                0, 129, 0, 129, 200, 400, 200, 400, 700, 0, 700, 0}; }),
    make("d64_sink_learnable_window", [](Case& c) {
      c.D = 64, c.sink = 2, c.causal = true, c.left = 100, c.Sq = c.Skv = 900, c.amp = 0.3f; }),
    make("d256_sink_learnable_softcap", [](Case& c) {
      c.D = 256, c.sink = 2, c.causal = true, c.Sq = c.Skv = 512, c.softcap = 20.0f, c.amp = 3.0f; }),
    // Head dim 256: 64-key steps, the m64n256 P V product, row sums in registers.
    make("d256_plain_fp16_ragged", [](Case& c) { c.D = 256, c.bf16 = false, c.Sq = 300, c.Skv = 777; }),
    make("d256_causal_gqa", [](Case& c) { c.D = 256, c.causal = true, c.Sq = c.Skv = 1000, c.Hkv = 2; }),
    make("d256_bottom_right_bhsd", [](Case& c) {
      c.D = 256, c.causal = true, c.bottom_right = true, c.bhsd = true, c.Sq = 200, c.Skv = 650; }),
    make("d256_window_static_schedule", [](Case& c) {
      c.D = 256, c.causal = true, c.Sq = c.Skv = 1000, c.left = 100, c.counter = false; }),
    make("d256_window_both_sides", [](Case& c) { c.D = 256, c.Sq = c.Skv = 700, c.left = 70, c.right = 37; }),
    make("d256_softcap_block_a_tile", [](Case& c) {
      c.D = 256, c.causal = true, c.Sq = c.Skv = 512, c.softcap = 20.0f, c.amp = 3.0f,
      c.persistent = 0; }),
    make("d256_alibi_abs", [](Case& c) { c.D = 256, c.Sq = 300, c.Skv = 777, c.alibi = 2; }),
    make("d256_padding_causal_empty_rows", [](Case& c) {
      c.D = 256, c.causal = true, c.Sq = c.Skv = 640, c.q_lens = {640, 0}, c.kv_lens = {65, 640}; }),
    make("d256_thd_causal_gaps", [](Case& c) {
      c.D = 256, c.causal = true, c.Sq = c.Skv = 700, c.segments = 3;
      c.segs = {0, 300, 0, 300, 300, 250, 300, 250, 550, 150, 550, 150,
                0, 129, 0, 129, 200, 400, 200, 400, 700, 0, 700, 0}; }),
    make("d256_causal_many_tiles", [](Case& c) {
      c.D = 256, c.causal = true, c.B = 4, c.Hq = 16, c.Hkv = 4, c.Sq = c.Skv = 1500; }),
    make("d256_full_many_tiles_fp16", [](Case& c) {
      c.D = 256, c.bf16 = false, c.B = 4, c.Hq = 16, c.Sq = 1100, c.Skv = 1300; }),
    // Dense masks (a folded boolean mask: dropped keys skipped by tile, the rest read).
    make("mask_dense_causal", [](Case& c) { c.mask = 1, c.Sq = c.Skv = 700; }),
    make("mask_dense_band_holes_per_batch_and_head_values", [](Case& c) {
      c.mask = 2, c.mask_b = c.mask_h = true, c.mask_values = true, c.Sq = 600, c.Skv = 900; }),
    make("mask_dense_band_gqa_fp16", [](Case& c) {
      c.mask = 2, c.mask_h = true, c.bf16 = false, c.Hq = 8, c.Hkv = 2, c.Sq = c.Skv = 777; }),
    make("mask_dense_with_causal_type_and_padding", [](Case& c) {
      c.mask = 2, c.mask_b = true, c.causal = true, c.Sq = c.Skv = 640, c.q_lens = {640, 300},
      c.kv_lens = {500, 640}; }),
    make("d64_mask_dense_band_three_groups", [](Case& c) {
      c.D = 64, c.groups = 3, c.mask = 2, c.B = 3, c.Sq = 1000, c.Skv = 1100; }),
    make("d64_mask_dense_causal_window_type", [](Case& c) {
      c.D = 64, c.mask = 1, c.mask_values = true, c.causal = true, c.left = 200, c.Sq = c.Skv = 900; }),
    make("d256_mask_dense_causal_fp16", [](Case& c) {
      c.D = 256, c.mask = 1, c.bf16 = false, c.Sq = 500, c.Skv = 700; }),
    make("d256_mask_dense_band_heads", [](Case& c) {
      c.D = 256, c.mask = 2, c.mask_h = true, c.Sq = c.Skv = 640; }),
    // Keys in 8-key units: the classification's 16-byte loads (classify_vec); the cases above
    // of other key counts take its key-at-a-time loads.
    make("mask_dense_band_holes_values_keys_of_8", [](Case& c) {
      c.mask = 2, c.mask_b = c.mask_h = true, c.mask_values = true, c.Sq = 600, c.Skv = 896; }),
    make("d64_mask_dense_band_keys_of_8", [](Case& c) {
      c.D = 64, c.mask = 2, c.B = 3, c.Sq = 1000, c.Skv = 1096; }),
    // A boolean keep mask's bytes (bias_keep: dot_product_attention's mask alone): 16-key
    // loads (keys and strides in 16-key units) or one key a lane.
    make("keep_mask_band_holes_per_batch_and_head", [](Case& c) {
      c.keep = true, c.mask = 2, c.mask_b = c.mask_h = true, c.Sq = 600, c.Skv = 896; }),
    make("keep_mask_causal_keys_not_of_16", [](Case& c) { c.keep = true, c.mask = 1, c.Sq = c.Skv = 700; }),
    make("d64_keep_mask_band_gqa", [](Case& c) {
      c.D = 64, c.keep = true, c.mask = 2, c.Hq = 8, c.Hkv = 2, c.B = 3, c.Sq = 1000, c.Skv = 1024; }),
    make("d256_keep_mask_band_heads_fp16", [](Case& c) {
      c.D = 256, c.keep = true, c.mask = 2, c.mask_h = true, c.bf16 = false, c.Sq = c.Skv = 640; }),
    // A bias: its tiles through the copy engine (rows past Sq and keys past Skv read as 0),
    // or a score at a time (rows not 16-byte units, or bias_tile 0).
    make("bias_post_causal_tiles", [](Case& c) { c.bias = 1, c.causal = true, c.Sq = c.Skv = 700; }),
    make("bias_pre_ragged_gqa_tiles", [](Case& c) {
      c.bias = 2, c.Sq = 300, c.Skv = 776, c.Hkv = 2, c.bias_b = true; }),
    make("bias_post_batch_only_window_fp16_tiles", [](Case& c) {
      c.bias = 1, c.bias_b = true, c.bias_h = false, c.bf16 = false, c.causal = true, c.left = 200,
      c.Sq = c.Skv = 900; }),
    make("bias_pre_broadcast_padding_bottom_right_tiles", [](Case& c) {
      c.bias = 2, c.bias_h = false, c.causal = true, c.bottom_right = true, c.Sq = 400, c.Skv = 904,
      c.q_lens = {200, 400}, c.kv_lens = {850, 130}; }),
    make("bias_post_padded_rows_many_tiles", [](Case& c) {
      c.bias = 1, c.bias_pad = 8, c.B = 4, c.Hq = 16, c.Hkv = 4, c.Sq = c.Skv = 1500, c.causal = true; }),
    make("bias_post_unaligned_rows_global_reads", [](Case& c) {
      c.bias = 1, c.Sq = 300, c.Skv = 777; }),
    make("bias_pre_tiles_off", [](Case& c) { c.bias = 2, c.bias_tile = 0, c.Sq = c.Skv = 640; }),
    make("d64_bias_post_tiles", [](Case& c) { c.D = 64, c.bias = 1, c.Sq = 1000, c.Skv = 1096; }),
    make("d64_bias_pre_causal_many_tiles_fp16", [](Case& c) {
      c.D = 64, c.bias = 2, c.bf16 = false, c.causal = true, c.B = 4, c.Hq = 16, c.Sq = c.Skv = 1500; }),
    make("d64_bias_three_groups_forced_global_reads", [](Case& c) {
      c.D = 64, c.groups = 3, c.bias = 1, c.bias_tile = 0, c.causal = true, c.Sq = c.Skv = 1000; }),
    make("d256_bias_post_causal_tiles", [](Case& c) { c.D = 256, c.bias = 1, c.causal = true, c.Sq = c.Skv = 700; }),
    make("d256_bias_pre_ragged_fp16_tiles", [](Case& c) {
      c.D = 256, c.bias = 2, c.bf16 = false, c.bias_b = true, c.Sq = 300, c.Skv = 520; }),
    // ALiBi with a bias's tiles (WithBiasTile): the tile joins q.k before the modifier.
    make("alibi_bias_post_causal_tiles", [](Case& c) {
      c.alibi = 1, c.bias = 1, c.causal = true, c.Sq = c.Skv = 640; }),
    make("alibi_abs_bias_pre_ragged_gqa_tiles", [](Case& c) {
      c.alibi = 2, c.bias = 2, c.Sq = 300, c.Skv = 776, c.Hkv = 2, c.bias_b = true; }),
    make("d64_alibi_one_slope_bias_post_bottom_right_fp16", [](Case& c) {
      c.D = 64, c.alibi = 3, c.bias = 1, c.bf16 = false, c.causal = true, c.bottom_right = true,
      c.Sq = 200, c.Skv = 648, c.Hkv = 1; }),
    make("d64_alibi_bias_pre_window_broadcast", [](Case& c) {
      c.D = 64, c.alibi = 1, c.bias = 2, c.bias_h = false, c.causal = true, c.left = 300,
      c.Sq = c.Skv = 1000; }),
    make("d256_alibi_abs_bias_post_padded_rows", [](Case& c) {
      c.D = 256, c.alibi = 2, c.bias = 1, c.bias_pad = 8, c.Sq = 700, c.Skv = 520; }),
    // softcap with a bias's tiles (WithBiasTile<SoftcapScores>): the tile joins q.k before
    // the tanh; large scores and biases so that the tanh saturates.
    make("softcap_bias_post_causal_tiles", [](Case& c) {
      c.softcap = 5.0f, c.amp = 3.0f, c.bias = 1, c.causal = true, c.Sq = c.Skv = 640; }),
    make("softcap_bias_pre_ragged_gqa_fp16_tiles", [](Case& c) {
      c.softcap = 20.0f, c.amp = 2.0f, c.bias = 2, c.bf16 = false, c.Sq = 300, c.Skv = 776, c.Hkv = 2,
      c.bias_b = true; }),
    make("d64_softcap_bias_post_window_broadcast_mul", [](Case& c) {
      c.D = 64, c.softcap = 3.0f, c.amp = 3.0f, c.bias = 1, c.bias_h = false, c.causal = true,
      c.left = 300, c.Sq = c.Skv = 1000, c.post_bias_mul = 0.3f; }),
    make("d64_softcap_bias_pre_padding_bottom_right", [](Case& c) {
      c.D = 64, c.softcap = 30.0f, c.amp = 4.0f, c.bias = 2, c.causal = true, c.bottom_right = true,
      c.B = 3, c.Sq = 200, c.Skv = 648, c.q_lens = {200, 77, 0}, c.kv_lens = {648, 300, 40}; }),
    make("d256_softcap_bias_post_padded_rows_sink", [](Case& c) {
      c.D = 256, c.softcap = 10.0f, c.amp = 3.0f, c.bias = 1, c.bias_pad = 8, c.sink = 2,
      c.Sq = 700, c.Skv = 520; }),
};

INSTANTIATE_TEST_SUITE_P(Cases, HopperMode, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

// max_logit's keys keep the floats' order, NaN above all and 0 below all (no row yet).
TEST(HopperFwdMaxLogitKey, KeepsTheOrder) {
  const float xs[] = {-INFINITY, -3e38f, -2.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 1.0f, 7.5f, 3e38f,
                      INFINITY};
  uint32_t last = 0;
  for (float x : xs) {
    const uint32_t key = max_logit_key(x);
    EXPECT_GE(key, last) << x;
    EXPECT_GT(key, 0u) << x;
    last = key;
    const float back = max_logit_value(key);
    EXPECT_TRUE(back == x && std::signbit(back) == std::signbit(x)) << x << " -> " << back;
  }
  EXPECT_GT(max_logit_key(NAN), max_logit_key(INFINITY));
  EXPECT_GT(max_logit_key(-NAN), max_logit_key(INFINITY));  // any NaN
  EXPECT_TRUE(std::isnan(max_logit_value(max_logit_key(NAN))));
  EXPECT_EQ(max_logit_value(0), -INFINITY);
}

// What the host refuses, with the reason, before any launch.
TEST(HopperFwdUnsupported, NamesTheRule) {
  FlashFwdParams p;
  p.batch = 1, p.seqlen_q = 512, p.seqlen_kv = 256, p.heads_q = p.heads_kv = 1, p.head_dim = 128;
  alignas(16) static char buf[16];
  p.q = p.k = p.v = p.out = buf;
  p.left_bound = true, p.lo_diag = -64;  // row 511 would keep keys from 447 >= 256
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("without keys"), std::string::npos);
  p.lo_diag = -256;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  EXPECT_NE(flash_fwd_unsupported(p, 80).find("9.0"), std::string::npos);
  static int32_t lens[2];
  p.lo_diag = -64, p.q_lens = lens;  // lengths come in pairs
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("together"), std::string::npos);
  p.kv_lens = lens + 1;  // padded: the kernel masks rows of no keys one by one
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.seq_q_len = p.seq_kv_len = p.seq_q_tok = lens;  // THD's four tables come together
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("together"), std::string::npos);
  p.seq_kv_tok = lens;  // and replace the padding lengths
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("not both"), std::string::npos);
  p.q_lens = p.kv_lens = nullptr, p.segments = 4;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.seq_q_len = p.seq_kv_len = p.seq_q_tok = p.seq_kv_tok = nullptr;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("segments > 1"), std::string::npos);
  p.segments = 1, p.left_bound = false;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.head_dim = 64;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.groups = 3;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.head_dim = 128;  // three groups at head dim 64 only
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("groups"), std::string::npos);
  p.groups = 0, p.head_dim = 256;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.groups = 3;  // two at head dim 256
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("groups"), std::string::npos);
  p.groups = 0, p.head_dim = 192;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("64, 128 or 256"), std::string::npos);
  // A score modifier's bias: ALiBi's as tiles only, softcap none.
  p.head_dim = 64, p.seqlen_kv = 512;
  alignas(16) static uint16_t bias[16];
  static float slopes[1];
  p.bias = bias, p.bias_s = 512, p.bias_batch = p.bias_heads = 1, p.alibi_slopes = slopes;
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.groups = 3;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("no bias tiles"), std::string::npos);
  p.groups = 0, p.bias_s = 516;  // rows not 16-byte units: no tiles
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("as tiles"), std::string::npos);
  p.bias_s = 512, p.bias_tile = 0;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("as tiles"), std::string::npos);
  p.bias_tile = -1, p.scale = 0.0f;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("scale != 0"), std::string::npos);
  p.alibi_slopes = nullptr, p.scale = 0.125f, p.softcap = 30.0f;  // softcap's alike
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.bias_s = 516;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("as tiles"), std::string::npos);
  p.bias_s = 512, p.scale = 0.0f;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("scale != 0"), std::string::npos);
  p.post_bias_mul = 0.5f;  // the caller's own multiplier: scale 0 then fine
  EXPECT_EQ(flash_fwd_unsupported(p, 90), "");
  p.post_bias_mul = INFINITY;
  EXPECT_NE(flash_fwd_unsupported(p, 90).find("post_bias_mul"), std::string::npos);
}

}  // namespace
}  // namespace fusedattn::cuda::hopper
