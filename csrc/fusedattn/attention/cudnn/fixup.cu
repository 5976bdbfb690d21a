#include <cmath>

#include "fusedattn/attention/cudnn/fixup.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda {
namespace {

struct Segment {
  int64_t q_begin, q_len, kv_begin, kv_len;
};

__host__ __device__ inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// Segment s of row b, every length and offset clamped to the tensor's extent
// (the same rule as cpu/mask.cc, so both backends agree on any descriptor).
__device__ Segment segment(const RowRule& r, int64_t b, int64_t s) {
  const int64_t M = r.segments;
  Segment g{0, r.seqlen_q, 0, r.seqlen_kv};
  if (r.thd) {
    g.q_begin = clamp64(r.q_offsets[b * (M + 1) + s], 0, r.seqlen_q);
    g.kv_begin = clamp64(r.kv_offsets[b * (M + 1) + s], 0, r.seqlen_kv);
    g.q_len = r.seqlen_q - g.q_begin;
    g.kv_len = r.seqlen_kv - g.kv_begin;
  }
  if (r.padding) {
    g.q_len = clamp64(r.q_lens[b * M + s], 0, g.q_len);
    g.kv_len = clamp64(r.kv_lens[b * M + s], 0, g.kv_len);
  }
  return g;
}

enum RowState { kPadding = 0, kNoKey = 1, kKept = 2 };

// Whether query token i of row b is padding (in no sequence), a query that keeps no
// key, or one that keeps at least one.
__device__ RowState row_state(const RowRule& r, int64_t b, int64_t i) {
  Segment g{0, 0, 0, 0};
  bool found = false;
  for (int64_t s = 0; s < (r.thd ? r.segments : 1); ++s) {  // the later segment wins overlaps
    const Segment c = segment(r, b, s);
    if (i >= c.q_begin && i < c.q_begin + c.q_len) g = c, found = true;
  }
  if (!found) return kPadding;
  const int64_t li = i - g.q_begin, diag = r.bottom_right ? g.kv_len - g.q_len : 0;
  const int64_t right = r.causal ? 0 : r.right;
  int64_t a = 0, e = g.kv_len;
  if (r.left >= 0 && li + diag - r.left > a) a = li + diag - r.left;
  if (right >= 0 && li + diag + right + 1 < e) e = li + diag + right + 1;
  return e > a ? kKept : kNoKey;
}

__global__ void prepare_sequences_kernel(RowRule r, SequenceArgs a) {
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
  const Segment g = segment(r, b, s);
  a.seq_q[t] = int32_t(g.q_len);
  a.seq_kv[t] = int32_t(g.kv_len);
  for (int k = 0; k < 5; ++k) {
    if (!a.ragged[k]) continue;
    const int64_t token = a.ragged_is_kv[k] ? b * r.seqlen_kv + g.kv_begin : b * r.seqlen_q + g.q_begin;
    a.ragged[k][t] = int32_t(token * a.token_stride[k]);
  }
}

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

// One block per (head, batch entry); its threads stride over the query rows.
__global__ void finalize_forward_kernel(RowRule r, FinalizeArgs a) {
  const int64_t h = blockIdx.x, b = blockIdx.y;
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
      const float m = a.max[li];
      a.lse[li] = m + logf(a.sum_exp[li]);
      local_max = fmaxf(local_max, m);
    }
  }
  if (!a.max_logit) return;
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o /= 2) local_max = fmaxf(local_max, __shfl_xor_sync(~0u, local_max, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = local_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int w = 0; w < int(blockDim.x / 32); ++w) m = fmaxf(m, warp_max[w]);
    a.max_logit[b * a.heads + h] = m;
  }
}

__global__ void backward_lse_kernel(const float* lse, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float x = lse[i];
    out[i] = x == -INFINITY ? INFINITY : x;
  }
}

}  // namespace

RowRule make_row_rule(const AttnParams& p, const int32_t* q_lens, const int32_t* kv_lens,
                      const int32_t* q_offsets, const int32_t* kv_offsets) {
  RowRule r;
  r.seqlen_q = p.seqlen_q;
  r.seqlen_kv = p.seqlen_kv;
  r.segments = p.max_segments;
  r.thd = p.layout == FA_THD_THD_THD || p.layout == FA_T3HD || p.layout == FA_THD_T2HD;
  r.padding = has_padding(p.mask_type);
  r.causal = is_causal_top_left(p.mask_type) || is_causal_bottom_right(p.mask_type);
  r.bottom_right = is_causal_bottom_right(p.mask_type);
  r.left = p.window_left;
  r.right = p.window_right;
  r.q_lens = q_lens;
  r.kv_lens = kv_lens;
  r.q_offsets = q_offsets;
  r.kv_offsets = kv_offsets;
  return r;
}

Status prepare_sequences(const RowRule& rule, const SequenceArgs& a, cudaStream_t stream) {
  const int64_t n = a.rows * rule.segments + 1;
  const int threads = 256;
  prepare_sequences_kernel<<<unsigned((n + threads - 1) / threads), threads, 0, stream>>>(rule, a);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

Status finalize_forward(const RowRule& rule, const FinalizeArgs& a, cudaStream_t stream) {
  finalize_forward_kernel<<<dim3(unsigned(a.heads), unsigned(a.batch)), 256, 0, stream>>>(rule, a);
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
