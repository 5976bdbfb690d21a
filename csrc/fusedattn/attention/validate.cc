#include "fusedattn/attention/validate.h"

#include "fusedattn/attention/mask.h"
#include "fusedattn/core/messages.h"

#include <cmath>
#include <sstream>
#include <string>

namespace fusedattn {

const char* layout_name(int32_t layout) {
  switch (layout) {
    case FA_BS3HD: return "BS3HD";
    case FA_BSHD_BS2HD: return "BSHD_BS2HD";
    case FA_BSHD_BSHD_BSHD: return "BSHD_BSHD_BSHD";
    case FA_T3HD: return "T3HD";
    case FA_THD_T2HD: return "THD_T2HD";
    case FA_THD_THD_THD: return "THD_THD_THD";
  }
  return "unknown";
}

const char* mask_name(int32_t mask) {
  switch (mask) {
    case FA_NO_MASK: return "NO_MASK";
    case FA_PADDING_MASK: return "PADDING_MASK";
    case FA_CAUSAL_MASK: return "CAUSAL_MASK";
    case FA_PADDING_CAUSAL_MASK: return "PADDING_CAUSAL_MASK";
    case FA_CAUSAL_BOTTOM_RIGHT_MASK: return "CAUSAL_BOTTOM_RIGHT_MASK";
    case FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK: return "PADDING_CAUSAL_BOTTOM_RIGHT_MASK";
  }
  return "unknown";
}

const char* bias_name(int32_t bias) {
  switch (bias) {
    case FA_NO_BIAS: return "NO_BIAS";
    case FA_PRE_SCALE_BIAS: return "PRE_SCALE_BIAS";
    case FA_POST_SCALE_BIAS: return "POST_SCALE_BIAS";
  }
  return "unknown";
}

const char* softmax_name(int32_t softmax) {
  switch (softmax) {
    case FA_VANILLA_SOFTMAX: return "VANILLA_SOFTMAX";
    case FA_OFF_BY_ONE_SOFTMAX: return "OFF_BY_ONE_SOFTMAX";
    case FA_LEARNABLE_SOFTMAX: return "LEARNABLE_SOFTMAX";
  }
  return "unknown";
}

const char* backend_name(int32_t backend) {
  switch (backend) {
    case FA_BACKEND_NONE: return "none";
    case FA_BACKEND_CPU_FLASH: return "cpu_flash";
    case FA_BACKEND_XLA_REFERENCE: return "xla_reference";
    case FA_BACKEND_CUDNN: return "cudnn";
    case FA_BACKEND_HOPPER_FWD: return "hopper";
    case FA_BACKEND_CUDA_FLASH: return "cuda_flash";
    case FA_BACKEND_HOPPER_BWD: return "hopper";
  }
  return "unknown";
}

Status validate(const AttnParams& p) {
  if (p.dtype != FA_FLOAT32 && p.dtype != FA_BFLOAT16 && p.dtype != FA_FLOAT16 &&
      p.dtype != FA_FLOAT64)
    return (Msg() << "dtype: got code " << p.dtype
                  << "; q, k and v must all be float32, bfloat16, float16 or float64")
        .invalid();
  if (p.layout < FA_BS3HD || p.layout > FA_THD_THD_THD)
    return (Msg() << "qkv_layout: got code " << p.layout << ", not a QKVLayout").invalid();
  if (p.mask_type < FA_NO_MASK || p.mask_type > FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK)
    return (Msg() << "attn_mask_type: got code " << p.mask_type << ", not an AttnMaskType")
        .invalid();
  if (p.bias_type < FA_NO_BIAS || p.bias_type > FA_POST_SCALE_BIAS)
    return (Msg() << "attn_bias_type: got code " << p.bias_type << ", not an AttnBiasType")
        .invalid();
  if (p.softmax_type < FA_VANILLA_SOFTMAX || p.softmax_type > FA_LEARNABLE_SOFTMAX)
    return (Msg() << "softmax_type: got code " << p.softmax_type << ", not a SoftmaxType")
        .invalid();

  if (p.batch < 1)
    return (Msg() << "batch: got " << p.batch << "; must be at least 1").invalid();
  if (p.seqlen_q < 1 || p.seqlen_q > kMaxSeqLen)
    return (Msg() << "query sequence length: got " << p.seqlen_q << "; allowed 1.." << kMaxSeqLen)
        .invalid();
  if (p.seqlen_kv < 1 || p.seqlen_kv > kMaxSeqLen)
    return (Msg() << "key/value sequence length: got " << p.seqlen_kv << "; allowed 1.."
                  << kMaxSeqLen)
        .invalid();
  if (p.heads_q < 1 || p.heads_kv < 1)
    return (Msg() << "heads: got q heads " << p.heads_q << ", k/v heads " << p.heads_kv
                  << "; both must be at least 1")
        .invalid();
  if (p.heads_q % p.heads_kv != 0)
    return (Msg() << "heads: q has " << p.heads_q << " heads and k/v have " << p.heads_kv
                  << "; the q head count must be a multiple of the k/v head count (GQA/MQA)")
        .invalid();
  if (p.head_dim_qk < 1 || p.head_dim_qk > kMaxHeadDim)
    return (Msg() << "head dim of q and k: got " << p.head_dim_qk << "; allowed 1.." << kMaxHeadDim)
        .invalid();
  if (p.head_dim_v < 1 || p.head_dim_v > kMaxHeadDim)
    return (Msg() << "head dim of v: got " << p.head_dim_v << "; allowed 1.." << kMaxHeadDim)
        .invalid();
  if (!std::isfinite(p.scale))
    return (Msg() << "scaling_factor: got " << p.scale << "; must be finite").invalid();
  if (!(p.dropout >= 0.0f && p.dropout < 1.0f))
    return (Msg() << "dropout_probability: got " << p.dropout << "; allowed 0 <= p < 1").invalid();
  if (p.window_left < -1 || p.window_right < -1)
    return (Msg() << "window_size: got (" << p.window_left << ", " << p.window_right
                  << "); each side must be -1 (unbounded) or >= 0")
        .invalid();
  if (p.num_slices < 1 || p.batch % p.num_slices != 0)
    return (Msg() << "num_slices: got " << p.num_slices << " for batch " << p.batch
                  << "; must be >= 1 and divide the batch")
        .invalid();

  // Layouts: packed tensors force equal extents; THD rows hold several sequences.
  if (is_qkv_packed(p.layout) &&
      (p.seqlen_q != p.seqlen_kv || p.heads_q != p.heads_kv || p.head_dim_qk != p.head_dim_v))
    return (Msg() << "qkv_layout=" << layout_name(p.layout) << ": q, k and v share one tensor "
                  << "[B, S, 3, H, D], so their sequence lengths, heads and head dims must be "
                  << "equal; got Sq " << p.seqlen_q << ", Skv " << p.seqlen_kv << ", Hq "
                  << p.heads_q << ", Hkv " << p.heads_kv << ", D " << p.head_dim_qk << ", Dv "
                  << p.head_dim_v)
        .invalid();
  if (is_kv_packed(p.layout) && p.head_dim_qk != p.head_dim_v)
    return (Msg() << "qkv_layout=" << layout_name(p.layout) << ": k and v share one tensor "
                  << "[B, S, 2, H, D], so the head dims of k and v must be equal; got "
                  << p.head_dim_qk << " and " << p.head_dim_v)
        .invalid();
  if (p.max_segments < 1 || p.max_segments > kMaxSeqLen)
    return (Msg() << "max_segments_per_seq: got " << p.max_segments << "; allowed 1.."
                  << kMaxSeqLen)
        .invalid();
  if (!is_thd(p.layout) && p.max_segments != 1)
    return (Msg() << "max_segments_per_seq=" << p.max_segments << " needs a THD layout "
                  << "(THD_THD_THD, T3HD or THD_T2HD); qkv_layout=" << layout_name(p.layout)
                  << " holds one sequence per row, so max_segments_per_seq must be 1")
        .invalid();
  if (is_thd(p.layout) && !has_padding(p.mask_type))
    return (Msg() << "qkv_layout=" << layout_name(p.layout) << " with attn_mask_type="
                  << mask_name(p.mask_type) << ": THD layouts take their segments from the "
                  << "sequence descriptor and need a padding mask; allowed: PADDING_MASK, "
                  << "PADDING_CAUSAL_MASK, PADDING_CAUSAL_BOTTOM_RIGHT_MASK")
        .invalid();

  // Bias: [1 | B, 1 | Hq, Sq, Skv].
  const bool has_bias_tensor = p.bias_batch != 0 || p.bias_heads != 0;
  if (p.bias_type == FA_NO_BIAS && has_bias_tensor)
    return (Msg() << "bias: a bias tensor [" << p.bias_batch << ", " << p.bias_heads << ", "
                  << p.seqlen_q << ", " << p.seqlen_kv << "] was given with attn_bias_type="
                  << "NO_BIAS; pass no bias or choose PRE_SCALE_BIAS / POST_SCALE_BIAS")
        .invalid();
  if (p.bias_type != FA_NO_BIAS &&
      !((p.bias_batch == 1 || p.bias_batch == slice_batch(p)) &&
        (p.bias_heads == 1 || p.bias_heads == p.heads_q)))
    return (Msg() << "bias: attn_bias_type=" << bias_name(p.bias_type) << " got a bias with "
                  << "batch extent " << p.bias_batch << " and head extent " << p.bias_heads
                  << "; allowed shapes: [1 or " << slice_batch(p) << ", 1 or " << p.heads_q
                  << ", " << p.seqlen_q << ", " << p.seqlen_kv << "] (a missing bias has extent 0)")
        .invalid();
  return Status::Ok();
}

Status validate_index_base(const AttnParams& p, const int32_t* index_base, int64_t cols) {
  if (!index_base) return Status::Ok();
  for (int64_t s = 0; s < p.num_slices; ++s) {
    const int32_t* r = index_base + cols * s;
    const std::string where = p.num_slices > 1 ? " in vmap slice " + std::to_string(s) : "";
    if (r[0] < 0 || r[1] < 0)
      return (Msg() << "index_base: got (batch_base " << r[0] << ", head_base " << r[1] << ")"
                    << where << "; both must be >= 0")
          .invalid();
    if (cols == 2) continue;
    const BlockPos b = block_pos(r, cols);
    const int64_t stripe = b.q.stripe, stride = b.q.stride;
    if (stripe < 1 || stride < stripe || stride % stripe != 0)
      return (Msg() << "index_base: got (stripe " << stripe << ", stride " << stride << ")"
                    << where << "; allowed: stripe >= 1 and stride a multiple of stripe (local "
                    << "token t is global token pos + (t / stripe) * stride + t % stripe)")
          .invalid();
    const int64_t q_pos = b.q.pos, kv_pos = b.kv.pos, q_ext = b.q_extent, kv_ext = b.kv_extent;
    // The last local tokens' global tokens (the map is increasing).
    const int64_t q_last = global_token(b.q, p.seqlen_q - 1);
    const int64_t kv_last = global_token(b.kv, p.seqlen_kv - 1);
    if (q_pos < 0 || kv_pos < 0 || q_last >= q_ext || kv_last >= kv_ext) {
      if (cols == 6)
        return (Msg() << "index_base: got (q_pos " << q_pos << ", kv_pos " << kv_pos
                      << ", q_extent " << q_ext << ", kv_extent " << kv_ext << ")" << where
                      << " for a block of " << p.seqlen_q << " queries and " << p.seqlen_kv
                      << " keys; allowed: q_pos, kv_pos >= 0, q_pos + " << p.seqlen_q
                      << " <= q_extent and kv_pos + " << p.seqlen_kv << " <= kv_extent")
            .invalid();
      return (Msg() << "index_base: got (q_pos " << q_pos << ", kv_pos " << kv_pos
                    << ", q_extent " << q_ext << ", kv_extent " << kv_ext << ", stripe "
                    << stripe << ", stride " << stride << ")" << where << " for a block of "
                    << p.seqlen_q << " queries and " << p.seqlen_kv << " keys, whose last "
                    << "query is global token " << q_last << " and last key global token "
                    << kv_last << "; allowed: q_pos, kv_pos >= 0, " << q_last
                    << " < q_extent and " << kv_last << " < kv_extent")
          .invalid();
    }
    if (has_dropout(p) && kv_pos % 4 != 0)
      return (Msg() << "index_base: got kv_pos " << kv_pos << where << " with dropout; "
                    << "dropout's Philox counter groups 4 keys, so a block's kv_pos must be a "
                    << "multiple of 4")
          .invalid();
    if (has_dropout(p) && stripe < stride && stripe % 4 != 0)
      return (Msg() << "index_base: got stripe " << stripe << " (stride " << stride << ")"
                    << where << " with dropout; dropout's Philox counter groups 4 keys, so a "
                    << "striped block's stripe must be a multiple of 4")
          .invalid();
  }
  return Status::Ok();
}

Status validate_average_empty_rows(const AttnParams& p, int64_t index_cols) {
  const char* why = is_thd(p.layout) ? "a THD layout (rows hold several sequences)"
                    : p.softmax_type != FA_VANILLA_SOFTMAX
                        ? "a softmax offset (a row that keeps no key gives its mass to the sink)"
                    : has_dropout(p) ? "dropout"
                    : index_cols > 2
                        ? "a block of a bigger call (index_base with positions: a row's keys "
                          "are spread over blocks)"
                        : nullptr;
  if (!why) return Status::Ok();
  return Status::Invalid(std::string("backend_flags: the average of empty rows (") +
                         "kRequestAverageEmptyRows, jax.nn.dot_product_attention's rows that "
                         "keep nothing) takes a BSHD layout, vanilla softmax, no dropout and no "
                         "block positions; the call has " + why);
}

}  // namespace fusedattn
