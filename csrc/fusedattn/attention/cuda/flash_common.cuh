// The pieces the CUDA flash kernels share (flash.cu's wmma kernels, flash_mma.cu's
// register-resident ones): the kept-key table's rows, element conversions, and the
// per-element steps of attention/cpu/score_ops.h (bias, sink, dropout) on the device.
// Internal to attention/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <limits>

#include "fusedattn/attention/cuda/flash.h"
#include "fusedattn/core/fast_math.h"
#include "fusedattn/core/philox.h"

namespace fusedattn::cuda::flash::detail {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A row of the kept-key table: keys [lo, hi) (mask.h), and the first query / key token
// of its sequence (q_base < 0: a padding row).
struct RowInfo {
  int32_t lo, hi, q_base, kv_base;
};
struct TileRange {
  int32_t lo, hi;  // union of a tile's rows' kept keys; lo >= hi: none
};


// ---- element types -------------------------------------------------------------------

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- per-element steps (attention/cpu/score_ops.h) ------------------------------------

// The inputs every kernel reads besides q, k, v: p, a and what follows from them.
struct Call {
  AttnParams p;
  AttnTensors a;
  AttnMask mask;
  int64_t Dp, Dvp, bs;  // head dims rounded up to 16; batch entries per slice
  float bmul;           // bias factor: scale for PRE_SCALE_BIAS, else 1
  uint32_t threshold;   // dropout
  float inv_keep;
  RowInfo* rows;        // [B, Sq]
  TileRange* tiles;     // [B, n_tiles]
};

// Dropout's keep factor of query i, key j (local tokens) of folded batch entry b, head h:
// philox.h's rule on the global indices (index_base; a block's global tokens).
struct Drop {
  bool on = false;
  uint32_t seed[2] = {0, 0};
  int64_t b = 0, h = 0;
  StripeMap q{0, 1, 1}, kv{0, 1, 1};
  uint32_t threshold = 0;
  float inv_keep = 1.0f;

  __device__ Drop(const Call& c, int64_t bb, int64_t hh) {
    on = c.p.is_training && c.p.dropout > 0.0f;
    if (!on) return;
    const int64_t slice = bb / c.bs;
    seed[0] = c.a.seed[2 * slice];
    seed[1] = c.a.seed[2 * slice + 1];
    b = bb % c.bs;
    h = hh;
    if (c.a.index_base) {
      const int32_t* r = c.a.index_base + c.a.index_cols * slice;
      b += r[0];
      h += r[1];
      if (c.a.index_cols > 2) {
        const BlockPos pos = block_pos(r, c.a.index_cols);
        q = pos.q;
        kv = pos.kv;
      }
    }
    threshold = c.threshold;
    inv_keep = c.inv_keep;
  }
  __device__ __forceinline__ float z(int64_t i, int64_t j) const {
    const int64_t gi = global_token(q, i), gj = global_token(kv, j);
    const Philox4 w = dropout_words(seed, b, h, gi, gj / 4);
    return w.v[gj % 4] >= threshold ? inv_keep : 0.0f;
  }
};

template <class T>
__device__ __forceinline__ const T* bias_plane(const Call& c, int64_t b, int64_t h) {
  if (!c.a.bias) return nullptr;
  return static_cast<const T*>(c.a.bias) + (b / c.bs) * c.a.bias_slice + (b % c.bs) * c.a.bias_b +
         h * c.a.bias_h;
}

__device__ __forceinline__ float sink_logit(const Call& c, int64_t b, int64_t h) {
  if (c.p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) return 0.0f;
  if (c.p.softmax_type == FA_LEARNABLE_SOFTMAX)
    return c.a.softmax_offset[(b / c.bs) * c.p.heads_q + h];
  return -kInf;
}

// ---- the register-resident kernels (flash_mma.cu, flash_mma_bwd.cu) -----------------

// Their head-dim tile: both head dims zero-padded to 64 or 128.
inline int64_t mma_head_dim_tile(const AttnParams& p) {
  return (p.head_dim_qk > p.head_dim_v ? p.head_dim_qk : p.head_dim_v) <= 64 ? 64 : 128;
}
// Whether they serve a call whose operands are `views` at `ptrs`: both head dims <= 128,
// rows of whole 16-byte chunks (head dims and strides multiples of 16 / element bytes,
// pointers 16-byte aligned), and smem(element bytes, head-dim tile) bytes of shared memory
// per block within the device's opt-in limit.
bool mma_rows_fit(const AttnParams& p, std::initializer_list<ViewStrides> views,
                  std::initializer_list<const void*> ptrs, size_t (*smem)(int elem, int64_t tile));

// Whether flash_mma.cu's forward serves a call: both head dims <= 128, rows of whole
// 16-byte chunks (head dims and the q, k, v strides multiples of 16 / element bytes, the
// pointers 16-byte aligned). Else flash.cu's wmma kernel runs it.
bool mma_fwd_fits(const AttnParams& p, const AttnTensors& a);
// The forward on c (make_call's), query tiles of kMmaBM rows (8 warps of 16; c.tiles and
// tile_max per such tile).
constexpr int kMmaBM = 128;
template <class T, bool EXACT>
Status mma_fwd(const Call& c, float* tile_max, cudaStream_t stream);

// Whether flash_mma_bwd.cu's backward serves a call: mma_fwd_fits's rule with dout's
// strides and pointer too, and its shared memory (per head dim and dtype) within the
// device's opt-in limit. Else flash.cu's wmma bwd_kernel runs it.
bool mma_bwd_fits(const AttnParams& p, const AttnTensors& a);
// bwd_kernel's work on c (make_call's; tables built with query tiles of kBMQ = 64 rows):
// key tiles of 64, dq_acc [B, Sq, Hq, Dp] and dbias_acc (or null) accumulated with
// atomics, dk and dv written. delta [B, Hq, Sq] from flash.cu's delta_kernel.
template <class T, bool EXACT>
Status mma_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream);

}  // namespace fusedattn::cuda::flash::detail
