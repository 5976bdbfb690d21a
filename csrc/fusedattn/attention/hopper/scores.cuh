// What the Hopper forward (fwd_kernel.cuh) and backward (bwd_kernel.cuh) kernels share: the
// score modifiers, 16-bit packing, wgmma's accumulator layout, register fences and the
// band's edge values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "fusedattn/attention/hopper/sm90.cuh"

namespace fusedattn::cuda::hopper {

// The multiplier a bias's values join the raw q.k with (host side; flash_fwd.cu's and
// flash_bwd.cu's one rule): raw = 1 for a pre-scale bias, post_bias_mul for a post-scale one
// where the caller gives it (softcap: its scale folds the program's constants in), else
// 1 / scale; scaled = raw * scale, exactly 1 for a plain post-scale bias (dbias's stores take
// that case without a multiply).
struct BiasMul {
  float raw, scaled;
};
inline BiasMul bias_mul_of(bool pre_scale, float post_bias_mul, float scale) {
  if (pre_scale) return {1.0f, scale};
  if (post_bias_mul != 0.0f) return {post_bias_mul, post_bias_mul * scale};
  return {1.0f / scale, 1.0f};
}

template <bool kBf16>
__device__ __forceinline__ float bits_to_float(uint16_t x) {
  if constexpr (kBf16) return __uint_as_float(static_cast<uint32_t>(x) << 16);
  else return __half2float(__ushort_as_half(x));
}

// Score modifiers. The softmax runs in log2 units: score x = out * v with v = pre(s, ...),
// a map of the raw q.k that keeps order (out > 0), so the row max is taken over v and
// exp2(x - max x) is one fused multiply-add and one exp2: exp2(v * out - max_v * out).
// pre also gets the score's relative position kv - q, as the affine map d0 + off of a
// per-block d0 and the element's compile-time offset off (ALiBi's bias).
// kBiasTile: the bias comes through shared memory (FwdArgs::bias_map, BiasRing) and is
// added to the raw scores before the softmax step (BiasTileScores only).
// kBiasReads: the code that reads a bias a score at a time from global memory and a dense
// mask's tile classes and keep bits (FwdArgs::bias, tiles, keep_bits) is compiled in
// (BiasReadScores only: softcap and ALiBi take a bias as tiles only, and no dense mask).
// Plain calls without either take PlainScores, which leaves it out: head dims 64 and 256
// ran 2-5% faster without it (H200, 2026-11-30, dev/hopper_fwd/README.md's mask_code A/B).
struct PlainScores {  // v = s; out = scale * log2(e)
  static constexpr bool kRowByRow = false;  // softmax_step's order (H100: dev/hopper_fwd/hopper_fwd_check)
  static constexpr bool kBiasTile = false;
  static constexpr bool kBiasReads = false;
  __device__ __forceinline__ static float pre(float s, float, float, float, float) { return s; }
};
struct SoftcapScores {  // x = c tanh(s scale / c) log2(e): v = tanh(s in), in = scale / c,
                        // out = c log2(e)
  static constexpr bool kRowByRow = true;
  static constexpr bool kBiasTile = false;
  static constexpr bool kBiasReads = false;
  __device__ __forceinline__ static float pre(float s, float in, float, float, float) {
    return tanh_approx(s * in);
  }
};
template <bool kAbs>
struct AlibiScores {  // x = v = s in + slope g(kv - q), g = identity or abs; in = scale
                      // log2(e), slope = +-slope_h log2(e) (the bias's sign folded in); out = 1
  static constexpr bool kRowByRow = false;
  static constexpr bool kBiasTile = false;
  static constexpr bool kBiasReads = false;
  __device__ __forceinline__ static float pre(float s, float in, float slope, float d0,
                                              float off) {
    if constexpr (kAbs) return fmaf(s, in, slope * fabsf(d0 + off));
    return fmaf(s, in, fmaf(slope, off, slope * d0));  // slope * d0: once a block
  }
};

// A call with a bias [Bm, Hm, Sq, Skv] whose rows take 16-byte units (flash_fwd.cu's
// bias_tiles): the bias's tiles come through the copy engine and join the raw scores
// before the modifier, v = pre(s + bias * bias_mul), the engine's order (the bias, then the
// score_mod). Plain calls and ALiBi (whose calls with a bias ran the CUDA flash kernels'
// forward before, 6x slower).
template <class Mod>
struct WithBiasTile : Mod {
  static constexpr bool kBiasTile = true;
  static constexpr bool kBiasReads = false;
};
using BiasTileScores = WithBiasTile<PlainScores>;
// A plain call with a bias read a score at a time (rows not in 16-byte units) or a dense
// mask (its tiles' classes and keep bits, with the bias's values where a tile holds some).
struct BiasReadScores : PlainScores {
  static constexpr bool kBiasReads = true;
};

template <bool kBf16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}

// The accumulator layout of wgmma m64nN (per thread of a warpgroup): warp w holds rows
// 16w..16w+15; lane (g = lane / 4, t = lane % 4) holds, for each 8-column chunk j,
// d[4j + 0..1] = row g, columns 8j + 2t + 0..1 and d[4j + 2..3] = row g + 8, same columns.
// So a thread owns two rows (r = 0, 1: d[4j + 2r + e]) and a row is spread over 4 lanes.

// Row r's i-th score of a thread (i = 2j + e: 8-column chunk j, column e of the pair):
// s[4j + 2r + e] in the accumulator layout above.
__host__ __device__ constexpr int row_score(int r, int i) { return 4 * (i / 2) + 2 * r + i % 2; }

// Before a product's issue (the forward's issue_qk / issue_pv, the backward's wgmma):
// fence_regs() on its registers and wgmma_fence(), so that no instruction touches a register
// of the products between their issue and the wait.
template <int N, class R>
__device__ __forceinline__ void fence_regs(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_reg(r[i]);
}

// A band edge that is not there (Tile / BwdTile's diag, lo_diag), and an edge clamped to
// the int range around it.
constexpr int kNoEdge = -(1 << 30);

__device__ __forceinline__ int clamp_edge(long long x) {
  return static_cast<int>(max(static_cast<long long>(kNoEdge), min(x, static_cast<long long>(1 << 30))));
}

}  // namespace fusedattn::cuda::hopper
