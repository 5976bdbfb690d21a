#include "fusedattn/attention/ffi_decode.h"

#include <sstream>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/validate.h"

namespace fusedattn::ffi_glue {
namespace {

using Dims = ffi::AnyBuffer::Dimensions;

bool is_empty(const ffi::AnyBuffer& b) { return b.element_count() == 0; }

int64_t product(Dims d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

bool same_dims(Dims a, Dims b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// Pointer `elements` elements past the start of buf.
const void* at(const ffi::AnyBuffer& buf, int64_t elements) {
  return static_cast<const char*>(buf.untyped_data()) + elements * ffi::ByteWidth(buf.element_type());
}
void* at(ffi::AnyBuffer* buf, int64_t elements) {
  return static_cast<char*>(buf->untyped_data()) + elements * ffi::ByteWidth(buf->element_type());
}

Status expect_empty(const char* name, const ffi::AnyBuffer& b, const std::string& why) {
  if (is_empty(b)) return Status::Ok();
  return Status::Invalid(std::string(name) + ": got shape " + dims_str(b.dimensions()) +
                         "; expected an empty array (" + why + ")");
}

// `got` must have the dims and dtype of `like` (a gradient and its operand).
Status expect_like(const char* name, const ffi::AnyBuffer& got, const char* like_name,
                   const ffi::AnyBuffer& like) {
  if (same_dims(got.dimensions(), like.dimensions()) && got.element_type() == like.element_type())
    return Status::Ok();
  return Status::Invalid(std::string(name) + ": got shape " + dims_str(got.dimensions()) +
                         "; expected the shape and dtype of " + like_name + " " +
                         dims_str(like.dimensions()));
}

constexpr const char* kDtypeError =
    "dtype: q, k and v must share one dtype among float32, bfloat16, float16 and float64";

Status shape_error(const char* name, const ffi::AnyBuffer& b, const std::string& expected) {
  return Status::Invalid(std::string(name) + ": got shape " + dims_str(b.dimensions()) +
                         "; expected " + expected);
}

}  // namespace

ffi::DataType stat_dtype(const AttnParams& p) {
  return p.dtype == FA_FLOAT64 ? ffi::DataType::F64 : ffi::DataType::F32;
}

Status decode_operands(const AttnOperands& in, const AttnAttrs& attrs, AttnParams* p,
                       AttnTensors* t) {
  if (attrs.layout < FA_BS3HD || attrs.layout > FA_THD_THD_THD)
    return Status::Invalid("qkv_layout: got code " + std::to_string(attrs.layout) +
                           ", not a QKVLayout");
  const bool qkv_packed = is_qkv_packed(attrs.layout), kv_packed = is_kv_packed(attrs.layout);
  const std::string layout = std::string("qkv_layout=") + layout_name(attrs.layout);
  const ffi::AnyBuffer &q = *in.q, &k = *in.k, &v = *in.v;
  const Dims qd = q.dimensions();
  const size_t tail = qkv_packed ? 4 : 3;
  if (qd.size() < tail + 1)
    return shape_error("q", q, std::string(qkv_packed ? "qkv [B, S, 3, H, D]" : "[B, Sq, Hq, D]") +
                                   " (" + layout + ")");
  const size_t nlead = qd.size() - tail;
  const Dims lead = qd.first(nlead), vlead = qd.first(nlead - 1);
  const int32_t dt = fa_dtype(q.element_type());
  if (dt < 0)
    return Status::Invalid(kDtypeError);

  *p = AttnParams{};
  if (qkv_packed) {
    if (qd[nlead + 1] != 3) return shape_error("q", q, "qkv [B, S, 3, H, D] (" + layout + ")");
    FA_RETURN_IF_NOT_OK(expect_empty("k", k, "k lives in qkv with " + layout));
    FA_RETURN_IF_NOT_OK(expect_empty("v", v, "v lives in qkv with " + layout));
    p->seqlen_q = p->seqlen_kv = qd[nlead];
    p->heads_q = p->heads_kv = qd[nlead + 2];
    p->head_dim_qk = p->head_dim_v = qd[nlead + 3];
  } else {
    p->seqlen_q = qd[nlead];
    p->heads_q = qd[nlead + 1];
    p->head_dim_qk = qd[nlead + 2];
    const Dims kd = k.dimensions();
    if (kv_packed) {
      FA_RETURN_IF_NOT_OK(expect_empty("v", v, "v lives in kv with " + layout));
      if (kd.size() != nlead + 4 || !same_dims(kd.first(nlead), lead) || kd[nlead + 1] != 2)
        return shape_error("k", k, "kv [B, Skv, 2, Hkv, D] with q's batch dims " +
                                       dims_str(lead) + " (" + layout + ")");
      p->seqlen_kv = kd[nlead];
      p->heads_kv = kd[nlead + 2];
      p->head_dim_v = kd[nlead + 3];
      if (kd[nlead + 3] != p->head_dim_qk)
        return Status::Invalid("q, kv: head dims must match: q " + dims_str(qd) + ", kv " +
                               dims_str(kd));
    } else {
      const Dims vd = v.dimensions();
      if (kd.size() != qd.size() || vd.size() != qd.size())
        return Status::Invalid("k, v: got shapes " + dims_str(kd) + " and " + dims_str(vd) +
                               "; expected the same rank as q " + dims_str(qd));
      if (!same_dims(kd.first(nlead), lead) || !same_dims(vd.first(nlead), lead))
        return Status::Invalid("q, k, v: batch dimensions differ: " + dims_str(qd) + ", " +
                               dims_str(kd) + ", " + dims_str(vd));
      if (kd[nlead] != vd[nlead] || kd[nlead + 1] != vd[nlead + 1])
        return Status::Invalid("k, v: sequence length and heads must match: k " + dims_str(kd) +
                               ", v " + dims_str(vd));
      if (kd[nlead + 2] != p->head_dim_qk)
        return Status::Invalid("q, k: head dims must match: q " + dims_str(qd) + ", k " +
                               dims_str(kd));
      p->seqlen_kv = kd[nlead];
      p->heads_kv = kd[nlead + 1];
      p->head_dim_v = vd[nlead + 2];
      if (v.element_type() != q.element_type())
        return Status::Invalid(kDtypeError);
    }
    if (k.element_type() != q.element_type())
      return Status::Invalid(kDtypeError);
  }

  // Sequence descriptor: seqlens [L, M], offsets [L, M + 1].
  const ffi::AnyBuffer &ql = *in.q_seqlens, &kl = *in.kv_seqlens;
  const Dims qld = ql.dimensions();
  if (qld.size() != nlead + 1 || !same_dims(qld.first(nlead), lead) ||
      ql.element_type() != ffi::DataType::S32 || qld[nlead] < 1)
    return shape_error("q_seqlens", ql, "int32 " + dims_str(lead) + " + [M] (M >= 1)");
  const int64_t M = qld[nlead];
  FA_RETURN_IF_NOT_OK(expect_shape("kv_seqlens", kl, ffi::DataType::S32, lead, {M}));
  FA_RETURN_IF_NOT_OK(expect_shape("q_offsets", *in.q_offsets, ffi::DataType::S32, lead, {M + 1}));
  FA_RETURN_IF_NOT_OK(expect_shape("kv_offsets", *in.kv_offsets, ffi::DataType::S32, lead, {M + 1}));

  // Bias [V, 1|B, 1|Hq, Sq, Skv].
  const ffi::AnyBuffer& bias = *in.bias;
  if (!is_empty(bias)) {
    const Dims bd = bias.dimensions();
    if (bd.size() != nlead + 3 || !same_dims(bd.first(nlead - 1), vlead) ||
        bd[nlead + 1] != p->seqlen_q || bd[nlead + 2] != p->seqlen_kv)
      return shape_error("bias", bias, "[1 or B, 1 or Hq, " + std::to_string(p->seqlen_q) + ", " +
                                           std::to_string(p->seqlen_kv) + "] after the vmap dims " +
                                           dims_str(vlead));
    const bool keep = (attrs.backend_flags & kRequestMaskKeepOnly) != 0;
    if (keep && !(attrs.backend_flags & kRequestMaskBias))
      return Status::Invalid("backend_flags: kRequestMaskKeepOnly (a boolean keep mask as the "
                             "bias) needs kRequestMaskBias beside it");
    if (keep && bias.element_type() != ffi::DataType::PRED)
      return Status::Invalid("bias: dtype code " + std::to_string(int(bias.element_type())) +
                             "; with kRequestMaskKeepOnly the bias is a boolean mask (bool)");
    if (!keep && bias.element_type() != q.element_type())
      return Status::Invalid("bias: dtype code " + std::to_string(int(bias.element_type())) +
                             "; the bias must have q's dtype");
    p->bias_batch = bd[nlead - 1];
    p->bias_heads = bd[nlead];
  }

  p->batch = product(lead);
  p->num_slices = product(vlead);
  p->max_segments = M;
  p->dtype = dt;
  p->layout = attrs.layout;
  p->mask_type = attrs.mask_type;
  p->bias_type = attrs.bias_type;
  p->softmax_type = attrs.softmax_type;
  p->is_training = attrs.is_training;
  p->scale = static_cast<float>(attrs.scale);
  p->dropout = static_cast<float>(attrs.dropout);
  p->window_left = attrs.window_left;
  p->window_right = attrs.window_right;
  FA_RETURN_IF_NOT_OK(validate(*p));

  const ffi::AnyBuffer& offset = *in.softmax_offset;
  if (p->softmax_type == FA_LEARNABLE_SOFTMAX) {
    FA_RETURN_IF_NOT_OK(expect_shape("softmax_offset", offset, stat_dtype(*p), vlead, {p->heads_q}));
  } else {
    FA_RETURN_IF_NOT_OK(expect_empty("softmax_offset", offset,
                                    "only softmax_type=LEARNABLE_SOFTMAX reads softmax_offset"));
  }
  if (has_dropout(*p))
    FA_RETURN_IF_NOT_OK(expect_shape("seed", *in.seed, ffi::DataType::U32, vlead, {2}));
  const ffi::AnyBuffer& index_base = *in.index_base;
  int64_t index_cols = 0;
  if (!is_empty(index_base)) {
    const Dims id = index_base.dimensions();
    if (id.size() == nlead && same_dims(id.first(nlead - 1), vlead)) index_cols = id[nlead - 1];
    if (index_base.element_type() != ffi::DataType::S32 ||
        (index_cols != 2 && index_cols != 6 && index_cols != 8))
      return shape_error("index_base", index_base,
                         "int32 " + (vlead.size() ? dims_str(vlead) + " + " : std::string()) +
                             "[2] (batch_base, head_base) or [6] (batch_base, head_base, q_pos, "
                             "kv_pos, q_extent, kv_extent) or [8] (.., stripe, stride), or an "
                             "empty array");
  }

  *t = AttnTensors{};
  const int64_t H = p->heads_q, D = p->head_dim_qk;
  if (qkv_packed) {
    const ViewStrides s{p->seqlen_q * 3 * H * D, 3 * H * D, D};
    t->q = at(q, 0);
    t->k = at(q, H * D);
    t->v = at(q, 2 * H * D);
    t->sq = t->sk = t->sv = s;
  } else {
    t->q = q.untyped_data();
    t->sq = {p->seqlen_q * H * D, H * D, D};
    const int64_t Hkv = p->heads_kv;
    if (kv_packed) {
      const ViewStrides s{p->seqlen_kv * 2 * Hkv * D, 2 * Hkv * D, D};
      t->k = at(k, 0);
      t->v = at(k, Hkv * D);
      t->sk = t->sv = s;
    } else {
      t->k = k.untyped_data();
      t->v = v.untyped_data();
      t->sk = {p->seqlen_kv * Hkv * D, Hkv * D, D};
      t->sv = {p->seqlen_kv * Hkv * p->head_dim_v, Hkv * p->head_dim_v, p->head_dim_v};
    }
  }
  if (p->bias_type != FA_NO_BIAS) {
    t->bias = bias.untyped_data();
    t->bias_keep = (attrs.backend_flags & kRequestMaskKeepOnly) != 0;
    t->bias_s = p->seqlen_kv;
    const int64_t plane = p->seqlen_q * p->seqlen_kv;
    t->bias_h = p->bias_heads > 1 ? plane : 0;
    t->bias_b = p->bias_batch > 1 ? p->bias_heads * plane : 0;
    t->bias_slice = p->bias_batch * p->bias_heads * plane;
  }
  if (p->softmax_type == FA_LEARNABLE_SOFTMAX) t->softmax_offset = static_cast<const float*>(offset.untyped_data());
  if (has_dropout(*p)) t->seed = static_cast<const uint32_t*>(in.seed->untyped_data());
  t->q_seqlens = static_cast<const int32_t*>(ql.untyped_data());
  t->kv_seqlens = static_cast<const int32_t*>(kl.untyped_data());
  t->q_offsets = static_cast<const int32_t*>(in.q_offsets->untyped_data());
  t->kv_offsets = static_cast<const int32_t*>(in.kv_offsets->untyped_data());
  if (!is_empty(index_base)) {
    t->index_base = static_cast<const int32_t*>(index_base.untyped_data());
    t->index_cols = index_cols;
  }
  t->so = {p->seqlen_q * H * p->head_dim_v, H * p->head_dim_v, p->head_dim_v};
  t->slse = is_thd(p->layout) ? ViewStrides{p->seqlen_q * H, H, 1} : ViewStrides{H * p->seqlen_q, 1, p->seqlen_q};
  return Status::Ok();
}

Status check_index_base(const AttnParams& p, const AttnTensors& t, const ScoreMod* sm) {
  FA_RETURN_IF_NOT_OK(validate_index_base(p, t.index_base, t.index_cols));
  if (!sm || !t.index_base || t.index_cols == 2 || !is_thd(p.layout)) return Status::Ok();
  // THD operands are tables indexed by the position in the segment, which a block's
  // local tokens do not bound.
  for (int32_t k = 0; k < sm->n_operands; ++k)
    if (sm->shape[k][2] != 1 || sm->shape[k][3] != 1)
      return Status::Invalid(
          "score_mod_operands: operand " + std::to_string(k) + " has shape [" +
          std::to_string(sm->shape[k][0]) + ", " + std::to_string(sm->shape[k][1]) + ", " +
          std::to_string(sm->shape[k][2]) + ", " + std::to_string(sm->shape[k][3]) +
          "]; a THD block (index_base with positions) takes operands without a query or key "
          "dim ([1|B, 1|Hq, 1, 1]): THD operands are read at the position in the segment");
  return Status::Ok();
}

double empty_row_threshold(int32_t dtype) { return 0.5 * fa_masked_bias_value(dtype); }

namespace {

Dims lead_dims(const AttnParams& p, const AttnOperands& in) {
  const Dims qd = in.q->dimensions();
  return qd.first(qd.size() - (is_qkv_packed(p.layout) ? 4 : 3));
}

Status check_out_and_lse(const AttnParams& p, const AttnOperands& in, const ffi::AnyBuffer& out,
                         const ffi::AnyBuffer& lse) {
  const Dims lead = lead_dims(p, in);
  FA_RETURN_IF_NOT_OK(expect_shape("out", out, in.q->element_type(), lead,
                                  {p.seqlen_q, p.heads_q, p.head_dim_v}));
  if (is_thd(p.layout))
    return expect_shape("softmax_aux", lse, stat_dtype(p), lead, {p.seqlen_q, p.heads_q});
  return expect_shape("softmax_aux", lse, stat_dtype(p), lead, {p.heads_q, p.seqlen_q});
}

}  // namespace

Status decode_fwd_results(const AttnParams& p, const AttnOperands& in, ffi::AnyBuffer* out,
                          ffi::AnyBuffer* lse, ffi::AnyBuffer* max_logit, AttnTensors* t) {
  FA_RETURN_IF_NOT_OK(check_out_and_lse(p, in, *out, *lse));
  FA_RETURN_IF_NOT_OK(expect_shape("max_logit", *max_logit, stat_dtype(p), lead_dims(p, in), {p.heads_q}));
  t->out = out->untyped_data();
  t->lse = static_cast<float*>(lse->untyped_data());
  t->max_logit = static_cast<float*>(max_logit->untyped_data());
  return Status::Ok();
}

Status decode_bwd_buffers(const AttnParams& p, const AttnOperands& in, const ffi::AnyBuffer& out,
                          const ffi::AnyBuffer& dout, const ffi::AnyBuffer& lse,
                          ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv,
                          ffi::AnyBuffer* dbias, ffi::AnyBuffer* dsoftmax_offset, AttnTensors* t) {
  FA_RETURN_IF_NOT_OK(check_out_and_lse(p, in, out, lse));
  FA_RETURN_IF_NOT_OK(expect_like("dout", dout, "out", out));
  FA_RETURN_IF_NOT_OK(expect_like("dq", *dq, "q", *in.q));
  FA_RETURN_IF_NOT_OK(expect_like("dk", *dk, "k", *in.k));
  FA_RETURN_IF_NOT_OK(expect_like("dv", *dv, "v", *in.v));
  FA_RETURN_IF_NOT_OK(expect_like("dbias", *dbias, "bias", *in.bias));
  if (t->softmax_offset)
    FA_RETURN_IF_NOT_OK(expect_shape("dsoftmax_offset", *dsoftmax_offset, stat_dtype(p),
                                    lead_dims(p, in), {p.heads_q}));
  else
    FA_RETURN_IF_NOT_OK(expect_empty("dsoftmax_offset", *dsoftmax_offset, "there is no softmax_offset"));

  t->out = const_cast<void*>(out.untyped_data());
  t->lse = static_cast<float*>(const_cast<void*>(lse.untyped_data()));
  t->dout = dout.untyped_data();
  t->sdo = t->so;
  const int64_t H = p.heads_q, D = p.head_dim_qk, Hkv = p.heads_kv;
  if (is_qkv_packed(p.layout)) {
    t->dq = at(dq, 0);
    t->dk = at(dq, H * D);
    t->dv = at(dq, 2 * H * D);
  } else if (is_kv_packed(p.layout)) {
    t->dq = dq->untyped_data();
    t->dk = at(dk, 0);
    t->dv = at(dk, Hkv * D);
  } else {
    t->dq = dq->untyped_data();
    t->dk = dk->untyped_data();
    t->dv = dv->untyped_data();
  }
  t->sdq = t->sq;
  t->sdk = t->sk;
  t->sdv = t->sv;
  // A keep mask takes no gradient: its dbias (a boolean array of its shape) is not written.
  t->dbias = t->bias && !t->bias_keep ? dbias->untyped_data() : nullptr;
  t->dsoftmax_offset = t->softmax_offset ? static_cast<float*>(dsoftmax_offset->untyped_data()) : nullptr;
  return Status::Ok();
}

Status decode_score_mod_call(const AttnParams& p, ffi::Span<const int32_t> program,
                             const ffi::AnyBuffer& operands, ffi::AnyBuffer* doperands,
                             ScoreModCall* c) {
  const int64_t ext[4] = {slice_batch(p), p.heads_q, p.seqlen_q, p.seqlen_kv};
  FA_RETURN_IF_NOT_OK(decode_score_mod(program.begin(), static_cast<int64_t>(program.size()), ext,
                                       &c->sm));
  const int64_t want = p.num_slices * c->sm.total_size();
  if (operands.element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(operands.element_count()) != want)
    return Status::Invalid("score_mod_operands: expected float32 with " + std::to_string(want) +
                           " elements (the concatenated operands per vmap slice); got " +
                           std::to_string(operands.element_count()));
  c->operands = static_cast<const float*>(operands.untyped_data());
  if (doperands) {
    if (doperands->element_type() != ffi::DataType::F32 ||
        static_cast<int64_t>(doperands->element_count()) != want)
      return Status::Invalid("dscore_mod_operands: expected float32 with " + std::to_string(want) +
                             " elements");
    c->doperands = static_cast<float*>(doperands->untyped_data());
  }
  return Status::Ok();
}


}  // namespace fusedattn::ffi_glue
