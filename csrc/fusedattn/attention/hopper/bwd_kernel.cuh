// Flash attention backward for Hopper (sm_90a), head dims 64, 128 and 256, bf16 / fp16 (flash_bwd.cu
// runs it; select_backend gives it dense masks' backwards, and plain calls' where
// hopper/measured_bwd.h found it faster than cuDNN's). FlashAttention-2's loop order with
// Hopper's instructions and FlashAttention-3's order within an iteration:
//   - a thread block owns 128 keys of one (batch row, kv head): its K and V stay in shared
//     memory (the copy engine, TMA), dK and dV in registers; it walks the query blocks
//     (kBwdBlockM rows: 128 at head dim 64 without a dense mask or with one that holds no
//     values (kBwdKeep), else 64) of each query head
//     of the kv head's group that the band lets see its keys, two stages of Q, dO, lse and D
//     in flight (one thread issues the copies, after the iteration's barrier);
//   - two warpgroups, 64 keys each: S^T = K Q^T, then dP^T = V dO^T (wgmma, both operands in
//     shared memory), P^T = exp2(S^T scale log2(e) - lse2) while dP^T's product runs,
//     dS^T = P^T (dP^T - D), all in registers (the band checked only in tiles that cross an
//     edge); dV += P^T dO with P^T as the register operand, issued before the barrier;
//   - dS^T goes to shared memory (double-buffered, 128-byte swizzled as the copy engine
//     writes); after the one 256-thread barrier of the iteration each group computes a
//     64 x 64 part of the block's dS K (head dim 128: 64 columns over the 128 keys; 64 with
//     128 queries: 64 queries over the 128 keys; 64 with 64 queries: all over its own 64
//     keys), then dK += dS^T Q runs while the part goes to shared memory, where the copy
//     engine adds it to a float32 accumulator in global memory (a bulk reduction, waited
//     for only before the next part; handed over at once or, kDqLate, at the next
//     iteration's start); flash_bwd.cu's last kernel scales and converts it;
//   - at the end dK and dV go through shared memory (the free Q / dO stages) and leave in
//     16-byte row stores.
// kSoftcap (the softcap score_mod, c tanh(s scale / c)): t = tanh(s scale / c) (tanh.approx,
// as the forward) while dP^T's product runs, kept in S^T's registers (-inf where dropped);
// after it P^T = exp2(t c log2(e) - lse2) and dS^T = P^T (dP^T - D) (1 - t^2), the scale folded
// into BwdArgs::scale as for plain calls. Two MUFU operations an element, no register more
// than a plain call's (recovering t from P instead, a third, lg2, took 1.11-1.23x the time:
// session 32, dev/hopper_bwd/README.md).
// ALiBi (kAlibi: x = s scale log2(e) + slope_h g(kv - q), the sign and log2(e) folded into
// slope_mul, g = identity or |.|): the bias joins x as the forward adds it; dS is plain.
// Head dim 256 (kWide) changes the block: 64 keys (dK and dV of 128 keys x 256 columns would
// take 256 registers a thread each), both groups over the same keys. S^T and dP^T split by
// queries (m64n32 products, a group's 32 of the 64), P^T and dS^T both go to shared memory,
// and after the barrier each group computes its 128 columns of dV += P^T dO, dK += dS^T Q and
// dQ = dS K from shared memory; dQ leaves from registers as float4 atomic additions into
// dq_acc (no shared memory left for the parts: K, V and two stages of Q and dO take 192 KiB).
// Tiles with values read them from global memory (no bias stages); kDet orders the
// additions as it orders the parts (a group waits for its turn, adds, counts itself). ALiBi
// there as at 64 and 128 (flash_bwd_d256_alibi.cu: its variants' own translation unit).
// GQA: the group's query heads run in the same block, so dK and dV are summed in registers
// (deterministic); dQ's reductions are not (their order varies) unless kDet (BwdArgs::dq_sem):
// then each part waits until the key blocks before its own (in launch order: blockIdx.x)
// have added theirs to its 64-row block (a counter in dq_sem, acquire / release), adds, waits
// for its addition to complete and counts itself. A block waits only on blocks launched
// before it, so the chain always moves.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "fusedattn/attention/hopper/bwd_layout.cuh"
#include "fusedattn/attention/hopper/scores.cuh"
#include "fusedattn/attention/hopper/sm90.cuh"

namespace fusedattn::cuda::hopper {

// kDet: waits until *sem reaches turn; false when it gave up after 10 s (a counter that never
// gets there: a bug in the turn's count), so that the stream does not hang (the caller then
// makes the result visibly wrong). No trap and no call here: either makes ptxas serialize
// every wgmma of the kernel (C7518, C7510).
__device__ __forceinline__ bool wait_turn(const int* sem, int turn) {
  uint64_t start = 0;
  for (uint32_t spins = 0; ld_acquire(sem) != turn; ++spins) {
    if ((spins & 1023) != 1023) continue;
    const uint64_t now = global_ns();
    if (start == 0) start = now;
    else if (now - start > 10'000'000'000ull) return false;
  }
  return true;
}

// (kDense, kDet, kMod: bwd_layout.cuh, above kBwdBlockM.)
template <bool kCausal, bool kBf16, bool kDense, int kD, bool kDet, int kMod = kBwdPlain>
__global__ void __launch_bounds__(BwdDims::kThreads, 1)
    flash_bwd_kernel(const __grid_constant__ BwdArgs a) {
  [[maybe_unused]] constexpr bool kSoftcap = kMod == kBwdSoftcap, kAlibi = kMod == kBwdAlibi || kMod == kBwdAlibiAbs;
  static_assert(kMod != kBwdDbias || kDense, "dbias: the dense variants");
  static_assert(kMod != kBwdKeep || (kDense && kD == 64), "keep-only masks: head dim 64's dense variant");
  // Head dim 256 (kWide): 64-key blocks, two groups over the same keys. S^T and dP^T split
  // by queries (group w: the query block's 32w..), P^T and dS^T both to shared memory, then
  // each group's dV += P^T dO, dK += dS^T Q and dQ = dS K for its 128 of the 256 columns
  // (all three from shared memory), dQ added from registers (float4 atomics into dq_acc,
  // bwd_dq_index's order; kDet: in turns, as the parts). No bias stages (a tile's values
  // read from global memory).
  constexpr bool kWide = kD == 256;
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kBiasStages = kDense && kMod != kBwdKeep && !kWide;  // BwdSmem::bias is there
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  constexpr int kBlockM = kBwdBlockM<kD, kDense, kMod>;  // this variant's query block
  constexpr int kBlockN = kBwdBlockN<kD>;                // and its key block
  constexpr uint32_t kKV = kBlockN * 128, kQ = kBlockM * 128;  // a 64-column span of K / V, Q / dO
  // A group's queries of S^T (from qoff) and columns of dK / dV (from coff).
  constexpr int kQC = kWide ? 32 : kBlockM, kDc = kWide ? 128 : kD;
  extern __shared__ uint8_t smem_raw[];
  static_assert(kD == 64 || kD == 128 || kD == 256, "head dims 64, 128 and 256");
  constexpr int kSpans = kD / 64;
  using Smem = BwdSmem<kD, kBlockM>;
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  // kDet with a right edge (causal, a window's right side) takes the parts in descending
  // key-block order (turn_of): the blocks launch from the last key block down, so that a
  // block still waits only on blocks launched before it.
  constexpr bool kDescending = kDet && kCausal;
  const int n = kDescending ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h_kv = blockIdx.y, b = blockIdx.z;
  const int w = threadIdx.x / 128, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int qoff = kWide ? 32 * w : 0, coff = kWide ? 128 * w : 0;
  // The 128-key block of a dense mask's tables (classes, column ranges) holding this block.
  const int nb = n * kBlockN / BwdDims::kBlockN;
  // The (batch, head) table of a dense mask's classes and ranges (mask_tiles.cuh).
  auto table_of = [&](int h) { return (a.bias_b ? b : 0) * a.bias_heads + (a.bias_heads > 1 ? h : 0); };
  BwdTile tile = bwd_tile<kCausal, kBlockM, kBlockN>(a, n, b);
  if constexpr (kDense) {  // a folded mask: the query tiles any of the group's heads keeps a key of
    if (a.cols) {
      int lo = tile.m_end, hi = tile.m_begin;
      for (int hh = 0; hh < a.heads_per_kv; ++hh) {
        const int2 r = a.cols[int64_t{table_of(h_kv * a.heads_per_kv + hh)} * a.mask_n + nb];
        if (r.x < r.y) lo = min(lo, r.x), hi = max(hi, r.y);
      }
      tile.m_begin = max(tile.m_begin, lo), tile.m_end = max(tile.m_begin, min(tile.m_end, hi));
    }
  }
  const int blocks = max(0, tile.m_end - tile.m_begin);
  const int total = blocks * a.heads_per_kv;

  if (threadIdx.x == 0) {
    mbar_init(&sm.kv_full, 1);
    mbar_init(&sm.full[0], 1);
    mbar_init(&sm.full[1], 1);
    mbar_init_fence();
  }
  __syncthreads();
  // Iteration it: head h_kv * group + it / blocks, query block m_begin + it % blocks; a dense
  // mask's class of it (1: no mask; 0: nothing kept, skipped).
  auto head_of = [&](int it) { return h_kv * a.heads_per_kv + it / blocks; };
  auto block_of = [&](int it) { return tile.m_begin + it % blocks; };
  auto class_of = [&](int it) -> int {
    if constexpr (!kDense) return 1;
    return a.tiles[(int64_t(table_of(head_of(it))) * a.mask_m + block_of(it)) * a.mask_n + nb];
  };
  auto next = [&](int it) {
    while (it < total && !(class_of(it) & 1)) ++it;
    return it;
  };
  // Stage st's Q, dO, lse2 and D of iteration it.
  auto load = [&](int it, int st) {
    const int h = head_of(it), m0 = block_of(it) * kBlockM;
    // a tile whose bias values join the scores (class bit 2): its bias tile too
    const bool bias_tile = kBiasStages && a.bias_tma && (class_of(it) & 4);
    mbar_expect_bytes(&sm.full[st], 2 * kSpans * kQ + 2 * kBlockM * 4 + (bias_tile ? 2 * kQ : 0));
    for (int sp = 0; sp < kSpans; ++sp) {
      tma_load_4d(&a.q, &sm.full[st], sm.q[st] + sp * kQ, 64 * sp, m0, h, b);
      tma_load_4d(&a.dout, &sm.full[st], sm.dout[st] + sp * kQ, 64 * sp, m0, h, b);
    }
    if constexpr (kBiasStages) {
      if (bias_tile)
        for (int sp = 0; sp < 2; ++sp)
          tma_load_4d(&a.bias_map, &sm.full[st], sm.bias[st] + sp * kQ, tile.n0 + 64 * sp, m0,
                      a.bias_heads > 1 ? h : 0, a.bias_b ? b : 0);
    }
    const int64_t row = (int64_t{b} * a.heads_q + h) * a.sq_pad + m0;
    bulk_load(sm.lse2[st], a.lse2 + row, kBlockM * 4, &sm.full[st]);
    bulk_load(sm.dsum[st], a.dsum + row, kBlockM * 4, &sm.full[st]);
  };
  const int first = next(0);
  if (threadIdx.x == 0 && first < total) {
    tma_prefetch_map(&a.q);
    tma_prefetch_map(&a.dout);
    mbar_expect_bytes(&sm.kv_full, 2 * kSpans * kKV);
    for (int sp = 0; sp < kSpans; ++sp) {
      tma_load_4d(&a.k, &sm.kv_full, sm.k + sp * kKV, 64 * sp, tile.n0, h_kv, b);
      tma_load_4d(&a.v, &sm.kv_full, sm.v + sp * kKV, 64 * sp, tile.n0, h_kv, b);
    }
    load(first, 0);
  }

  float dk[kDc / 2], dv[kDc / 2];
#pragma unroll
  for (int i = 0; i < kDc / 2; ++i) dk[i] = 0.0f, dv[i] = 0.0f;
  // Two orders, measured (dev/hopper_bwd, session 29): kLseEarly, the stage's lse2 reaches
  // registers before the products are issued (read after them, the loads waited behind
  // them: D128 full 2.55 -> 2.46 ms, causal 1.50 -> 1.43); kDqLate, a group's dQ part leaves
  // for the copy engine at the start of the next iteration, while S^T's product runs,
  // instead of right after it is written (the proxy fence waited for the writes: D64 full
  // 2.94 -> 2.72, causal 1.69 -> 1.56; D128 causal 1.42). Both at once spill at 128, and the
  // first spills with a dense mask's code: head dim 128 without a dense mask takes the first,
  // the rest the second.
  // (kWide: the first; its dQ leaves from registers.)
  constexpr bool kLseEarly = (kD == 128 && !kDense) || kWide, kDqLate = !kLseEarly;
  const uint32_t k_addr = smem_addr(sm.k), v_addr = smem_addr(sm.v);
  const int key_l = (kWide ? 0 : 64 * w) + 16 * warp + lane / 4;  // this thread's keys in the block: +0, +8
  const int key0 = tile.n0 + key_l;
  if (first < total) mbar_wait(&sm.kv_full, 0);
  [[maybe_unused]] float dslope = 0.0f;  // kAlibi with dslopes: this thread's part, the head's so far
  float* pending = nullptr;  // where the group's part in sm.dq goes
  int pending_it = 0;          // kDet: the iteration whose part it is
  // kDet: the parts added to query block mb's rows (kBlockM units) before this block's, by
  // the key blocks n' < n whose band reaches mb (a run [lo, n): m_begin grows with n', and
  // without a window every n' <= n reaches it; with one, n' reaches it when its last key
  // minus lo_diag is at or past mb's first row) and, with a dense mask, keep a key of it
  // (class bit 0, as next() skips: a tile whose keys the mask all drops is class 2).
  // (Key blocks of kBlockN keys; a dense mask's class of block x is its 128-key table
  // block's, as class_of reads it.)
  auto turn_of = [&](int h, int mb) {
    [[maybe_unused]] const uint8_t* row = kDense ? a.tiles + (int64_t(table_of(h)) * a.mask_m + mb) * a.mask_n : nullptr;
    [[maybe_unused]] auto kept = [&](int x) { return row[x * kBlockN / BwdDims::kBlockN] & 1; };
    if constexpr (kDescending) {
      // The parts added before this block's: the key blocks n' > n that reach mb. Those run
      // up to hi, the last block holding a key (kv_len) whose first key the right edge lets
      // mb's last row see (n' kBlockN <= (mb + 1) kBlockM - 1 + diag); a window's left edge
      // lets every n' > n see mb, as it lets n (its last key only grows with n').
      const int last = (tile.kv_len + kBlockN - 1) / kBlockN - 1;
      const long long edge = static_cast<long long>(mb + 1) * kBlockM - 1 + tile.diag;
      const int hi = edge < 0 ? -1 : static_cast<int>(min(static_cast<long long>(last), edge / kBlockN));
      int after = max(0, hi - n);
      if constexpr (kDense) {
        after = 0;
        for (int x = n + 1; x <= hi; ++x) after += kept(x);
      }
      return after;
    }
    int lo = 0;
    if (tile.lo_diag != kNoEdge) {
      const long long need = static_cast<long long>(mb) * kBlockM + tile.lo_diag - (kBlockN - 1);
      lo = need <= 0 ? 0 : static_cast<int>((need + kBlockN - 1) / kBlockN);
    }
    int before = max(0, n - lo);
    if constexpr (kDense) {
      before = 0;
      for (int x = lo; x < n; ++x) before += kept(x);  // class_of's rule: bit 0, a key kept
    }
    return before;
  };
  auto flush_dq = [&] {     // hands the part to the copy engine, which adds it there
    fence_proxy_async();
    group_sync(2 + w);  // the group's part written
    if (tid == 0) {
      int* sem = nullptr;
      if constexpr (kDet) {  // wait until the parts before this one are added (and complete)
        // Its 64-row block's counter (head dim 128: a group's 64 columns each); head dim 64
        // with 64 queries: both groups add to the same 64 x 64 block, group 0 first.
        constexpr bool kShared = kD == 64 && kBlockM == 64;
        const int h = head_of(pending_it), mb = block_of(pending_it);
        const int rows = mb * kBlockM + (kBlockM == 128 ? 64 * w : 0);
        sem = a.dq_sem + 2 * (((int64_t{b} * a.heads_q + h) * a.sq_pad + rows) / 64) + (kD == 128 ? w : 0);
        const int turn = kShared ? 2 * turn_of(h, mb) + w : turn_of(h, mb);
        if (!wait_turn(sem, turn)) {  // gave up: this part adds NaN, so dQ's rows show it
          for (int i = 0; i < 64 * 64; ++i) sm.dq[w][i] = __int_as_float(0x7fc00000);
          fence_proxy_async();
        }
        fence_proxy_async_global();
      }
      bulk_reduce_add(pending, sm.dq[w], 64 * 64 * 4);
      bulk_commit();
      if constexpr (kDet) {  // this one's writes complete, then the next may add
        bulk_wait<0>();
        fence_proxy_async_global();
        red_release_add(sem, 1);
      }
    }
  };
  for (int it = first, k = 0; it < total; ++k) {
    const int st = k % 2, nx = next(it + 1);
    const int h = head_of(it), m0 = block_of(it) * kBlockM, cls = class_of(it);
    mbar_wait(&sm.full[st], (k / 2) & 1);
    const uint32_t q_addr = smem_addr(sm.q[st]), do_addr = smem_addr(sm.dout[st]);

    // S^T = K Q^T and dP^T = V dO^T for this group's 64 keys (N = the block's queries; kWide:
    // the block's 64 keys, N = the group's 32 queries).
    constexpr int kAcc = kQC / 2;  // accumulators a thread: 64 keys x kQC queries
    float s[kAcc], dp[kAcc];
    fence_regs(s);
    fence_regs(dp);
    wgmma_fence();
    auto product = [&](float (&acc)[kAcc], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
      for (int kk = 0; kk < 4 * kSpans; ++kk) {
        const uint64_t da = desc_sw128(a_addr + (kk / 4) * kKV + (kWide ? 0 : w * 64 * 128) + (kk % 4) * 32, 16, 1024);
        const uint64_t db = desc_sw128(b_addr + (kk / 4) * kQ + qoff * 128 + (kk % 4) * 32, 16, 1024);
        if constexpr (kWide) wgmma_ss_m64n32k16<kBf16>(acc, da, db, kk > 0);
        else if constexpr (kBlockM == 128) wgmma_ss_m64n128k16<kBf16>(acc, da, db, kk > 0);
        else wgmma_ss_m64n64k16<kBf16>(acc, da, db, kk > 0);
      }
      wgmma_commit();
    };
    float lse_r[kLseEarly ? kQC / 4 : 1];  // the lse2 of this thread's queries (kLseEarly)
    if constexpr (kLseEarly) {
#pragma unroll
      for (int j = 0; j < kQC / 8; ++j) {
        const float2 l = *reinterpret_cast<const float2*>(&sm.lse2[st][qoff + 8 * j + 2 * (lane % 4)]);
        lse_r[2 * j] = l.x, lse_r[2 * j + 1] = l.y;
      }
    }
    product(s, k_addr, q_addr);
    product(dp, v_addr, do_addr);
    if constexpr (!kWide)
      if (kDqLate && k > 0) flush_dq();  // the last iteration's part
    wgmma_wait<1>();  // S^T (P^T is computed while dP^T's product runs)
    fence_regs(s);

    // P^T and dS^T. Element (key key0 + 8r, query m0 + c), c = qoff + 8j + 2 (lane % 4) + e, is
    // s[4j + 2r + e] (the accumulator layout, scores.cuh). kMode: 0 the band alone, 1 a
    // dense mask's bits (a word a query: the block's 32 keys of this thread's two), 2 its
    // 16-bit values (dropped, or a bias added), 3 a bias's values from the stage's tile
    // (class bit 3: none dropped).
    const bool edge = m0 + kBlockM > tile.q_len || tile.n0 + kBlockN > tile.kv_len ||
                      (kCausal && tile.n0 + kBlockN - 1 > m0 + tile.diag) ||
                      (tile.lo_diag != kNoEdge && tile.n0 < m0 + kBlockM - 1 + tile.lo_diag);
    auto probs = [&](auto mode_tag, auto edge_tag) {
      constexpr int kMode = decltype(mode_tag)::value;
      constexpr bool kEdge = decltype(edge_tag)::value;  // the tile crosses an edge (checked a key)
      const int tbl = table_of(h);
      const uint32_t* bits = kMode == 1 ? a.keep_bits + (int64_t(tbl) * a.mask_m * kBlockM + m0) *
                                                            a.words_per_row + (n * kBlockN + key_l) / 32
                                        : nullptr;
      const uint16_t* bias = kMode == 2 ? a.bias + b * a.bias_b + h * a.bias_h : nullptr;
      [[maybe_unused]] const float slope = kAlibi ? a.slopes[h * a.slope_stride] * a.slope_mul : 0.0f;
      // kMode 3: the bias pairs (queries c, c + 1 of key key_l + 8 r) of query chunks j, j + 1,
      // four 8 x 8 blocks of the stage's tile transposed by one ldmatrix (block 2 (j % 2) + r;
      // lane L addresses row L % 8 of block L / 8: query 8 (j + L / 16) + L % 8, keys
      // 16 warp + 8 (L / 8 % 2) of span w, 128-byte swizzled).
      [[maybe_unused]] uint32_t bv[4];
#pragma unroll
      for (int j = 0; j < kQC / 8; ++j) {
        if constexpr (kMode == 3) {
          if (j % 2 == 0) {
            const int c = 8 * (j + lane / 16) + lane % 8, chunk = 2 * warp + lane / 8 % 2;
            ldsm_x4_trans(bv, smem_addr(sm.bias[st] + w * kQ + c * 128 + ((chunk ^ (c % 8)) << 4)));
          }
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = qoff + 8 * j + 2 * (lane % 4) + e, q = m0 + c;
          const float lse2 = kLseEarly ? lse_r[2 * j + e] : sm.lse2[st][c];
          uint32_t word = 0;
          if constexpr (kMode == 1) word = bits[int64_t{c} * a.words_per_row] >> (key_l % 32);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int i = 4 * j + 2 * r + e, key = key0 + 8 * r;
            // the forward's score functors (scores.cuh): ALiBi's x, softcap's t below
            float x;
            if constexpr (kAlibi)
              x = AlibiScores<kMod == kBwdAlibiAbs>::pre(s[i], a.scale_log2, slope, 0.0f, static_cast<float>(key - q));
            else if constexpr (kSoftcap)
              x = s[i];  // the raw q.k: a bias joins it before the tanh (bias_mul: raw units)
            else
              x = s[i] * a.scale_log2;
            bool drop = false;
            if constexpr (kMode == 1) drop = !((word >> (8 * r)) & 1u);
            if constexpr (kMode == 2) {
              // the stage's tile: row c, key kl = key_l + 8 r's 16-byte chunk (kl % 64) / 8 of
              // span kl / 64 at chunk ^ (c % 8) (128-byte swizzle); rows and keys past the
              // extents read 0 there (the edge drops them)
              uint16_t v = 0;
              if (kBiasStages && a.bias_tma) {
                const int kl = key_l + 8 * r;
                v = *reinterpret_cast<const uint16_t*>(sm.bias[st] + (kl / 64) * kQ + c * 128 +
                                                       ((((kl % 64) / 8) ^ (c % 8)) * 16) + (kl % 8) * 2);
              } else if (q < a.seqlen_q && key < a.seqlen_kv) {
                v = bias[int64_t{q} * a.bias_s + key];
              }
              if (v == a.masked_bits) drop = true;
              else x = fmaf(bits_to_float<kBf16>(v), a.bias_mul, x);
            }
            if constexpr (kMode == 3) {
              const uint32_t pair = bv[2 * (j % 2) + r];
              x = fmaf(bits_to_float<kBf16>(static_cast<uint16_t>(e ? pair >> 16 : pair & 0xffffu)), a.bias_mul, x);
            }
            if (kEdge && (q >= tile.q_len || key >= tile.kv_len || (kCausal && key > q + tile.diag) ||
                         (tile.lo_diag != kNoEdge && key < q + tile.lo_diag)))
              drop = true;
            // exp2 of every element, then the select: no branch an element (ex2 of a
            // dropped one's garbage is discarded). kSoftcap: t now, P after dP's product.
            if constexpr (kSoftcap) {
              (void)lse2;  // read after dP's product
              const float t = SoftcapScores::pre(x, a.cap_in, 0.0f, 0.0f, 0.0f);
              s[i] = drop ? -INFINITY : t;
            } else {
              const float pr = exp2_approx(x - lse2);
              s[i] = drop ? 0.0f : pr;
            }
          }
        }
      }
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if (!kDense || cls == 1) {
      if (edge) probs(std::integral_constant<int, 0>{}, Yes{});
      else probs(std::integral_constant<int, 0>{}, No{});
    } else if ((kBiasStages || kWide) && (cls & 4)) {  // a bias's values (a folded mask's kept keys')
      if constexpr (kBiasStages) {
        if (cls & 8) {  // a bias through the copy engine: no key dropped by value
          if (edge) probs(std::integral_constant<int, 3>{}, Yes{});
          else probs(std::integral_constant<int, 3>{}, No{});
        } else {
          probs(std::integral_constant<int, 2>{}, Yes{});
        }
      } else if constexpr (kDense) {  // kWide: from global memory
        probs(std::integral_constant<int, 2>{}, Yes{});
      }
    } else {  // the bits (inside the band: the bits alone)
      if (edge) probs(std::integral_constant<int, 1>{}, Yes{});
      else probs(std::integral_constant<int, 1>{}, No{});
      // kBwdKeep: the caller said the mask holds no values and this tile has some (class bit
      // 2): NaN in its P makes the broken claim visible in dQ, dK and dV
      if constexpr (kMod == kBwdKeep) {
        if (cls & 4) s[0] = __int_as_float(0x7fc00000);
      }
    }
    wgmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int j = 0; j < kQC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = qoff + 8 * j + 2 * (lane % 4) + e;
        const float dsum = sm.dsum[st][c];
        float lse2 = 0.0f;
        if constexpr (kSoftcap) lse2 = kLseEarly ? lse_r[2 * j + e] : sm.lse2[st][c];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 4 * j + 2 * r + e;
          if constexpr (kSoftcap) {  // s holds t: P, and d(c tanh(u)) / du = 1 - t^2. Dropped
            // (t -inf) or a row of lse +inf: P 0 and 1 - t^2 of t clamped to -1, 0; a NaN t
            // gives P NaN (fmaxf drops the NaN from the derivative only)
            const float t = s[i], tc = fmaxf(t, -1.0f);
            s[i] = exp2_approx(fmaf(t, a.cap_out, -lse2));
            dp[i] = s[i] * (dp[i] - dsum) * fmaf(-tc, tc, 1.0f);
          } else {
            dp[i] = s[i] * (dp[i] - dsum);
          }
          if constexpr (kAlibi) {  // the slopes' gradient: dS g(kv - q) (dropped scores' dS is 0)
            if (a.dslopes) {
              const float rel = static_cast<float>(key0 + 8 * r - (m0 + c));
              dslope = fmaf(dp[i], kMod == kBwdAlibiAbs ? fabsf(rel) : rel, dslope);
            }
          }
        }
      }
    uint32_t p[kAcc / 2], ds[kAcc / 2];
#pragma unroll
    for (int i = 0; i < kAcc / 2; ++i) {
      p[i] = pack2<kBf16>(s[2 * i], s[2 * i + 1]);
      ds[i] = pack2<kBf16>(dp[2 * i], dp[2 * i + 1]);
    }
    // dS^T to shared memory (this iteration's buffer), 128-byte swizzled: key row kr, queries'
    // 16-byte chunk jq at chunk jq % 8 ^ (kr % 8) of the row in span jq / 8 (64 queries a
    // span); kWide: P^T too, into the buffer's second half.
    uint8_t* ds_buf = sm.ds[k % 2][0];
#pragma unroll
    for (int j = 0; j < kQC / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int kr = key_l + 8 * r, jq = qoff / 8 + j;
        const int at = (jq / 8) * kKV + kr * 128 + (((jq % 8) ^ (kr % 8)) << 4) + 4 * (lane % 4);
        *reinterpret_cast<uint32_t*>(ds_buf + at) = ds[2 * j + r];
        if constexpr (kWide) *reinterpret_cast<uint32_t*>(sm.ds[k % 2][1] + at) = p[2 * j + r];
      }
    fence_proxy_async();

    // dV += P^T dO (K = the block's queries, 16 a step), running across the barrier (kWide:
    // after it, P^T from shared memory).
    if constexpr (!kWide) {
      fence_regs(dv);
      fence_regs(p);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const uint32_t fa[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        if constexpr (kD == 128) wgmma_rs_m64n128k16<kBf16>(dv, fa, desc_sw128(do_addr + kk * 16 * 128, kQ, 1024));
        else wgmma_rs_m64n64k16<kBf16>(dv, fa, desc_sw128(do_addr + kk * 16 * 128, kQ, 1024));
      }
      wgmma_commit();
      if (tid == 0) bulk_wait_read<0>();  // the last iteration's dQ part has left sm.dq[w]
    }
    // Both groups' dS^T (kWide: and P^T) written, and both done with iteration k - 1: its
    // stage (loaded next here), sm.dq (free above) and the dS^T buffer of k + 1.
    named_sync(1);
    if (threadIdx.x == 0 && nx < total) load(nx, st ^ 1);

    // kWide: the group's 128 columns (coff..) of dQ = dS K (over the block's 64 keys, from
    // the dS^T buffer), then of dV += P^T dO and dK += dS^T Q (over the 64 queries).
    float dq[kWide ? 64 : 32];
    if constexpr (kWide) {
      const uint32_t ds_at = smem_addr(ds_buf), pt_at = smem_addr(sm.ds[k % 2][1]);
      fence_regs(dq);
      fence_regs(dv);
      fence_regs(dk);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_ss_m64n128k16_tt<kBf16>(dq, desc_sw128(ds_at + kk * 16 * 128, kKV, 1024),
                                      desc_sw128(k_addr + 2 * w * kKV + kk * 16 * 128, kKV, 1024), kk > 0);
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma_ss_m64n128k16_bt<kBf16>(dv, desc_sw128(pt_at + kk * 32, 16, 1024),
                                      desc_sw128(do_addr + 2 * w * kQ + kk * 16 * 128, kQ, 1024));
        wgmma_ss_m64n128k16_bt<kBf16>(dk, desc_sw128(ds_at + kk * 32, 16, 1024),
                                      desc_sw128(q_addr + 2 * w * kQ + kk * 16 * 128, kQ, 1024));
      }
      wgmma_commit();
    } else {
      // dQ's part of the block, dS K, a 64 x 64 product a group: head dim 128, columns 64w..
      // over the block's 128 keys; head dim 64 and 128 queries, queries 64w.. over the 128
      // keys; head dim 64 and 64 queries, all over this group's 64 keys (the groups' sums add
      // up in dq_acc). Then dK += dS^T Q, running while the part goes to shared memory.
      fence_regs(dq);
      wgmma_fence();
      constexpr bool kOwnKeys = kD == 64 && kBlockM == 64;
      constexpr int kDqSteps = kOwnKeys ? 4 : 8;  // 16 keys a step
      const uint32_t ds_at = smem_addr(ds_buf) + (kOwnKeys ? w * 64 * 128 : kBlockM == 128 ? w * kKV : 0);
      const uint32_t k_at = k_addr + (kOwnKeys ? w * 64 * 128 : kD == 128 ? w * kKV : 0);
#pragma unroll
      for (int kk = 0; kk < kDqSteps; ++kk)
        wgmma_ss_m64n64k16_tt<kBf16>(dq, desc_sw128(ds_at + kk * 16 * 128, kKV, 1024),
                                     desc_sw128(k_at + kk * 16 * 128, kKV, 1024), kk > 0);
      wgmma_commit();
      fence_regs(dk);
      fence_regs(ds);
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        const uint32_t fa[4] = {ds[4 * kk], ds[4 * kk + 1], ds[4 * kk + 2], ds[4 * kk + 3]};
        if constexpr (kD == 128) wgmma_rs_m64n128k16<kBf16>(dk, fa, desc_sw128(q_addr + kk * 16 * 128, kQ, 1024));
        else wgmma_rs_m64n64k16<kBf16>(dk, fa, desc_sw128(q_addr + kk * 16 * 128, kQ, 1024));
      }
      wgmma_commit();
    }
    // kBwdDbias, or ALiBi's and softcap's dense variants (a bias beside them) when dbias is
    // wanted (a.dbias; softcap's dS holds its 1 - t^2 already)
    constexpr bool kDbiasCode = kMod == kBwdDbias || ((kAlibi || kSoftcap) && kDense);
    if (kDbiasCode && (kMod == kBwdDbias || a.dbias)) {
      // This tile's dS is the bias's gradient (times the scale, pre-scale), read back from
      // the dS^T buffer (both groups' written: named_sync above; the products read it too)
      // while they run: one ldmatrix.x4.trans gives a thread two adjacent keys of one query
      // in each of four 8 x 8 blocks (keys 16 warp + 8 (block % 2) of this group's 64, query
      // chunk jc + block / 2), so each store writes 4 bytes of a dbias row (a float2 sum where
      // the bias broadcasts: dbias_acc) instead of 2.
      const uint32_t ds_base = smem_addr(ds_buf);
      const int tbl = table_of(h);
      T* dbias_at = a.dbias_acc ? nullptr : static_cast<T*>(a.dbias) + b * a.bias_b + h * a.bias_h;
      // kBiasStages with dbias_tile (dbias of the call's extents, whole 16-byte rows): the
      // group's 64 keys go to span w of the stage's bias buffer (the bias tile's layout: query
      // row c, 128-byte swizzled), then out a row at a time (full lines, where the pairs
      // filled half sectors); else each thread stores its pairs.
      const bool rows_out = kBiasStages && a.dbias_tile;
      uint8_t* span = sm.bias[st] + w * kQ;
      // Rows jc, jc + 1 (8 queries each) of the group's 64 keys: r[blk] the pair of keys
      // kc = 2 warp + blk % 2 (16-byte chunk), 2 (lane % 4) of query row 8 (jc + blk / 2) + lane / 4.
      // (kWide: the block's 64 keys, the group's query chunks qoff / 8..)
      auto ds_pairs = [&](int jc, uint32_t (&r)[4]) {
        const int kr = (kWide ? 0 : 64 * w) + 16 * warp + 8 * (lane / 8 % 2) + lane % 8, chunk = jc + lane / 16;
        ldsm_x4_trans(r, ds_base + (chunk / 8) * kKV + kr * 128 + (((chunk % 8) ^ (kr % 8)) << 4));
      };
      // (Two loops: one loop with the branch inside cost the D128 causal backward with dbias
      // 2.9 -> 3.4 ms, bwd_time on the H200, session 40.)
      if (rows_out) {
#pragma unroll
        for (int jc = 0; jc < kBlockM / 8; jc += 2) {
          uint32_t r[4];
          ds_pairs(jc, r);
#pragma unroll
          for (int blk = 0; blk < 4; ++blk) {
            const int c = 8 * (jc + blk / 2) + lane / 4, kc = 2 * warp + blk % 2;
            uint32_t v = r[blk];
            if (a.dbias_mul != 1.0f)
              v = pack2<kBf16>(bits_to_float<kBf16>(static_cast<uint16_t>(v & 0xffffu)) * a.dbias_mul,
                               bits_to_float<kBf16>(static_cast<uint16_t>(v >> 16)) * a.dbias_mul);
            *reinterpret_cast<uint32_t*>(span + c * 128 + ((kc ^ (c % 8)) << 4) + 4 * (lane % 4)) = v;
          }
        }
      } else {
#pragma unroll
        for (int jc = qoff / 8; jc < (qoff + kQC) / 8; jc += 2) {
          uint32_t r[4];
          ds_pairs(jc, r);
#pragma unroll
          for (int blk = 0; blk < 4; ++blk) {
            const int q = m0 + 8 * (jc + blk / 2) + lane / 4;
            const int key = tile.n0 + (kWide ? 0 : 64 * w) + 16 * warp + 8 * (blk % 2) + 2 * (lane % 4);
            if (q >= a.seqlen_q || key >= a.seqlen_kv) continue;
            const bool two = key + 1 < a.seqlen_kv;
            const float lo = bits_to_float<kBf16>(static_cast<uint16_t>(r[blk] & 0xffffu)) * a.dbias_mul;
            const float hi = bits_to_float<kBf16>(static_cast<uint16_t>(r[blk] >> 16)) * a.dbias_mul;
            if (a.dbias_acc) {
              float* at = a.dbias_acc + (int64_t(tbl) * a.seqlen_q + q) * a.seqlen_kv + key;
              if (two && a.dbias_vec) {
                atomicAdd(reinterpret_cast<float2*>(at), make_float2(lo, hi));
              } else {
                atomicAdd(at, lo);
                if (two) atomicAdd(at + 1, hi);
              }
            } else {
              T* at = dbias_at + int64_t{q} * a.bias_s + key;
              if (two && a.dbias_vec) {
                *reinterpret_cast<uint32_t*>(at) = a.dbias_mul == 1.0f ? r[blk] : pack2<kBf16>(lo, hi);
              } else {
                at[0] = static_cast<T>(lo);
                if (two) at[1] = static_cast<T>(hi);
              }
            }
          }
        }
      }
      if (rows_out) {
        group_sync(2 + w);
#pragma unroll
        for (int x = tid; x < kBlockM * 8; x += 128) {
          const int c = x / 8, j = x % 8, q = m0 + c, key = tile.n0 + 64 * w + 8 * j;
          if (q >= a.seqlen_q || key >= a.seqlen_kv) continue;
          const uint4 val = *reinterpret_cast<const uint4*>(span + c * 128 + ((j ^ (c % 8)) << 4));
          T* at = dbias_at + int64_t{q} * a.bias_s + key;
          if (key + 8 <= a.seqlen_kv) {
            *reinterpret_cast<uint4*>(at) = val;
          } else {
            const T* v8 = reinterpret_cast<const T*>(&val);
            for (int e = 0; e < a.seqlen_kv - key; ++e) at[e] = v8[e];
          }
        }
        // the buffer's next write is the copy engine's (this stage's next bias tile)
        fence_proxy_async();
      }
    }
    wgmma_wait<1>();  // dV and dQ's part (kWide: dQ's)
    fence_regs(dq);
    if constexpr (kWide) {
      // A thread's float4 of accumulator step j, (row, col + 0, 1) and (row + 8, col + 0, 1),
      // is one float4 of bwd_dq_index's order (the 64-column part 2w + j / 8): one atomic
      // addition each, while dV's and dK's products run. kDet: the group's 128 columns of
      // the 64-row block have a counter (slot w); thread 0 waits for the block's turn, the
      // group adds (each element once: the order of additions is the turns'), then fences
      // and counts itself.
      float4* acc = reinterpret_cast<float4*>(a.dq_acc + ((int64_t{b} * a.heads_q + h) * a.sq_pad + m0) * kD);
      [[maybe_unused]] int* sem = nullptr;
      [[maybe_unused]] bool poison = false;
      if constexpr (kDet) {
        sem = a.dq_sem + 2 * (((int64_t{b} * a.heads_q + h) * a.sq_pad + m0) / 64) + w;
        if (tid == 0) sm.dq[w][0] = wait_turn(sem, turn_of(h, block_of(it))) ? 0.0f : 1.0f;
        group_sync(2 + w);
        poison = sm.dq[w][0] != 0.0f;  // gave up: NaN in dQ's rows shows it
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        float4 v = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
        if constexpr (kDet) {
          if (poison) v.x = __int_as_float(0x7fc00000);
        }
        atomicAdd(acc + (2 * w + j / 8) * 1024 + (j % 8) * 128 + tid, v);
      }
      if constexpr (kDet) {
        __threadfence();
        group_sync(2 + w);
        if (tid == 0) red_release_add(sem, 1);
      }
    } else {
      // The part to shared memory (a float4 a thread and step: bwd_dq_index), then one thread
      // a group hands it to the copy engine (flush_dq: now, or kDqLate at the next iteration's
      // start), which adds it to dq_acc while the loop goes on.
      float4* part = reinterpret_cast<float4*>(sm.dq[w]);
#pragma unroll
      for (int j = 0; j < 8; ++j) part[j * 128 + tid] = make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]);
      const int rows = m0 + (kBlockM == 128 ? 64 * w : 0);  // the part's 64-row block of dq_acc
      pending = a.dq_acc + ((int64_t{b} * a.heads_q + h) * a.sq_pad + rows) * kD + (kD == 128 ? 64 * 64 * w : 0);
      if constexpr (kDet) pending_it = it;
      if (!kDqLate) flush_dq();
    }
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(dk);
    if constexpr (kAlibi) {  // the head's part of the slopes' gradient, when the next is another's
      if (a.dslopes && (nx >= total || head_of(nx) != h)) {
#pragma unroll
        for (int o = 16; o > 0; o /= 2) dslope += __shfl_xor_sync(0xffffffffu, dslope, o);
        if (lane == 0) atomicAdd(a.dslopes + h * a.slope_stride, dslope * a.dslope_mul);
        dslope = 0.0f;
      }
    }
    it = nx;
  }

  if constexpr (!kWide)
    if (kDqLate && first < total) flush_dq();
  // dbias written per element (no sums): zeros in the rows of this block's keys that no
  // iteration visited (query blocks outside [m_begin, m_end), or a dense mask's empty tiles),
  // for each head of the group, where a pass over the whole tensor wrote them before.
  if constexpr (kMod == kBwdDbias || ((kAlibi || kSoftcap) && kDense)) {
    if (a.dbias && !a.dbias_acc && a.dbias_zeros) {
      const int mblocks = (a.seqlen_q + kBlockM - 1) / kBlockM;
      for (int hh = 0; hh < a.heads_per_kv; ++hh) {
        const int h = h_kv * a.heads_per_kv + hh;
        T* rows = static_cast<T*>(a.dbias) + b * a.bias_b + h * a.bias_h;
        const uint8_t* cls = kDense ? a.tiles + int64_t(table_of(h)) * a.mask_m * a.mask_n + nb : nullptr;
        for (int mb = 0; mb < mblocks; ++mb) {
          if (mb >= tile.m_begin && mb < tile.m_end && (!kDense || (cls[int64_t{mb} * a.mask_n] & 1))) continue;
          constexpr int kChunks = kBlockN / 8;  // 8 keys each
          for (int x = threadIdx.x; x < kBlockM * kChunks; x += BwdDims::kThreads) {
            const int q = mb * kBlockM + x / kChunks, key = tile.n0 + 8 * (x % kChunks);
            if (q >= a.seqlen_q || key >= a.seqlen_kv) continue;
            T* at = rows + int64_t{q} * a.bias_s + key;
            if (a.dbias_tile && key + 8 <= a.seqlen_kv) {
              *reinterpret_cast<uint4*>(at) = make_uint4(0u, 0u, 0u, 0u);
            } else {
              for (int e = 0; e < min(8, a.seqlen_kv - key); ++e) at[e] = static_cast<T>(0.0f);
            }
          }
        }
      }
    }
  }
  if (tid == 0) bulk_wait<0>();  // the last part added before the block ends
  // dK (scaled) and dV of this thread's two keys; keys past kv_len get 0 (none of their P).
  if (a.dkv_vec) {
    // Through shared memory (the Q and dO stages, free now), rows of kD 16-bit values with
    // their 16-byte chunks swizzled by the row (a warp's pair writes hit 32 banks), then
    // whole rows out in 16-byte stores (a thread's 4-byte stores filled half a sector).
    static_assert(sizeof(sm.q) >= kBlockN * kD * 2 && sizeof(sm.dout) >= kBlockN * kD * 2);
    constexpr int kRow = kD * 2, kChunks = kD / 8;
    uint8_t* st_k = &sm.q[0][0];
    uint8_t* st_v = &sm.dout[0][0];
    __syncthreads();  // both groups done with the last stage
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int kr = key_l + 8 * r;
#pragma unroll
      for (int j = 0; j < kDc / 8; ++j) {  // the group's columns coff + 8j..
        const int at = kr * kRow + (((coff / 8 + j) ^ (kr % 8)) << 4) + 4 * (lane % 4);
        *reinterpret_cast<uint32_t*>(st_k + at) =
            pack2<kBf16>(dk[4 * j + 2 * r] * a.scale, dk[4 * j + 2 * r + 1] * a.scale);
        *reinterpret_cast<uint32_t*>(st_v + at) = pack2<kBf16>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < kBlockN * kChunks; x += BwdDims::kThreads) {
      const int kr = x / kChunks, c = x % kChunks, key = tile.n0 + kr;
      if (key >= a.seqlen_kv) continue;
      const int at = kr * kRow + ((c ^ (kr % 8)) << 4);
      *reinterpret_cast<uint4*>(static_cast<T*>(a.dk) + b * a.dk_b + key * a.dk_s + h_kv * a.dk_h + 8 * c) =
          *reinterpret_cast<const uint4*>(st_k + at);
      *reinterpret_cast<uint4*>(static_cast<T*>(a.dv) + b * a.dv_b + key * a.dv_s + h_kv * a.dv_h + 8 * c) =
          *reinterpret_cast<const uint4*>(st_v + at);
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + 8 * r;
    if (key >= a.seqlen_kv) continue;
    T* dk_row = static_cast<T*>(a.dk) + b * a.dk_b + key * a.dk_s + h_kv * a.dk_h;
    T* dv_row = static_cast<T*>(a.dv) + b * a.dv_b + key * a.dv_s + h_kv * a.dv_h;
#pragma unroll
    for (int j = 0; j < kDc / 8; ++j) {
      const int col = coff + 8 * j + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(dk_row + col) =
          pack2<kBf16>(dk[4 * j + 2 * r] * a.scale, dk[4 * j + 2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dv_row + col) = pack2<kBf16>(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
    }
  }
#endif
}

}  // namespace fusedattn::cuda::hopper
