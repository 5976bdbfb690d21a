// Host side of the Hopper flash backward (flash_bwd.h): checks, scratch, tensor maps and the
// three kernels.
#include "fusedattn/attention/hopper/flash_bwd.h"

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "fusedattn/attention/hopper/bwd_kernel.cuh"
#include "fusedattn/attention/hopper/mask_tiles.cuh"
#include "fusedattn/attention/hopper/tma_map.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::cuda::hopper {
namespace {

constexpr int64_t kBlockM = BwdDims::kBlockM;

std::atomic<int64_t> launches{0};

int64_t sq_pad(const FlashBwdParams& p) {
  return (p.seqlen_q + BwdDims::kPadM - 1) / BwdDims::kPadM * BwdDims::kPadM;
}
// The kernel variant's query block (kBwdBlockM: 128 at head dim 64 without a dense mask).
uint32_t block_m(const FlashBwdParams& p) { return p.head_dim == 64 && !p.mask_bias ? 128 : 64; }
int64_t align256(int64_t x) { return (x + 255) / 256 * 256; }

MaskTiles mask_tiles(const FlashBwdParams& p) {
  return MaskTiles(p.bias_batch, p.bias_heads, p.seqlen_q, p.seqlen_kv, BwdDims::kBlockM, BwdDims::kBlockN);
}

struct Scratch {  // byte offsets into the workspace
  int64_t lse2 = 0, dsum = 0, dq_acc = 0, mask = 0, bytes = 0;
  explicit Scratch(const FlashBwdParams& p) {
    const int64_t rows = p.batch * p.heads_q * sq_pad(p);
    dsum = align256(rows * 4);
    dq_acc = dsum + align256(rows * 4);
    mask = dq_acc + align256(rows * p.head_dim * 4);
    bytes = mask + (p.mask_bias ? align256(mask_tiles(p).bytes) : 0);
  }
};

// One warp a row of [B * Hq, sq_pad]: D = rowsum(dO * O) (float32), lse in log2 units (+inf
// where the row's P is 0: lse +-inf, rows past Sq).
template <class T>
__global__ void bwd_rows(const T* out, const T* dout, const float* lse, FlashBwdParams p,
                         int64_t pad, float* lse2, float* dsum) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.batch * p.heads_q * pad) return;
  const int64_t s = row % pad, h = row / pad % p.heads_q, b = row / (pad * p.heads_q);
  if (s >= p.seqlen_q) {
    if (lane == 0) lse2[row] = INFINITY, dsum[row] = 0.0f;
    return;
  }
  const T* o = out + b * p.o_b + s * p.o_s + h * p.o_h;
  const T* d = dout + b * p.do_b + s * p.do_s + h * p.do_h;
  float acc = 0.0f;
  for (int x = lane; x < p.head_dim; x += 32) acc += static_cast<float>(o[x]) * static_cast<float>(d[x]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    const float l = lse[b * p.l_b + h * p.l_h + s * p.l_s];
    lse2[row] = isinf(l) ? INFINITY : l * 1.4426950408889634f;
    dsum[row] = acc;
  }
}

// dQ = scale * the accumulator (bwd_dq_index's order), to dq's dtype and strides.
template <class T>
__global__ void bwd_dq(const float* acc, FlashBwdParams p, int64_t pad) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;  // a pair of columns
  const int64_t D = p.head_dim, n = p.batch * p.heads_q * p.seqlen_q * D / 2;
  if (i >= n) return;
  const int64_t x = 2 * i % D, s = 2 * i / D % p.seqlen_q, h = 2 * i / (D * p.seqlen_q) % p.heads_q,
                b = 2 * i / (D * p.seqlen_q * p.heads_q);
  const float2 v = *reinterpret_cast<const float2*>(
      acc + ((b * p.heads_q + h) * pad + s / kBlockM * kBlockM) * D +
      bwd_dq_index(static_cast<int>(D), static_cast<int>(s % kBlockM), static_cast<int>(x)));
  T* dq = static_cast<T*>(p.dq) + b * p.dq_b + s * p.dq_s + h * p.dq_h + x;
  dq[0] = static_cast<T>(v.x * p.scale);
  dq[1] = static_cast<T>(v.y * p.scale);
}

template <bool kCausal, bool kBf16, bool kDense, int kD>
Status launch_bwd(const BwdArgs& a, dim3 grid, cudaStream_t stream) {
  auto kernel = flash_bwd_kernel<kCausal, kBf16, kDense, kD>;
  FA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kBwdSmemBytes<kD, kDense>)));
  kernel<<<grid, BwdDims::kThreads, kBwdSmemBytes<kD, kDense>, stream>>>(a);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

bool aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

std::string flash_bwd_unsupported(const FlashBwdParams& p, int cc) {
  if (cc != 90) return "needs an sm_90 device";
  if (p.head_dim != 64 && p.head_dim != 128) return "head dims 64 and 128 only";
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (!(p.scale > 0.0f)) return "scale must be > 0";
  if (p.seqlen_q <= 0 || p.seqlen_kv <= 0 || p.batch <= 0) return "empty extents";
  if (p.seqlen_q > (int64_t{1} << 30) || p.seqlen_kv > (int64_t{1} << 30))
    return "sequence lengths up to 2^30";
  if (p.batch > 65535 || p.heads_kv > 65535) return "batch and kv heads up to 65535 (the grid)";
  for (const void* t : {p.q, p.k, p.v, p.dout})
    if (!aligned(t, 16)) return "q, k, v and dout must be 16-byte aligned";
  for (int64_t s : {p.q_s, p.q_h, p.q_b, p.k_s, p.k_h, p.k_b, p.v_s, p.v_h, p.v_b, p.do_s, p.do_h, p.do_b})
    if (s % 8 != 0) return "strides of q, k, v and dout must be multiples of 8 elements";
  for (const void* t : {p.dq, p.dk, p.dv})
    if (!aligned(t, 4)) return "dq, dk and dv must be 4-byte aligned";
  for (int64_t s : {p.dk_s, p.dk_h, p.dk_b, p.dv_s, p.dv_h, p.dv_b})
    if (s % 2 != 0) return "strides of dk and dv must be even";
  if (!p.lse || !p.workspace) return "lse and the workspace are required";
  if (p.mask_bias && !p.bias) return "mask_bias needs the bias (the folded mask)";
  if (p.bias) {
    if (!p.mask_bias) return "a bias only as a folded mask (mask_bias): no dbias";
    if ((p.bias_batch != 1 && p.bias_batch != p.batch) || (p.bias_heads != 1 && p.bias_heads != p.heads_q))
      return "the bias's batch and head extents must be 1 or the call's";
    if (p.bias_b < 0 || p.bias_h < 0 || p.bias_s < p.seqlen_kv)
      return "the bias's strides must be >= 0 and its rows Skv apart or more";
    if (p.bias_batch * p.bias_heads > 65535 || (p.seqlen_q + 63) / 64 > 65535)
      return "a dense mask's classes take at most 65535 (batch, head) planes and query blocks";
  }
  if (!aligned(p.workspace, 256)) return "the workspace must be 256-byte aligned";
  return "";
}

int64_t flash_bwd_workspace_bytes(const FlashBwdParams& p) { return Scratch(p).bytes; }

int64_t bwd_launch_count() { return launches.load(std::memory_order_relaxed); }

Status flash_bwd(const FlashBwdParams& p, cudaStream_t stream) {
  launches.fetch_add(1, std::memory_order_relaxed);
  const Scratch sc(p);
  const int64_t pad = sq_pad(p), rows = p.batch * p.heads_q * pad;
  auto* base = static_cast<uint8_t*>(p.workspace);
  auto* lse2 = reinterpret_cast<float*>(base + sc.lse2);
  auto* dsum = reinterpret_cast<float*>(base + sc.dsum);
  auto* dq_acc = reinterpret_cast<float*>(base + sc.dq_acc);
  FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dq_acc, 0, rows * p.head_dim * 4, stream));
  const unsigned row_blocks = static_cast<unsigned>((rows * 32 + 255) / 256);
  if (p.bf16)
    bwd_rows<__nv_bfloat16><<<row_blocks, 256, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(p.out), static_cast<const __nv_bfloat16*>(p.dout), p.lse, p,
        pad, lse2, dsum);
  else
    bwd_rows<__half><<<row_blocks, 256, 0, stream>>>(static_cast<const __half*>(p.out),
                                                     static_cast<const __half*>(p.dout), p.lse, p,
                                                     pad, lse2, dsum);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());

  BwdArgs a{};
  const int64_t D = p.head_dim;
  FA_RETURN_IF_NOT_OK(make_map(&a.q, p.q, p.bf16, D, p.seqlen_q, p.heads_q, p.batch, p.q_s, p.q_h,
                               p.q_b, block_m(p), "q"));
  FA_RETURN_IF_NOT_OK(make_map(&a.dout, p.dout, p.bf16, D, p.seqlen_q, p.heads_q, p.batch, p.do_s,
                               p.do_h, p.do_b, block_m(p), "dout"));
  FA_RETURN_IF_NOT_OK(make_map(&a.k, p.k, p.bf16, D, p.seqlen_kv, p.heads_kv, p.batch, p.k_s, p.k_h,
                               p.k_b, BwdDims::kBlockN, "k"));
  FA_RETURN_IF_NOT_OK(make_map(&a.v, p.v, p.bf16, D, p.seqlen_kv, p.heads_kv, p.batch, p.v_s, p.v_h,
                               p.v_b, BwdDims::kBlockN, "v"));
  a.lse2 = lse2, a.dsum = dsum, a.dq_acc = dq_acc;
  a.dk = p.dk, a.dv = p.dv;
  a.dk_b = p.dk_b, a.dk_s = p.dk_s, a.dk_h = p.dk_h;
  a.dv_b = p.dv_b, a.dv_s = p.dv_s, a.dv_h = p.dv_h;
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
  if (p.bias) {
    a.bias = static_cast<const uint16_t*>(p.bias);
    a.bias_b = p.bias_batch > 1 ? p.bias_b : 0, a.bias_h = p.bias_heads > 1 ? p.bias_h : 0;
    a.bias_s = p.bias_s;
    a.bias_heads = static_cast<int>(p.bias_heads);
    a.bias_mul = 1.4426950408889634f;
    a.masked_bits = p.bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(p.mask_value))
                           : __half_as_ushort(__float2half_rn(p.mask_value));
    const MaskTiles mt = mask_tiles(p);
    auto* bits = reinterpret_cast<uint32_t*>(base + sc.mask);
    auto* tiles = base + sc.mask + mt.tiles_at;
    const dim3 grid(static_cast<unsigned>(mt.num_n), static_cast<unsigned>(mt.num_m),
                    static_cast<unsigned>(mt.tables));
    classify_mask<BwdDims::kBlockN><<<grid, 256, 0, stream>>>(
        a.bias, a.bias_b, a.bias_h, a.bias_s, a.bias_heads, a.seqlen_q, a.seqlen_kv, BwdDims::kBlockM,
        a.masked_bits, tiles, bits);
    FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    a.tiles = tiles, a.keep_bits = bits;
    a.words_per_row = static_cast<int>(mt.words_per_row);
    a.mask_m = static_cast<int>(mt.num_m), a.mask_n = static_cast<int>(mt.num_n);
  }
  const dim3 grid(static_cast<unsigned>((p.seqlen_kv + BwdDims::kBlockN - 1) / BwdDims::kBlockN),
                  static_cast<unsigned>(p.heads_kv), static_cast<unsigned>(p.batch));
  auto launch = [&](auto causal, auto bf16) {
    constexpr bool c = decltype(causal)::value, h = decltype(bf16)::value;
    if (p.head_dim == 64)
      return a.tiles ? launch_bwd<c, h, true, 64>(a, grid, stream) : launch_bwd<c, h, false, 64>(a, grid, stream);
    return a.tiles ? launch_bwd<c, h, true, 128>(a, grid, stream) : launch_bwd<c, h, false, 128>(a, grid, stream);
  };
  using T = std::true_type;
  using F = std::false_type;
  const Status st = p.causal ? (p.bf16 ? launch(T{}, T{}) : launch(T{}, F{}))
                             : (p.bf16 ? launch(F{}, T{}) : launch(F{}, F{}));
  FA_RETURN_IF_NOT_OK(st);

  const int64_t pairs = p.batch * p.heads_q * p.seqlen_q * D / 2;
  const unsigned dq_blocks = static_cast<unsigned>((pairs + 255) / 256);
  if (p.bf16)
    bwd_dq<__nv_bfloat16><<<dq_blocks, 256, 0, stream>>>(dq_acc, p, pad);
  else
    bwd_dq<__half><<<dq_blocks, 256, 0, stream>>>(dq_acc, p, pad);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

}  // namespace fusedattn::cuda::hopper
