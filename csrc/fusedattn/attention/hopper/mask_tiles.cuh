// A dense mask (a folded boolean mask, kRequestMaskBias) classified per tile on the device,
// for the Hopper forward (flash_fwd.cu) and backward (flash_bwd.cu): the scratch's layout and
// the two kernels that fill it.
#pragma once

#include <cstdint>

namespace fusedattn::cuda::hopper {
namespace {  // each translation unit its own kernels

// A dense mask's scratch for a tile shape (16-byte aligned parts): the bits (num_m * bm rows
// a table, num_n * bn / 32 words a row), the classes, the ranges.
struct MaskTiles {
  int64_t num_m, num_n, tables, words_per_row, tiles_at, ranges_at, bytes;
  MaskTiles(int64_t bias_batch, int64_t bias_heads, int64_t sq, int64_t skv, int64_t bm, int64_t bn)
      : num_m((sq + bm - 1) / bm), num_n((skv + bn - 1) / bn), tables(bias_batch * bias_heads) {
    words_per_row = num_n * bn / 32;
    tiles_at = tables * num_m * bm * words_per_row * 4;
    ranges_at = tiles_at + (tables * num_m * num_n + 15) / 16 * 16;
    bytes = ranges_at + tables * num_m * 8;
  }
};

// A dense mask's classes (FwdArgs::tiles) and bits (keep_bits): block (key block, query
// tile, table) classifies its tile — bit 0 some key kept, bit 1 some dropped, bit 2 a kept
// key's bias not 0 (+-0 are 0) — and writes its rows' bits (rows and keys past the extents:
// 0). A warp reads whole rows of the tile (kBlockN keys: 256 or 128 contiguous bytes).
// kVec (classify_vec: rows and strides in 8-key units): a lane loads 8 keys at once, four
// 16-byte loads in flight, and each 4 lanes' bytes make a 32 keys' word (two shuffles);
// else a lane loads one key, eight loads in flight, and a ballot makes the word. (H200, bf16
// [1, 1, 4096, 4096]: 0.022 ms the key at a time, 1.5 TB/s; session 35.)
// E uint8_t: a boolean keep mask (kRequestMaskKeepOnly: nonzero keeps the key, no values;
// `masked` unused); kVec then loads 16 keys a lane (strides in 16-key units), two lanes a word.
template <int kBlockN, bool kVec = false, class E = uint16_t>
__global__ void classify_mask(const E* bias, int64_t sb, int64_t sh, int64_t ss, int heads,
                              int seqlen_q, int seqlen_kv, int block_m, uint16_t masked,
                              uint8_t* tiles, uint32_t* bits) {
  constexpr bool kKeep = sizeof(E) == 1;
  constexpr int kWords = kBlockN / 32, kLoads = 8, kRows = kLoads / kWords;
  const int n = blockIdx.x, num_n = gridDim.x, mq = blockIdx.y, num_m = gridDim.y, table = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const E* base = bias + (table / heads) * sb + (table % heads) * sh;
  const int r0 = mq * block_m, rows = min(block_m, seqlen_q - r0);
  const int c0 = n * kBlockN, cols = min(kBlockN, seqlen_kv - c0);
  const int64_t row_words = int64_t{num_n} * kWords;
  uint32_t* out = bits + (int64_t(table) * num_m * block_m + r0) * row_words + n * kWords;
  bool kept = false, dropped = false, value = false;
  if constexpr (kVec && kKeep) {
    // A load: kRowsLoad rows of kLanesRow lanes; lane's row lr, its keys c .. c + 15 (cols is
    // a multiple of 16).
    constexpr int kLanesRow = kBlockN / 16, kRowsLoad = 32 / kLanesRow, kLoadsV = 4;
    const int lr = lane / kLanesRow, c = 16 * (lane % kLanesRow);
    for (int r1 = warp * kRowsLoad * kLoadsV; r1 < block_m; r1 += warps * kRowsLoad * kLoadsV) {
      uint4 x[kLoadsV];
#pragma unroll
      for (int i = 0; i < kLoadsV; ++i) {
        const int r = r1 + i * kRowsLoad + lr;
        x[i] = r < rows && c < cols ? *reinterpret_cast<const uint4*>(base + int64_t(r0 + r) * ss + c0 + c)
                                    : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kLoadsV; ++i) {
        const int r = r1 + i * kRowsLoad + lr;
        const bool in = r < rows && c < cols;
        const uint32_t w4[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
        uint32_t half = 0;  // this lane's 16 keys
#pragma unroll
        for (int e = 0; e < 16; ++e) half |= uint32_t{((w4[e / 4] >> (8 * (e % 4))) & 0xffu) != 0} << e;
        kept |= half != 0;
        dropped |= in && half != 0xffffu;
        uint32_t word = half << (16 * (lane % 2));
        word |= __shfl_xor_sync(0xffffffffu, word, 1);
        if (lane % 2 == 0 && r < block_m) out[r * row_words + c / 32] = word;
      }
    }
  } else if constexpr (kVec) {
    // A load: kRowsLoad rows of kLanesRow lanes; lane's row lr, its keys c .. c + 7 (cols is a
    // multiple of 8: all of them in the extents or none).
    constexpr int kLanesRow = kBlockN / 8, kRowsLoad = 32 / kLanesRow, kLoadsV = 4;
    const int lr = lane / kLanesRow, c = 8 * (lane % kLanesRow);
    const uint32_t m2 = masked | uint32_t{masked} << 16;
    for (int r1 = warp * kRowsLoad * kLoadsV; r1 < block_m; r1 += warps * kRowsLoad * kLoadsV) {
      uint4 x[kLoadsV];
#pragma unroll
      for (int i = 0; i < kLoadsV; ++i) {
        const int r = r1 + i * kRowsLoad + lr;
        x[i] = r < rows && c < cols ? *reinterpret_cast<const uint4*>(base + int64_t(r0 + r) * ss + c0 + c)
                                    : make_uint4(m2, m2, m2, m2);
      }
#pragma unroll
      for (int i = 0; i < kLoadsV; ++i) {
        const int r = r1 + i * kRowsLoad + lr;
        const bool in = r < rows && c < cols;
        const uint32_t w4[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
        uint32_t byte = 0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const uint16_t v = static_cast<uint16_t>(w4[e / 2] >> (16 * (e % 2)));
          const bool keep = v != masked;
          dropped |= !keep && in;
          value |= keep && (v & 0x7fffu) != 0;
          kept |= keep;
          byte |= uint32_t{keep} << e;
        }
        uint32_t word = byte << (8 * (lane % 4));
        word |= __shfl_xor_sync(0xffffffffu, word, 1);
        word |= __shfl_xor_sync(0xffffffffu, word, 2);
        if (lane % 4 == 0 && r < block_m) out[r * row_words + c / 32] = word;
      }
    }
  } else {
    for (int r1 = warp * kRows; r1 < block_m; r1 += warps * kRows) {
      E x[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int r = r1 + i / kWords, c = 32 * (i % kWords) + lane;
        x[i] = r < rows && c < cols ? base[int64_t(r0 + r) * ss + c0 + c] : kKeep ? E(0) : E(masked);
      }
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int r = r1 + i / kWords, c = 32 * (i % kWords) + lane;
        const bool keep = kKeep ? x[i] != 0 : x[i] != masked;
        dropped |= !keep && r < rows && c < cols;
        value |= !kKeep && keep && (x[i] & 0x7fffu) != 0;
        kept |= keep;
        const uint32_t w = __ballot_sync(0xffffffffu, keep);
        if (lane == 0 && r < block_m) out[r * row_words + i % kWords] = w;
      }
    }
  }
  kept = __syncthreads_or(kept);
  dropped = __syncthreads_or(dropped);
  value = __syncthreads_or(value);
  if (threadIdx.x == 0)
    tiles[(int64_t(table) * num_m + mq) * num_n + n] = uint8_t(kept | dropped << 1 | value << 2);
}

// FwdArgs::ranges from the classes: for each (table, query tile) the first and one past the
// last key block that keeps a key ({0, 0}: none).
__global__ void mask_ranges(const uint8_t* tiles, int64_t rows, int num_n, int2* ranges) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows) return;
  int first = -1, last = -1;
  for (int n = 0; n < num_n; ++n)
    if (tiles[i * num_n + n] & 1) last = n, first = first < 0 ? n : first;
  ranges[i] = first < 0 ? make_int2(0, 0) : make_int2(first, last + 1);
}

// Whether classify_mask's 16-byte loads (kVec) can read the bias: 16-byte aligned, every
// stride and the key extent in 8-key units.
inline bool classify_vec(const void* bias, int64_t sb, int64_t sh, int64_t ss, int64_t seqlen_kv) {
  return reinterpret_cast<uintptr_t>(bias) % 16 == 0 && sb % 8 == 0 && sh % 8 == 0 && ss % 8 == 0 &&
         seqlen_kv % 8 == 0;
}

// The classify_mask variant for a bias (its 16-byte loads where classify_vec allows them).
template <int kBlockN>
inline auto classify_kernel(const void* bias, int64_t sb, int64_t sh, int64_t ss, int64_t seqlen_kv) {
  return classify_vec(bias, sb, sh, ss, seqlen_kv) ? classify_mask<kBlockN, true> : classify_mask<kBlockN>;
}

// The same for a boolean keep mask (16-byte loads of 16 keys: strides in 16-key units).
template <int kBlockN>
inline auto classify_keep_kernel(const void* mask, int64_t sb, int64_t sh, int64_t ss, int64_t seqlen_kv) {
  return reinterpret_cast<uintptr_t>(mask) % 16 == 0 && sb % 16 == 0 && sh % 16 == 0 && ss % 16 == 0 &&
                 seqlen_kv % 16 == 0
             ? classify_mask<kBlockN, true, uint8_t>
             : classify_mask<kBlockN, false, uint8_t>;
}

// The backward's column ranges from the classes: for each (table, key block) the first and one
// past the last query tile that keeps a key of it ({0, 0}: none), so a key block's CTA starts
// at its first such tile instead of stepping through the empty ones.
__global__ void mask_columns(const uint8_t* tiles, int64_t tables, int num_m, int num_n, int2* cols) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= tables * num_n) return;
  const uint8_t* t = tiles + (i / num_n) * num_m * num_n + i % num_n;
  int first = -1, last = -1;
  for (int m = 0; m < num_m; ++m)
    if (t[int64_t{m} * num_n] & 1) last = m, first = first < 0 ? m : first;
  cols[i] = first < 0 ? make_int2(0, 0) : make_int2(first, last + 1);
}

}  // namespace
}  // namespace fusedattn::cuda::hopper
