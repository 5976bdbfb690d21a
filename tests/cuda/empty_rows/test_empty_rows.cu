// The empty-row passes (attention/cuda/empty_rows.h: kRequestAverageEmptyRows) alone, against
// a host reference: rows below their query length whose lse is at most the threshold (-inf,
// or a folded mask's value) get their kv head's average of the values, every other row of
// out stays as it was (bit for bit); the backward's lse is +inf exactly there, and dv gains
// the sum of those rows' dout / Skv, the same bits on a second run. Scratch is poisoned.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fusedattn/attention/cuda/empty_rows.h"

namespace fusedattn::cuda {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

float to_f(float x) { return x; }
float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
T from_f(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return __float2bfloat16(x);
}

struct Case {
  int64_t B, Sq, Skv, Hq, Hkv, Dv;
  std::vector<int32_t> q_lens;  // empty: no padding
  int64_t quiet_kv_head = -1;   // a kv head none of whose rows is empty (-1: none)
};

template <class T>
void run_case(const Case& c) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  const float threshold = -1.0e38f;
  const int64_t n_lse = c.B * c.Hq * c.Sq, n_o = c.B * c.Sq * c.Hq * c.Dv, n_v = c.B * c.Skv * c.Hkv * c.Dv;
  std::vector<float> lse(n_lse);
  std::vector<bool> empty(n_lse);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        const int64_t at = (b * c.Hq + h) * c.Sq + i, len = c.q_lens.empty() ? c.Sq : c.q_lens[b];
        const bool padding = i >= len;
        // rows that keep nothing: -inf (keys dropped) or about the folded mask's value
        const bool quiet = h / (c.Hq / c.Hkv) == c.quiet_kv_head;
        const int kind = padding ? 1 : quiet ? 0 : int(rng() % 9);
        lse[at] = kind == 1 ? -INFINITY : kind == 2 ? -2.3e38f : 3.0f + normal(rng);
        empty[at] = !padding && (kind == 1 || kind == 2);
      }
  std::vector<T> v(n_v), out(n_o), dout(n_o), dv(n_v);
  for (auto& x : v) x = from_f<T>(normal(rng));
  for (auto& x : out) x = from_f<T>(normal(rng));
  for (auto& x : dout) x = from_f<T>(normal(rng));
  for (auto& x : dv) x = from_f<T>(normal(rng));

  AttnParams p{};
  p.batch = c.B, p.seqlen_q = c.Sq, p.seqlen_kv = c.Skv, p.heads_q = c.Hq, p.heads_kv = c.Hkv;
  p.head_dim_qk = p.head_dim_v = c.Dv, p.max_segments = 1, p.num_slices = 1;
  p.dtype = std::is_same_v<T, float> ? FA_FLOAT32 : FA_BFLOAT16;
  p.mask_type = c.q_lens.empty() ? FA_NO_MASK : FA_PADDING_MASK;
  const ViewStrides so{c.Sq * c.Hq * c.Dv, c.Hq * c.Dv, c.Dv}, sv{c.Skv * c.Hkv * c.Dv, c.Hkv * c.Dv, c.Dv};

  float *d_lse = nullptr;
  T *d_v = nullptr, *d_out = nullptr, *d_dout = nullptr, *d_dv = nullptr;
  int32_t* d_lens = nullptr;
  void* bwd_scratch = nullptr;
  const size_t bwd_bytes = empty_rows_bwd_scratch_bytes(p);
  CUDA_OK(cudaMalloc(&d_lse, n_lse * 4));
  CUDA_OK(cudaMalloc(&d_v, n_v * sizeof(T)));
  CUDA_OK(cudaMalloc(&d_out, n_o * sizeof(T)));
  CUDA_OK(cudaMalloc(&d_dout, n_o * sizeof(T)));
  CUDA_OK(cudaMalloc(&d_dv, n_v * sizeof(T)));
  CUDA_OK(cudaMalloc(&bwd_scratch, bwd_bytes));
  CUDA_OK(cudaMemset(bwd_scratch, 0xff, bwd_bytes));  // NaN: unwritten reads show
  CUDA_OK(cudaMemcpy(d_lse, lse.data(), n_lse * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_v, v.data(), n_v * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_out, out.data(), n_o * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_dout, dout.data(), n_o * sizeof(T), cudaMemcpyHostToDevice));
  if (!c.q_lens.empty()) {
    CUDA_OK(cudaMalloc(&d_lens, c.B * 4));
    CUDA_OK(cudaMemcpy(d_lens, c.q_lens.data(), c.B * 4, cudaMemcpyHostToDevice));
  }
  const EmptyRowsArgs a{c.B, c.Sq, c.Skv, c.Hq, c.Hkv, c.Dv, p.dtype, threshold,
                        attn_mask(p, {d_lens, nullptr, nullptr, nullptr}), d_lse, d_v, sv};

  // Forward.
  ASSERT_TRUE(average_empty_rows_fwd(a, d_out, so, 0).ok());
  std::vector<T> got(n_o);
  CUDA_OK(cudaMemcpy(got.data(), d_out, n_o * sizeof(T), cudaMemcpyDeviceToHost));
  const int64_t G = c.Hq / c.Hkv;
  int64_t bad = 0, n_empty = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        const bool e = empty[(b * c.Hq + h) * c.Sq + i];
        n_empty += e;
        for (int64_t d = 0; d < c.Dv; ++d) {
          const int64_t at = b * so.b + i * so.s + h * so.h + d;
          if (!e) {
            bad += std::memcmp(&got[at], &out[at], sizeof(T)) != 0;
            continue;
          }
          double mean = 0;
          for (int64_t j = 0; j < c.Skv; ++j) mean += to_f(v[b * sv.b + j * sv.s + (h / G) * sv.h + d]);
          mean /= double(c.Skv);
          const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-5 + std::ldexp(std::fabs(mean), -8);
          bad += !(std::fabs(to_f(got[at]) - mean) <= tol);
        }
      }
  EXPECT_GT(n_empty, 0);
  EXPECT_EQ(bad, 0) << "elements of out wrong (forward)";

  // Backward, twice: the same bits.
  std::vector<T> dv_runs[2];
  for (int run = 0; run < 2; ++run) {
    CUDA_OK(cudaMemcpy(d_dv, dv.data(), n_v * sizeof(T), cudaMemcpyHostToDevice));
    const float* lse_out = nullptr;
    ASSERT_TRUE(empty_rows_bwd_prepare(a, d_dout, so, bwd_scratch, &lse_out, 0).ok());
    std::vector<float> got_lse(n_lse);
    CUDA_OK(cudaMemcpy(got_lse.data(), lse_out, n_lse * 4, cudaMemcpyDeviceToHost));
    int64_t bad_lse = 0;
    for (int64_t x = 0; x < n_lse; ++x) {
      const float want = empty[x] ? INFINITY : lse[x];
      bad_lse += std::memcmp(&got_lse[x], &want, 4) != 0;
    }
    EXPECT_EQ(bad_lse, 0) << "lse entries wrong (backward)";
    ASSERT_TRUE(empty_rows_bwd_finish(a, d_dv, sv, bwd_scratch, 0).ok());
    dv_runs[run].resize(n_v);
    CUDA_OK(cudaMemcpy(dv_runs[run].data(), d_dv, n_v * sizeof(T), cudaMemcpyDeviceToHost));
  }
  EXPECT_EQ(std::memcmp(dv_runs[0].data(), dv_runs[1].data(), n_v * sizeof(T)), 0) << "not repeatable";
  bad = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t kh = 0; kh < c.Hkv; ++kh)
      for (int64_t d = 0; d < c.Dv; ++d) {
        double sum = 0;
        for (int64_t h = kh * G; h < (kh + 1) * G; ++h)
          for (int64_t i = 0; i < c.Sq; ++i)
            if (empty[(b * c.Hq + h) * c.Sq + i]) sum += to_f(dout[b * so.b + i * so.s + h * so.h + d]);
        for (int64_t j = 0; j < c.Skv; ++j) {
          const int64_t at = b * sv.b + j * sv.s + kh * sv.h + d;
          const double want = to_f(dv[at]) + sum / double(c.Skv);
          const double tol = std::is_same_v<T, float> ? 1e-5 * (1 + std::fabs(want))
                                                      : 1e-4 + std::ldexp(std::fabs(want), -8);
          bad += !(std::fabs(to_f(dv_runs[0][at]) - want) <= tol);
        }
      }
  EXPECT_EQ(bad, 0) << "elements of dv wrong (backward)";
  for (void* ptr : {(void*)d_lse, (void*)d_v, (void*)d_out, (void*)d_dout, (void*)d_dv, (void*)d_lens,
                    bwd_scratch})
    if (ptr) CUDA_OK(cudaFree(ptr));
}

TEST(EmptyRows, Float32PaddingGqaOddSizes) {
  run_case<float>({2, 150, 97, 4, 2, 40, {120, 150}});
}

TEST(EmptyRows, Bf16MqaManyBlocks) {
  run_case<__nv_bfloat16>({3, 300, 1000, 8, 1, 128, {}});
}

TEST(EmptyRows, Float32ForwardChunksOfOneKvHead) {
  // 2100 rows a head: three chunks of the forward's scan, each with its own empty rows
  run_case<float>({1, 2100, 300, 4, 1, 64, {1900}});
}

TEST(EmptyRows, Bf16HeadDimsOffTheVectorLoads) {
  // 36 and 300 columns are not in 16-byte units: the passes' column sums read an element a
  // thread (300: two groups of columns in turn)
  run_case<__nv_bfloat16>({2, 100, 50, 2, 1, 36, {80, 100}});
  run_case<__nv_bfloat16>({2, 100, 50, 2, 1, 300, {70, 100}});
}

TEST(EmptyRows, Float32HeadDim512) {
  run_case<float>({1, 40, 33, 2, 2, 512, {}});
}

TEST(EmptyRows, Bf16OneKvHeadWithNoEmptyRow) {
  // kv head 1 of every batch entry has no empty row: its flag stays 0, its rows untouched
  run_case<__nv_bfloat16>({2, 64, 70, 4, 2, 64, {}, 1});
}

}  // namespace
}  // namespace fusedattn::cuda
