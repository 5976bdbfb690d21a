// The Hopper flash backward (bwd_kernel.cuh): what it takes and when it applies. Head dims
// 64, 128 and 256, bf16 / fp16, BSHD / BHSD strides, the band (causal top-left or bottom-right,
// windows), GQA / MQA, padding lengths, dense masks (skipping the tiles they empty), sinks
// (a learnable one's gradient too), softcap and ALiBi, a deterministic dQ. select_backend
// gives it a dense mask's and the score_mods' (softcap, ALiBi) backward, plain calls' where
// hopper/measured_bwd.h found it faster than cuDNN's, and a deterministic call's
// (dev/hopper_bwd). Kernel tests: tests/cuda/hopper/test_hopper_bwd.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "fusedattn/core/status.h"

namespace fusedattn::cuda::hopper {

// One backward call. Strides in elements; the head dim is contiguous.
struct FlashBwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;   // the forward's output
  const void* dout = nullptr;  // its cotangent
  int64_t q_b = 0, q_s = 0, q_h = 0, k_b = 0, k_s = 0, k_h = 0, v_b = 0, v_s = 0, v_h = 0;
  int64_t o_b = 0, o_s = 0, o_h = 0, do_b = 0, do_s = 0, do_h = 0;
  // The forward's log-sum-exp (natural log, [B, H, S] through its strides): a row of +-inf
  // (it kept nothing) gets no gradient.
  const float* lse = nullptr;
  int64_t l_b = 0, l_h = 0, l_s = 0;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  int64_t dq_b = 0, dq_s = 0, dq_h = 0, dk_b = 0, dk_s = 0, dk_h = 0, dv_b = 0, dv_s = 0, dv_h = 0;
  int64_t batch = 0, seqlen_q = 0, seqlen_kv = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
  bool bf16 = true;
  float scale = 1.0f;
  // The band and padding, as FlashFwdParams.
  bool causal = false;
  int64_t diag = 0;
  bool left_bound = false;
  int64_t lo_diag = 0;
  bool bottom_right = false;
  const int32_t* q_lens = nullptr;
  const int32_t* kv_lens = nullptr;
  int64_t lens_stride = 1;
  // A bias (FlashFwdParams' fields of the same names), added to the scores after the scale
  // or, pre_scale_bias, before it; no dbias is computed (the caller wants none). mask_bias:
  // it is a folded mask (keys holding mask_value dropped, its kept keys' values, if any,
  // added), whose tiles the backward classifies again (64 queries x 128 keys) into the
  // workspace and skips where empty.
  const void* bias = nullptr;
  int64_t bias_b = 0, bias_h = 0, bias_s = 0, bias_batch = 1, bias_heads = 1;
  bool pre_scale_bias = false;
  // A post-scale bias joins the raw q.k times post_bias_mul (0: 1 / scale); softcap's caller
  // passes 1 / its call's scale (FlashFwdParams::post_bias_mul).
  float post_bias_mul = 0.0f;
  bool mask_bias = false;
  float mask_value = 0.0f;
  // The folded mask holds no values (every kept key's is 0: a boolean mask alone): at head
  // dim 64 its tiles are 128 queries tall and the kernel takes 128-query blocks, as without
  // a mask. A tile that does hold values stays correct (its values read from global memory).
  bool mask_keep_only = false;
  // With mask_keep_only: the bias is a boolean keep mask itself (one byte a key, nonzero
  // keeps it; its strides count bytes), classified from its bytes, never read as values.
  bool bias_keep = false;
  // Non-null: the bias's gradient, written with the bias's extents and strides: dS = P (dP - D)
  // (times the scale for a pre-scale bias), summed over the batch rows and heads the bias
  // broadcasts over (float32 atomics into the workspace, then rounded), 0 where no key is
  // kept. want_dbias sizes that workspace before the pointer exists.
  void* dbias = nullptr;
  bool want_dbias = false;
  // dbias's stores a tile row at a time through shared memory (16-byte stores) where it has
  // the call's extents and its rows allow; false keeps the pairs of keys a thread (for A/B).
  bool dbias_tile = true;
  // > 0: the softcap score_mod, scores softcap * tanh(scale * q.k / softcap) (the forward's
  // FlashFwdParams::softcap); a bias joins q.k before the tanh (no dense mask; dbias too).
  float softcap = 0.0f;
  // Non-null: ALiBi, as FlashFwdParams' fields of the same names (scores scale * s + sign *
  // slopes[h * stride] * g(kv - q), g = |.| when abs); no dense mask with it.
  const float* alibi_slopes = nullptr;
  int64_t alibi_stride = 0;
  float alibi_sign = 1.0f;
  bool alibi_abs = false;
  // Non-null (with alibi_slopes): the slopes' gradient, [Hq] (alibi_stride 1) or [1]:
  // sign sum over the batch, the head's rows and kept keys of dS g(kv - q), in float32
  // (flash_bwd zeroes it first; summed with atomics: not with deterministic).
  float* alibi_dslopes = nullptr;
  // A learnable sink (softmax_type LEARNABLE: an extra logit sinks[slice, h] a row, with no
  // value): the lse already holds it, so dQ, dK and dV are the plain ones; dsinks [B, Hq]
  // (null: not wanted) gets its gradient -sum_i exp(sink - lse_i) D_i, each (b, h)'s rows
  // summed in a fixed order. Batch entry b reads slice b / sink_rows.
  const float* sinks = nullptr;
  int64_t sink_rows = 1;
  float* dsinks = nullptr;
  // Bitwise repeatable dQ: each 64-row block's parts are added in the key blocks' order
  // (a counter a block in the workspace; a block waits for the ones before it). dK and dV
  // are repeatable either way.
  bool deterministic = false;
  // Device scratch of flash_bwd_workspace_bytes(p) bytes or more, 256-byte aligned, and its
  // size (checked: the scratch's parts depend on mask_bias and deterministic, so a workspace
  // sized before one of them changed would be written past its end).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Empty when the kernel can run p on a device of compute capability cc; otherwise the
// first reason it cannot.
std::string flash_bwd_unsupported(const FlashBwdParams& p, int cc);

// Bytes of scratch p needs: lse and D a row, dQ's float32 accumulator, deterministic's
// counters, a folded mask's bits and classes (by mask_bias) or a bias's classes (by the
// pointer), a broadcast bias's float32 dbias (by want_dbias). Only that pointer matters, so a caller may size before it has them, with
// mask_bias set for any bias (the most either needs).
int64_t flash_bwd_workspace_bytes(const FlashBwdParams& p);

// Enqueues the backward on `stream` (three kernels: rows' D, the blocks, dQ's conversion).
Status flash_bwd(const FlashBwdParams& p, cudaStream_t stream);

// flash_bwd calls so far in this process (tests: which kernel ran).
int64_t bwd_launch_count();

}  // namespace fusedattn::cuda::hopper
