// kRequestAverageEmptyRows on the GPU (empty_rows.h). The forward: one kernel whose blocks
// each scan a chunk of a head's rows' lse and return when none is empty, else average the
// kv head's values and write them to the chunk's empty rows. The backward: a pass writes lse
// with +inf at the empty rows and, per block of 256 query rows with one, the sum of their
// dout; after the route's kernel a pass adds a kv head's block sums in order (no atomics:
// repeatable) and puts them / Skv on dv. A call without empty rows pays one light launch
// in the forward and two in the backward.
#include "fusedattn/attention/cuda/empty_rows.h"

#include <algorithm>
#include <cmath>

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
    const auto add = [&](size_t bytes) {
      const size_t at = total;
      total += (bytes + 255) / 256 * 256;
      return at;
    };
    blocks = (Sq + kThreads - 1) / kThreads;
    lse = add(size_t(B * Hq * Sq) * 4);
    blk_any = add(size_t(B * Hq * blocks));
    partial = add(size_t(B * Hq * blocks * Dv) * 4);
  }
};

// The forward's one pass (grid: chunks of kScan rows, Hq, batch): returns unless a row of
// its chunk is empty (a thread reads kScan / kThreads rows' lse at once); then the kv head's
// average of the values (8 warps split the keys, a lane a column) and the chunk's empty rows
// written (a warp a row).
template <class T>
__global__ void fwd_kernel(EmptyRowsArgs a, T* out, ViewStrides so) {
  __shared__ float part[kThreads / 32][32];
  __shared__ float mean[kMaxDv];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t h = blockIdx.y, kh = h / (a.heads_q / a.heads_kv), i0 = blockIdx.x * int64_t(kScan);
  const T* v = static_cast<const T*>(a.v);
  for (int64_t b = blockIdx.z; b < a.batch; b += gridDim.z) {
    const int64_t n = rows_of(a.mask, b);
    bool any = false;
#pragma unroll
    for (int r = 0; r < kScan / kThreads; ++r) any |= is_empty(a, b, h, i0 + r * kThreads + threadIdx.x, n);
    if (!__syncthreads_or(any)) continue;
    for (int64_t d0 = 0; d0 < a.head_dim_v; d0 += 32) {
      const int64_t d = d0 + lane;
      float s = 0.0f;
      if (d < a.head_dim_v)
        for (int64_t j = w; j < a.seqlen_kv; j += kThreads / 32)
          s += to_f(v[b * a.sv.b + j * a.sv.s + kh * a.sv.h + d]);
      part[w][lane] = s;
      __syncthreads();
      if (w == 0 && d < a.head_dim_v) {
        float t = 0.0f;
        for (int k = 0; k < kThreads / 32; ++k) t += part[k][lane];
        mean[d] = t / float(a.seqlen_kv);
      }
      __syncthreads();
    }
    for (int r = w; r < kScan; r += kThreads / 32) {
      const int64_t i = i0 + r;
      if (!is_empty(a, b, h, i, n)) continue;
      T* o = out + b * so.b + i * so.s + h * so.h;
      for (int64_t d = lane; d < a.head_dim_v; d += 32) o[d] = from_f<T>(mean[d]);
    }
    __syncthreads();  // mean[] is the next batch entry's
  }
}

// lse_out = lse with +inf at the empty rows; per block of kThreads rows (a thread a row),
// whether one is empty (blk_any, always written) and then the sum of their dout (partial)
// (grid: row blocks, Hq, batch).
template <class T>
__global__ void prepare_kernel(EmptyRowsArgs a, const T* dout, ViewStrides sdo, float* lse_out,
                               uint8_t* blk_any, float* partial) {
  __shared__ bool empty[kThreads];
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
      for (int64_t d = threadIdx.x; d < a.head_dim_v; d += kThreads) {
        float s = 0.0f;
        for (int r = 0; r < kThreads; ++r)
          if (empty[r]) s += to_f(dout[b * sdo.b + (i0 + r) * sdo.s + h * sdo.h + d]);
        partial[blk * a.head_dim_v + d] = s;
      }
    __syncthreads();  // empty[] is the next batch entry's
  }
}

// dv += (the kv head's blocks' partial sums, added in order: repeatable) / Skv on every key
// of a kv head with an empty row (grid: key blocks of kThreads, Hkv, batch; a warp a key).
template <class T>
__global__ void finish_kernel(EmptyRowsArgs a, const uint8_t* blk_any, const float* partial,
                              int64_t blocks, T* dv, ViewStrides sdv) {
  __shared__ float sum[kMaxDv];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int64_t G = a.heads_q / a.heads_kv, kh = blockIdx.y, n = G * blocks;
  const float inv = 1.0f / float(a.seqlen_kv);
  for (int64_t b = blockIdx.z; b < a.batch; b += gridDim.z) {
    const int64_t first = (b * a.heads_q + kh * G) * blocks;  // the kv head's q heads' blocks
    bool any = false;
    for (int64_t x = threadIdx.x; x < n; x += kThreads) any |= blk_any[first + x] != 0;
    if (!__syncthreads_or(any)) continue;
    for (int64_t d = threadIdx.x; d < a.head_dim_v; d += kThreads) {
      float s = 0.0f;
      for (int64_t x = 0; x < n; ++x)
        if (blk_any[first + x]) s += partial[(first + x) * a.head_dim_v + d];
      sum[d] = s * inv;
    }
    __syncthreads();
    for (int r = w; r < kThreads; r += kThreads / 32) {
      const int64_t j = blockIdx.x * int64_t(kThreads) + r;
      if (j >= a.seqlen_kv) break;
      T* row = dv + b * sdv.b + j * sdv.s + kh * sdv.h;
      for (int64_t d = lane; d < a.head_dim_v; d += 32) row[d] = from_f<T>(to_f(row[d]) + sum[d]);
    }
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
    fwd_kernel<T><<<grid((a.seqlen_q + kScan - 1) / kScan, a.heads_q, a.batch), kThreads, 0,
                    stream>>>(a, static_cast<T*>(out), so);
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
    prepare_kernel<T><<<grid(l.blocks, a.heads_q, a.batch), kThreads, 0, stream>>>(
        a, static_cast<const T*>(dout), sdo, lse, reinterpret_cast<uint8_t*>(at(scratch, l.blk_any)),
        reinterpret_cast<float*>(at(scratch, l.partial)));
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
    finish_kernel<T><<<grid((a.seqlen_kv + kThreads - 1) / kThreads, a.heads_kv, a.batch), kThreads,
                       0, stream>>>(a, reinterpret_cast<const uint8_t*>(at(scratch, l.blk_any)),
                                    reinterpret_cast<const float*>(at(scratch, l.partial)), l.blocks,
                                    static_cast<T*>(dv), sdv);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  });
}

}  // namespace fusedattn::cuda
