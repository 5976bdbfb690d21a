// The CUDA attention handlers' cuDNN route (ffi_cuda_route.h): a cached SDPA graph
// (attention/cudnn) per slice of the call, its operands bound by uid, its temporaries (and
// the sequence tensors, max / sum-exp, sinks and fixed lse it reads) in the workspace.
#include <memory>
#include <unordered_map>

#include "fusedattn/attention/ffi_cuda_route.h"
#include "fusedattn/attention/mask.h"
#include "fusedattn/platform/cuda/check.h"

namespace fusedattn::ffi_glue::cuda_route {
namespace {

using cudnn::SdpaConfig;
using Pack = std::unordered_map<int64_t, void*>;

template <class T>
T* offset(T* p, int64_t elements, int64_t elem_bytes) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return p ? reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + elements * elem_bytes) : nullptr;
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

// Binds slice s's score_mod operands (their graph uids) into the pack.
void bind_sm_operands(const SmArgs& sm, int64_t s, Pack& pack) {
  if (!sm.call) return;
  const ScoreMod& m = sm.call->sm;
  for (int32_t i = 0; i < m.n_operands; ++i)
    pack[cudnn::kScoreModOperand + i] =
        const_cast<float*>(sm.call->operands + s * m.total_size() + m.offset(i));
}

// Slice s's (rows from r0) operands that the forward's and the backward's graphs share: Q,
// K, V and O, the bias, dropout's seed, the sink (sink: the off-by-one sink's zeros in
// scratch) and the score_mod's operands. cuDNN serves bf16 / fp16 only (2-byte elements).
void bind_slice(const AttnParams& p, const SdpaConfig& c, const AttnTensors& t, const SmArgs& sm,
                int64_t s, int64_t r0, float* sink, Pack& pack) {
  constexpr int64_t eb = 2;
  pack[cudnn::kQ] = const_cast<void*>(offset(t.q, r0 * c.q.b, eb));
  pack[cudnn::kK] = const_cast<void*>(offset(t.k, r0 * c.k.b, eb));
  pack[cudnn::kV] = const_cast<void*>(offset(t.v, r0 * c.v.b, eb));
  pack[cudnn::kO] = offset(t.out, r0 * c.o.b, eb);
  if (c.bias) pack[cudnn::kBias] = const_cast<void*>(offset(t.bias, s * t.bias_slice, eb));
  if (c.dropout > 0.0f) pack[cudnn::kSeed] = const_cast<uint32_t*>(t.seed + 2 * s);
  if (p.softmax_type == FA_LEARNABLE_SOFTMAX)
    pack[cudnn::kSink] = const_cast<float*>(t.softmax_offset + p.heads_q * s);
  if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) pack[cudnn::kSink] = sink;
  bind_sm_operands(sm, s, pack);
}

}  // namespace

Status cudnn_workspace_bytes(const AttnParams& p, int device, bool want_lse, bool want_max_logit,
                             bool backward, bool deterministic, const cudnn::ScoreModSpec* sm,
                             bool dbias, int64_t* bytes) {
  SdpaConfig c = backward ? cudnn::make_bwd_config(p, deterministic, sm)
                          : cudnn::make_config(p, want_max_logit, want_lse, sm);
  if (backward) c.dbias = dbias;
  std::shared_ptr<const cudnn::BuiltGraph> g;
  FA_RETURN_IF_NOT_OK(cudnn::get_graph(c, backward, device, &g));
  *bytes = static_cast<int64_t>(backward ? BwdPlan(p, c, *g).plan.bytes() : FwdPlan(p, c, *g).plan.bytes());
  return Status::Ok();
}

Status cudnn_fwd(cudaStream_t stream, int device, const AttnParams& p, const AttnTensors& t,
                 ffi::AnyBuffer* workspace, bool want_max, bool want_lse, const SmArgs& sm) {
  const SdpaConfig c = cudnn::make_config(p, want_max, want_lse, sm.get());
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

  for (int64_t s = 0; s < slices; ++s) {
    const int64_t r0 = s * rows;
    Pack pack;
    bind_slice(p, c, t, sm, s, r0, plan.at<float>(sink_at), pack);
    if (c.gen_stats) pack[cudnn::kStats] = offset(t.lse, r0 * c.lse.b, 4);
    if (c.max_sum) {
      pack[cudnn::kMax] = plan.at<float>(max_at) + r0 * c.lse.b;
      pack[cudnn::kSumExp] = plan.at<float>(sum_at) + r0 * c.lse.b;
    }
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

Status cudnn_bwd(cudaStream_t stream, int device, const AttnParams& p, const AttnTensors& t,
                 ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv, ffi::AnyBuffer* dbias,
                 ffi::AnyBuffer* workspace, bool deterministic, bool mask_bias, const SmArgs& sm) {
  SdpaConfig c = cudnn::make_bwd_config(p, deterministic, sm.get());
  c.dbias = t.dbias != nullptr;  // none for a keep mask's fold
  std::shared_ptr<const cudnn::BuiltGraph> g;
  FA_RETURN_IF_NOT_OK(cudnn::get_graph(c, /*backward=*/true, device, &g));

  const int64_t slices = cudnn::graph_per_slice(p, sm.get()) ? p.num_slices : 1;
  const int64_t rows = p.batch / slices, H = p.heads_q;
  const int64_t n_lse = p.batch * H * p.seqlen_q;
  // (The Hopper forward drops a folded mask's keys: rows it empties have lse -inf.)
  const bool fix_lse =
      cudnn::rows_may_be_empty(p) || (t.bias && mask_bias);
  const BwdPlan bp(p, c, *g);
  ScratchPlan plan = bp.plan;
  const size_t ws = bp.ws, lse_at = bp.lse_at, sink_at = bp.sink_at;
  const SeqScratch& seq = bp.seq;
  FA_RETURN_IF_NOT_OK(plan.bind(workspace));

  // cuDNN writes no gradient for padding and THD gaps: those stay zero.
  if (c.padding || c.ragged) {
    for (ffi::AnyBuffer* b : {dq, dk, dv, c.dbias ? dbias : nullptr})
      if (b)
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
    bind_slice(p, c, t, sm, s, r0, plan.at<float>(sink_at), pack);
    pack[cudnn::kDO] = const_cast<void*>(offset(t.dout, r0 * c.o.b, eb));
    pack[cudnn::kStats] = const_cast<float*>(lse_in) + r0 * c.lse.b;
    pack[cudnn::kDQ] = offset(t.dq, r0 * c.q.b, eb);
    pack[cudnn::kDK] = offset(t.dk, r0 * c.k.b, eb);
    pack[cudnn::kDV] = offset(t.dv, r0 * c.v.b, eb);
    if (c.bias && c.dbias) pack[cudnn::kDBias] = offset(t.dbias, s * t.bias_slice, eb);
    if (p.softmax_type == FA_LEARNABLE_SOFTMAX) pack[cudnn::kDSink] = t.dsoftmax_offset + H * r0;
    if (p.softmax_type == FA_OFF_BY_ONE_SOFTMAX)  // the constant's gradient: discarded
      pack[cudnn::kDSink] = plan.at<float>(sink_at) + H;
    FA_RETURN_IF_NOT_OK(seq.prepare(p, c, t, r0, rows, plan, stream, pack));
    FA_RETURN_IF_NOT_OK(cudnn::execute(*g, device, stream, std::move(pack), plan.at<void>(ws)));
  }
  return Status::Ok();
}

}  // namespace fusedattn::ffi_glue::cuda_route
