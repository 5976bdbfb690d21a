// XLA FFI handlers of attention on NVIDIA GPUs (operands and results as the CPU
// handlers: ffi_decode.h):
//   fa_cuda_attn_fwd: q, k, v, bias, softmax_offset, seed, q_seqlens, kv_seqlens,
//                     q_offsets, kv_offsets, index_base -> out, softmax_aux (lse), max_logit
//   fa_cuda_attn_bwd: the same 11, out, dout, softmax_aux -> dq, dk, dv, dbias, dsoftmax_offset
//   (each with one more result: a uint8 workspace, sized at trace time by
//   attn_workspace_bytes(), since XLA's FFI scratch allocator is not available to
//   every custom call)
//   fa_cuda_attn_fwd_sm / fa_cuda_attn_bwd_sm: the same with score_mod (flex attention):
//   one more operand after the eleven (the concatenated score_mod operands, f32) and the
//   program attribute; the kernel runs the program (cudnn/sdpa_graph.cc, the Hopper
//   forward's own softcap / ALiBi, or the CUDA flash kernels' interpreter). The backward
//   returns one more result before the workspace, the operands' gradient (f32, their
//   size): the CUDA flash backward computes it in-kernel; behind cuDNN it is zeros and
//   fusedattn/attention.py takes it from XLA.
// Each decodes one AttnParams and AttnTensors (the same code as the CPU) and runs the
// kernels select_backend() chose (backend.h): the Hopper flash forward (attention/hopper),
// or a cached cuDNN graph (cudnn/sdpa_config.h) that takes every temporary from the
// workspace; everything is enqueued on XLA's stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/cuda/empty_rows.h"
#include "fusedattn/attention/cuda/flash.h"
#include "fusedattn/attention/cudnn/fixup.h"
#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/attention/cudnn/sdpa_config.h"
#include "fusedattn/attention/hopper/band.h"
#include "fusedattn/attention/hopper/flash_bwd.h"
#include "fusedattn/attention/hopper/flash_fwd.h"
#include "fusedattn/attention/ffi_decode.h"
#include "fusedattn/attention/validate.h"
#include "fusedattn/attention/ffi_cuda.h"
#include "fusedattn/platform/cuda/platform_info.h"
#include "fusedattn/score_mod/device_program_host.h"

namespace fusedattn::ffi_glue {
namespace {

using cudnn::SdpaConfig;
namespace hopper = cuda::hopper;
using Pack = std::unordered_map<int64_t, void*>;

// Carves 256-byte aligned regions out of the workspace result (a uint8 buffer that
// Python sizes at trace time by asking workspace_bytes(), so XLA owns every byte).
class ScratchPlan {
 public:
  size_t add(size_t bytes) {
    const size_t at = total_;
    total_ += (bytes + 255) / 256 * 256;
    return at;
  }
  // Bytes the workspace must have: the regions, plus slack to align its start.
  size_t bytes() const { return total_ + 255; }
  Status bind(ffi::AnyBuffer* workspace) {
    if (workspace->size_bytes() < bytes())
      return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                              " bytes, the call needs " + std::to_string(bytes()));
    const uintptr_t p = reinterpret_cast<uintptr_t>(workspace->untyped_data());
    base_ = reinterpret_cast<char*>((p + 255) / 256 * 256);
    return Status::Ok();
  }
  template <class T>
  T* at(size_t offset) const { return reinterpret_cast<T*>(base_ + offset); }

 private:
  size_t total_ = 0;
  char* base_ = nullptr;
};

template <class T>
T* offset(T* p, int64_t elements, int64_t elem_bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return p ? reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + elements * elem_bytes) : nullptr;
}

// select_backend()'s choice for this call, with the flags of the decision Python made
// (AttnAttrs::backend_flags); Python routes a call here only when the CUDA handler serves
// it (backend cudnn or cuda_flash), so anything else is a caller error.
Status choose(const AttnParams& p, int device, BackendRequest req, int32_t flags,
              BackendChoice* c, PlatformInfo* info_out = nullptr, BackendRequest* req_out = nullptr) {
  PlatformInfo info;
  FA_RETURN_IF_NOT_OK(cuda::platform_info(device, &info));
  req = request_from_flags(flags, req);
  *c = select_backend(p, FA_PLATFORM_CUDA, info, req);
  if (info_out) *info_out = info;
  if (req_out) *req_out = req;
  if (!c->status.ok()) return c->status;
  if (c->backend != FA_BACKEND_CUDNN && c->backend != FA_BACKEND_CUDA_FLASH)
    return Status::Unimplemented("the CUDA attention handler serves cuDNN and CUDA flash "
                                 "calls only; " + c->reason);
  return Status::Ok();
}

// Bytes of the flash kernels' workspace result (with the slack to align its start).
size_t flash_workspace(const AttnParams& p, bool backward, bool score_mod) {
  return cuda::flash::workspace_bytes(p, backward, score_mod) + 255;
}

// The flash kernels' workspace, aligned to 256 bytes.
Status flash_workspace_at(const AttnParams& p, bool backward, bool score_mod, ffi::AnyBuffer* workspace,
                          void** at) {
  const size_t need = flash_workspace(p, backward, score_mod);
  if (workspace->size_bytes() < need)
    return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                            " bytes, the CUDA flash kernels need " + std::to_string(need));
  const uintptr_t u = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  *at = reinterpret_cast<void*>((u + 255) / 256 * 256);
  return Status::Ok();
}

// Sequence tensors (lengths, ragged offsets) of one slice's graph, in scratch.
struct SeqScratch {
  size_t seq_q = 0, seq_kv = 0, ragged[5] = {0, 0, 0, 0, 0};
  bool used = false;

  void plan(const SdpaConfig& c, ScratchPlan& plan) {
    used = c.padding || c.ragged;
    if (!used) return;
    seq_q = plan.add(c.batch * 4);
    seq_kv = plan.add(c.batch * 4);
    if (c.ragged)
      for (auto& r : ragged) r = plan.add((c.batch + 1) * 4);
  }

  // Fills them for rows [row0, row0 + rows) and binds them into the pack.
  Status prepare(const AttnParams& p, const SdpaConfig& c, const AttnTensors& t, int64_t row0,
                 int64_t rows, const ScratchPlan& plan, cudaStream_t stream, Pack& pack) const {
    if (!used) return Status::Ok();
    const int64_t M = p.max_segments;
    const AttnMask mask = attn_mask(
        p, {offset(t.q_seqlens, row0 * M, 4), offset(t.kv_seqlens, row0 * M, 4),
            offset(t.q_offsets, row0 * (M + 1), 4), offset(t.kv_offsets, row0 * (M + 1), 4)});
    cuda::SequenceArgs a{};
    a.rows = rows;
    a.seq_q = plan.at<int32_t>(seq_q);
    a.seq_kv = plan.at<int32_t>(seq_kv);
    pack[cudnn::kSeqQ] = a.seq_q;
    pack[cudnn::kSeqKV] = a.seq_kv;
    if (c.ragged) {
      const cudnn::Uid uids[5] = {cudnn::kRagQ, cudnn::kRagK, cudnn::kRagV, cudnn::kRagO,
                                  cudnn::kRagStats};
      const int64_t token[5] = {c.q.s, c.k.s, c.v.s, c.o.s, c.lse.s};
      for (int r = 0; r < 5; ++r) {
        a.ragged[r] = plan.at<int32_t>(ragged[r]);
        a.token_stride[r] = token[r];
        a.ragged_is_kv[r] = r == 1 || r == 2;
        pack[uids[r]] = a.ragged[r];
      }
    }
    return cuda::prepare_sequences(mask, a, stream);
  }
};

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

// Where each temporary of a forward call lives in the workspace.
struct FwdPlan {
  ScratchPlan plan;
  SeqScratch seq;
  size_t ws = 0, max_at = 0, sum_at = 0, sink_at = 0;

  FwdPlan(const AttnParams& p, const SdpaConfig& c, const cudnn::BuiltGraph& g) {
    const int64_t n_lse = p.batch * p.heads_q * p.seqlen_q;
    ws = plan.add(g.workspace_bytes);
    seq.plan(c, plan);
    if (c.max_sum) max_at = plan.add(n_lse * 4), sum_at = plan.add(n_lse * 4);
    if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) sink_at = plan.add(p.heads_q * 4);
  }
};

struct BwdPlan {
  ScratchPlan plan;
  SeqScratch seq;
  size_t ws = 0, lse_at = 0, sink_at = 0;

  BwdPlan(const AttnParams& p, const SdpaConfig& c, const cudnn::BuiltGraph& g) {
    ws = plan.add(g.workspace_bytes);
    seq.plan(c, plan);
    // (and a bias: it may be a folded mask whose rows the Hopper forward left without keys)
    if (cudnn::rows_may_be_empty(p) || p.bias_type == FA_POST_SCALE_BIAS)
      lse_at = plan.add(p.batch * p.heads_q * p.seqlen_q * 4);
    if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) sink_at = plan.add(2 * p.heads_q * 4);
  }
};

// A score_mod call as the graph code takes it (null: none), checked against p.
struct SmArgs {
  const ScoreModCall* call = nullptr;
  cudnn::ScoreModSpec spec;
  const cudnn::ScoreModSpec* get() const { return call ? &spec : nullptr; }
};

Status make_sm_args(const AttnParams& p, const ffi::Span<const int32_t>* program,
                    const ffi::AnyBuffer* operands, ScoreModCall* call, SmArgs* out,
                    ffi::AnyBuffer* doperands = nullptr) {
  if (!program) return Status::Ok();
  FA_RETURN_IF_NOT_OK(decode_score_mod_call(p, *program, *operands, doperands, call));
  out->call = call;
  out->spec = {program->begin(), static_cast<int64_t>(program->size())};
  return Status::Ok();
}

// The program packed for the CUDA flash kernels (none without a score_mod).
struct FlashSm {
  std::unique_ptr<DeviceScoreMod> program;
  cuda::flash::ScoreModArgs args;
  Status pack(const SmArgs& sm) {
    if (!sm.call) return Status::Ok();
    program = std::make_unique<DeviceScoreMod>();
    FA_RETURN_IF_NOT_OK(pack_device_score_mod(sm.call->sm, program.get()));
    args = {program.get(), sm.call->operands, sm.call->doperands};
    return Status::Ok();
  }
};

// Binds slice s's score_mod operands (their graph uids) into the pack.
void bind_sm_operands(const SmArgs& sm, int64_t s, Pack& pack) {
  if (!sm.call) return;
  const ScoreMod& m = sm.call->sm;
  for (int32_t i = 0; i < m.n_operands; ++i)
    pack[cudnn::kScoreModOperand + i] =
        const_cast<float*>(sm.call->operands + s * m.total_size() + m.offset(i));
}

// cuDNN and the Hopper forward count dropout's Philox counter and score_mod's batch and
// head inputs from 0: they cannot take a shard's index_base (Python sends such calls
// elsewhere). Without dropout and score_mod nothing reads the indices, so a base is
// ignored; positions (6 or 8 columns) change the mask too, so they are refused whatever
// the call. Decided by the buffer's shape: its values stay on the device.
Status refuse_index_base(const AttnParams& p, const AttnTensors& t, const SmArgs& sm) {
  if (t.index_base && t.index_cols > 2)
    return Status::Unimplemented(
        "index_base: got " + std::to_string(t.index_cols) + " columns (a block's q_pos, "
        "kv_pos, q_extent, kv_extent" + (t.index_cols == 8 ? ", stripe, stride" : "") +
        "); the CUDA backends take no positions (Python runs XLA's reference for such "
        "blocks on the GPU)");
  if (!t.index_base || (!has_dropout(p) && !sm.call)) return Status::Ok();
  return Status::Unimplemented(
      std::string("index_base: the CUDA backends take no index_base with ") +
      (has_dropout(p) ? "dropout" : "score_mod") +
      " (they count the batch and head index from 0); pass an empty index_base");
}

// finalize_forward's arguments for call p's out and lse (no max_logit: the caller adds it).
cuda::FinalizeArgs finalize_args(const AttnParams& p, const AttnTensors& t) {
  cuda::FinalizeArgs a{};
  a.batch = p.batch;
  a.heads = p.heads_q;
  a.dtype = p.dtype;
  a.head_dim_v = p.head_dim_v;
  a.out = t.out;
  a.so = {t.so.b, t.so.s, t.so.h};
  a.lse = t.lse;
  a.slse = {t.slse.b, t.slse.s, t.slse.h};
  a.softmax_type = p.softmax_type;
  a.sink = t.softmax_offset;
  a.rows_per_slice = p.batch / p.num_slices;
  return a;
}

// Runs the Hopper flash forward, which select_backend() chose for this call (a softcap or
// ALiBi score_mod, form, or none); want_max: it writes max_logit [B, Hq] too.
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
    fp.mask_value = fa_masked_bias_value(p.dtype);
    fp.mask_tiles = hp.plan.at<void>(hp.mask_tiles);
  }
  if (const auto pers = backend_options().hopper_persistent) fp.persistent = *pers != 0;
  if (!backend_options().hopper_bias_tile) fp.bias_tile = 0;
  if (form.kind == ScoreModKind::kSoftcap) {
    // The program sees s = scale q.k: k1 tanh(k2 scale q.k) = c tanh(scale' q.k / c).
    fp.softcap = form.softcap_k1;
    fp.scale = p.scale * form.softcap_k2 * form.softcap_k1;
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

Status memset_async(void* p, size_t bytes, cudaStream_t stream, const char* what) {
  if (!p || bytes == 0) return Status::Ok();
  return cuda::cuda_status(cudaMemsetAsync(p, 0, bytes, stream), what);
}

// The Hopper flash backward's parameters for a call select_backend() gave it (a plain call,
// softcap's or ALiBi's (form, its operands in sm), or a bias or dense mask with no dbias);
// workspace: its scratch, 256-byte aligned (null: sizing only) of workspace_bytes;
// deterministic: its ordered dQ (kRequestDeterministic); mask_bias: the bias is a folded
// mask (kRequestMaskBias; sizing takes it for any bias: the larger scratch); want_dbias: the
// bias's gradient is wanted (no kRequestNoDbias; sizing takes it: its float32 sums).
hopper::FlashBwdParams hopper_bwd_params(const AttnParams& p, const AttnTensors& t, void* workspace,
                                         int64_t workspace_bytes, bool deterministic, bool mask_bias,
                                         bool want_dbias, const ScoreModForm& form = {},
                                         const SmArgs& sm = {}) {
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
    bp.mask_value = fa_masked_bias_value(p.dtype);
    bp.want_dbias = want_dbias;
    bp.dbias = want_dbias ? t.dbias : nullptr;
  }
  if (p.softmax_type == FA_LEARNABLE_SOFTMAX) {  // its gradient (off-by-one's logit has none)
    bp.sinks = t.softmax_offset, bp.dsinks = t.dsoftmax_offset;
    bp.sink_rows = p.batch / std::max<int64_t>(p.num_slices, 1);
  }
  if (form.kind == ScoreModKind::kSoftcap) {  // as the forward: k1 tanh(k2 scale q.k)
    bp.softcap = form.softcap_k1;
    bp.scale = p.scale * form.softcap_k2 * form.softcap_k1;
  } else if (form.kind == ScoreModKind::kAlibi && sm.call) {  // as the forward
    const ScoreMod& m = sm.call->sm;
    bp.alibi_slopes = sm.call->operands + m.offset(0);
    bp.alibi_stride = m.shape[0][1] == 1 ? 0 : 1;
    bp.alibi_sign = form.alibi.sign;
    bp.alibi_abs = form.alibi.abs;
  }
  bp.workspace = workspace;
  bp.workspace_bytes = workspace_bytes;
  bp.deterministic = deterministic;
  return bp;
}

// Bytes of the Hopper backward's workspace result (with the slack to align its start; a
// bias's part sized as a folded mask's, the larger), with room for the deterministic dQ's
// counters (8 bytes a 64-row block) either way, and a broadcast bias's float32 dbias when
// want_dbias.
size_t hopper_bwd_workspace(const AttnParams& p, bool want_dbias) {
  return static_cast<size_t>(hopper::flash_bwd_workspace_bytes(
             hopper_bwd_params(p, AttnTensors{}, nullptr, 0, /*deterministic=*/true, /*mask_bias=*/true,
                               want_dbias && p.bias_type != FA_NO_BIAS))) + 255;
}

// Runs the Hopper flash backward, which select_backend() chose (a bias's or dense mask's
// dbias, not wanted: zeros there, never read).
Status hopper_bwd(const AttnParams& p, const AttnTensors& t, size_t dbias_bytes,
                  ffi::AnyBuffer* workspace, int device, cudaStream_t stream, bool deterministic,
                  bool mask_bias, bool want_dbias, const ScoreModForm& form, const SmArgs& sm) {
  PlatformInfo info;
  FA_RETURN_IF_NOT_OK(cuda::platform_info(device, &info));
  if (form.kind == ScoreModKind::kAlibi && !sm.call)
    return Status::Internal("the Hopper backward was chosen for ALiBi without its slopes");
  const size_t need = hopper_bwd_workspace(p, want_dbias);
  if (workspace->size_bytes() < need)
    return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                            " bytes, the Hopper backward needs " + std::to_string(need));
  const uintptr_t u = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  const uintptr_t aligned = (u + 255) / 256 * 256;
  const hopper::FlashBwdParams bp =
      hopper_bwd_params(p, t, reinterpret_cast<void*>(aligned),
                        static_cast<int64_t>(workspace->size_bytes() - (aligned - u)), deterministic, mask_bias,
                        want_dbias, form, sm);
  const std::string why_not = hopper::flash_bwd_unsupported(bp, info.sm);
  if (!why_not.empty())
    return Status::Internal("the Hopper flash backward was chosen for a call it cannot run: " + why_not);
  FA_RETURN_IF_NOT_OK(memset_async(t.dbias, t.dbias ? dbias_bytes : 0, stream, "cudaMemsetAsync(dbias)"));
  if (!bp.dsinks)  // a d softmax_offset no sink gradient fills (off-by-one): zeros
    FA_RETURN_IF_NOT_OK(memset_async(t.dsoftmax_offset, t.dsoftmax_offset ? p.batch * p.heads_q * 4 : 0, stream,
                                     "cudaMemsetAsync(dsoftmax_offset)"));
  return hopper::flash_bwd(bp, stream);
}

// kRequestAverageEmptyRows's backward scratch (the forward takes none): the last bytes of
// the workspace (every route's temporaries are at its start; attn_workspace_bytes adds
// these, + the slack of aligning their start).
size_t empty_rows_bytes(const AttnParams& p, bool backward, int32_t flags) {
  return backward && (flags & kRequestAverageEmptyRows) ? cuda::empty_rows_bwd_scratch_bytes(p) + 256 : 0;
}

void* empty_rows_scratch(const AttnParams& p, ffi::AnyBuffer* workspace) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(workspace->untyped_data()) + workspace->size_bytes();
  return reinterpret_cast<void*>((end - cuda::empty_rows_bwd_scratch_bytes(p)) / 256 * 256);
}

// Checks a call that asks for kRequestAverageEmptyRows (ok when it does not) and gives its
// passes' arguments.
Status empty_rows_args(const AttnParams& p, const AttnTensors& t, const AttnAttrs& attrs,
                       const ffi::AnyBuffer* workspace, bool backward, cuda::EmptyRowsArgs* a) {
  if (!(attrs.backend_flags & kRequestAverageEmptyRows)) return Status::Ok();
  FA_RETURN_IF_NOT_OK(validate_average_empty_rows(p, t.index_base ? t.index_cols : 0));
  if (!backward && !attrs.want_lse)
    return Status::Invalid("want_lse: 0; the average of empty rows (kRequestAverageEmptyRows) "
                           "reads the forward's lse: pass want_lse=1");
  const size_t need = empty_rows_bytes(p, backward, attrs.backend_flags);
  if (workspace->size_bytes() < need)
    return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                            " bytes, the empty rows' passes alone need " + std::to_string(need));
  *a = {p.batch, p.seqlen_q, p.seqlen_kv, p.heads_q, p.heads_kv, p.head_dim_v, p.dtype,
        static_cast<float>(empty_row_threshold(p.dtype)),
        attn_mask(p, {t.q_seqlens, t.kv_seqlens, t.q_offsets, t.kv_offsets}), t.lse, t.v, t.sv};
  return Status::Ok();
}

Status fwd_route(cudaStream_t stream, int device, const AttnParams& p, const AttnTensors& t,
                 ffi::AnyBuffer* workspace, const AttnAttrs& attrs, const SmArgs& sm);

Status attn_fwd(cudaStream_t stream, int device, const AttnOperands& in, ffi::AnyBuffer* out,
                ffi::AnyBuffer* lse, ffi::AnyBuffer* max_logit, ffi::AnyBuffer* workspace,
                const AttnAttrs& attrs, const SmArgs& sm) {
  AttnParams p;
  AttnTensors t;
  FA_RETURN_IF_NOT_OK(decode_operands(in, attrs, &p, &t));
  FA_RETURN_IF_NOT_OK(decode_fwd_results(p, in, out, lse, max_logit, &t));
  cuda::EmptyRowsArgs empty{};
  FA_RETURN_IF_NOT_OK(empty_rows_args(p, t, attrs, workspace, false, &empty));
  FA_RETURN_IF_NOT_OK(fwd_route(stream, device, p, t, workspace, attrs, sm));
  if (!(attrs.backend_flags & kRequestAverageEmptyRows)) return Status::Ok();
  return cuda::average_empty_rows_fwd(empty, t.out, t.so, stream);
}

// The forward by the kernels select_backend() chose.
Status fwd_route(cudaStream_t stream, int device, const AttnParams& p, const AttnTensors& t,
                 ffi::AnyBuffer* workspace, const AttnAttrs& attrs, const SmArgs& sm) {
  const bool want_max = attrs.want_max_logit != 0;
  BackendRequest req;
  req.score_mod = recognize_score_mod(sm.call ? &sm.call->sm : nullptr);
  req.want_max_logit = want_max;
  BackendChoice choice;
  FA_RETURN_IF_NOT_OK(choose(p, device, req, attrs.backend_flags, &choice));
  if (choice.forward == FA_BACKEND_CUDA_FLASH) {
    void* ws = nullptr;
    FA_RETURN_IF_NOT_OK(flash_workspace_at(p, false, sm.call != nullptr, workspace, &ws));
    FlashSm fs;
    FA_RETURN_IF_NOT_OK(fs.pack(sm));
    return cuda::flash::forward(p, t, f32_tf32(backend_options(), attrs.backend_flags & kRequestF32Exact), ws,
                                stream, fs.args, (attrs.backend_flags & kRequestDropoutBroadcast) != 0);
  }
  FA_RETURN_IF_NOT_OK(refuse_index_base(p, t, sm));
  if (choice.forward == FA_BACKEND_HOPPER_FWD)
    return hopper_fwd(p, t, sm, req.score_mod, want_max, attrs.backend_flags, device, workspace,
                      stream);
  const SdpaConfig c = cudnn::make_config(p, want_max, attrs.want_lse != 0, sm.get());
  std::shared_ptr<const cudnn::BuiltGraph> g;
  FA_RETURN_IF_NOT_OK(cudnn::get_graph(c, /*backward=*/false, device, &g));

  const int64_t slices = cudnn::graph_per_slice(p, sm.get()) ? p.num_slices : 1;
  const int64_t rows = p.batch / slices, H = p.heads_q;
  const FwdPlan fp(p, c, *g);
  ScratchPlan plan = fp.plan;
  const size_t ws = fp.ws, max_at = fp.max_at, sum_at = fp.sum_at, sink_at = fp.sink_at;
  const SeqScratch& seq = fp.seq;
  FA_RETURN_IF_NOT_OK(plan.bind(workspace));
  if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX)
    FA_RETURN_IF_NOT_OK(cuda::cuda_status(
        cudaMemsetAsync(plan.at<float>(sink_at), 0, H * 4, stream), "cudaMemsetAsync(sink)"));

  const int64_t eb = 2;  // cuDNN serves bf16 / fp16 only
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t r0 = s * rows;
    Pack pack;
    pack[cudnn::kQ] = const_cast<void*>(offset(t.q, r0 * c.q.b, eb));
    pack[cudnn::kK] = const_cast<void*>(offset(t.k, r0 * c.k.b, eb));
    pack[cudnn::kV] = const_cast<void*>(offset(t.v, r0 * c.v.b, eb));
    pack[cudnn::kO] = offset(t.out, r0 * c.o.b, eb);
    if (c.gen_stats) pack[cudnn::kStats] = offset(t.lse, r0 * c.lse.b, 4);
    if (c.max_sum) {
      pack[cudnn::kMax] = plan.at<float>(max_at) + r0 * c.lse.b;
      pack[cudnn::kSumExp] = plan.at<float>(sum_at) + r0 * c.lse.b;
    }
    if (c.bias) pack[cudnn::kBias] = const_cast<void*>(offset(t.bias, s * t.bias_slice, eb));
    if (c.dropout > 0.0f) pack[cudnn::kSeed] = const_cast<uint32_t*>(t.seed + 2 * s);
    if (p.softmax_type == FA_LEARNABLE_SOFTMAX)
      pack[cudnn::kSink] = const_cast<float*>(t.softmax_offset + H * s);
    if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) pack[cudnn::kSink] = plan.at<float>(sink_at);
    bind_sm_operands(sm, s, pack);
    FA_RETURN_IF_NOT_OK(seq.prepare(p, c, t, r0, rows, plan, stream, pack));
    FA_RETURN_IF_NOT_OK(cudnn::execute(*g, device, stream, std::move(pack), plan.at<void>(ws)));
  }

  if (!want_max)  // not returned to the caller; NaN makes any misuse visible
    FA_RETURN_IF_NOT_OK(cuda::cuda_status(
        cudaMemsetAsync(t.max_logit, 0xff, p.batch * H * 4, stream), "cudaMemsetAsync(max_logit)"));
  if (want_max || cudnn::rows_may_be_empty(p)) {
    cuda::FinalizeArgs a = finalize_args(p, t);
    a.max = want_max ? plan.at<float>(max_at) : nullptr;
    a.sum_exp = want_max ? plan.at<float>(sum_at) : nullptr;
    a.max_logit = want_max ? t.max_logit : nullptr;
    const AttnMask mask =
        attn_mask(p, {t.q_seqlens, t.kv_seqlens, t.q_offsets, t.kv_offsets});
    FA_RETURN_IF_NOT_OK(cuda::finalize_forward(mask, a, stream));
  }
  return Status::Ok();
}


Status bwd_route(cudaStream_t stream, int device, const AttnParams& p, AttnTensors t,
                 ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv, ffi::AnyBuffer* dbias,
                 ffi::AnyBuffer* workspace, const AttnAttrs& attrs, const SmArgs& sm);

Status attn_bwd(cudaStream_t stream, int device, const AttnOperands& in,
                const ffi::AnyBuffer& out, const ffi::AnyBuffer& dout, const ffi::AnyBuffer& lse,
                ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv, ffi::AnyBuffer* dbias,
                ffi::AnyBuffer* dsoftmax_offset, ffi::AnyBuffer* workspace,
                const AttnAttrs& attrs, const SmArgs& sm) {
  AttnParams p;
  AttnTensors t;
  FA_RETURN_IF_NOT_OK(decode_operands(in, attrs, &p, &t));
  FA_RETURN_IF_NOT_OK(
      decode_bwd_buffers(p, in, out, dout, lse, dq, dk, dv, dbias, dsoftmax_offset, &t));
  if (!(attrs.backend_flags & kRequestAverageEmptyRows))
    return bwd_route(stream, device, p, t, dq, dk, dv, dbias, workspace, attrs, sm);
  cuda::EmptyRowsArgs empty{};
  FA_RETURN_IF_NOT_OK(empty_rows_args(p, t, attrs, workspace, true, &empty));
  void* scratch = empty_rows_scratch(p, workspace);
  const float* lse_in = nullptr;  // lse with +inf at the empty rows: the route reads it
  FA_RETURN_IF_NOT_OK(cuda::empty_rows_bwd_prepare(empty, t.dout, t.sdo, scratch, &lse_in, stream));
  AttnTensors routed = t;
  routed.lse = const_cast<float*>(lse_in);
  FA_RETURN_IF_NOT_OK(bwd_route(stream, device, p, routed, dq, dk, dv, dbias, workspace, attrs, sm));
  return cuda::empty_rows_bwd_finish(empty, t.dv, t.sdv, scratch, stream);
}

// The backward by the kernels select_backend() chose.
Status bwd_route(cudaStream_t stream, int device, const AttnParams& p, AttnTensors t,
                 ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv, ffi::AnyBuffer* dbias,
                 ffi::AnyBuffer* workspace, const AttnAttrs& attrs, const SmArgs& sm) {
  BackendRequest req;
  req.score_mod = recognize_score_mod(sm.call ? &sm.call->sm : nullptr);
  BackendChoice choice;
  FA_RETURN_IF_NOT_OK(choose(p, device, req, attrs.backend_flags, &choice));
  const bool deterministic = (attrs.backend_flags & kRequestDeterministic) != 0;
  if (choice.backward == FA_BACKEND_NONE)  // a deterministic call the flash kernels serve
    return Status::Unimplemented("no backward serves this call: " + choice.reason);
  if (choice.backward == FA_BACKEND_CUDA_FLASH) {
    void* ws = nullptr;
    FA_RETURN_IF_NOT_OK(flash_workspace_at(p, true, sm.call != nullptr, workspace, &ws));
    if (t.dbias && (attrs.backend_flags & kRequestNoDbias)) {  // not wanted (backend.h): zeros
      FA_RETURN_IF_NOT_OK(cuda::cuda_status(cudaMemsetAsync(t.dbias, 0, dbias->size_bytes(), stream),
                                            "cudaMemsetAsync(dbias)"));
      t.dbias = nullptr;
    }
    FlashSm fs;
    FA_RETURN_IF_NOT_OK(fs.pack(sm));
    return cuda::flash::backward(p, t, f32_tf32(backend_options(), attrs.backend_flags & kRequestF32Exact), ws,
                                 stream, fs.args, (attrs.backend_flags & kRequestDropoutBroadcast) != 0);
  }
  // cuDNN and the Hopper backward compute no operand gradient: zeros (attention.py takes XLA's).
  const int64_t n_dop = sm.call && sm.call->doperands ? p.num_slices * sm.call->sm.total_size() : 0;
  if (n_dop > 0)
    FA_RETURN_IF_NOT_OK(cuda::cuda_status(
        cudaMemsetAsync(sm.call->doperands, 0, size_t(n_dop) * 4, stream), "cudaMemsetAsync(dscore_mod_operands)"));
  if (choice.backward == FA_BACKEND_HOPPER_BWD)
    return hopper_bwd(p, t, dbias->size_bytes(), workspace, device, stream, deterministic,
                      (attrs.backend_flags & kRequestMaskBias) != 0,
                      t.dbias && !(attrs.backend_flags & kRequestNoDbias), req.score_mod, sm);
  FA_RETURN_IF_NOT_OK(refuse_index_base(p, t, sm));
  if (choice.backward != FA_BACKEND_CUDNN)
    return Status::Internal(std::string("the CUDA attention handler runs cuDNN backwards; "
                                        "select_backend chose ") + backend_name(choice.backward));
  const SdpaConfig c = cudnn::make_bwd_config(p, deterministic, sm.get());
  std::shared_ptr<const cudnn::BuiltGraph> g;
  FA_RETURN_IF_NOT_OK(cudnn::get_graph(c, /*backward=*/true, device, &g));

  const int64_t slices = cudnn::graph_per_slice(p, sm.get()) ? p.num_slices : 1;
  const int64_t rows = p.batch / slices, H = p.heads_q;
  const int64_t n_lse = p.batch * H * p.seqlen_q;
  // (The Hopper forward drops a folded mask's keys: rows it empties have lse -inf.)
  const bool fix_lse =
      cudnn::rows_may_be_empty(p) || (t.bias && (attrs.backend_flags & kRequestMaskBias));
  const BwdPlan bp(p, c, *g);
  ScratchPlan plan = bp.plan;
  const size_t ws = bp.ws, lse_at = bp.lse_at, sink_at = bp.sink_at;
  const SeqScratch& seq = bp.seq;
  FA_RETURN_IF_NOT_OK(plan.bind(workspace));

  // cuDNN writes no gradient for padding and THD gaps: those stay zero.
  if (c.padding || c.ragged) {
    for (ffi::AnyBuffer* b : {dq, dk, dv, dbias})
      FA_RETURN_IF_NOT_OK(memset_async(b->untyped_data(), b->size_bytes(), stream,
                                             "cudaMemsetAsync(gradients)"));
  }
  // dsoftmax_offset [B, Hq]: cuDNN sums a slice's batch into the slice's first row.
  FA_RETURN_IF_NOT_OK(memset_async(t.dsoftmax_offset, t.dsoftmax_offset ? p.batch * H * 4 : 0,
                                         stream, "cudaMemsetAsync(dsoftmax_offset)"));
  if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX)
    FA_RETURN_IF_NOT_OK(memset_async(plan.at<float>(sink_at), H * 4, stream,
                                           "cudaMemsetAsync(sink)"));
  const float* lse_in = t.lse;
  if (fix_lse) {
    FA_RETURN_IF_NOT_OK(cuda::backward_lse(t.lse, plan.at<float>(lse_at), n_lse, stream));
    lse_in = plan.at<float>(lse_at);
  }

  const int64_t eb = 2;
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t r0 = s * rows;
    Pack pack;
    pack[cudnn::kQ] = const_cast<void*>(offset(t.q, r0 * c.q.b, eb));
    pack[cudnn::kK] = const_cast<void*>(offset(t.k, r0 * c.k.b, eb));
    pack[cudnn::kV] = const_cast<void*>(offset(t.v, r0 * c.v.b, eb));
    pack[cudnn::kO] = const_cast<void*>(offset(t.out, r0 * c.o.b, eb));
    pack[cudnn::kDO] = const_cast<void*>(offset(t.dout, r0 * c.o.b, eb));
    pack[cudnn::kStats] = const_cast<float*>(lse_in) + r0 * c.lse.b;
    pack[cudnn::kDQ] = offset(t.dq, r0 * c.q.b, eb);
    pack[cudnn::kDK] = offset(t.dk, r0 * c.k.b, eb);
    pack[cudnn::kDV] = offset(t.dv, r0 * c.v.b, eb);
    if (c.bias) {
      pack[cudnn::kBias] = const_cast<void*>(offset(t.bias, s * t.bias_slice, eb));
      pack[cudnn::kDBias] = offset(t.dbias, s * t.bias_slice, eb);
    }
    if (c.dropout > 0.0f) pack[cudnn::kSeed] = const_cast<uint32_t*>(t.seed + 2 * s);
    if (p.softmax_type == FA_LEARNABLE_SOFTMAX) {
      pack[cudnn::kSink] = const_cast<float*>(t.softmax_offset + H * s);
      pack[cudnn::kDSink] = t.dsoftmax_offset + H * r0;
    }
    if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) {
      pack[cudnn::kSink] = plan.at<float>(sink_at);
      pack[cudnn::kDSink] = plan.at<float>(sink_at) + H;  // the constant's gradient: discarded
    }
    bind_sm_operands(sm, s, pack);
    FA_RETURN_IF_NOT_OK(seq.prepare(p, c, t, r0, rows, plan, stream, pack));
    FA_RETURN_IF_NOT_OK(cudnn::execute(*g, device, stream, std::move(pack), plan.at<void>(ws)));
  }
  return Status::Ok();
}

ffi::Error attn_fwd_cuda(cudaStream_t stream, int32_t device,
                         ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                         ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                         ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                         ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                         ffi::AnyBuffer index_base,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                         ffi::Result<ffi::AnyBuffer> max_logit,
                         ffi::Result<ffi::AnyBuffer> workspace, AttnAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  return to_ffi_error(
      attn_fwd(stream, device, in, &*out, &*lse, &*max_logit, &*workspace, attrs, SmArgs{}));
}

ffi::Error attn_fwd_sm_cuda(cudaStream_t stream, int32_t device,
                            ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer bias, ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                            ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                            ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                            ffi::AnyBuffer index_base,
                            ffi::AnyBuffer sm_operands, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> max_logit,
                            ffi::Result<ffi::AnyBuffer> workspace, AttnScoreModAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  AttnParams p;
  AttnTensors t;
  FA_RETURN_IF_ERROR(decode_operands(in, attrs.base(), &p, &t));
  ScoreModCall call;
  SmArgs sm;
  FA_RETURN_IF_ERROR(make_sm_args(p, &attrs.score_mod, &sm_operands, &call, &sm));
  return to_ffi_error(
      attn_fwd(stream, device, in, &*out, &*lse, &*max_logit, &*workspace, attrs.base(), sm));
}

ffi::Error attn_bwd_cuda(cudaStream_t stream, int32_t device,
                         ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                         ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                         ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                         ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                         ffi::AnyBuffer index_base, ffi::AnyBuffer out,
                         ffi::AnyBuffer dout, ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                         ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                         ffi::Result<ffi::AnyBuffer> dbias,
                         ffi::Result<ffi::AnyBuffer> dsoftmax_offset,
                         ffi::Result<ffi::AnyBuffer> workspace, AttnAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  return to_ffi_error(attn_bwd(stream, device, in, out, dout, lse, &*dq, &*dk, &*dv, &*dbias,
                               &*dsoftmax_offset, &*workspace, attrs, SmArgs{}));
}

ffi::Error attn_bwd_sm_cuda(cudaStream_t stream, int32_t device,
                            ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer bias, ffi::AnyBuffer softmax_offset, ffi::AnyBuffer seed,
                            ffi::AnyBuffer q_seqlens, ffi::AnyBuffer kv_seqlens,
                            ffi::AnyBuffer q_offsets, ffi::AnyBuffer kv_offsets,
                            ffi::AnyBuffer index_base,
                            ffi::AnyBuffer sm_operands, ffi::AnyBuffer out, ffi::AnyBuffer dout,
                            ffi::AnyBuffer lse, ffi::Result<ffi::AnyBuffer> dq,
                            ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                            ffi::Result<ffi::AnyBuffer> dbias,
                            ffi::Result<ffi::AnyBuffer> dsoftmax_offset,
                            ffi::Result<ffi::AnyBuffer> dsm_operands,
                            ffi::Result<ffi::AnyBuffer> workspace, AttnScoreModAttrs attrs) {
  const AttnOperands in{&q, &k, &v, &bias, &softmax_offset, &seed,
                        &q_seqlens, &kv_seqlens, &q_offsets, &kv_offsets, &index_base};
  AttnParams p;
  AttnTensors t;
  FA_RETURN_IF_ERROR(decode_operands(in, attrs.base(), &p, &t));
  ScoreModCall call;
  SmArgs sm;
  FA_RETURN_IF_ERROR(make_sm_args(p, &attrs.score_mod, &sm_operands, &call, &sm, &*dsm_operands));
  return to_ffi_error(attn_bwd(stream, device, in, out, dout, lse, &*dq, &*dk, &*dv, &*dbias,
                               &*dsoftmax_offset, &*workspace, attrs.base(), sm));
}

}  // namespace

namespace {

Status route_workspace_bytes(const AttnParams& p, int device, bool want_lse, bool want_max_logit,
                             bool backward, int32_t backend_flags, int64_t* bytes,
                             const cudnn::ScoreModSpec* sm) {
  // The workspace holds the cuDNN graph's temporaries, the flash kernels' tables and
  // program, the Hopper forward's THD tables or the Hopper backward's scratch: the
  // score_mod's form decides as in the handlers (softcap's backward runs the Hopper kernel);
  // a program that does not decode is sized as a general one (cuDNN's graph).
  BackendRequest req;
  if (sm && !recognize_score_mod_program(p, sm->attr, sm->n, &req.score_mod).ok())
    req.score_mod.kind = ScoreModKind::kOther;
  BackendChoice choice;
  PlatformInfo info;
  FA_RETURN_IF_NOT_OK(choose(p, device, req, backend_flags, &choice, &info, &req));
  // Whichever runs the forward (the score_mod's form, unknown here, may pick the Hopper
  // kernel), the workspace holds the Hopper forward's THD tables too.
  const int64_t hopper = backward ? 0 : static_cast<int64_t>(HopperPlan(p, backend_flags).plan.bytes());
  // A backward the Hopper kernel can run is sized for it and for cuDNN's or the flash
  // kernels', whichever runs (set_hopper_bwd_override switches compiled functions between
  // them at run time).
  const int64_t hopper_bwd =
      backward && hopper_bwd_unsupported_reason(p, req, info).empty() ? static_cast<int64_t>(hopper_bwd_workspace(p, !req.no_dbias)) : 0;
  if (choice.backend == FA_BACKEND_CUDA_FLASH) {
    *bytes = std::max({hopper, hopper_bwd, static_cast<int64_t>(flash_workspace(p, backward, sm != nullptr))});
    return Status::Ok();
  }
  // A deterministic call's cuDNN graph would hold dP ([B, H, Sq, Skv]): not sized for when
  // the Hopper backward runs it.
  if (backward && req.deterministic && choice.backward == FA_BACKEND_HOPPER_BWD) {
    *bytes = hopper_bwd;
    return Status::Ok();
  }
  const SdpaConfig c = backward ? cudnn::make_bwd_config(p, req.deterministic, sm)
                                : cudnn::make_config(p, want_max_logit, want_lse, sm);
  std::shared_ptr<const cudnn::BuiltGraph> g;
  const Status built = cudnn::get_graph(c, backward, device, &g);
  if (!built.ok() && hopper_bwd > 0 && choice.backward == FA_BACKEND_HOPPER_BWD) {
    *bytes = hopper_bwd;  // cuDNN cannot build it: the Hopper backward's alone
    return Status::Ok();
  }
  FA_RETURN_IF_NOT_OK(built);
  if (backward) {
    *bytes = std::max(hopper_bwd, static_cast<int64_t>(BwdPlan(p, c, *g).plan.bytes()));
    return Status::Ok();
  }
  *bytes = std::max(hopper, static_cast<int64_t>(FwdPlan(p, c, *g).plan.bytes()));
  return Status::Ok();
}

}  // namespace

Status attn_workspace_bytes(const AttnParams& p, int device, bool want_lse, bool want_max_logit,
                            bool backward, int32_t backend_flags, int64_t* bytes,
                            const cudnn::ScoreModSpec* sm) {
  FA_RETURN_IF_NOT_OK(route_workspace_bytes(p, device, want_lse, want_max_logit, backward,
                                            backend_flags, bytes, sm));
  *bytes += static_cast<int64_t>(empty_rows_bytes(p, backward, backend_flags));
  return Status::Ok();
}

}  // namespace fusedattn::ffi_glue

namespace ffi = xla::ffi;
using fusedattn::ffi_glue::AttnAttrs;
using fusedattn::ffi_glue::AttnScoreModAttrs;

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_attn_fwd, fusedattn::ffi_glue::attn_fwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_FWD_RESULTS
                                  .Ret<ffi::AnyBuffer>()  // workspace (uint8)
                                  .Attrs<AttnAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_attn_bwd, fusedattn::ffi_glue::attn_bwd_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_BWD_INPUTS
                                  FA_ATTN_BIND_BWD_RESULTS
                                  .Ret<ffi::AnyBuffer>()  // workspace (uint8)
                                  .Attrs<AttnAttrs>());

// score_mod variants: the eleven operands, then score_mod_operands (float32, the array
// operands concatenated), and the program attribute.
XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_attn_fwd_sm, fusedattn::ffi_glue::attn_fwd_sm_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_SM_OPERANDS
                                  FA_ATTN_BIND_FWD_RESULTS
                                  .Ret<ffi::AnyBuffer>()  // workspace (uint8)
                                  .Attrs<AttnScoreModAttrs>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(fa_cuda_attn_bwd_sm, fusedattn::ffi_glue::attn_bwd_sm_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  FA_ATTN_BIND_OPERANDS
                                  FA_ATTN_BIND_SM_OPERANDS
                                  FA_ATTN_BIND_BWD_INPUTS
                                  FA_ATTN_BIND_BWD_RESULTS
                                  .Ret<ffi::AnyBuffer>()  // dscore_mod_operands (f32)
                                  .Ret<ffi::AnyBuffer>()  // workspace (uint8)
                                  .Attrs<AttnScoreModAttrs>());
