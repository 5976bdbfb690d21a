#include "fusedattn/small_seq/validate.h"

#include "fusedattn/core/messages.h"

#include <cmath>
#include <sstream>

namespace fusedattn::small_seq {
namespace {

constexpr const char* kOp = "small-seq: ";  // every message names the op

bool is_padding(int32_t mask) {
  return mask == FA_PADDING_MASK || mask == FA_PADDING_CAUSAL_MASK ||
         mask == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}

}  // namespace

Status validate(const SmallSeqParams& p) {
  if (p.dtype != FA_FLOAT32 && p.dtype != FA_BFLOAT16 && p.dtype != FA_FLOAT16)
    return (Msg(kOp) << "dtype: got code " << p.dtype
                  << "; q, k and v must all be float32, bfloat16 or float16")
        .invalid();
  if (p.layout < FA_BS3HD || p.layout > FA_THD_THD_THD)
    return (Msg(kOp) << "qkv_layout: got code " << p.layout << ", not a QKVLayout").invalid();
  if (p.mask_type < FA_NO_MASK || p.mask_type > FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK)
    return (Msg(kOp) << "attn_mask_type: got code " << p.mask_type << ", not an AttnMaskType")
        .invalid();
  if (p.bias_type < FA_NO_BIAS || p.bias_type > FA_POST_SCALE_BIAS)
    return (Msg(kOp) << "attn_bias_type: got code " << p.bias_type << ", not an AttnBiasType")
        .invalid();
  if (p.softmax_type < FA_VANILLA_SOFTMAX || p.softmax_type > FA_LEARNABLE_SOFTMAX)
    return (Msg(kOp) << "softmax_type: got code " << p.softmax_type << ", not a SoftmaxType")
        .invalid();
  if (p.layout != FA_BSHD_BSHD_BSHD && p.layout != FA_THD_THD_THD)
    return (Msg(kOp) << "qkv_layout=" << layout_name(p.layout)
                  << " is not served; the small-seq backend takes separate q, k, v: "
                     "BSHD_BSHD_BSHD or THD_THD_THD")
        .unimplemented();
  const bool thd = p.layout == FA_THD_THD_THD;
  if (thd && !is_padding(p.mask_type))
    return (Msg(kOp) << "attn_mask_type=" << mask_name(p.mask_type)
                  << " with qkv_layout=THD_THD_THD: packed segments need a padding mask "
                     "(PADDING_MASK, PADDING_CAUSAL_MASK or PADDING_CAUSAL_BOTTOM_RIGHT_MASK)")
        .invalid();
  if (p.bias_type != FA_NO_BIAS)
    return (Msg(kOp) << "attn_bias_type=" << bias_name(p.bias_type)
                  << " is not implemented; use bias=None (NO_BIAS)")
        .unimplemented();
  if (p.softmax_type != FA_VANILLA_SOFTMAX)
    return (Msg(kOp) << "softmax_type=" << softmax_name(p.softmax_type)
                  << " is not implemented; implemented: VANILLA_SOFTMAX")
        .unimplemented();
  if (!(p.dropout >= 0.0f && p.dropout < 1.0f))
    return (Msg(kOp) << "dropout_probability: got " << p.dropout << "; allowed 0 <= p < 1").invalid();
  if (p.is_training && p.dropout > 0.0f)
    return (Msg(kOp) << "dropout_probability=" << p.dropout
                  << " is not implemented; use 0.0 (or is_training=False)")
        .unimplemented();
  if (p.window_left != -1 || p.window_right != -1)
    return (Msg(kOp) << "window_size=(" << p.window_left << ", " << p.window_right
                  << ") is not implemented; use None")
        .unimplemented();
  if (!std::isfinite(p.scale))
    return (Msg(kOp) << "scaling_factor: got " << p.scale << "; must be finite").invalid();

  if (p.packs < 1)
    return (Msg(kOp) << "leading (vmap) dimensions: got a product of " << p.packs
                  << "; must be at least 1")
        .invalid();
  if (p.num_segments < 1)
    return (Msg(kOp) << "segments: got " << p.num_segments << "; need at least one").invalid();
  if (p.tokens_q < 1 || p.tokens_q > kMaxTokens)
    return (Msg(kOp) << "q tokens: got " << p.tokens_q << "; allowed 1.." << kMaxTokens).invalid();
  if (p.tokens_kv < 1 || p.tokens_kv > kMaxTokens)
    return (Msg(kOp) << "k/v tokens: got " << p.tokens_kv << "; allowed 1.." << kMaxTokens)
        .invalid();
  if (p.num_segments > kMaxTokens)
    return (Msg(kOp) << "segments: got " << p.num_segments << "; allowed up to " << kMaxTokens)
        .invalid();
  if (p.heads_q < 1 || p.heads_kv < 1)
    return (Msg(kOp) << "heads: got q heads " << p.heads_q << ", k/v heads " << p.heads_kv
                  << "; both must be at least 1")
        .invalid();
  if (p.heads_q % p.heads_kv != 0)
    return (Msg(kOp) << "heads: q has " << p.heads_q << " heads and k/v have " << p.heads_kv
                  << "; the q head count must be a multiple of the k/v head count (GQA/MQA)")
        .invalid();
  if (p.heads_q > kMaxHeads)
    return (Msg(kOp) << "heads: got " << p.heads_q << " q heads; allowed up to " << kMaxHeads)
        .invalid();
  if (p.head_dim_qk != p.head_dim_v)
    return (Msg(kOp) << "head dims: q/k have " << p.head_dim_qk << " and v has " << p.head_dim_v
                  << "; the small-seq backend needs them equal")
        .unimplemented();
  if (!head_dim_supported(p.head_dim_qk))
    return (Msg(kOp) << "head dim: got " << p.head_dim_qk << "; allowed 64, 128, 256 or 512")
        .unimplemented();
  if (p.max_seqlen_q != 1)
    return (Msg(kOp) << (thd ? "max_segment_seqlen_q" : "query sequence length") << ": got "
                  << p.max_seqlen_q
                  << "; the small-seq backend serves one query per segment (use fused_attn)")
        .invalid();
  if (p.max_seqlen_kv < 1 || p.max_seqlen_kv > kMaxWidth)
    return (Msg(kOp) << (thd ? "max_segment_seqlen_kv" : "key/value sequence length") << ": got "
                  << p.max_seqlen_kv << "; allowed 1.." << kMaxWidth)
        .invalid();
  if (thd && !p.has_offsets)
    return (Msg(kOp) << "qkv_layout=THD_THD_THD needs q and kv offsets [num_segments + 1] "
                     "(cumulative, cu_seqlens style)")
        .invalid();
  if (!thd) {
    if (p.has_offsets)
      return (Msg(kOp) << "offsets are for THD_THD_THD; a BSHD segment is its batch entry").invalid();
    if (p.packs != 1)
      return (Msg(kOp) << "BSHD: leading dimensions fold into the batch (packs must be 1, got "
                    << p.packs << ")")
          .invalid();
    if (p.tokens_q != p.num_segments * p.max_seqlen_q ||
        p.tokens_kv != p.num_segments * p.max_seqlen_kv)
      return (Msg(kOp) << "BSHD: tokens (" << p.tokens_q << ", " << p.tokens_kv
                    << ") must be batch * sequence length")
          .invalid();
  }
  if (p.packs * p.num_segments * p.heads_q > kMaxWorkItems)
    return (Msg(kOp) << "work items: " << p.packs << " packs x " << p.num_segments
                  << " segments x " << p.heads_q << " heads exceeds " << kMaxWorkItems)
        .invalid();
  return Status::Ok();
}

Eligibility eligibility(const SmallSeqParams& p, int32_t platform, bool built_with_cuda) {
  Eligibility e;
  e.status = validate(p);
  if (!e.status.ok()) {
    e.reason = e.status.message;
    return e;
  }
  if (platform == FA_PLATFORM_CUDA && !built_with_cuda) {
    e.reason = "small-seq: this build of fusedattn has no CUDA kernels";
    return e;
  }
  if (platform != FA_PLATFORM_CPU && platform != FA_PLATFORM_CUDA) {
    e.status = Status::Invalid("platform: got code " + std::to_string(platform) +
                               "; allowed 0 (cpu) or 1 (cuda)");
    e.reason = e.status.message;
    return e;
  }
  e.served = true;
  std::ostringstream os;
  os << "small_seq: one query per segment over at most " << p.max_seqlen_kv
     << " keys, one pass per (segment, head); saves the attention weights P for the backward";
  e.reason = os.str();
  return e;
}

}  // namespace fusedattn::small_seq
