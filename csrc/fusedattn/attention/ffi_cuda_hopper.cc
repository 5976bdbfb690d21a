// The CUDA attention handlers' Hopper route (ffi_cuda_route.h): fusedattn's own flash
// forward and backward for sm_90 (attention/hopper), their parameters from the decoded
// call and their temporaries in the workspace.
#include <algorithm>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/ffi_cuda_route.h"
#include "fusedattn/attention/hopper/band.h"
#include "fusedattn/attention/hopper/flash_bwd.h"
#include "fusedattn/attention/hopper/flash_fwd.h"
#include "fusedattn/attention/options.h"
#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/platform/cuda/platform_info.h"

namespace fusedattn::ffi_glue::cuda_route {
namespace {

namespace hopper = cuda::hopper;

// The Hopper forward's temporaries: its tile scheduler's counter, and THD's per-sequence
// lengths and first tokens (prepare_sequences' flat lengths and ragged token offsets,
// token stride 1).
struct HopperPlan {
  ScratchPlan plan;
  size_t counter = 0, q_len = 0, kv_len = 0, q_tok = 0, kv_tok = 0, mask_tiles = 0;

  // flags: the call's backend_flags (kRequestMaskBias: a dense mask's bits and classes).
  HopperPlan(const AttnParams& p, int32_t flags) {
    counter = plan.add(sizeof(int));
    if (p.bias_type == FA_POST_SCALE_BIAS && (flags & kRequestMaskBias))
      mask_tiles = plan.add(static_cast<size_t>(
          hopper::mask_tiles_bytes(p.bias_batch, p.bias_heads, p.seqlen_q, p.seqlen_kv)));
    if (!is_thd(p.layout)) return;
    const size_t n = static_cast<size_t>(p.batch * p.max_segments + 1) * 4;
    q_len = plan.add(n), kv_len = plan.add(n), q_tok = plan.add(n), kv_tok = plan.add(n);
  }
};

}  // namespace

size_t hopper_fwd_workspace(const AttnParams& p, int32_t flags) {
  return HopperPlan(p, flags).plan.bytes();
}

Status hopper_fwd(const AttnParams& p, const AttnTensors& t, const SmArgs& sm,
                  const ScoreModForm& form, bool want_max, int32_t flags, int device,
                  ffi::AnyBuffer* workspace, cudaStream_t stream) {
  PlatformInfo info;
  FA_RETURN_IF_NOT_OK(cuda::platform_info(device, &info));
  hopper::FlashFwdParams fp;
  fp.q = t.q, fp.k = t.k, fp.v = t.v, fp.out = t.out, fp.lse = t.lse;
  fp.q_b = t.sq.b, fp.q_s = t.sq.s, fp.q_h = t.sq.h;
  fp.k_b = t.sk.b, fp.k_s = t.sk.s, fp.k_h = t.sk.h;
  fp.v_b = t.sv.b, fp.v_s = t.sv.s, fp.v_h = t.sv.h;
  fp.o_b = t.so.b, fp.o_s = t.so.s, fp.o_h = t.so.h;
  fp.l_b = t.slse.b, fp.l_h = t.slse.h, fp.l_s = t.slse.s;
  if (want_max) fp.max_logit = t.max_logit, fp.ml_b = p.heads_q, fp.ml_h = 1;
  if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) fp.sink = 1;
  if (p.softmax_type == FA_LEARNABLE_SOFTMAX)
    fp.sink = 2, fp.sinks = t.softmax_offset, fp.sink_rows = p.batch / p.num_slices;
  fp.batch = p.batch, fp.seqlen_q = p.seqlen_q, fp.seqlen_kv = p.seqlen_kv;
  fp.heads_q = p.heads_q, fp.heads_kv = p.heads_kv, fp.head_dim = p.head_dim_qk;
  fp.bf16 = p.dtype == FA_BFLOAT16;
  const hopper_rules::Band band = hopper_rules::band(p);
  fp.causal = band.causal, fp.diag = band.diag;
  fp.left_bound = band.left_bound, fp.lo_diag = band.lo_diag;
  fp.bottom_right = band.bottom_right;
  const bool thd = is_thd(p.layout);
  const AttnMask mask = attn_mask(p, {t.q_seqlens, t.kv_seqlens, t.q_offsets, t.kv_offsets});
  HopperPlan hp(p, flags);
  FA_RETURN_IF_NOT_OK(hp.plan.bind(workspace));
  fp.counter = hp.plan.at<int>(hp.counter);
  if (thd) {  // the sequences by mask.h's rule, as cuDNN reads them (prepare_sequences)
    cuda::SequenceArgs a{};
    a.rows = p.batch;
    a.seq_q = hp.plan.at<int32_t>(hp.q_len);
    a.seq_kv = hp.plan.at<int32_t>(hp.kv_len);
    a.ragged[0] = hp.plan.at<int32_t>(hp.q_tok);
    a.ragged[1] = hp.plan.at<int32_t>(hp.kv_tok);
    a.token_stride[0] = a.token_stride[1] = 1;
    a.ragged_is_kv[1] = true;
    FA_RETURN_IF_NOT_OK(cuda::prepare_sequences(mask, a, stream));
    fp.seq_q_len = a.seq_q, fp.seq_kv_len = a.seq_kv;
    fp.seq_q_tok = a.ragged[0], fp.seq_kv_tok = a.ragged[1];
    fp.segments = p.max_segments;
  } else if (has_padding(p.mask_type)) {  // BSHD: one segment a row, [B, M] lengths
    fp.q_lens = t.q_seqlens, fp.kv_lens = t.kv_seqlens;
    fp.lens_stride = p.max_segments;
  }
  fp.scale = p.scale;
  if (t.bias) {  // a pre- or post-scale bias, or a folded mask (kRequestMaskBias)
    fp.bias = t.bias;
    fp.bias_pre_scale = p.bias_type == FA_PRE_SCALE_BIAS;
    fp.bias_b = t.bias_b, fp.bias_h = t.bias_h, fp.bias_s = t.bias_s;
    fp.bias_batch = p.bias_batch, fp.bias_heads = p.bias_heads;
    fp.mask_bias = (flags & kRequestMaskBias) != 0;
    fp.bias_keep = t.bias_keep;
    fp.mask_value = fa_masked_bias_value(p.dtype);
    fp.mask_tiles = hp.plan.at<void>(hp.mask_tiles);
  }
  if (const auto pers = backend_options().hopper_persistent) fp.persistent = *pers != 0;
  if (!backend_options().hopper_bias_tile) fp.bias_tile = 0;
  if (backend_options().hopper_bias_reads) fp.bias_reads = 1;
  if (form.kind == ScoreModKind::kSoftcap) {
    // The program sees s = scale q.k (+ a post-scale bias b): k1 tanh(k2 (scale q.k + b)) =
    // c tanh(scale' (q.k + b / scale) / c), with scale' = scale k1 k2.
    fp.softcap = form.softcap_k1;
    fp.scale = p.scale * form.softcap_k2 * form.softcap_k1;
    if (t.bias && p.scale != 0.0f) fp.post_bias_mul = 1.0f / p.scale;
  } else if (form.kind == ScoreModKind::kAlibi) {
    const ScoreMod& m = sm.call->sm;
    fp.alibi_slopes = sm.call->operands + m.offset(0);
    fp.alibi_stride = m.shape[0][1] == 1 ? 0 : 1;
    fp.alibi_sign = form.alibi.sign;
    fp.alibi_abs = form.alibi.abs;
  }
  const std::string why_not = hopper::flash_fwd_unsupported(fp, info.sm);
  if (!why_not.empty())
    return Status::Internal("the Hopper flash forward was chosen for a call it cannot run: " +
                            why_not);
  FA_RETURN_IF_NOT_OK(hopper::flash_fwd(fp, stream));
  if (thd)  // tokens of no sequence (the kernel writes the sequences' rows): out 0, lse -inf
    FA_RETURN_IF_NOT_OK(cuda::finalize_forward(mask, finalize_args(p, t), stream));
  if (want_max) return Status::Ok();
  // max_logit is not returned to the caller: NaN makes any misuse visible.
  return cuda::cuda_status(cudaMemsetAsync(t.max_logit, 0xff, p.batch * p.heads_q * 4, stream),
                           "cudaMemsetAsync(max_logit)");
}

namespace {

// The Hopper flash backward's parameters for a call select_backend() gave it (a plain call,
// softcap's or ALiBi's (form, its operands in sm), or a bias or dense mask with no dbias);
// workspace: its scratch, 256-byte aligned (null: sizing only) of workspace_bytes;
// deterministic: its ordered dQ (kRequestDeterministic); mask_bias: the bias is a folded
// mask (kRequestMaskBias; sizing takes it for any bias: the larger scratch), keep_only:
// without values (kRequestMaskKeepOnly); want_dbias: the
// bias's gradient is wanted (no kRequestNoDbias; sizing takes it: its float32 sums).
hopper::FlashBwdParams hopper_bwd_params(const AttnParams& p, const AttnTensors& t, void* workspace,
                                         int64_t workspace_bytes, bool deterministic, bool mask_bias,
                                         bool keep_only, bool want_dbias, const ScoreModForm& form = {},
                                         const SmArgs& sm = {}, bool want_dslopes = false) {
  hopper::FlashBwdParams bp;
  bp.q = t.q, bp.k = t.k, bp.v = t.v, bp.out = t.out, bp.dout = t.dout, bp.lse = t.lse;
  bp.dq = t.dq, bp.dk = t.dk, bp.dv = t.dv;
  bp.q_b = t.sq.b, bp.q_s = t.sq.s, bp.q_h = t.sq.h;
  bp.k_b = t.sk.b, bp.k_s = t.sk.s, bp.k_h = t.sk.h;
  bp.v_b = t.sv.b, bp.v_s = t.sv.s, bp.v_h = t.sv.h;
  bp.o_b = t.so.b, bp.o_s = t.so.s, bp.o_h = t.so.h;
  bp.do_b = t.sdo.b, bp.do_s = t.sdo.s, bp.do_h = t.sdo.h;
  bp.dq_b = t.sdq.b, bp.dq_s = t.sdq.s, bp.dq_h = t.sdq.h;
  bp.dk_b = t.sdk.b, bp.dk_s = t.sdk.s, bp.dk_h = t.sdk.h;
  bp.dv_b = t.sdv.b, bp.dv_s = t.sdv.s, bp.dv_h = t.sdv.h;
  bp.l_b = t.slse.b, bp.l_h = t.slse.h, bp.l_s = t.slse.s;
  bp.batch = p.batch, bp.seqlen_q = p.seqlen_q, bp.seqlen_kv = p.seqlen_kv;
  bp.heads_q = p.heads_q, bp.heads_kv = p.heads_kv, bp.head_dim = p.head_dim_qk;
  bp.bf16 = p.dtype == FA_BFLOAT16;
  bp.scale = p.scale;
  const hopper_rules::Band band = hopper_rules::band(p);
  bp.causal = band.causal, bp.diag = band.diag;
  bp.left_bound = band.left_bound, bp.lo_diag = band.lo_diag;
  bp.bottom_right = band.bottom_right;
  if (has_padding(p.mask_type)) bp.q_lens = t.q_seqlens, bp.kv_lens = t.kv_seqlens, bp.lens_stride = p.max_segments;
  if (p.bias_type != FA_NO_BIAS) {  // a bias or a folded mask (no dbias)
    bp.bias = t.bias;
    bp.bias_b = t.bias_b, bp.bias_h = t.bias_h, bp.bias_s = t.bias_s;
    bp.bias_batch = p.bias_batch, bp.bias_heads = p.bias_heads;
    bp.pre_scale_bias = p.bias_type == FA_PRE_SCALE_BIAS;
    bp.mask_bias = mask_bias;
    bp.mask_keep_only = mask_bias && keep_only;
    bp.bias_keep = t.bias_keep;
    bp.mask_value = fa_masked_bias_value(p.dtype);
    bp.want_dbias = want_dbias;
    bp.dbias = want_dbias ? t.dbias : nullptr;
  }
  if (p.softmax_type == FA_LEARNABLE_SOFTMAX) {  // its gradient (off-by-one's logit has none)
    bp.sinks = t.softmax_offset, bp.dsinks = t.dsoftmax_offset;
    bp.sink_rows = p.batch / std::max<int64_t>(p.num_slices, 1);
  }
  if (form.kind == ScoreModKind::kSoftcap) {  // as the forward: k1 tanh(k2 (scale q.k + b))
    bp.softcap = form.softcap_k1;
    bp.scale = p.scale * form.softcap_k2 * form.softcap_k1;
    if (p.bias_type != FA_NO_BIAS && p.scale != 0.0f) bp.post_bias_mul = 1.0f / p.scale;
  } else if (form.kind == ScoreModKind::kAlibi && sm.call) {  // as the forward
    const ScoreMod& m = sm.call->sm;
    bp.alibi_slopes = sm.call->operands + m.offset(0);
    bp.alibi_stride = m.shape[0][1] == 1 ? 0 : 1;
    bp.alibi_sign = form.alibi.sign;
    bp.alibi_abs = form.alibi.abs;
    // the slopes' gradient (kRequestScoreModGrads): into their place in the operands' gradient
    if (want_dslopes && sm.call->doperands) bp.alibi_dslopes = sm.call->doperands + m.offset(0);
  }
  bp.workspace = workspace;
  bp.workspace_bytes = workspace_bytes;
  bp.deterministic = deterministic;
  return bp;
}

}  // namespace

size_t hopper_bwd_workspace(const AttnParams& p, bool want_dbias) {
  return static_cast<size_t>(hopper::flash_bwd_workspace_bytes(
             hopper_bwd_params(p, AttnTensors{}, nullptr, 0, /*deterministic=*/true, /*mask_bias=*/true,
                               /*keep_only=*/false, want_dbias && p.bias_type != FA_NO_BIAS))) + kRegionAlign - 1;
}

Status hopper_bwd(const AttnParams& p, const AttnTensors& t, size_t dbias_bytes,
                  ffi::AnyBuffer* workspace, int device, cudaStream_t stream, bool deterministic,
                  bool mask_bias, bool keep_only, bool want_dbias, const ScoreModForm& form,
                  const SmArgs& sm, bool want_dslopes) {
  PlatformInfo info;
  FA_RETURN_IF_NOT_OK(cuda::platform_info(device, &info));
  if (form.kind == ScoreModKind::kAlibi && !sm.call)
    return Status::Internal("the Hopper backward was chosen for ALiBi without its slopes");
  const size_t need = hopper_bwd_workspace(p, want_dbias);
  if (workspace->size_bytes() < need)
    return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                            " bytes, the Hopper backward needs " + std::to_string(need));
  const uintptr_t u = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  const uintptr_t aligned = align_region_ptr(u);
  const hopper::FlashBwdParams bp =
      hopper_bwd_params(p, t, reinterpret_cast<void*>(aligned),
                        static_cast<int64_t>(workspace->size_bytes() - (aligned - u)), deterministic, mask_bias,
                        keep_only, want_dbias, form, sm, want_dslopes);
  const std::string why_not = hopper::flash_bwd_unsupported(bp, info.sm);
  if (!why_not.empty())
    return Status::Internal("the Hopper flash backward was chosen for a call it cannot run: " + why_not);
  FA_RETURN_IF_NOT_OK(memset_async(t.dbias, t.dbias ? dbias_bytes : 0, stream, "cudaMemsetAsync(dbias)"));
  if (!bp.dsinks)  // a d softmax_offset no sink gradient fills (off-by-one): zeros
    FA_RETURN_IF_NOT_OK(memset_async(t.dsoftmax_offset, t.dsoftmax_offset ? p.batch * p.heads_q * 4 : 0, stream,
                                     "cudaMemsetAsync(dsoftmax_offset)"));
  return hopper::flash_bwd(bp, stream);
}

}  // namespace fusedattn::ffi_glue::cuda_route
