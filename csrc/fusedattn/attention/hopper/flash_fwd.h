// The Hopper flash forward (fwd_kernel.cuh): what it takes and when it applies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "fusedattn/core/status.h"

namespace fusedattn::cuda::hopper {

// One forward call. Strides in elements; the head dim is contiguous.
struct FlashFwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t q_b = 0, q_s = 0, q_h = 0, k_b = 0, k_s = 0, k_h = 0, v_b = 0, v_s = 0, v_h = 0;
  void* out = nullptr;
  int64_t o_b = 0, o_s = 0, o_h = 0;
  float* lse = nullptr;  // [B, H, S] through its strides; null: not wanted
  int64_t l_b = 0, l_h = 0, l_s = 0;
  // Non-null: each (batch row, head)'s max logit (the max over its kept scores after the
  // scale and the modifier; -inf where none is kept, NaN where a kept one is NaN), f32
  // through its strides.
  float* max_logit = nullptr;
  int64_t ml_b = 0, ml_h = 0;
  // A softmax with one extra logit a head (a sink: it joins the denominator and lse, has no
  // value, is not in max_logit): 0 none (VANILLA), 1 a logit 0 (OFF_BY_ONE), 2
  // sinks[(b / sink_rows) * heads_q + h] (LEARNABLE, f32; sink_rows: batch rows a vmap slice).
  int sink = 0;
  const float* sinks = nullptr;
  int64_t sink_rows = 1;
  int64_t batch = 0, seqlen_q = 0, seqlen_kv = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  bool bf16 = true;
  // The band, from each sequence's base diagonal (kv_len - q_len when bottom_right, else 0):
  // causal (a right edge): query i sees key j when j <= i + base + diag; left_bound (a
  // window's left edge): only when j >= i + base + lo_diag.
  bool causal = false;
  int64_t diag = 0;
  bool left_bound = false;
  int64_t lo_diag = 0;
  bool bottom_right = false;
  // Padding: sequence b has q_lens[b * lens_stride] queries and kv_lens[..] keys (int32 on
  // the device, clamped to the extents); null: the extents. Padded queries: out 0, lse -inf.
  const int32_t* q_lens = nullptr;
  const int32_t* kv_lens = nullptr;
  int64_t lens_stride = 1;
  // THD (packed sequences; instead of q_lens / kv_lens): batch row b packs `segments`
  // sequences, t = b * segments + s, of seq_q_len[t] queries starting at global token
  // seq_q_tok[t] (= b * seqlen_q + the first query's place in its row) and seq_kv_len[t] /
  // seq_kv_tok[t] keys likewise: int32 on the device, each sequence inside its row and
  // none overlapping (cudnn/fixup.h's prepare_sequences writes them so). Only the
  // sequences' rows of out and lse are written: the caller fills the rest (finalize_forward).
  const int32_t* seq_q_len = nullptr;
  const int32_t* seq_kv_len = nullptr;
  const int32_t* seq_q_tok = nullptr;
  const int32_t* seq_kv_tok = nullptr;
  int64_t segments = 1;
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: scores become softcap * tanh(scale * s / softcap)
  // Non-null: ALiBi, scores become scale * s + sign * slopes[h * stride] * g(kv - q), with
  // g = |.| when abs, the query head h, stride 0 (one slope) or 1, float32 slopes.
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride = 0;
  float alibi_sign = 1.0f;
  bool alibi_abs = false;
  // Non-null: a post-scale bias [bias_batch, bias_heads, Sq, Skv] of q's dtype (bias_b /
  // bias_h: 0 where broadcast; the key dim contiguous), scores scale * q.k + bias;
  // bias_pre_scale: a pre-scale bias instead (scale * (q.k + bias)). With softcap or ALiBi
  // the biased score goes through the modifier (the engine's order), the bias as tiles only
  // (bias_tile below). post_bias_mul: a post-scale bias joins the raw q.k times it (0:
  // 1 / scale); softcap's caller folds the program's constants into scale and passes 1 /
  // the call's own scale here.
  // mask_bias: it is a folded boolean mask (backend.h's kRequestMaskBias) whose dropped keys
  // hold mask_value: the kernel drops them (as -inf) and skips the key blocks a query tile
  // keeps none of, classified on the device before the launch into `mask_tiles` (device
  // scratch of mask_tiles_bytes(p), 16-byte aligned).
  const void* bias = nullptr;
  int64_t bias_b = 0, bias_h = 0, bias_s = 0, bias_batch = 1, bias_heads = 1;
  bool bias_pre_scale = false;
  float post_bias_mul = 0.0f;
  bool mask_bias = false;
  float mask_value = 0.0f;
  // With mask_bias: the bias is a boolean keep mask (one byte a key, nonzero keeps it;
  // kRequestMaskKeepOnly), classified from its bytes; its strides count bytes then.
  bool bias_keep = false;
  void* mask_tiles = nullptr;
  // A bias (not mask_bias), its rows in 16-byte units (pointer
  // 16-byte aligned, strides multiples of 8): -1 (default) reads its tiles through the copy
  // engine into shared memory (WithBiasTile); 0 reads a plain call's a score at a time from
  // global memory, as any other bias (A/B: FUSEDATTN_HOPPER_BIAS_TILE=0; ALiBi's is then
  // refused).
  int bias_tile = -1;
  // Plain calls without a bias: -1 (default) run the instances without the code that reads
  // a bias a score at a time and a dense mask's tiles (PlainScores); 1 runs them on the
  // instances with it (BiasReadScores; A/B: FUSEDATTN_HOPPER_BIAS_READS=1).
  int bias_reads = -1;
  // Persistent blocks (one an SM, taking tiles in turn) or one block a tile: -1 decides
  // (persistent with a counter below; without one, for calls without a right edge, with a
  // left one, or THD), 0 / 1 force it (FUSEDATTN_HOPPER_PERSISTENT).
  int persistent = -1;
  // One device int of scratch: persistent grids then hand out tiles as blocks free up
  // (flash_fwd zeroes it on the stream); null: each block takes every gridDim-th tile.
  int* counter = nullptr;
  // Consumer warpgroups a block (64 query rows each): 0 picks by the rule of flash_fwd.cu's
  // groups() (three at head dim 64 for full calls and long causal ones, else two); 2 or 3
  // (head dim 64 only) force it (the kernel tests).
  int groups = 0;
  int probe = -1;  // sweep builds only (FA_HOPPER_SWEEP): 10 runs softcap without its tanh
};

// Empty when the kernel can run p on a device of compute capability cc (major * 10 +
// minor); otherwise the first reason it cannot.
std::string flash_fwd_unsupported(const FlashFwdParams& p, int cc);

// Bytes of the scratch a mask_bias call classifies its tiles into (for any tile shape of
// the kernel; calls without mask_bias need none).
int64_t mask_tiles_bytes(int64_t bias_batch, int64_t bias_heads, int64_t seqlen_q, int64_t seqlen_kv);

// Enqueues the forward on `stream`. p must be supported.
Status flash_fwd(const FlashFwdParams& p, cudaStream_t stream);

// Launches so far in this process.
int64_t launch_count();

}  // namespace fusedattn::cuda::hopper
