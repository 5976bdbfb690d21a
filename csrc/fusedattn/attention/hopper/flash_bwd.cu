// Host side of the Hopper flash backward (flash_bwd.h): checks, scratch, tensor maps and the
// three kernels.
#include "fusedattn/attention/hopper/flash_bwd.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "fusedattn/attention/hopper/bwd_launch.cuh"
#include "fusedattn/attention/hopper/mask_tiles.cuh"
#include "fusedattn/attention/hopper/tma_map.h"
#include "fusedattn/core/regions.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda::hopper {
namespace {

constexpr int64_t kBlockM = BwdDims::kBlockM;

std::atomic<int64_t> launches{0};

int64_t sq_pad(const FlashBwdParams& p) {
  return (p.seqlen_q + BwdDims::kPadM - 1) / BwdDims::kPadM * BwdDims::kPadM;
}
// Head dim 64's keep-only dense variant (kBwdKeep): a folded mask without values and no
// dbias.
bool keep_variant(const FlashBwdParams& p) {
  return p.head_dim == 64 && p.mask_bias && p.mask_keep_only && !p.dbias && !p.want_dbias;
}
// The kernel variant's query block (kBwdBlockM: 128 at head dim 64 without a dense mask or
// with a keep-only one; a bias, a folded mask's or not, runs the dense variants).
uint32_t block_m(const FlashBwdParams& p) { return p.head_dim == 64 && (!p.bias || keep_variant(p)) ? 128 : 64; }
// The variant has the bias stages (BwdSmem::bias: bias tiles by TMA, dbias's tile rows): the
// dense variants but the keep-only one and head dim 256's (no room beside its stages).
bool bias_stages(const FlashBwdParams& p) { return !keep_variant(p) && p.head_dim != 256; }

// A dense mask's tiles: the variant's query block tall.
MaskTiles mask_tiles(const FlashBwdParams& p, int64_t bm) {
  return MaskTiles(p.bias_batch, p.bias_heads, p.seqlen_q, p.seqlen_kv, bm, BwdDims::kBlockN);
}
MaskTiles mask_tiles(const FlashBwdParams& p) { return mask_tiles(p, keep_variant(p) ? 128 : BwdDims::kBlockM); }
// The dense variants' scratch: a folded mask's bits and classes (mask_bias, the pointer
// aside: the most a bias can need; at head dim 64 the larger of the 64- and 128-query
// tiles', so that sizing does not depend on mask_keep_only), a bias's classes only.
// A folded mask's column ranges (mask_columns) follow at mask_cols_at.
int64_t mask_cols_at(const MaskTiles& mt) { return (mt.bytes + 15) / 16 * 16; }
int64_t mask_scratch_bytes(const FlashBwdParams& p) {
  if (!p.mask_bias) {
    const MaskTiles mt = mask_tiles(p, BwdDims::kBlockM);
    return p.bias ? mt.tables * mt.num_m * mt.num_n : 0;
  }
  int64_t bytes = 0;
  for (int64_t bm : {int64_t{BwdDims::kBlockM}, int64_t{128}}) {
    if (bm == 128 && p.head_dim != 64) continue;
    const MaskTiles mt = mask_tiles(p, bm);
    bytes = std::max(bytes, mask_cols_at(mt) + mt.tables * mt.num_n * 8);
  }
  return bytes;
}

// dbias sums over the batch rows or heads the bias broadcasts over (float32 atomics).
bool dbias_sums(const FlashBwdParams& p) {
  return p.want_dbias && (p.bias_batch < p.batch || p.bias_heads < p.heads_q);
}

struct Scratch {  // byte offsets into the workspace (core/regions.h's 256-byte regions)
  int64_t lse2 = 0, dsum = 0, dq_acc = 0, mask = 0, sem = 0, dbias = 0, bytes = 0;
  explicit Scratch(const FlashBwdParams& p) {
    const int64_t rows = p.batch * p.heads_q * sq_pad(p);
    Regions r;
    lse2 = r.add(rows * 4);
    dsum = r.add(rows * 4);
    dq_acc = r.add(rows * p.head_dim * 4);
    mask = r.add(mask_scratch_bytes(p));
    sem = r.add(p.deterministic ? rows / kBlockM * 2 * 4 : 0);
    dbias = r.add(dbias_sums(p) ? p.bias_batch * p.bias_heads * p.seqlen_q * p.seqlen_kv * 4 : 0);
    bytes = r.total;
  }
};

// dbias from a broadcast bias's float32 sums ([tables, Sq, Skv]), rounded to T; acc null:
// zeros (before the kernel, which writes the tiles it visits). A block a row at a time (its
// table, query and address once; an element's 64-bit divisions made the pass slower than the
// backward itself); kVec: 8 keys a thread, one 16-byte store (and two float4 loads): dbias
// 16-byte aligned with strides multiples of 8, Skv a multiple of 8.
template <class T, bool kVec>
__global__ void bwd_dbias(const float* acc, FlashBwdParams p) {
  const int64_t rows = p.bias_batch * p.bias_heads * p.seqlen_q, skv = p.seqlen_kv;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t tbl = row / p.seqlen_q, q = row % p.seqlen_q;
    T* out = static_cast<T*>(p.dbias) + tbl / p.bias_heads * p.bias_b + tbl % p.bias_heads * p.bias_h + q * p.bias_s;
    const float* in = acc ? acc + row * skv : nullptr;
    if constexpr (kVec) {
      for (int64_t k = 8 * int64_t{threadIdx.x}; k < skv; k += 8 * int64_t{blockDim.x}) {
        alignas(16) T v[8];
        if (in) {
          const float4 lo = *reinterpret_cast<const float4*>(in + k), hi = *reinterpret_cast<const float4*>(in + k + 4);
          v[0] = static_cast<T>(lo.x), v[1] = static_cast<T>(lo.y), v[2] = static_cast<T>(lo.z), v[3] = static_cast<T>(lo.w);
          v[4] = static_cast<T>(hi.x), v[5] = static_cast<T>(hi.y), v[6] = static_cast<T>(hi.z), v[7] = static_cast<T>(hi.w);
        } else {
          for (int e = 0; e < 8; ++e) v[e] = static_cast<T>(0.0f);
        }
        *reinterpret_cast<uint4*>(out + k) = *reinterpret_cast<const uint4*>(v);
      }
    } else {
      for (int64_t k = threadIdx.x; k < skv; k += blockDim.x) out[k] = static_cast<T>(in ? in[k] : 0.0f);
    }
  }
}

// The rows of [B * Hq, sq_pad], `lanes` threads a row (a power of two <= 32): D = rowsum(dO * O)
// (float32), lse in log2 units (+inf where the row's P is 0: lse +-inf, rows past Sq), and the
// row's D floats of dq_acc zeroed (no memset pass). kVec: O and dO 16-byte aligned with strides
// of multiples of 8, so a thread loads 8 elements at once (lanes = D / 8); else one at a time.
template <class T, bool kVec>
__global__ void bwd_rows(const T* out, const T* dout, const float* lse, FlashBwdParams p,
                         int64_t pad, int lanes, float* lse2, float* dsum, float* dq_acc, int* sem) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t row = t / lanes;
  const int g = static_cast<int>(t % lanes);
  const bool live = row < p.batch * p.heads_q * pad;  // every lane reaches the shuffles below
  const int D = static_cast<int>(p.head_dim);
  if (live) {
    float4* zero = reinterpret_cast<float4*>(dq_acc + row * D);
    for (int x = g; x < D / 4; x += lanes) zero[x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (sem && g == 0 && row % kBlockM == 0) sem[2 * (row / kBlockM)] = sem[2 * (row / kBlockM) + 1] = 0;
  }
  const int64_t s = row % pad, h = row / pad % p.heads_q, b = row / (pad * p.heads_q);
  float acc = 0.0f;
  if (live && s < p.seqlen_q) {
    const T* o = out + b * p.o_b + s * p.o_s + h * p.o_h;
    const T* d = dout + b * p.do_b + s * p.do_s + h * p.do_h;
    if constexpr (kVec) {
      for (int x = 8 * g; x < D; x += 8 * lanes) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + x), dv = *reinterpret_cast<const uint4*>(d + x);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc += static_cast<float>(oe[e]) * static_cast<float>(de[e]);
      }
    } else {
      for (int x = g; x < D; x += lanes) acc += static_cast<float>(o[x]) * static_cast<float>(d[x]);
    }
  }
  for (int off = lanes / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (live && g == 0) {
    if (s >= p.seqlen_q) {
      lse2[row] = INFINITY, dsum[row] = 0.0f;
    } else {
      const float l = lse[b * p.l_b + h * p.l_h + s * p.l_s];
      lse2[row] = isinf(l) ? INFINITY : l * 1.4426950408889634f;
      dsum[row] = acc;
    }
  }
}

// d sink [B, Hq] = -sum_i exp(sink - lse_i) D_i: a block a (batch, head), its rows' terms
// summed by thread (rows t, t + 256, ...), then across the warp and the warps in a fixed
// order (repeatable). Rows whose lse is -inf (nothing kept, not even the sink: sink -inf)
// add nothing; a row whose lse is the sink (it kept only the sink) adds D_i exactly.
__global__ void bwd_sink_grad(const float* lse, FlashBwdParams p, int64_t pad, const float* dsum) {
  __shared__ float warp_sums[8];
  const int64_t bh = blockIdx.x, h = bh % p.heads_q, b = bh / p.heads_q;
  const float sink = p.sinks[(b / p.sink_rows) * p.heads_q + h];
  float acc = 0.0f;
  for (int64_t s = threadIdx.x; s < p.seqlen_q; s += blockDim.x) {
    const float l = lse[b * p.l_b + h * p.l_h + s * p.l_s];
    if (l == -INFINITY) continue;
    acc += (sink == l ? 1.0f : expf(sink - l)) * dsum[bh * pad + s];
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < 8; ++w) total += warp_sums[w];
    p.dsinks[bh] = -total;
  }
}

// dQ = scale * the accumulator, to dq's dtype and strides: a thread block a 64-row block of a
// (batch, head). It reads the block's kD * 64 floats in order (a float4 a thread and step:
// bwd_dq_index's (row, col .. col + 1) and (row + 8, col .. col + 1)), converts them into a
// row-major tile in shared memory, and writes the tile's rows (below Sq) a column pair a thread.
template <class T, int kD>
__global__ void __launch_bounds__(256) bwd_dq(const float* acc, FlashBwdParams p, int64_t pad) {
  constexpr int kPitch = kD + 8;  // elements: the pairs' 4-byte writes hit 32 banks a warp
  __shared__ uint32_t tile[kBlockM * kPitch / 2];
  const int64_t blocks_m = (p.seqlen_q + kBlockM - 1) / kBlockM;  // a 1-D grid: B * Hq can pass 65535
  const int64_t bh = blockIdx.x / blocks_m, m0 = blockIdx.x % blocks_m * kBlockM;
  const float4* src = reinterpret_cast<const float4*>(acc + (bh * pad + m0) * kD);
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
#pragma unroll
  for (int i = 0; i < kD / 16; ++i) {
    const int f = threadIdx.x + 256 * i;                // the float4 of the block
    const int w = f / 1024, j = f % 1024 / 128, tid = f % 128;  // bwd_dq_index's parts
    const int row = tid / 32 * 16 + tid % 32 / 4, col = 64 * w + 8 * j + 2 * (tid % 4);
    const float4 v = src[f];
    tile[(row * kPitch + col) / 2] = pack2<bf16>(v.x * p.scale, v.y * p.scale);
    tile[((row + 8) * kPitch + col) / 2] = pack2<bf16>(v.z * p.scale, v.w * p.scale);
  }
  __syncthreads();
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  const int rows = static_cast<int>(min(int64_t{kBlockM}, p.seqlen_q - m0));
  for (int x = threadIdx.x; x < rows * kD / 2; x += 256) {
    const int row = x / (kD / 2), col = 2 * (x % (kD / 2));
    T* dq = static_cast<T*>(p.dq) + b * p.dq_b + (m0 + row) * p.dq_s + h * p.dq_h + col;
    *reinterpret_cast<uint32_t*>(dq) = tile[(row * kPitch + col) / 2];
  }
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// dbias's rows in whole 16-byte units (its pointer and the bias's strides): 16-byte stores.
bool dbias_rows16(const FlashBwdParams& p) {
  return rows16({p.dbias}, {p.bias_s, p.bias_heads > 1 ? p.bias_h : 0, p.bias_batch > 1 ? p.bias_b : 0});
}

Status dbias_pass(const FlashBwdParams& p, const float* acc, cudaStream_t stream) {
  const int64_t rows = p.bias_batch * p.bias_heads * p.seqlen_q;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
  const bool vec = p.seqlen_kv % 8 == 0 && (!acc || aligned(acc, 16)) && dbias_rows16(p);
  if (p.bf16) {
    vec ? bwd_dbias<__nv_bfloat16, true><<<blocks, 256, 0, stream>>>(acc, p)
        : bwd_dbias<__nv_bfloat16, false><<<blocks, 256, 0, stream>>>(acc, p);
  } else {
    vec ? bwd_dbias<__half, true><<<blocks, 256, 0, stream>>>(acc, p)
        : bwd_dbias<__half, false><<<blocks, 256, 0, stream>>>(acc, p);
  }
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

std::string flash_bwd_unsupported(const FlashBwdParams& p, int cc) {
  if (cc != 90) return "needs an sm_90 device";
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return "head dims 64, 128 and 256 only";
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  const bool modified = p.softcap > 0.0f || p.alibi_slopes;
  if (modified ? !(std::isfinite(p.scale) && p.scale != 0.0f) : !(p.scale > 0.0f))
    return "scale must be > 0 (with softcap or ALiBi: finite and nonzero)";
  if (p.seqlen_q <= 0 || p.seqlen_kv <= 0 || p.batch <= 0) return "empty extents";
  if (p.seqlen_q > (int64_t{1} << 30) || p.seqlen_kv > (int64_t{1} << 30))
    return "sequence lengths up to 2^30";
  if (p.batch > 65535 || p.heads_kv > 65535) return "batch and kv heads up to 65535 (the grid)";
  if (!rows16({p.q, p.k, p.v, p.dout},
              {p.q_s, p.q_h, p.q_b, p.k_s, p.k_h, p.k_b, p.v_s, p.v_h, p.v_b, p.do_s, p.do_h, p.do_b}))
    return "q, k, v and dout must be 16-byte aligned with strides multiples of 8 elements";
  for (const void* t : {p.dq, p.dk, p.dv})
    if (!aligned(t, 4)) return "dq, dk and dv must be 4-byte aligned";
  for (int64_t s : {p.dq_s, p.dq_h, p.dq_b, p.dk_s, p.dk_h, p.dk_b, p.dv_s, p.dv_h, p.dv_b})
    if (s % 2 != 0) return "strides of dq, dk and dv must be even";
  if (!p.lse || !p.workspace) return "lse and the workspace are required";
  if (p.mask_bias && !p.bias) return "mask_bias needs the bias (the folded mask)";
  if (p.bias_keep && !(p.mask_bias && p.mask_keep_only))
    return "bias_keep (a boolean keep mask) needs mask_bias and mask_keep_only";
  if (p.bias_keep && (p.dbias || p.want_dbias)) return "a boolean keep mask takes no dbias";
  if ((p.dbias || p.want_dbias) && !p.bias) return "dbias needs the bias";
  if (p.dbias && !p.want_dbias) return "dbias needs want_dbias (the workspace is sized by it)";
  if (p.deterministic && dbias_sums(p))
    return "a broadcast bias's dbias sums with float32 atomics: not in deterministic mode";
  if (p.bias) {  // (a bias's gradient: none computed, the caller wants none)
    if ((p.bias_batch != 1 && p.bias_batch != p.batch) || (p.bias_heads != 1 && p.bias_heads != p.heads_q))
      return "the bias's batch and head extents must be 1 or the call's";
    if (p.bias_b < 0 || p.bias_h < 0 || p.bias_s < p.seqlen_kv)
      return "the bias's strides must be >= 0 and its rows Skv apart or more";
    if (p.bias_batch * p.bias_heads > 65535 || (p.seqlen_q + 63) / 64 > 65535)
      return "a dense mask's classes take at most 65535 (batch, head) planes and query blocks";
  }
  if (!(p.softcap >= 0.0f) || std::isinf(p.softcap)) return "softcap must be finite and >= 0 (0: none)";
  if (p.softcap > 0.0f && p.alibi_slopes) return "one score modifier: softcap or ALiBi";
  if (p.softcap > 0.0f && p.bias && p.mask_bias) return "softcap takes a bias and no dense mask";
  if (p.alibi_slopes && p.bias && p.mask_bias) return "ALiBi takes a bias and no dense mask";
  if (!std::isfinite(p.post_bias_mul)) return "post_bias_mul must be finite (0: 1 / scale)";
  if (p.alibi_slopes && ((p.alibi_stride != 0 && p.alibi_stride != 1) ||
                         (p.alibi_sign != 1.0f && p.alibi_sign != -1.0f)))
    return "alibi_stride must be 0 or 1 and alibi_sign +-1";
  if (p.alibi_dslopes && !p.alibi_slopes) return "alibi_dslopes needs alibi_slopes";
  if (p.alibi_dslopes && p.deterministic)
    return "the slopes' gradient sums with float32 atomics: not in deterministic mode";
  if (p.dsinks && (!p.sinks || p.sink_rows <= 0 || p.batch % p.sink_rows != 0))
    return "dsinks needs sinks and sink_rows dividing the batch";
  if (!aligned(p.workspace, 256)) return "the workspace must be 256-byte aligned";
  if (const int64_t need = flash_bwd_workspace_bytes(p); p.workspace_bytes < need)
    return "workspace_bytes " + std::to_string(p.workspace_bytes) + " is less than the " +
           std::to_string(need) + " bytes flash_bwd_workspace_bytes asks";
  return "";
}

int64_t flash_bwd_workspace_bytes(const FlashBwdParams& p) { return Scratch(p).bytes; }

int64_t bwd_launch_count() { return launches.load(std::memory_order_relaxed); }

Status flash_bwd(const FlashBwdParams& p, cudaStream_t stream) {
  const Scratch sc(p);
  if (p.workspace_bytes < sc.bytes)  // (flash_bwd_unsupported says the rest)
    return Status::Invalid("flash_bwd: workspace_bytes " + std::to_string(p.workspace_bytes) +
                           " is less than flash_bwd_workspace_bytes(p) = " +
                           std::to_string(sc.bytes));
  launches.fetch_add(1, std::memory_order_relaxed);
  const int64_t pad = sq_pad(p), rows = p.batch * p.heads_q * pad;
  auto* base = static_cast<uint8_t*>(p.workspace);
  auto* lse2 = reinterpret_cast<float*>(base + sc.lse2);
  auto* dsum = reinterpret_cast<float*>(base + sc.dsum);
  auto* dq_acc = reinterpret_cast<float*>(base + sc.dq_acc);
  int* sem = p.deterministic ? reinterpret_cast<int*>(base + sc.sem) : nullptr;
  // D and lse2 for every row, dq_acc zeroed (bwd_rows), then the kernel, then dQ (bwd_dq).
  const bool vec = rows16({p.out}, {p.o_s, p.o_h, p.o_b});
  const int lanes = vec ? static_cast<int>(p.head_dim / 8) : 32;
  const unsigned row_blocks = static_cast<unsigned>((rows * lanes + 255) / 256);
  auto rows_kernel = [&](auto tag) {
    using T = decltype(tag);
    const T* out = static_cast<const T*>(p.out);
    const T* dout = static_cast<const T*>(p.dout);
    if (vec) bwd_rows<T, true><<<row_blocks, 256, 0, stream>>>(out, dout, p.lse, p, pad, lanes, lse2, dsum, dq_acc, sem);
    else bwd_rows<T, false><<<row_blocks, 256, 0, stream>>>(out, dout, p.lse, p, pad, lanes, lse2, dsum, dq_acc, sem);
  };
  if (p.bf16) rows_kernel(__nv_bfloat16{});
  else rows_kernel(__half{});
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (p.alibi_dslopes)  // the kernel adds the heads' parts
    FA_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(p.alibi_dslopes, 0, (p.alibi_stride ? p.heads_q : 1) * sizeof(float), stream));
  if (p.dsinks) {
    bwd_sink_grad<<<static_cast<unsigned>(p.batch * p.heads_q), 256, 0, stream>>>(p.lse, p, pad, dsum);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }

  BwdArgs a{};
  const int64_t D = p.head_dim;
  FA_RETURN_IF_NOT_OK(make_map(&a.q, p.q, p.bf16, D, p.seqlen_q, p.heads_q, p.batch, p.q_s, p.q_h,
                               p.q_b, block_m(p), "q"));
  FA_RETURN_IF_NOT_OK(make_map(&a.dout, p.dout, p.bf16, D, p.seqlen_q, p.heads_q, p.batch, p.do_s,
                               p.do_h, p.do_b, block_m(p), "dout"));
  const int64_t block_n = D == 256 ? kBwdBlockN<256> : kBwdBlockN<128>;  // the kernel's keys a block
  FA_RETURN_IF_NOT_OK(make_map(&a.k, p.k, p.bf16, D, p.seqlen_kv, p.heads_kv, p.batch, p.k_s, p.k_h,
                               p.k_b, block_n, "k"));
  FA_RETURN_IF_NOT_OK(make_map(&a.v, p.v, p.bf16, D, p.seqlen_kv, p.heads_kv, p.batch, p.v_s, p.v_h,
                               p.v_b, block_n, "v"));
  a.lse2 = lse2, a.dsum = dsum, a.dq_acc = dq_acc, a.dq_sem = sem;
  a.dk = p.dk, a.dv = p.dv;
  a.dk_b = p.dk_b, a.dk_s = p.dk_s, a.dk_h = p.dk_h;
  a.dv_b = p.dv_b, a.dv_s = p.dv_s, a.dv_h = p.dv_h;
  a.dkv_vec = rows16({p.dk, p.dv}, {p.dk_s, p.dk_h, p.dk_b, p.dv_s, p.dv_h, p.dv_b});
  a.batch = static_cast<int>(p.batch);
  a.seqlen_q = static_cast<int>(p.seqlen_q), a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.heads_q = static_cast<int>(p.heads_q);
  a.heads_per_kv = static_cast<int>(p.heads_q / p.heads_kv);
  a.sq_pad = static_cast<int>(pad);
  const int64_t edge = int64_t{1} << 30;
  a.diag = static_cast<int>(std::clamp<int64_t>(p.diag, -edge, edge));
  a.lo_diag = p.left_bound ? static_cast<int>(std::clamp<int64_t>(p.lo_diag, -edge + 1, edge))
                           : static_cast<int>(-edge);
  a.bottom_right = p.bottom_right;
  a.q_lens = p.q_lens, a.kv_lens = p.kv_lens;
  a.lens_stride = static_cast<int>(p.lens_stride);
  a.scale = p.scale;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  if (p.softcap > 0.0f) {
    a.cap_in = p.scale / p.softcap;
    a.cap_out = p.softcap * 1.4426950408889634f;
  }
  if (p.alibi_slopes) {
    a.slopes = p.alibi_slopes;
    a.slope_stride = static_cast<int>(p.alibi_stride);
    a.slope_mul = p.alibi_sign * 1.4426950408889634f;
    a.dslopes = p.alibi_dslopes, a.dslope_mul = p.alibi_sign;
  }
  // The bias joins the raw q.k times m (scores.cuh's bias_mul_of: the forward's rule).
  const BiasMul m = bias_mul_of(p.pre_scale_bias, p.post_bias_mul, p.scale);
  if (p.dbias) {  // dS (times m scale): straight to dbias, or summed in float32
    a.dbias = p.dbias;
    a.dbias_mul = m.scaled;
    // Two keys a store (bwd_kernel.cuh): the float32 sums' pairs 8-byte aligned (Skv even),
    // or dbias's 4-byte aligned (its pointer and strides).
    a.dbias_vec = dbias_sums(p) ? (p.seqlen_kv % 2 == 0 && aligned(base + sc.dbias, 8))
                                : (aligned(p.dbias, 4) && p.bias_s % 2 == 0 &&
                                   (p.bias_heads == 1 || p.bias_h % 2 == 0) &&
                                   (p.bias_batch == 1 || p.bias_b % 2 == 0));
    // Whole rows of a tile through shared memory (bwd_kernel.cuh): 16-byte stores where
    // dbias has the call's extents and its rows are whole 16-byte units (bwd_time, H200,
    // session 39: D128 causal 3.29 -> 2.87 ms, D64 5.52 -> 4.82). The float4 sums of a
    // broadcast bias measured slower than the pairs' (3.59 -> 4.01 ms): pairs there.
    a.dbias_tile = p.dbias_tile && bias_stages(p) && !dbias_sums(p) && dbias_rows16(p);
    if (dbias_sums(p)) {
      a.dbias_acc = reinterpret_cast<float*>(base + sc.dbias);
      FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          a.dbias_acc, 0, p.bias_batch * p.bias_heads * p.seqlen_q * p.seqlen_kv * 4, stream));
    } else {  // zeros where no tile writes: the kernel's blocks, each for its keys
      a.dbias_zeros = 1;
    }
  }
  if (p.bias) {
    a.bias = static_cast<const uint16_t*>(p.bias);
    a.bias_b = p.bias_batch > 1 ? p.bias_b : 0, a.bias_h = p.bias_heads > 1 ? p.bias_h : 0;
    a.bias_s = p.bias_s;
    a.bias_heads = static_cast<int>(p.bias_heads);
    // Rows of whole 16-byte chunks: the tiles through the copy engine (BwdArgs::bias_map),
    // where the variant has stages for them. (A keep mask's bytes are never read as values:
    // no map.)
    if (bias_stages(p) && !p.bias_keep &&
        rows16({p.bias}, {p.bias_s, p.bias_heads > 1 ? p.bias_h : 0, p.bias_batch > 1 ? p.bias_b : 0})) {
      FA_RETURN_IF_NOT_OK(make_map(&a.bias_map, p.bias, p.bf16, p.seqlen_kv, p.seqlen_q, p.bias_heads,
                                   p.bias_batch, p.bias_s, p.bias_h, p.bias_b, BwdDims::kBlockM, "bias"));
      a.bias_tma = 1;
    }
    // In log2 units (s scale log2(e) + b m scale log2(e)); softcap's x is the raw q.k,
    // which the bias joins before the tanh (b m).
    a.bias_mul = p.softcap > 0.0f ? m.raw : m.scaled * 1.4426950408889634f;
    const MaskTiles mt = mask_tiles(p);
    if (p.mask_bias) {  // classify the folded mask's tiles (empty ones skipped, bits or values read)
      a.masked_bits = p.bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(p.mask_value))
                             : __half_as_ushort(__float2half_rn(p.mask_value));
      auto* bits = reinterpret_cast<uint32_t*>(base + sc.mask);
      auto* tiles = base + sc.mask + mt.tiles_at;
      const dim3 grid(static_cast<unsigned>(mt.num_n), static_cast<unsigned>(mt.num_m),
                      static_cast<unsigned>(mt.tables));
      if (p.bias_keep) {  // a keep mask's bytes: classes without values
        const auto* keep = static_cast<const uint8_t*>(p.bias);
        auto classify = classify_keep_kernel<BwdDims::kBlockN>(keep, a.bias_b, a.bias_h, a.bias_s, a.seqlen_kv);
        classify<<<grid, 256, 0, stream>>>(keep, a.bias_b, a.bias_h, a.bias_s, a.bias_heads, a.seqlen_q,
                                           a.seqlen_kv, static_cast<int>(block_m(p)), 0, tiles, bits);
      } else {
        auto classify = classify_kernel<BwdDims::kBlockN>(a.bias, a.bias_b, a.bias_h, a.bias_s, a.seqlen_kv);
        classify<<<grid, 256, 0, stream>>>(
            a.bias, a.bias_b, a.bias_h, a.bias_s, a.bias_heads, a.seqlen_q, a.seqlen_kv,
            static_cast<int>(block_m(p)), static_cast<uint16_t>(a.masked_bits), tiles, bits);
      }
      FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      auto* cols = reinterpret_cast<int2*>(base + sc.mask + mask_cols_at(mt));
      const int64_t columns = mt.tables * mt.num_n;
      mask_columns<<<static_cast<unsigned>((columns + 255) / 256), 256, 0, stream>>>(
          tiles, mt.tables, static_cast<int>(mt.num_m), static_cast<int>(mt.num_n), cols);
      FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      a.tiles = tiles, a.keep_bits = bits, a.cols = cols;
    } else {  // a bias: every tile keeps its keys and reads its values (class 5), none dropped
      // (class bit 3: through ldmatrix from the stage's tile when bias_tma)
      a.masked_bits = kNoMaskedBits;
      auto* tiles = base + sc.mask;
      FA_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(tiles, a.bias_tma ? 13 : 5, mt.tables * mt.num_m * mt.num_n, stream));
      a.tiles = tiles, a.keep_bits = nullptr;
    }
    a.words_per_row = static_cast<int>(mt.words_per_row);
    a.mask_m = static_cast<int>(mt.num_m), a.mask_n = static_cast<int>(mt.num_n);
  }
  const dim3 grid(static_cast<unsigned>((p.seqlen_kv + block_n - 1) / block_n),
                  static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
  const int mod = p.softcap > 0.0f ? kBwdSoftcap
                  : p.alibi_slopes ? (p.alibi_abs ? kBwdAlibiAbs : kBwdAlibi)
                                   : kBwdPlain;
  auto launch = [&](auto causal, auto bf16) {
    constexpr bool c = decltype(causal)::value, h = decltype(bf16)::value;
    auto modified = [&](auto tag) {
      constexpr int m = decltype(tag)::value;
      return p.head_dim == 64 ? launch_bwd<c, h, false, 64, m>(a, grid, stream)
                              : launch_bwd<c, h, false, 128, m>(a, grid, stream);
    };
    // softcap or ALiBi with a bias (no dense mask: flash_bwd_unsupported): the dense
    // variants' bias stages, the bias joining the score before the modifier (ALiBi's sum,
    // softcap's tanh), dbias where wanted.
    auto modified_bias = [&](auto tag) {
      constexpr int m = decltype(tag)::value;
      return p.head_dim == 64 ? launch_bwd<c, h, true, 64, m>(a, grid, stream)
                              : launch_bwd<c, h, true, 128, m>(a, grid, stream);
    };
    if (mod != kBwdPlain && a.tiles)
      return mod == kBwdSoftcap ? modified_bias(std::integral_constant<int, kBwdSoftcap>{})
             : mod == kBwdAlibi ? modified_bias(std::integral_constant<int, kBwdAlibi>{})
                                : modified_bias(std::integral_constant<int, kBwdAlibiAbs>{});
    if (mod == kBwdSoftcap) return modified(std::integral_constant<int, kBwdSoftcap>{});
    if (mod == kBwdAlibi) return modified(std::integral_constant<int, kBwdAlibi>{});
    if (mod == kBwdAlibiAbs) return modified(std::integral_constant<int, kBwdAlibiAbs>{});
    if (a.dbias)
      return p.head_dim == 64 ? launch_bwd<c, h, true, 64, kBwdDbias>(a, grid, stream)
                              : launch_bwd<c, h, true, 128, kBwdDbias>(a, grid, stream);
    if (p.head_dim == 64) {
      if (keep_variant(p)) return launch_bwd<c, h, true, 64, kBwdKeep>(a, grid, stream);
      return a.tiles ? launch_bwd<c, h, true, 64>(a, grid, stream) : launch_bwd<c, h, false, 64>(a, grid, stream);
    }
    return a.tiles ? launch_bwd<c, h, true, 128>(a, grid, stream) : launch_bwd<c, h, false, 128>(a, grid, stream);
  };
  using T = std::true_type;
  using F = std::false_type;
  const Status st = D == 256 ? launch_bwd_d256(a, grid, p.causal, p.bf16, a.tiles != nullptr,
                                               mod == kBwdPlain && a.dbias ? kBwdDbias : mod, stream)
                    : p.causal ? (p.bf16 ? launch(T{}, T{}) : launch(T{}, F{}))
                               : (p.bf16 ? launch(F{}, T{}) : launch(F{}, F{}));
  FA_RETURN_IF_NOT_OK(st);

  const unsigned dq_grid = static_cast<unsigned>((p.seqlen_q + kBlockM - 1) / kBlockM * p.batch * p.heads_q);
  if (p.head_dim == 64)
    p.bf16 ? bwd_dq<__nv_bfloat16, 64><<<dq_grid, 256, 0, stream>>>(dq_acc, p, pad)
           : bwd_dq<__half, 64><<<dq_grid, 256, 0, stream>>>(dq_acc, p, pad);
  else if (p.head_dim == 256)
    p.bf16 ? bwd_dq<__nv_bfloat16, 256><<<dq_grid, 256, 0, stream>>>(dq_acc, p, pad)
           : bwd_dq<__half, 256><<<dq_grid, 256, 0, stream>>>(dq_acc, p, pad);
  else
    p.bf16 ? bwd_dq<__nv_bfloat16, 128><<<dq_grid, 256, 0, stream>>>(dq_acc, p, pad)
           : bwd_dq<__half, 128><<<dq_grid, 256, 0, stream>>>(dq_acc, p, pad);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (a.dbias_acc) FA_RETURN_IF_NOT_OK(dbias_pass(p, a.dbias_acc, stream));
  return Status::Ok();
}

}  // namespace fusedattn::cuda::hopper
