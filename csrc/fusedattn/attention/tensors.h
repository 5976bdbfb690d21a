// AttnTensors: the pointers and strides of one attention call's operands and results, as
// ffi_decode.h decodes them from XLA's buffers, platform-neutral (plain C++ that the CUDA
// kernels take too: attention/cuda/flash.h).
#pragma once

#include <cstdint>

namespace fusedattn {

// Element strides of a [batch, seq, heads, dim] view whose last dim is contiguous.
struct ViewStrides {
  int64_t b = 0, s = 0, h = 0;
};

// The float pointers (softmax_offset, lse, max_logit, dsoftmax_offset) are float32 for
// every call the CUDA handlers take; a float64 call's (CPU only) are float64, and the CPU
// handler reads those from the buffers untyped (ffi_cpu.cc).
struct AttnTensors {
  // Inputs. Packed layouts point q, k, v (and dq, dk, dv) into one buffer.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  ViewStrides sq, sk, sv;
  // bias [V, 1|B, 1|Hq, Sq, Skv] dense; the b / h strides are 0 on broadcast dims,
  // and folded batch entry b reads slice b / (B / num_slices), entry b % (B / num_slices).
  const void* bias = nullptr;
  int64_t bias_slice = 0, bias_b = 0, bias_h = 0, bias_s = 0;
  // The bias is a boolean keep mask (kRequestMaskKeepOnly: one byte a key, nonzero keeps
  // it), not values: the handlers fold it (fold_keep_mask) for every kernel but the Hopper
  // ones' tile classification, which reads the bytes.
  bool bias_keep = false;
  const float* softmax_offset = nullptr;  // [V, Hq]
  const uint32_t* seed = nullptr;         // [V, 2]
  const int32_t* q_seqlens = nullptr;     // [B, M]
  const int32_t* kv_seqlens = nullptr;    // [B, M]
  const int32_t* q_offsets = nullptr;     // [B, M + 1]
  const int32_t* kv_offsets = nullptr;    // [B, M + 1]
  const int32_t* index_base = nullptr;    // [V, index_cols]; null: (0, 0)
  int64_t index_cols = 0;                 // 2 (batch_base, head_base), or 6 / 8 with positions
  // Forward results (backward: out and lse are inputs).
  void* out = nullptr;
  ViewStrides so;
  float* lse = nullptr;  // [B, Hq, Sq] or, for THD layouts, [B, Sq, Hq]
  ViewStrides slse;
  float* max_logit = nullptr;  // [B, Hq]
  // Backward.
  const void* dout = nullptr;
  ViewStrides sdo;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  ViewStrides sdq, sdk, sdv;
  void* dbias = nullptr;             // the bias's shape and strides; null without bias
  float* dsoftmax_offset = nullptr;  // [B, Hq]; null without softmax_offset
};

}  // namespace fusedattn
