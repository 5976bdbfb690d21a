// The CUDA flash kernels' shapes (attention/cuda/flash.cu) as plain C++: the tile sizes,
// warps per block and shared-memory layouts, which select_backend() (backend.cc, built
// with or without CUDA) reads to decide whether the kernels fit a device, and the kernels
// read to carve their shared memory. One definition for both.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "fusedattn/core/host_device.h"

namespace fusedattn::cuda::flash {

constexpr int kBN = 64;   // forward: keys per tile
constexpr int kBMQ = 64;  // backward: queries per tile
constexpr int kDC = 64;   // head-dim chunk of the streamed operands

// Row padding (elements) of the shared-memory tiles that wmma reads: 16 bytes for 16-bit
// elements, 16 bytes for float32 (4 elements), keeping rows 32-byte aligned.
FA_HOST_DEVICE FA_INLINE int pad_of(int elem_bytes) { return elem_bytes == 2 ? 8 : 4; }
FA_HOST_DEVICE FA_INLINE int64_t round16(int64_t d) { return (d + 15) / 16 * 16; }

// Warps per block: the forward's query tile is 16 W rows, the backward's key tile 16 W keys.
FA_HOST_DEVICE FA_INLINE int fwd_warps(int64_t head_dim_v) { return head_dim_v > 256 ? 2 : 4; }
FA_HOST_DEVICE FA_INLINE int bwd_warps(int64_t head_dim_qk, int64_t head_dim_v) {
  return (head_dim_qk > head_dim_v ? head_dim_qk : head_dim_v) > 256 ? 1 : 2;
}

// Byte offsets of a forward block's shared memory (elem: bytes of q's dtype).
struct FwdLayout {
  int ldq, ldc, ldp;
  size_t q, kv, s, pr, o, rows, alpha, state, wmax, total;
  FA_HOST_DEVICE FwdLayout(int W, int64_t Dp, int64_t Dvp, int elem) {
    const int BM = 16 * W, pad = pad_of(elem);
    ldq = int(Dp) + pad, ldc = kDC + pad, ldp = kBN + pad;
    size_t at = 0;
    auto take = [&](size_t bytes) { const size_t r = at; at += (bytes + 127) / 128 * 128; return r; };
    q = take(size_t(BM) * ldq * elem);
    kv = take(size_t(kBN) * ldc * elem);
    s = take(size_t(BM) * kBN * 4);
    pr = take(size_t(BM) * ldp * elem);
    o = take(size_t(BM) * Dvp * 4);
    rows = take(size_t(BM) * 16);  // RowInfo
    alpha = take(size_t(BM) * 4);
    state = take(size_t(BM) * 3 * 4);
    wmax = take(size_t(W) * 4);
    total = at;
  }
};

// Byte offsets of a backward block's shared memory.
struct BwdLayout {
  int ldk, ldv, ldc, ldp;
  size_t k, v, ch, st, dpt, pt, dst, dk, dv, rows, lse, delta, total;
  FA_HOST_DEVICE BwdLayout(int W, int64_t Dp, int64_t Dvp, int elem) {
    const int BN = 16 * W, pad = pad_of(elem);
    ldk = int(Dp) + pad, ldv = int(Dvp) + pad, ldc = kDC + pad, ldp = kBMQ + pad;
    size_t at = 0;
    auto take = [&](size_t bytes) { const size_t r = at; at += (bytes + 127) / 128 * 128; return r; };
    k = take(size_t(BN) * ldk * elem);
    v = take(size_t(BN) * ldv * elem);
    ch = take(size_t(kBMQ) * ldc * elem);
    st = take(size_t(BN) * kBMQ * 4);
    dpt = take(size_t(BN) * kBMQ * 4);
    pt = take(size_t(BN) * ldp * elem);
    dst = take(size_t(BN) * ldp * elem);
    dk = take(size_t(BN) * Dp * 4);
    dv = take(size_t(BN) * Dvp * 4);
    rows = take(size_t(kBMQ) * 16);
    lse = take(size_t(kBMQ) * 4);
    delta = take(size_t(kBMQ) * 4);
    total = at;
  }
};

// The larger of the forward's and the backward's shared memory for head dims d, dv.
inline size_t smem_need(int64_t d, int64_t dv, int elem) {
  const size_t f = FwdLayout(fwd_warps(dv), round16(d), round16(dv), elem).total;
  const size_t b = BwdLayout(bwd_warps(d, dv), round16(d), round16(dv), elem).total;
  return f > b ? f : b;
}

}  // namespace fusedattn::cuda::flash
