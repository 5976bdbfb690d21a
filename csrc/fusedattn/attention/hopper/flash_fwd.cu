// Host side of the Hopper flash forward: checks, tensor maps, dispatch over the kernel's
// template arguments (the variants are instantiated in generated files: launch below).
#include "fusedattn/attention/hopper/flash_fwd.h"

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/attention/hopper/fwd_kernel.cuh"
#include "fusedattn/attention/hopper/mask_tiles.cuh"
#include "fusedattn/attention/hopper/tma_map.h"
#ifdef FA_HOPPER_SWEEP  // scripts/hopper_fwd_check.sh: every variant, and the probe, in this file
#include "fusedattn/attention/hopper/launch.cuh"
#endif

namespace fusedattn::cuda::hopper {

// One variant of the kernel (launch.cuh). The library builds each (Mod, kCausal, kBf16, kD,
// kGroups) used below in a translation unit of its own, generated from instance.cu.in by the
// list in CMakeLists.txt (score modifier x causal x dtype x (head dim, consumer groups)); a
// variant dispatched here and missing there fails the link.
template <class Mod, bool kCausal, bool kBf16, int kD, int kGroups>
Status launch(const FwdArgs& a, dim3 grid, cudaStream_t stream);

namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Whether p's bias comes through the copy engine's tiles (FlashFwdParams::bias_tile,
// WithBiasTile): a bias that is no folded mask, rows in 16-byte units.
bool bias_tiles(const FlashFwdParams& p) {
  return p.bias && !p.mask_bias && p.bias_tile != 0 &&
         rows16({p.bias}, {p.bias_s, p.bias_heads > 1 ? p.bias_h : 0, p.bias_batch > 1 ? p.bias_b : 0});
}

// What a bias tile's values are multiplied by to join the raw q.k (FwdArgs::bias_mul).
float raw_bias_mul(const FlashFwdParams& p) { return bias_mul_of(p.bias_pre_scale, p.post_bias_mul, p.scale).raw; }

// Tiles: the kernel counts them in int, and a block steps t += gridDim.x up to twice the
// count (causal grids have a block a tile), so at most 2^30 keeps that in range.
constexpr int64_t kMaxTiles = int64_t{1} << 30;

std::atomic<int64_t> launches{0};

// Consumer warpgroups of p's kernel (FlashFwdParams::groups). Head dim 64 by default takes
// three (192-row tiles) except for calls with a window's left edge and causal calls of
// Sq < 8192, whose rows keep fewer keys than such a tile spans (H200, 2026-11-28, forward
// against cuDNN's: three groups full 1.07 -> 1.17x at S 16384, causal 1.07 -> 1.12x there,
// but causal 0.85 -> 0.66x at S 1024 and a 512-key window 1.05 -> 0.72x at 16384;
// bench/runs/2026-11-28/session24). Head dim 64's bias tiles take two (Dims' stages leave room
// for two groups' tiles). So does a dense mask below 8192 queries, whose rows mostly keep
// a band too (H200, 2026-11-30, B 4, H 32, S 4096, classification included: a dense 512-key
// window 0.43 -> 0.36 ms, a dense causal mask 0.741 / 0.742 either way;
// dev/hopper_fwd/dense_groups_time.cu).
int groups(const FlashFwdParams& p) {
  if (p.groups > 0) return p.groups;
  if (p.head_dim != 64 || p.left_bound || ((p.causal || p.mask_bias) && p.seqlen_q < 8192) ||
      bias_tiles(p))
    return 2;
  return 3;
}

// Query rows of a tile, and keys of a step (fwd_kernel.cuh's Dims).
int64_t block_m(const FlashFwdParams& p) { return 64 * groups(p); }
uint32_t block_n(const FlashFwdParams& p) { return p.head_dim == 256 ? 64 : 128; }

// max_logit around the kernel: keys of 0 first (below any), floats from the keys after.
__global__ void max_logit_clear(uint32_t* m, int64_t batch, int64_t heads, int64_t sb, int64_t sh) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < batch * heads) m[i / heads * sb + i % heads * sh] = 0;
}
__global__ void max_logit_decode(uint32_t* m, int64_t batch, int64_t heads, int64_t sb, int64_t sh) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= batch * heads) return;
  uint32_t* at = m + i / heads * sb + i % heads * sh;
  const float x = max_logit_value(*at);
  memcpy(at, &x, 4);
}

#ifdef FA_HOPPER_SWEEP  // timing probes only (their results are not softcap's)
struct ProbeNoTanh {  // the softcap kernel without its tanh: what the MUFU op costs
  static constexpr bool kRowByRow = true;
  static constexpr bool kBiasTile = false;
  static constexpr bool kBiasReads = false;  // (as SoftcapScores)
  __device__ __forceinline__ static float pre(float s, float in, float, float, float) {
    return s * in;
  }
};
#endif

// Mod's variant of p's causality, dtype and head dim (flash_fwd picks Mod); counts the
// launches made.
template <class Mod, int kD, int kGroups>
Status launch_dim(const FlashFwdParams& p, const FwdArgs& a, dim3 grid, cudaStream_t stream) {
  return p.causal ? (p.bf16 ? launch<Mod, true, true, kD, kGroups>(a, grid, stream)
                            : launch<Mod, true, false, kD, kGroups>(a, grid, stream))
                  : (p.bf16 ? launch<Mod, false, true, kD, kGroups>(a, grid, stream)
                            : launch<Mod, false, false, kD, kGroups>(a, grid, stream));
}
template <class Mod>
Status launch_mod(const FlashFwdParams& p, const FwdArgs& a, dim3 grid, cudaStream_t stream) {
  // (Bias tiles take two groups at head dim 64, groups() and flash_fwd_unsupported: no
  // instance with three.)
  const auto d64 = [&] {
    if constexpr (Mod::kBiasTile) return launch_dim<Mod, 64, 2>(p, a, grid, stream);
    else return groups(p) == 3 ? launch_dim<Mod, 64, 3>(p, a, grid, stream)
                               : launch_dim<Mod, 64, 2>(p, a, grid, stream);
  };
  const Status s = p.head_dim == 256   ? launch_dim<Mod, 256, 2>(p, a, grid, stream)
                   : p.head_dim == 128 ? launch_dim<Mod, 128, 2>(p, a, grid, stream)
                                       : d64();
  if (s.ok()) launches.fetch_add(1, std::memory_order_relaxed);
  return s;
}

}  // namespace

int64_t launch_count() { return launches.load(std::memory_order_relaxed); }

#ifdef FA_HOPPER_PROFILE  // dev/hopper_fwd/hopper_fwd_check.cu: cycles by phase since the last call
void profile_take(unsigned long long (&out)[32]) {
  cudaMemcpyFromSymbol(out, g_profile, sizeof(out));
  const unsigned long long zero[32] = {};
  cudaMemcpyToSymbol(g_profile, zero, sizeof(zero));
}
#endif

std::string flash_fwd_unsupported(const FlashFwdParams& p, int cc) {
  if (cc != 90) return "needs compute capability 9.0 (wgmma, sm_90a)";
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return "head dim must be 64, 128 or 256";
  if (p.groups != 0 && p.groups != 2 && !(p.groups == 3 && p.head_dim == 64))
    return "groups must be 0 (the rule), 2, or 3 at head dim 64";
  if (p.groups == 3 && bias_tiles(p))
    return "groups 3 takes no bias tiles (two groups' tiles fill the shared memory; bias_tile 0 "
           "reads the bias a score at a time)";
  if (p.heads_kv <= 0 || p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (p.segments < 1 || p.segments > kMaxTiles) return "segments must be in [1, 2^30]";
  if (p.batch < 1 || p.heads_q < 1 ||
      (p.seqlen_q + block_m(p) - 1) / block_m(p) * p.heads_q > kMaxTiles / p.batch / p.segments)
    return "more than 2^30 tiles of query rows";
  if (p.seqlen_q < 1 || p.seqlen_kv < 1 || p.seqlen_q > (int64_t{1} << 30) ||
      p.seqlen_kv > (int64_t{1} << 30))
    return "sequence lengths must be in [1, 2^30]";
  if (p.causal && p.left_bound && p.lo_diag > p.diag) return "the band's left edge is right of its right edge";
  if ((p.q_lens == nullptr) != (p.kv_lens == nullptr) || p.lens_stride < 1)
    return "q_lens and kv_lens come together, with lens_stride >= 1";
  const bool thd = p.seq_q_len != nullptr;
  if (thd != (p.seq_kv_len != nullptr) || thd != (p.seq_q_tok != nullptr) ||
      thd != (p.seq_kv_tok != nullptr))
    return "THD takes seq_q_len, seq_kv_len, seq_q_tok and seq_kv_tok together";
  if (thd && p.q_lens) return "THD sequences or padding lengths, not both";
  if (!thd && p.segments != 1) return "segments > 1 needs the THD sequences";
  if (thd && (p.batch * p.seqlen_q >= (int64_t{1} << 31) || p.batch * p.seqlen_kv >= (int64_t{1} << 31)))
    return "THD token indices must fit int32 (B * S < 2^31)";
  // Without padding every query row keeps a key: the right edge keeps key 0 in reach, and
  // the left edge leaves the last row one (the edges grow with the row). (Padded calls may
  // have rows that keep none: the kernel gives them out 0, lse -inf.)
  const int64_t base = p.bottom_right ? p.seqlen_kv - p.seqlen_q : 0;
  const bool rows_may_be_empty = p.q_lens || thd;
  if (!rows_may_be_empty && p.causal && base + p.diag < 0) return "the mask leaves the first query rows without keys";
  if (!rows_may_be_empty && p.left_bound && p.seqlen_q - 1 + base + p.lo_diag >= p.seqlen_kv)
    return "the window leaves the last query rows without keys";
  if (p.alibi_slopes && p.softcap > 0.0f) return "one score modifier: softcap or ALiBi";
  // Without a modifier the running max is q.k's, which keeps the scores' order for scale > 0.
  if (!p.alibi_slopes && !(p.softcap > 0.0f) && !(p.scale > 0.0f)) return "scale must be > 0 without a modifier";
  if (p.alibi_slopes && ((p.alibi_stride != 0 && p.alibi_stride != 1) ||
                         (p.alibi_sign != 1.0f && p.alibi_sign != -1.0f)))
    return "alibi_stride must be 0 or 1 and alibi_sign +-1";
  for (const void* ptr : {p.q, p.k, p.v, static_cast<const void*>(p.out)})
    if (!aligned16(ptr)) return "q, k, v and out must be 16-byte aligned";
  for (int64_t s : {p.q_b, p.q_s, p.q_h, p.k_b, p.k_s, p.k_h, p.v_b, p.v_s, p.v_h})
    if (s % 8 != 0 || s < 0) return "q, k, v strides must be multiples of 8 elements";
  if (p.o_s % 2 != 0 || p.o_h % 2 != 0 || p.o_b % 2 != 0) return "out strides must be even";
  if (p.max_logit && (reinterpret_cast<uintptr_t>(p.max_logit) % 4 != 0 || p.ml_b < 0 || p.ml_h < 0))
    return "max_logit must be 4-byte aligned, its strides >= 0";
  if (p.sink < 0 || p.sink > 2 || (p.sink == 2) != (p.sinks != nullptr))
    return "sink must be 0, 1, or 2 with sinks";
  if (p.sink == 2 && (p.sink_rows < 1 || p.batch % p.sink_rows != 0))
    return "sink_rows must divide the batch";
  if (p.bias_pre_scale && !p.bias) return "bias_pre_scale needs a bias";
  // A score modifier's bias joins the raw scores as tiles (WithBiasTile), before the modifier.
  const bool modified = p.alibi_slopes || p.softcap > 0.0f;
  if (p.bias && modified && !bias_tiles(p))
    return "softcap's and ALiBi's bias must come as tiles: no dense mask (mask_bias), bias_tile "
           "not 0, rows of 16-byte units (bias_s, bias_h and bias_b multiples of 8, the bias "
           "16-byte aligned)";
  if (!std::isfinite(p.post_bias_mul)) return "post_bias_mul must be finite (0: 1 / scale)";
  if (p.bias && modified && !p.bias_pre_scale && p.scale == 0.0f && p.post_bias_mul == 0.0f)
    return "softcap or ALiBi with a post-scale bias needs scale != 0 (its tiles join q.k divided by it)";
  if (p.bias) {
    if (thd) return "a bias takes no THD sequences";
    if ((p.bias_batch != 1 && p.bias_batch != p.batch) || (p.bias_heads != 1 && p.bias_heads != p.heads_q))
      return "the bias's batch and head extents must be 1 or the call's";
    if (p.bias_b < 0 || p.bias_h < 0 || p.bias_s < p.seqlen_kv)
      return "the bias's strides must be >= 0 and its rows Skv apart or more";
    if (p.mask_bias && (p.bias_batch * p.bias_heads > 65535 || (p.seqlen_q + 127) / 128 > 65535))
      return "a dense mask's classes take at most 65535 (batch, head) planes and query tiles";
    if (p.bias_keep && !p.mask_bias) return "bias_keep (a boolean keep mask) needs mask_bias";
    if (p.mask_bias && (!p.mask_tiles || reinterpret_cast<uintptr_t>(p.mask_tiles) % 16 != 0))
      return "mask_bias needs mask_tiles (16-byte aligned scratch of mask_tiles_bytes)";
  }
  return {};
}

namespace {
Status run_kernel(const FlashFwdParams& p, cudaStream_t stream);

}  // namespace

int64_t mask_tiles_bytes(int64_t bias_batch, int64_t bias_heads, int64_t seqlen_q, int64_t seqlen_kv) {
  // The most any variant's tiles need (128 or 192 query rows, 64 or 128 keys).
  int64_t most = 0;
  for (int64_t bm : {128, 192})
    for (int64_t bn : {64, 128})
      most = std::max(most, MaskTiles(bias_batch, bias_heads, seqlen_q, seqlen_kv, bm, bn).bytes);
  return most;
}

Status flash_fwd(const FlashFwdParams& p, cudaStream_t stream) {
  if (!p.max_logit) return run_kernel(p, stream);
  const int64_t n = p.batch * p.heads_q;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  auto* m = reinterpret_cast<uint32_t*>(p.max_logit);
  max_logit_clear<<<blocks, 256, 0, stream>>>(m, p.batch, p.heads_q, p.ml_b, p.ml_h);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FA_RETURN_IF_NOT_OK(run_kernel(p, stream));
  max_logit_decode<<<blocks, 256, 0, stream>>>(m, p.batch, p.heads_q, p.ml_b, p.ml_h);
  FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::Ok();
}

namespace {
Status run_kernel(const FlashFwdParams& p, cudaStream_t stream) {
  FwdArgs a{};
  const uint32_t q_rows = static_cast<uint32_t>(block_m(p));
  FA_RETURN_IF_NOT_OK(make_map(&a.q, p.q, p.bf16, p.head_dim, p.seqlen_q, p.heads_q, p.batch,
                               p.q_s, p.q_h, p.q_b, q_rows, "q"));
  FA_RETURN_IF_NOT_OK(make_map(&a.k, p.k, p.bf16, p.head_dim, p.seqlen_kv, p.heads_kv, p.batch,
                               p.k_s, p.k_h, p.k_b, block_n(p), "k"));
  FA_RETURN_IF_NOT_OK(make_map(&a.v, p.v, p.bf16, p.head_dim, p.seqlen_kv, p.heads_kv, p.batch,
                               p.v_s, p.v_h, p.v_b, block_n(p), "v"));
  a.out = p.out;
  a.o_b = p.o_b, a.o_s = p.o_s, a.o_h = p.o_h;
  a.lse = p.lse;
  a.l_b = p.l_b, a.l_h = p.l_h, a.l_s = p.l_s;
  a.max_logit = reinterpret_cast<uint32_t*>(p.max_logit);
  a.ml_b = p.ml_b, a.ml_h = p.ml_h;
  a.sink = p.sink, a.sinks = p.sinks, a.sink_rows = static_cast<int>(p.sink_rows);
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.seqlen_kv = static_cast<int>(p.seqlen_kv);
  a.heads_per_kv = static_cast<int>(p.heads_q / p.heads_kv);
  // Offsets past +-2^30 keep what +-2^30 keeps (extents are at most 2^30); -2^30 itself is
  // the kernel's "no left edge".
  const int64_t edge = int64_t{1} << 30;
  a.diag = static_cast<int>(std::clamp<int64_t>(p.diag, -edge, edge));
  a.lo_diag = p.left_bound ? static_cast<int>(std::clamp<int64_t>(p.lo_diag, -edge + 1, edge))
                           : static_cast<int>(-edge);
  a.bottom_right = p.bottom_right;
  a.q_lens = p.q_lens, a.kv_lens = p.kv_lens;
  a.lens_stride = static_cast<int>(p.lens_stride);
  a.seq_q_len = p.seq_q_len, a.seq_kv_len = p.seq_kv_len;
  a.seq_q_tok = p.seq_q_tok, a.seq_kv_tok = p.seq_kv_tok;
  a.segments = static_cast<int>(p.segments);
  const float log2e = 1.4426950408889634f;
  const bool bias_tma = bias_tiles(p);
  if (bias_tma) {  // boxes of 64 keys x 64 query rows (a consumer group's), a.bias left null
    FA_RETURN_IF_NOT_OK(make_map(&a.bias_map, p.bias, p.bf16, p.seqlen_kv, p.seqlen_q, p.bias_heads,
                                 p.bias_batch, p.bias_s, p.bias_h, p.bias_b, 64, "bias"));
    a.bias_b = p.bias_batch > 1 ? p.bias_b : 0;
    a.bias_heads = static_cast<int>(p.bias_heads);
  } else if (p.bias) {
    a.bias = static_cast<const uint16_t*>(p.bias);
    // Extents of 1 read entry 0 whatever their stride (mask_table counts on 0 there).
    a.bias_b = p.bias_batch > 1 ? p.bias_b : 0, a.bias_h = p.bias_heads > 1 ? p.bias_h : 0;
    a.bias_s = p.bias_s;
    a.bias_heads = static_cast<int>(p.bias_heads);
    a.bias_drop = p.mask_bias;
    if (p.mask_bias) {
      a.masked_bits = p.bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(p.mask_value))
                             : __half_as_ushort(__float2half_rn(p.mask_value));
      const MaskTiles mt(p.bias_batch, p.bias_heads, p.seqlen_q, p.seqlen_kv, block_m(p), block_n(p));
      auto* bits = static_cast<uint32_t*>(p.mask_tiles);
      auto* tiles = static_cast<uint8_t*>(p.mask_tiles) + mt.tiles_at;
      auto* ranges = reinterpret_cast<int2*>(static_cast<uint8_t*>(p.mask_tiles) + mt.ranges_at);
      const dim3 grid(static_cast<unsigned>(mt.num_n), static_cast<unsigned>(mt.num_m),
                      static_cast<unsigned>(mt.tables));
      if (p.bias_keep) {  // a keep mask's bytes (the kernel reads only the classes and bits)
        const auto* keep = static_cast<const uint8_t*>(p.bias);
        auto classify = block_n(p) == 128
                            ? classify_keep_kernel<128>(keep, a.bias_b, a.bias_h, a.bias_s, a.seqlen_kv)
                            : classify_keep_kernel<64>(keep, a.bias_b, a.bias_h, a.bias_s, a.seqlen_kv);
        classify<<<grid, 256, 0, stream>>>(keep, a.bias_b, a.bias_h, a.bias_s,
                                           static_cast<int>(p.bias_heads), a.seqlen_q, a.seqlen_kv,
                                           static_cast<int>(block_m(p)), 0, tiles, bits);
      } else {
        auto classify = block_n(p) == 128
                            ? classify_kernel<128>(a.bias, a.bias_b, a.bias_h, a.bias_s, a.seqlen_kv)
                            : classify_kernel<64>(a.bias, a.bias_b, a.bias_h, a.bias_s, a.seqlen_kv);
        classify<<<grid, 256, 0, stream>>>(a.bias, a.bias_b, a.bias_h, a.bias_s,
                                           static_cast<int>(p.bias_heads), a.seqlen_q, a.seqlen_kv,
                                           static_cast<int>(block_m(p)), a.masked_bits, tiles, bits);
      }
      FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      const int64_t rows = mt.tables * mt.num_m;
      mask_ranges<<<static_cast<unsigned>((rows + 255) / 256), 256, 0, stream>>>(
          tiles, rows, static_cast<int>(mt.num_n), ranges);
      FA_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      a.tiles = tiles, a.ranges = ranges, a.keep_bits = bits;
      a.words_per_row = static_cast<int>(mt.words_per_row);
    }
  }
  a.heads_q = static_cast<int>(p.heads_q);
  a.batch = static_cast<int>(p.batch);
  // About 24 MiB of K and V per section: half of the H100's L2.
  const int64_t kv_bytes = 2 * p.seqlen_kv * p.head_dim * 2;
  a.section = static_cast<int>(std::clamp<int64_t>((int64_t{24} << 20) / kv_bytes, 1,
                                                   p.heads_q * p.batch * p.segments));
  // One persistent thread block an SM (its shared memory allows no second) hides each
  // tile's start behind the last one's end. With the scheduler's counter (p.counter) blocks
  // take tiles as they free up, so causal tiles of different lengths balance too (H200,
  // 2026-11-28, causal S 1024 .. 16384, forward ms a block a tile -> persistent with the
  // counter: 0.232 / 0.331 / 0.537 / 0.947 / 1.806 -> 0.198 / 0.297 / 0.505 / 0.939 / 1.775;
  // bench/runs/2026-11-28/session23). Without it each block takes every gridDim-th tile,
  // which suits equal tiles (no mask, a window's left edge: 0.212 -> 0.199 ms) but leaves
  // SMs idle at the end of a causal call (H200 causal S 16384: 2.02 against 1.83 ms a block
  // a tile), so causal calls then get a block a tile. THD: most tiles of the grid lie past
  // their sequence's end and are skipped, which a persistent block does in a few loads.
  const int64_t tiles =
      (p.seqlen_q + block_m(p) - 1) / block_m(p) * p.heads_q * p.batch * p.segments;
  int64_t blocks = tiles;
  if (p.persistent == 1 ||
      (p.persistent < 0 && (p.counter || !p.causal || p.left_bound || p.seq_q_len))) {
    int device = 0, sms = 0;
    FA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    FA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    blocks = std::min<int64_t>(tiles, sms);
  }
  if (p.counter && blocks < tiles) {
    FA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.counter, 0, sizeof(int), stream));
    a.counter = p.counter;
  }
  const dim3 grid(static_cast<unsigned>(blocks));
  if (p.softcap > 0.0f) {
    a.mul_in = p.scale / p.softcap;
    a.mul_out = p.softcap * log2e;
#ifdef FA_HOPPER_SWEEP  // dev/hopper_fwd/hopper_fwd_check.cu: what the tanh costs
    if (p.probe == 10) return launch_mod<ProbeNoTanh>(p, a, grid, stream);
#endif
    if (bias_tma) {  // the tile joins the raw q.k, which the tanh scales by mul_in
      a.bias_mul = raw_bias_mul(p);
      return launch_mod<WithBiasTile<SoftcapScores>>(p, a, grid, stream);
    }
    return launch_mod<SoftcapScores>(p, a, grid, stream);
  }
  if (p.alibi_slopes) {
    a.mul_in = p.scale * log2e;
    a.mul_out = 1.0f;
    a.slopes = p.alibi_slopes;
    a.slope_stride = static_cast<int>(p.alibi_stride);
    a.slope_mul = p.alibi_sign * log2e;
    if (bias_tma) {  // the tile joins the raw q.k, which pre scales by mul_in
      a.bias_mul = raw_bias_mul(p);
      return p.alibi_abs ? launch_mod<WithBiasTile<AlibiScores<true>>>(p, a, grid, stream)
                         : launch_mod<WithBiasTile<AlibiScores<false>>>(p, a, grid, stream);
    }
    return p.alibi_abs ? launch_mod<AlibiScores<true>>(p, a, grid, stream)
                       : launch_mod<AlibiScores<false>>(p, a, grid, stream);
  }
  a.mul_out = p.scale * log2e;
  a.bias_mul = raw_bias_mul(p);
  if (bias_tma) return launch_mod<BiasTileScores>(p, a, grid, stream);
  return a.bias || p.bias_reads == 1 ? launch_mod<BiasReadScores>(p, a, grid, stream)
                : launch_mod<PlainScores>(p, a, grid, stream);
}
}  // namespace

}  // namespace fusedattn::cuda::hopper
