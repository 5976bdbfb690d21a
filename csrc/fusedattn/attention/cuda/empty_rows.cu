// kRequestAverageEmptyRows on the GPU (empty_rows.h). The forward: one kernel whose blocks
// each scan a chunk of a head's rows' lse and return when none is empty, else average the
// kv head's values and write them to the chunk's empty rows. Sums over rows (column_sums,
// add_to_rows) read 16 bytes a thread where the view allows, several rows in flight: a
// padding mask empties whole chunks, and their few blocks do all of the pass's reading. The backward: a pass writes lse
// with +inf at the empty rows and, per block of 256 query rows with one, the sum of their
// dout; after the route's kernel a pass adds a kv head's block sums in order (no atomics:
// repeatable) and puts them / Skv on dv. A call without empty rows pays one light launch
// in the forward and two in the backward.
#include "fusedattn/attention/cuda/empty_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "fusedattn/core/regions.h"
#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/platform/cuda/elements.cuh"

namespace fusedattn::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps; the backward's passes: a row (key) a thread (warp)
constexpr unsigned kMaxGridZ = 65535;

// Query rows [0, n) of batch entry b are its sequence's (one segment a row: BSHD).
__device__ __forceinline__ int64_t rows_of(const AttnMask& m, int64_t b) {
  return segment(m, b, 0).q_len;
}

__device__ __forceinline__ bool is_empty(const EmptyRowsArgs& a, int64_t b, int64_t h, int64_t i,
                                         int64_t n) {
  return i < n && a.lse[(b * a.heads_q + h) * a.seqlen_q + i] <= a.threshold;
}

constexpr int kScan = 1024;  // query rows of a head a block of the forward scans
constexpr int kMaxDv = 512;   // the GPU kernels' largest head dim

// Where each piece of the backward lives in the scratch (offsets in bytes, each 256-byte
// aligned); the forward takes none.
struct Layout {
  size_t lse = 0, blk_any = 0, partial = 0, total = 0;
  int64_t blocks = 0;  // query row blocks of kThreads per (batch, head)

  Layout(int64_t B, int64_t Hq, int64_t Sq, int64_t Dv) {
    Regions r;
    blocks = (Sq + kThreads - 1) / kThreads;
    lse = r.add(size_t(B * Hq * Sq) * 4);
    blk_any = r.add(size_t(B * Hq * blocks));
    partial = r.add(size_t(B * Hq * blocks * Dv) * 4);
    total = r.total;
  }
};

// The rows of a [n, Dv] view (row r at base + r * stride) as the passes walk them: the
// block's kBlock threads in groups of Dv / kVec, a group a row, kVec elements a thread (one
// 16-byte load where the view allows it, else kVec 1 and groups of at most kBlock columns in
// turn), kFlight rows a thread in flight. f(u0, cols, r, R, u) runs per group of columns
// [u0 * kVec, u0 * kVec + cols): thread's row r of R at once (r < R or idle), its unit u.
template <int kVec, int kBlock, class F>
__device__ void by_row_groups(int Dv, F&& f) {
  const int units = Dv / kVec;
  for (int u0 = 0; u0 < units; u0 += kBlock) {
    const int L = min(units - u0, kBlock);
    f(u0, L * kVec, int(threadIdx.x) / L, kBlock / L, u0 + int(threadIdx.x) % L);
  }
}

template <int kVec, class T>
using VecLoad = std::conditional_t<kVec == 1, T, uint4>;

// Sums over the rows r < n that keep(r) selects of a [n, Dv] view, column by column, into
// out[0, Dv), times mul, in a fixed order (bitwise repeatable); red: kBlock * 8 floats of
// shared memory. Ends with the block synchronized.
template <int kVec, int kBlock, int kFlight, class T, class Keep>
__device__ void column_sums(const T* base, int64_t stride, int64_t n, int Dv, Keep keep, float mul,
                            float* red, float* out) {
  using Load = VecLoad<kVec, T>;
  static_assert(sizeof(Load) == kVec * sizeof(T));
  by_row_groups<kVec, kBlock>(Dv, [&](int u0, int cols, int r, int R, int u) {
    float acc[kVec] = {};
    if (r < R)
      for (int64_t j0 = r; j0 < n; j0 += int64_t{kFlight} * R) {
        Load x[kFlight];
        bool k[kFlight];
#pragma unroll
        for (int f = 0; f < kFlight; ++f) {
          const int64_t j = j0 + int64_t{f} * R;
          k[f] = j < n && keep(j);
          if (k[f]) x[f] = *reinterpret_cast<const Load*>(base + j * stride + int64_t{u} * kVec);
        }
#pragma unroll
        for (int f = 0; f < kFlight; ++f) {
          T e[kVec];
          memcpy(e, &x[f], sizeof(e));
#pragma unroll
          for (int c = 0; c < kVec; ++c)
            if (k[f]) acc[c] += to_f(e[c]);
        }
      }
    if (r < R)
#pragma unroll
      for (int c = 0; c < kVec; ++c) red[r * cols + (u - u0) * kVec + c] = acc[c];
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += kBlock) {
      float t = 0.0f;
      for (int q = 0; q < R; ++q) t += red[q * cols + c];
      out[u0 * kVec + c] = t * mul;
    }
    __syncthreads();
  });
}

// Rows [0, n) of a [n, Dv] view (row stride `stride`) each get add[0, Dv) (shared memory):
// read, add in float, round (kFlight rows a thread in flight).
template <int kVec, int kBlock, int kFlight, class T>
__device__ void add_to_rows(T* base, int64_t stride, int64_t n, int Dv, const float* add) {
  using Load = VecLoad<kVec, T>;
  by_row_groups<kVec, kBlock>(Dv, [&](int, int, int r, int R, int u) {
    if (r >= R) return;
    for (int64_t j0 = r; j0 < n; j0 += int64_t{kFlight} * R) {
      Load x[kFlight];
#pragma unroll
      for (int f = 0; f < kFlight; ++f) {
        const int64_t j = j0 + int64_t{f} * R;
        if (j < n) x[f] = *reinterpret_cast<const Load*>(base + j * stride + int64_t{u} * kVec);
      }
#pragma unroll
      for (int f = 0; f < kFlight; ++f) {
        const int64_t j = j0 + int64_t{f} * R;
        if (j >= n) continue;
        T e[kVec];
        memcpy(e, &x[f], sizeof(e));
#pragma unroll
        for (int c = 0; c < kVec; ++c) e[c] = from_f<T>(to_f(e[c]) + add[u * kVec + c]);
        memcpy(&x[f], e, sizeof(e));
        *reinterpret_cast<Load*>(base + j * stride + int64_t{u} * kVec) = x[f];
      }
    }
  });
}

// Whether column_sums may read kVec elements at once from rows of `base`'s view: 16-byte
// aligned base, strides and head dim in kVec units.
template <class T>
bool vector_rows(const void* base, ViewStrides s, int64_t dv) {
  constexpr int64_t kVec = 16 / sizeof(T);
  return reinterpret_cast<uintptr_t>(base) % 16 == 0 && s.b % kVec == 0 && s.s % kVec == 0 &&
         s.h % kVec == 0 && dv % kVec == 0;
}

// The forward's one pass (grid: chunks of kScan rows, Hq, batch; a thread a row's lse):
// returns unless a row of its chunk is empty; then the kv head's average of the values
// (column_sums; where a padding mask empties a chunk its block alone reads them: 1024
// threads, four 16-byte loads each in flight) and the chunk's empty rows written (a warp a
// row).
template <int kVec, class T>
__global__ void __launch_bounds__(kScan) fwd_kernel(EmptyRowsArgs a, T* out, ViewStrides so) {
  __shared__ float red[kScan * 8];
  __shared__ float mean[kMaxDv];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t h = blockIdx.y, kh = h / (a.heads_q / a.heads_kv), i0 = blockIdx.x * int64_t(kScan);
  const T* v = static_cast<const T*>(a.v);
  for (int64_t b = blockIdx.z; b < a.batch; b += gridDim.z) {
    const int64_t n = rows_of(a.mask, b);
    if (!__syncthreads_or(is_empty(a, b, h, i0 + threadIdx.x, n))) continue;
    column_sums<kVec, kScan, 4>(v + b * a.sv.b + kh * a.sv.h, a.sv.s, a.seqlen_kv,
                                int(a.head_dim_v), [](int64_t) { return true; },
                                1.0f / float(a.seqlen_kv), red, mean);
    for (int r = w; r < kScan; r += kScan / 32) {
      const int64_t i = i0 + r;
      if (!is_empty(a, b, h, i, n)) continue;
      T* o = out + b * so.b + i * so.s + h * so.h;
      for (int64_t d = lane; d < a.head_dim_v; d += 32) o[d] = from_f<T>(mean[d]);
    }
    __syncthreads();  // mean[] is the next batch entry's
  }
}

// lse_out = lse with +inf at the empty rows; per block of kThreads rows (a thread a row),
// whether one is empty (blk_any, always written) and then the sum of their dout (partial,
// column_sums) (grid: row blocks, Hq, batch).
template <int kVec, class T>
__global__ void prepare_kernel(EmptyRowsArgs a, const T* dout, ViewStrides sdo, float* lse_out,
                               uint8_t* blk_any, float* partial) {
  __shared__ bool empty[kThreads];
  __shared__ float red[kThreads * 8];
  const int64_t h = blockIdx.y, i0 = blockIdx.x * int64_t(kThreads), i = i0 + threadIdx.x;
  for (int64_t b = blockIdx.z; b < a.batch; b += gridDim.z) {
    bool e = false;
    if (i < a.seqlen_q) {
      const int64_t at = (b * a.heads_q + h) * a.seqlen_q + i;
      e = is_empty(a, b, h, i, rows_of(a.mask, b));
      lse_out[at] = e ? INFINITY : a.lse[at];
    }
    empty[threadIdx.x] = e;
    const bool any = __syncthreads_or(e);
    const int64_t blk = (b * a.heads_q + h) * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) blk_any[blk] = any;
    if (any)
      column_sums<kVec, kThreads, 4>(dout + b * sdo.b + i0 * sdo.s + h * sdo.h, sdo.s,
                        min(int64_t{kThreads}, a.seqlen_q - i0), int(a.head_dim_v),
                        [&](int64_t r) { return empty[r]; }, 1.0f, red, partial + blk * a.head_dim_v);
    __syncthreads();  // empty[] is the next batch entry's
  }
}

// dv += (the kv head's blocks' partial sums, added in order: repeatable) / Skv on every key
// of a kv head with an empty row (grid: key blocks of kThreads, Hkv, batch; add_to_rows).
template <int kVec, class T>
__global__ void finish_kernel(EmptyRowsArgs a, const uint8_t* blk_any, const float* partial,
                              int64_t blocks, T* dv, ViewStrides sdv) {
  __shared__ float sum[kMaxDv];
  const int64_t G = a.heads_q / a.heads_kv, kh = blockIdx.y, n = G * blocks;
  const float inv = 1.0f / float(a.seqlen_kv);
  const int64_t j0 = blockIdx.x * int64_t(kThreads);
  for (int64_t b = blockIdx.z; b < a.batch; b += gridDim.z) {
    const int64_t first = (b * a.heads_q + kh * G) * blocks;  // the kv head's q heads' blocks
    bool any = false;
    for (int64_t x = threadIdx.x; x < n; x += kThreads) any |= blk_any[first + x] != 0;
    if (!__syncthreads_or(any)) continue;
    for (int64_t d = threadIdx.x; d < a.head_dim_v; d += kThreads) {
      constexpr int kFlight = 4;  // blocks' flags and sums in flight
      float s = 0.0f;
      for (int64_t x0 = 0; x0 < n; x0 += kFlight) {
        bool k[kFlight];
        float y[kFlight];
#pragma unroll
        for (int f = 0; f < kFlight; ++f) k[f] = x0 + f < n && blk_any[first + x0 + f];
#pragma unroll
        for (int f = 0; f < kFlight; ++f)
          if (k[f]) y[f] = partial[(first + x0 + f) * a.head_dim_v + d];
#pragma unroll
        for (int f = 0; f < kFlight; ++f)
          if (k[f]) s += y[f];
      }
      sum[d] = s * inv;
    }
    __syncthreads();
    add_to_rows<kVec, kThreads, 4>(dv + b * sdv.b + j0 * sdv.s + kh * sdv.h, sdv.s,
                                   std::min<int64_t>(kThreads, a.seqlen_kv - j0), int(a.head_dim_v),
                                   sum);
    __syncthreads();  // sum[] is the next batch entry's
  }
}

dim3 grid(int64_t x, int64_t y, int64_t batch) {
  return dim3(unsigned(std::max<int64_t>(x, 1)), unsigned(y),
              unsigned(std::min<int64_t>(batch, kMaxGridZ)));
}

template <class F>
Status by_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case FA_FLOAT32: return f(float{});
    case FA_BFLOAT16: return f(__nv_bfloat16{});
    case FA_FLOAT16: return f(__half{});
  }
  return Status::Internal("the empty-row passes take float32, bf16 or fp16; got dtype " +
                          std::to_string(dtype));
}

Status check(const EmptyRowsArgs& a) {
  if (a.head_dim_v > kMaxDv)
    return Status::Invalid("head_dim_v: " + std::to_string(a.head_dim_v) +
                           "; the empty-row passes take head dims up to " + std::to_string(kMaxDv));
  return Status::Ok();
}

bool nothing(const EmptyRowsArgs& a) {
  return a.batch <= 0 || a.seqlen_q <= 0 || a.seqlen_kv <= 0 || a.heads_q <= 0 || a.heads_kv <= 0 ||
         a.head_dim_v <= 0;
}

char* at(void* scratch, size_t offset) { return static_cast<char*>(scratch) + offset; }

}  // namespace

size_t empty_rows_bwd_scratch_bytes(const AttnParams& p) {
  return Layout(p.batch, p.heads_q, p.seqlen_q, p.head_dim_v).total;
}

Status average_empty_rows_fwd(const EmptyRowsArgs& a, void* out, ViewStrides so,
                              cudaStream_t stream) {
  FA_RETURN_IF_NOT_OK(check(a));
  if (nothing(a)) return Status::Ok();
  return by_dtype(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    const dim3 g = grid((a.seqlen_q + kScan - 1) / kScan, a.heads_q, a.batch);
    if (vector_rows<T>(a.v, a.sv, a.head_dim_v))
      fwd_kernel<16 / sizeof(T)><<<g, kScan, 0, stream>>>(a, static_cast<T*>(out), so);
    else
      fwd_kernel<1><<<g, kScan, 0, stream>>>(a, static_cast<T*>(out), so);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  });
}

Status empty_rows_bwd_prepare(const EmptyRowsArgs& a, const void* dout, ViewStrides sdo,
                              void* scratch, const float** lse_out, cudaStream_t stream) {
  FA_RETURN_IF_NOT_OK(check(a));
  const Layout l(a.batch, a.heads_q, a.seqlen_q, a.head_dim_v);
  float* lse = reinterpret_cast<float*>(at(scratch, l.lse));
  *lse_out = lse;
  if (nothing(a)) return Status::Ok();
  return by_dtype(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    const dim3 g = grid(l.blocks, a.heads_q, a.batch);
    uint8_t* any = reinterpret_cast<uint8_t*>(at(scratch, l.blk_any));
    float* partial = reinterpret_cast<float*>(at(scratch, l.partial));
    const T* d = static_cast<const T*>(dout);
    if (vector_rows<T>(dout, sdo, a.head_dim_v))
      prepare_kernel<16 / sizeof(T)><<<g, kThreads, 0, stream>>>(a, d, sdo, lse, any, partial);
    else
      prepare_kernel<1><<<g, kThreads, 0, stream>>>(a, d, sdo, lse, any, partial);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  });
}

Status empty_rows_bwd_finish(const EmptyRowsArgs& a, void* dv, ViewStrides sdv, void* scratch,
                             cudaStream_t stream) {
  FA_RETURN_IF_NOT_OK(check(a));
  if (nothing(a)) return Status::Ok();
  const Layout l(a.batch, a.heads_q, a.seqlen_q, a.head_dim_v);
  return by_dtype(a.dtype, [&](auto t) -> Status {
    using T = decltype(t);
    const dim3 g = grid((a.seqlen_kv + kThreads - 1) / kThreads, a.heads_kv, a.batch);
    const uint8_t* any = reinterpret_cast<const uint8_t*>(at(scratch, l.blk_any));
    const float* partial = reinterpret_cast<const float*>(at(scratch, l.partial));
    T* d = static_cast<T*>(dv);
    if (vector_rows<T>(dv, sdv, a.head_dim_v))
      finish_kernel<16 / sizeof(T)><<<g, kThreads, 0, stream>>>(a, any, partial, l.blocks, d, sdv);
    else
      finish_kernel<1><<<g, kThreads, 0, stream>>>(a, any, partial, l.blocks, d, sdv);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  });
}

}  // namespace fusedattn::cuda
