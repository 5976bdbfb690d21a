// Times variants of the small-seq forward kernel (copy-ahead depth, blocks per SM, keys per
// step) on the bench's THD workload (B = 30720 segments of one query, H = 8, bf16) beside a
// copy and a read-only kernel of the same process, to pick the kernel's defaults. Each
// variant's output must equal the default's bit for bit (same arithmetic, other schedule).
// Build here, run on the GPU machine (dev/small_seq/small_seq_fwd_sweep.sh does both).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fusedattn/small_seq/cuda/fwd_kernel.cuh"

namespace ss = fusedattn::small_seq;
namespace ssc = fusedattn::small_seq::cuda;
using T = __nv_bfloat16;

#include "../cuda_check.cuh"

constexpr int kB = 30720, kH = 8;

// Median seconds of one call of fn (20 back-to-back calls, 5 repeats).
double time_calls(const std::function<void()>& fn) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  fn();
  CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) fn();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / 20);
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaGetLastError());
  return t[t.size() / 2];
}

__global__ void copy_kernel(const uint4* x, uint4* y, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint4 v = x[i];
    v.x += 1, v.y += 1, v.z += 1, v.w += 1;
    y[i] = v;
  }
}

__global__ void read_kernel(const uint4* x, size_t n, unsigned* sink) {
  unsigned s = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldcs(x + i);
    s ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (s == 0x12345678u) *sink = s;  // keeps the loads
}

struct Workload {
  int d, skv;
  T *q, *k, *v, *out, *ref;
  int32_t *q_off, *kv_off, *q_len, *kv_len;
  ssc::KernelArgs a{};
  double bytes;
};

// Fills x with normal-ish values from a hash of the index (fast for the 4 GB of K at
// D 512, Skv 16; the values need only be fresh and nonzero).
__global__ void fill_kernel(T* x, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    unsigned h = unsigned(i) * 0x9E3779B1u ^ unsigned(i >> 32) * 0x85EBCA77u ^ seed;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    const float u = (h & 0xffffff) * (1.0f / 16777216.0f);  // [0, 1)
    const float g = (u + ((h >> 24) & 0xff) * (1.0f / 256.0f)) - 1.0f;  // ~ triangular on [-1, 1)
    x[i] = __float2bfloat16(2.0f * g);
  }
}

Workload make_workload(int d, int skv) {
  Workload w{d, skv};
  const size_t nq = size_t{kB} * kH * d, nkv = nq * skv;
  auto upload = [&](size_t n, unsigned seed) {
    T* p = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(T)));
    fill_kernel<<<1024, 256>>>(p, n, seed + d * 100 + skv);
    CHECK(cudaGetLastError());
    return p;
  };
  w.q = upload(nq, 1), w.k = upload(nkv, 2), w.v = upload(nkv, 3);
  CHECK(cudaMalloc(&w.out, nq * sizeof(T)));
  CHECK(cudaMalloc(&w.ref, nq * sizeof(T)));
  auto ints = [&](int n, auto f) {
    std::vector<int32_t> h(n);
    for (int i = 0; i < n; ++i) h[i] = f(i);
    int32_t* p = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(int32_t)));
    CHECK(cudaMemcpy(p, h.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice));
    return p;
  };
  w.q_off = ints(kB + 1, [](int i) { return i; });
  w.kv_off = ints(kB + 1, [skv](int i) { return i * skv; });
  w.q_len = ints(kB, [](int) { return 1; });
  w.kv_len = ints(kB, [skv](int) { return skv; });
  ssc::KernelArgs& a = w.a;
  a.q = w.q, a.k = w.k, a.v = w.v, a.out = w.out;
  a.qs = ss::SideTable{w.q_len, w.q_off, kB, 1};
  a.kvs = ss::SideTable{w.kv_len, w.kv_off, kB * skv, skv};
  a.segments = kB;
  a.units = kB * kH;
  a.heads_q = a.heads_kv = kH;
  a.group = 1;
  a.width = skv;
  a.mask = FA_PADDING_MASK;
  a.save_aux = 0;
  a.scale = 1.0f / std::sqrt(float(d));
  w.bytes = double(nq) * sizeof(T) * 2 + 2.0 * nkv * sizeof(T);  // q, o + k, v
  return w;
}

// Times one variant; grid_per_sm > 0 launches fewer blocks than fit. The output goes to
// w.ref for the reference variant, else it is compared with w.ref: *diff = the largest
// difference (0: bit for bit the same).
template <int D, int kCs, int kStages, int kBlocks>
double run_variant(const Workload& w, bool is_ref, float* diff, int grid_per_sm = 0) {
  auto kernel = ssc::small_seq_fwd_kernel<T, D, kCs, kStages, kBlocks>;
  const int smem = ssc::FwdLayout<T, D, kCs, kStages>::kBlockBytes;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0, sms = 0, dev = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, smem));
  if (grid_per_sm > 0) per_sm = std::min(per_sm, grid_per_sm);
  const int needed = (w.a.units + 3) / 4;
  const int grid = std::min(needed, sms * std::max(per_sm, 1));
  const size_t n = size_t{kB} * kH * D, out_bytes = n * sizeof(T);
  CHECK(cudaMemset(w.out, 0xff, out_bytes));  // poisoned: unwritten rows show
  const double sec = time_calls([&] { kernel<<<grid, 128, smem>>>(w.a); });
  CHECK(cudaDeviceSynchronize());
  *diff = 0.0f;
  if (is_ref) {
    CHECK(cudaMemcpy(w.ref, w.out, out_bytes, cudaMemcpyDeviceToDevice));
  } else {
    std::vector<T> x(n), y(n);
    CHECK(cudaMemcpy(x.data(), w.out, out_bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(y.data(), w.ref, out_bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; ++i) {
      const float d = std::fabs(__bfloat162float(x[i]) - __bfloat162float(y[i]));
      *diff = d == d ? std::max(*diff, d) : INFINITY;  // NaN (poison) counts as infinite
    }
  }
  std::printf("  blocks/SM %d, smem %5d B", per_sm, smem);
  return sec;
}

// same_schedule: the variant sums in the reference's order, so its output must be the
// same bit for bit; otherwise (other chunks) within bf16 rounding.
void report(const char* name, const Workload& w, double sec, double copy, float diff,
            bool same_schedule = true) {
  const double gbs = w.bytes / sec / 1e9;
  const bool bad = same_schedule ? diff != 0.0f : !(diff <= 0.02f);
  std::printf(" | D %3d Skv %2d %-30s %7.1f us %7.0f GB/s %5.1f%% copy  max diff %.3g%s\n", w.d,
              w.skv, name, sec * 1e6, gbs, 100 * gbs * 1e9 / copy, diff, bad ? "  WRONG" : "");
}

template <int D, int kCs>
void sweep(int skv, double copy) {
  Workload w = make_workload(D, skv);
  float diff = 0.0f;
  constexpr int kDef = ssc::fwd_min_blocks<T, D, kCs, 3>();
  const int cap = D <= 256 && skv <= 4 ? 3 : 0;  // launch.cuh's grid for these rows
  double t = run_variant<D, kCs, 3, kDef>(w, true, &diff, cap);
  const std::string grid = cap ? ", grid of 3/SM)" : ")";
  report(("default (3 stages, " + std::to_string(kDef) + " blocks" + grid).c_str(), w, t, copy,
         diff);
  if (cap) {
    t = run_variant<D, kCs, 3, kDef>(w, false, &diff);
    report("3 stages, 4 blocks, full grid", w, t, copy, diff);
  }
  t = run_variant<D, kCs, 3, 6>(w, false, &diff);
  report("3 stages, 6 blocks", w, t, copy, diff);
  t = run_variant<D, kCs, 3, 6>(w, false, &diff, 4);
  report("6-block code, grid of 4/SM", w, t, copy, diff);
  t = run_variant<D, kCs, 3, 5>(w, false, &diff);
  report("3 stages, 5 blocks", w, t, copy, diff);
  t = run_variant<D, kCs, 3, 3>(w, false, &diff);
  report("3 stages, 3 blocks", w, t, copy, diff);
  t = run_variant<D, kCs, 2, 4>(w, false, &diff);
  report("2 stages, 4 blocks", w, t, copy, diff);
  t = run_variant<D, kCs, 4, 4>(w, false, &diff);
  report("4 stages, 4 blocks", w, t, copy, diff);
  if constexpr (kCs * 2 <= 4) {
    if (skv > kCs) {
      t = run_variant<D, kCs * 2, 3, ssc::fwd_min_blocks<T, D, kCs * 2, 3>()>(w, false, &diff);
      report(("chunk " + std::to_string(kCs * 2) + ", 3 stages").c_str(), w, t, copy, diff, false);
    }
  }
  for (void* p : {(void*)w.q, (void*)w.k, (void*)w.v, (void*)w.out, (void*)w.ref, (void*)w.q_off,
                  (void*)w.kv_off, (void*)w.q_len, (void*)w.kv_len})
    CHECK(cudaFree(p));
}

// Arguments: [D [Skv]] to time only those points (e.g. under a profiler).
int main(int argc, char** argv) {
  const int only_d = argc > 1 ? std::atoi(argv[1]) : 0;
  const int only_skv = argc > 2 ? std::atoi(argv[2]) : 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const size_t n = (size_t{1} << 30) / 16;  // 1 GiB of uint4
  uint4 *x, *y;
  unsigned* sink;
  CHECK(cudaMalloc(&x, n * 16));
  CHECK(cudaMalloc(&y, n * 16));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(x, 1, n * 16));
  const int grid = prop.multiProcessorCount * 8;
  const double copy = 2.0 * n * 16 / time_calls([&] { copy_kernel<<<grid, 256>>>(x, y, n); });
  const double read = 1.0 * n * 16 / time_calls([&] { read_kernel<<<grid, 256>>>(x, n, sink); });
  std::printf("%s: copy (read + write) %.0f GB/s, read only %.0f GB/s (%.1f%% of copy)\n",
              prop.name, copy / 1e9, read / 1e9, 100 * read / copy);
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  auto want = [&](int d, int skv) {
    return (only_d == 0 || only_d == d) && (only_skv == 0 || only_skv == skv);
  };
  for (int skv : {2, 4, 8, 16}) {
    if (want(128, skv)) sweep<128, 2>(skv, copy);
    if (want(256, skv)) sweep<256, 2>(skv, copy);
    if (want(512, skv)) sweep<512, 1>(skv, copy);
  }
  return 0;
}
