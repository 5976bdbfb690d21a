#include "fusedattn/attention/cudnn/sdpa_config.h"

#include "fusedattn/attention/mask.h"

namespace fusedattn::cudnn {
namespace {

// Element strides of q, k, v, o, lse for the dense buffers of each layout.
struct LayoutViews {
  View q, k, v, o, lse;
  int64_t token_q, token_k, token_v, token_o;  // elements between consecutive tokens
};

LayoutViews layout_views(const AttnParams& p) {
  const int64_t Sq = p.seqlen_q, Skv = p.seqlen_kv, Hq = p.heads_q, Hkv = p.heads_kv;
  const int64_t D = p.head_dim_qk, Dv = p.head_dim_v;
  LayoutViews l;
  if (is_qkv_packed(p.layout)) {  // qkv [B, S, 3, H, D]
    l.token_q = l.token_k = l.token_v = 3 * Hq * D;
  } else if (is_kv_packed(p.layout)) {  // q [B, Sq, Hq, D], kv [B, Skv, 2, Hkv, D]
    l.token_q = Hq * D;
    l.token_k = l.token_v = 2 * Hkv * D;
  } else {
    l.token_q = Hq * D;
    l.token_k = Hkv * D;
    l.token_v = Hkv * Dv;
  }
  l.token_o = Hq * Dv;
  l.q = {Sq * l.token_q, D, l.token_q};
  l.k = {Skv * l.token_k, D, l.token_k};
  l.v = {Skv * l.token_v, Dv, l.token_v};
  l.o = {Sq * l.token_o, Dv, l.token_o};
  // lse: [B, Hq, Sq], THD [B, Sq, Hq]
  l.lse = is_thd(p.layout) ? View{Sq * Hq, 1, Hq} : View{Hq * Sq, Sq, 1};
  return l;
}

}  // namespace

bool graph_per_slice(const AttnParams& p, const ScoreModSpec* sm) {
  if (p.num_slices <= 1) return false;
  return sm != nullptr || has_dropout(p) || p.softmax_type == FA_LEARNABLE_SOFTMAX ||
         (p.bias_type != FA_NO_BIAS && p.bias_batch == 1);
}

SdpaConfig make_bwd_config(const AttnParams& p, bool deterministic, const ScoreModSpec* sm) {
  SdpaConfig c = make_config(p, /*want_max_logit=*/false, /*want_lse=*/false, sm);
  c.deterministic = deterministic;
  return c;
}

SdpaConfig make_config(const AttnParams& p, bool want_max_logit, bool want_lse,
                       const ScoreModSpec* sm) {
  const LayoutViews l = layout_views(p);
  const int64_t rows = graph_per_slice(p, sm) ? p.batch / p.num_slices : p.batch;
  SdpaConfig c;
  c.dtype = p.dtype;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.seq_q = p.seqlen_q;
  c.seq_kv = p.seqlen_kv;
  c.dim_qk = p.head_dim_qk;
  c.dim_v = p.head_dim_v;
  c.q = l.q;
  c.k = l.k;
  c.v = l.v;
  c.o = l.o;
  c.lse = l.lse;
  c.padding = has_padding(p.mask_type);
  if (is_thd(p.layout)) {
    // Each of the M segments of a row is one cuDNN sequence, at most a row long.
    c.batch = rows * p.max_segments;
    c.ragged = true;
    c.total_q = rows * p.seqlen_q;
    c.total_kv = rows * p.seqlen_kv;
  } else {
    c.batch = rows;
  }
  // A side wider than Sq + Skv keeps every key (mask.h's clamp_window): clamped, the
  // bounds fit the int cuDNN takes and left + 1 cannot overflow.
  const int64_t reach = p.seqlen_q + p.seqlen_kv;
  if (is_causal(p.mask_type)) {
    c.diag = is_causal_bottom_right(p.mask_type) ? Diag::kBottomRight : Diag::kTopLeft;
    c.right_bound = 0;
  } else if (p.window_left >= 0 || p.window_right >= 0) {
    c.diag = Diag::kTopLeft;
    c.right_bound = p.window_right < 0 ? -1 : clamp_window(p.window_right, reach);
  }
  // fusedattn keeps j >= i - left; cuDNN masks j <= i - left_bound.
  if (p.window_left >= 0) c.left_bound = clamp_window(p.window_left, reach) + 1;
  c.scale = p.scale;
  if (p.bias_type != FA_NO_BIAS) {
    c.bias = true;
    c.bias_b = p.bias_batch == 1 ? 1 : c.batch;
    c.bias_h = p.bias_heads;
    const int64_t plane = p.seqlen_q * p.seqlen_kv;
    c.bias_view = {p.bias_batch == 1 ? 0 : p.bias_heads * plane, p.bias_heads == 1 ? 0 : plane,
                   p.seqlen_kv};
  }
  c.sink = p.softmax_type != FA_VANILLA_SOFTMAX;
  c.dropout = has_dropout(p) ? p.dropout : 0.0f;
  c.max_sum = want_max_logit;
  c.gen_stats = want_lse && !want_max_logit;
  if (sm) {
    c.score_mod.assign(sm->attr, sm->attr + sm->n);
    c.sm_batch = rows;  // per slice (graph_per_slice): the operands' batch extent
    c.segments = is_thd(p.layout) ? p.max_segments : 1;
  }
  return c;
}

bool rows_may_be_empty(const AttnParams& p) {
  if (has_padding(p.mask_type) || is_thd(p.layout)) return true;  // padding, THD gaps, length 0
  // Otherwise query i keeps key i itself whenever i < Skv (top-left diagonal; bottom-right
  // with Sq <= Skv only shifts it right), and a plain causal or unmasked row keeps key 0.
  if (p.seqlen_q <= p.seqlen_kv) return false;
  const bool plain = p.mask_type == FA_NO_MASK || p.mask_type == FA_CAUSAL_MASK;
  return !plain || p.window_left >= 0 || p.window_right >= 0;
}

}  // namespace fusedattn::cudnn
