#include <algorithm>
#include <cmath>

#include "fusedattn/attention/cudnn/fixup.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda {
namespace {

enum RowState { kPadding = 0, kNoKey = 1, kKept = 2 };

// Whether query token i of row b is padding (in no sequence), a query that keeps no
// key, or one that keeps at least one.
__device__ RowState row_state(const AttnMask& m, int64_t b, int64_t i) {
  Segment g;
  if (!find_segment(m, b, i, &g)) return kPadding;
  const KeyRange k = row_keys(m, g, i);
  return k.hi > k.lo ? kKept : kNoKey;
}

__global__ void prepare_sequences_kernel(AttnMask r, SequenceArgs a) {
  const int64_t n = a.rows * r.segments;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t > n) return;
  if (t == n) {  // the end of the token axis closes every ragged offset list
    for (int k = 0; k < 5; ++k)
      if (a.ragged[k])
        a.ragged[k][n] = int32_t(a.rows * (a.ragged_is_kv[k] ? r.seqlen_kv : r.seqlen_q) *
                                 a.token_stride[k]);
    return;
  }
  const int64_t b = t / r.segments, s = t % r.segments;
  // mask.h's clamped segment (O(s): it walks the offsets before it). cuDNN reads each
  // segment by these lengths and offsets, so it follows the rule of every backend.
  const Segment g = segment(r, b, s);
  a.seq_q[t] = int32_t(g.q_len);
  a.seq_kv[t] = int32_t(g.kv_len);
  for (int k = 0; k < 5; ++k) {
    if (!a.ragged[k]) continue;
    const int64_t token = a.ragged_is_kv[k] ? b * r.seqlen_kv + g.kv_begin : b * r.seqlen_q + g.q_begin;
    a.ragged[k][t] = int32_t(token * a.token_stride[k]);
  }
}

// max(a, b), NaN when either is NaN (fmaxf drops a NaN): max_logit shows a NaN row.
__device__ __forceinline__ float nan_max(float a, float b) { return b > a || b != b ? b : a; }

template <class T>
__device__ void zero_row(T* row, int64_t n) {
  // Rows start 16-byte aligned when n * sizeof(T) is a multiple of 16 (cuDNN needs D % 8 == 0).
  if ((n * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    uint4* p = reinterpret_cast<uint4*>(row);
    for (int64_t c = 0; c < int64_t(n * sizeof(T) / 16); ++c) p[c] = make_uint4(0, 0, 0, 0);
  } else {
    for (int64_t c = 0; c < n; ++c) row[c] = T(0);
  }
}

// Row states, lse and max_logit of head h of batch entry b (the whole block takes part).
__device__ void finalize_row(const AttnMask& r, const FinalizeArgs& a, int64_t h, int64_t b) {
  float extra = -INFINITY;
  if (a.softmax_type == FA_OFF_BY_ONE_SOFTMAX) extra = 0.0f;
  if (a.softmax_type == FA_LEARNABLE_SOFTMAX) extra = a.sink[(b / a.rows_per_slice) * a.heads + h];
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < r.seqlen_q; i += blockDim.x) {
    const int64_t li = b * a.slse.b + i * a.slse.s + h * a.slse.h;
    const RowState state = row_state(r, b, i);
    if (state != kKept) {
      a.lse[li] = state == kPadding ? -INFINITY : extra;
      const int64_t oi = b * a.so.b + i * a.so.s + h * a.so.h;
      if (a.dtype == FA_FLOAT32) zero_row(static_cast<float*>(a.out) + oi, a.head_dim_v);
      else zero_row(static_cast<uint16_t*>(a.out) + oi, a.head_dim_v);
    } else if (a.max) {
      const float m = a.max[li], sum = a.sum_exp[li];
      a.lse[li] = m + logf(sum);
      // cuDNN's row max may skip a NaN score; the sum of exps does not (a +inf max gives
      // a NaN sum too, and stays +inf).
      local_max = nan_max(local_max, sum != sum && m != INFINITY ? sum : m);
    }
  }
  if (!a.max_logit) return;
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o /= 2) local_max = nan_max(local_max, __shfl_xor_sync(~0u, local_max, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = local_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int w = 0; w < int(blockDim.x / 32); ++w) m = nan_max(m, warp_max[w]);
    a.max_logit[b * a.heads + h] = m;
  }
  __syncthreads();  // warp_max is read before the block's next b writes it
}

// One block per (head, batch entry b = blockIdx.y, + gridDim.y, ...: grid y stops at
// 65535); its threads stride over the query rows.
__global__ void finalize_forward_kernel(AttnMask r, FinalizeArgs a) {
  for (int64_t b = blockIdx.y; b < a.batch; b += gridDim.y) finalize_row(r, a, blockIdx.x, b);
}

__global__ void backward_lse_kernel(const float* lse, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float x = lse[i];
    out[i] = x == -INFINITY ? INFINITY : x;
  }
}

}  // namespace

Status prepare_sequences(const AttnMask& mask, const SequenceArgs& a, cudaStream_t stream) {
  const int64_t n = a.rows * mask.segments + 1;
  const int threads = 256;
  prepare_sequences_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(mask, a);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

Status finalize_forward(const AttnMask& mask, const FinalizeArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned(a.heads), unsigned(std::min<int64_t>(a.batch, 65535)));
  finalize_forward_kernel<<<grid, 256, 0, stream>>>(mask, a);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

Status backward_lse(const float* lse, float* out, int64_t n, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  backward_lse_kernel<<<unsigned(std::max<int64_t>(blocks, 1)), threads, 0, stream>>>(lse, out, n);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::cuda
