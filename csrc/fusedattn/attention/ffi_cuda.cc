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
// kernels select_backend() chose (backend.h): the Hopper kernels (ffi_cuda_hopper.cc), a
// cached cuDNN graph (ffi_cuda_cudnn.cc) or the CUDA flash kernels (here); rows that keep
// nothing get the engine's average (kRequestAverageEmptyRows: cuda/empty_rows.h) around any
// of them. Everything is enqueued on XLA's stream; every temporary is in the workspace.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/cuda/empty_rows.h"
#include "fusedattn/attention/cuda/flash.h"
#include "fusedattn/attention/cuda/keep_mask.h"
#include "fusedattn/attention/ffi_cuda.h"
#include "fusedattn/attention/ffi_cuda_route.h"
#include "fusedattn/attention/options.h"
#include "fusedattn/attention/validate.h"
#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/platform/cuda/platform_info.h"
#include "fusedattn/score_mod/device_program_host.h"

namespace fusedattn::ffi_glue {

namespace cuda_route {

Status memset_async(void* p, size_t bytes, cudaStream_t stream, const char* what) {
  if (!p || bytes == 0) return Status::Ok();
  return cuda::cuda_status(cudaMemsetAsync(p, 0, bytes, stream), what);
}

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

}  // namespace cuda_route

namespace {

using cuda_route::SmArgs;

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
  return cuda::flash::workspace_bytes(p, backward, score_mod) + kRegionAlign - 1;
}

// The flash kernels' workspace, aligned to 256 bytes.
Status flash_workspace_at(const AttnParams& p, bool backward, bool score_mod, ffi::AnyBuffer* workspace,
                          void** at) {
  const size_t need = flash_workspace(p, backward, score_mod);
  if (workspace->size_bytes() < need)
    return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                            " bytes, the CUDA flash kernels need " + std::to_string(need));
  const uintptr_t u = reinterpret_cast<uintptr_t>(workspace->untyped_data());
  *at = reinterpret_cast<void*>(align_region_ptr(u));
  return Status::Ok();
}

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


// kRequestAverageEmptyRows's backward scratch (the forward takes none): the last bytes of
// the workspace (every route's temporaries are at its start; attn_workspace_bytes adds
// these, + the slack of aligning their start).
size_t empty_rows_bytes(const AttnParams& p, bool backward, int32_t flags) {
  return backward && (flags & kRequestAverageEmptyRows) ? cuda::empty_rows_bwd_scratch_bytes(p) + kRegionAlign : 0;
}

void* empty_rows_scratch(const AttnParams& p, ffi::AnyBuffer* workspace) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(workspace->untyped_data()) + workspace->size_bytes();
  return reinterpret_cast<void*>((end - cuda::empty_rows_bwd_scratch_bytes(p)) / kRegionAlign * kRegionAlign);
}

// kRequestMaskKeepOnly's folded bias (cuda/keep_mask.h: q's dtype, the mask's extents) for
// the kernels that add a bias's values: the bytes just before the empty rows' scratch
// (attn_workspace_bytes adds these too).
size_t keep_fold_bytes(const AttnParams& p, int32_t flags) {
  if (!(flags & kRequestMaskKeepOnly) || p.bias_type == FA_NO_BIAS || p.bias_batch == 0) return 0;
  const int64_t n = p.num_slices * p.bias_batch * p.bias_heads * p.seqlen_q * p.seqlen_kv;
  return static_cast<size_t>(n) * (p.dtype == FA_FLOAT32 ? 4 : 2) + kRegionAlign;
}

// t with its keep mask (t.bias_keep) folded into the workspace (every route but the Hopper
// kernels' classification reads values).
Status fold_keep(const AttnParams& p, int32_t flags, bool backward, ffi::AnyBuffer* workspace,
                 cudaStream_t stream, AttnTensors* t) {
  if (!t->bias_keep) return Status::Ok();
  const size_t bytes = keep_fold_bytes(p, flags);
  const size_t tail = empty_rows_bytes(p, backward, flags) + bytes;
  if (bytes == 0 || workspace->size_bytes() < tail)
    return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                            " bytes, the keep mask's fold alone needs " + std::to_string(bytes));
  const uintptr_t end = reinterpret_cast<uintptr_t>(workspace->untyped_data()) + workspace->size_bytes() -
                        empty_rows_bytes(p, backward, flags);
  void* folded = reinterpret_cast<void*>((end - bytes + kRegionAlign) / kRegionAlign * kRegionAlign);
  const int64_t n = p.num_slices * t->bias_slice;
  FA_RETURN_IF_NOT_OK(cuda::fold_keep_mask(static_cast<const uint8_t*>(t->bias), n, p.dtype,
                                           fa_masked_bias_value(p.dtype), folded, stream));
  t->bias = folded;
  t->bias_keep = false;
  return Status::Ok();
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

Status fwd_route(cudaStream_t stream, int device, const AttnParams& p, AttnTensors t,
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
Status fwd_route(cudaStream_t stream, int device, const AttnParams& p, AttnTensors t,
                 ffi::AnyBuffer* workspace, const AttnAttrs& attrs, const SmArgs& sm) {
  const bool want_max = attrs.want_max_logit != 0;
  BackendRequest req;
  req.score_mod = recognize_score_mod(sm.call ? &sm.call->sm : nullptr);
  req.want_max_logit = want_max;
  BackendChoice choice;
  FA_RETURN_IF_NOT_OK(choose(p, device, req, attrs.backend_flags, &choice));
  // The Hopper forward classifies a keep mask's bytes: no fold.
  if (choice.forward != FA_BACKEND_HOPPER_FWD)
    FA_RETURN_IF_NOT_OK(fold_keep(p, attrs.backend_flags, false, workspace, stream, &t));
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
    return cuda_route::hopper_fwd(p, t, sm, req.score_mod, want_max, attrs.backend_flags, device, workspace,
                      stream);
  return cuda_route::cudnn_fwd(stream, device, p, t, workspace, want_max, attrs.want_lse != 0, sm);
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
  // The Hopper backward classifies a keep mask's bytes: no fold.
  if (choice.backward != FA_BACKEND_HOPPER_BWD)
    FA_RETURN_IF_NOT_OK(fold_keep(p, attrs.backend_flags, true, workspace, stream, &t));
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
  // cuDNN and the Hopper backward compute no operand gradient (attention.py takes XLA's), but
  // the Hopper backward's ALiBi slopes' (kRequestScoreModGrads): zeros, the slopes' filled there.
  const int64_t n_dop = sm.call && sm.call->doperands ? p.num_slices * sm.call->sm.total_size() : 0;
  if (n_dop > 0)
    FA_RETURN_IF_NOT_OK(cuda::cuda_status(
        cudaMemsetAsync(sm.call->doperands, 0, size_t(n_dop) * 4, stream), "cudaMemsetAsync(dscore_mod_operands)"));
  if (choice.backward == FA_BACKEND_HOPPER_BWD)
    return cuda_route::hopper_bwd(p, t, dbias->size_bytes(), workspace, device, stream, deterministic,
                                  (attrs.backend_flags & kRequestMaskBias) != 0,
                                  (attrs.backend_flags & kRequestMaskKeepOnly) != 0,
                                  t.dbias && !(attrs.backend_flags & kRequestNoDbias), req.score_mod, sm,
                                  (attrs.backend_flags & kRequestScoreModGrads) != 0);
  FA_RETURN_IF_NOT_OK(refuse_index_base(p, t, sm));
  if (choice.backward != FA_BACKEND_CUDNN)
    return Status::Internal(std::string("the CUDA attention handler runs cuDNN backwards; "
                                        "select_backend chose ") + backend_name(choice.backward));
  return cuda_route::cudnn_bwd(stream, device, p, t, dq, dk, dv, dbias, workspace, deterministic,
                               (attrs.backend_flags & kRequestMaskBias) != 0, sm);
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
  const int64_t hopper = backward ? 0 : static_cast<int64_t>(cuda_route::hopper_fwd_workspace(p, backend_flags));
  // A backward the Hopper kernel can run is sized for it and for cuDNN's or the flash
  // kernels', whichever runs (set_hopper_bwd_override switches compiled functions between
  // them at run time).
  const int64_t hopper_bwd =
      backward && hopper_bwd_unsupported_reason(p, req, info).empty() ? static_cast<int64_t>(cuda_route::hopper_bwd_workspace(p, !req.no_dbias)) : 0;
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
  int64_t cudnn_bytes = 0;
  const Status built = cuda_route::cudnn_workspace_bytes(p, device, want_lse, want_max_logit, backward,
                                                         req.deterministic, sm,
                                                         (backend_flags & kRequestMaskKeepOnly) == 0,
                                                         &cudnn_bytes);
  if (!built.ok() && hopper_bwd > 0 && choice.backward == FA_BACKEND_HOPPER_BWD) {
    *bytes = hopper_bwd;  // cuDNN cannot build it: the Hopper backward's alone
    return Status::Ok();
  }
  FA_RETURN_IF_NOT_OK(built);
  *bytes = std::max(backward ? hopper_bwd : hopper, cudnn_bytes);
  return Status::Ok();
}

}  // namespace

Status attn_workspace_bytes(const AttnParams& p, int device, bool want_lse, bool want_max_logit,
                            bool backward, int32_t backend_flags, int64_t* bytes,
                            const cudnn::ScoreModSpec* sm) {
  FA_RETURN_IF_NOT_OK(route_workspace_bytes(p, device, want_lse, want_max_logit, backward,
                                            backend_flags, bytes, sm));
  *bytes += static_cast<int64_t>(empty_rows_bytes(p, backward, backend_flags) +
                                 keep_fold_bytes(p, backend_flags));
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
