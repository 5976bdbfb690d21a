#include "fusedattn/small_seq/ffi_decode.h"

#include "fusedattn/small_seq/validate.h"

namespace fusedattn::ffi_glue {
namespace {

int64_t product(ffi::AnyBuffer::Dimensions d, size_t n) {
  int64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= d[i];
  return p;
}

bool same_prefix(ffi::AnyBuffer::Dimensions a, ffi::AnyBuffer::Dimensions b, size_t n) {
  if (a.size() < n || b.size() < n) return false;
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// A lengths/offsets array: int32 with dims lead + [n] or lead + [0] (absent).
Status expect_index_array(const char* name, const ffi::AnyBuffer& buf,
                          ffi::AnyBuffer::Dimensions lead, int64_t n, bool* present) {
  const auto d = buf.dimensions();
  const bool ok = buf.element_type() == ffi::DataType::S32 && d.size() == lead.size() + 1 &&
                  same_prefix(d, lead, lead.size()) && (d.back() == n || d.back() == 0);
  if (!ok)
    return Status::Invalid(std::string("small-seq: ") + name + ": got shape " + dims_str(d) +
                           " with dtype code " + std::to_string(static_cast<int>(buf.element_type())) +
                           "; expected int32 " + dims_str(lead) + " + [" + std::to_string(n) +
                           "] (or [0]: absent)");
  *present = d.back() == n && n > 0;
  return Status::Ok();
}

}  // namespace

Status decode_small_seq(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                        const ffi::AnyBuffer& q_lens, const ffi::AnyBuffer& kv_lens,
                        const ffi::AnyBuffer& q_offsets, const ffi::AnyBuffer& kv_offsets,
                        const SmallSeqAttrs& attrs, SmallSeqCall* call) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  const bool thd = attrs.layout == FA_THD_THD_THD;
  const size_t tail = thd ? 3 : 4;  // [T, H, D] or [B, S, H, D]
  const size_t rank = qd.size();
  if (rank < tail)
    return Status::Invalid("small-seq: q: got shape " + dims_str(qd) + "; expected " +
                           (thd ? "[T, H, D]" : "[B, 1, H, D]"));
  if (kd.size() != rank || vd.size() != rank)
    return Status::Invalid("small-seq: k, v: got shapes " + dims_str(kd) + " and " +
                           dims_str(vd) + "; expected the rank of q " + dims_str(qd));
  // Dims shared by q, k and v: the packs (THD) or packs and batch (BSHD).
  const size_t shared = rank - tail + (thd ? 0 : 1);
  if (!same_prefix(qd, kd, shared) || !same_prefix(qd, vd, shared))
    return Status::Invalid("small-seq: q, k, v: leading dimensions differ: " + dims_str(qd) +
                           ", " + dims_str(kd) + ", " + dims_str(vd));
  for (size_t i = shared; i < rank; ++i)
    if (kd[i] != vd[i])
      return Status::Invalid("small-seq: k and v must have the same shape; got k " +
                             dims_str(kd) + ", v " + dims_str(vd));
  const int32_t dt = fa_dtype(q.element_type());
  if (dt < 0 || k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return Status::Invalid("small-seq: dtype: q, k and v must share one dtype among float32, "
                           "bfloat16 and float16");

  SmallSeqParams& p = call->p;
  p = SmallSeqParams{};
  p.dtype = dt;
  p.layout = attrs.layout;
  p.mask_type = attrs.mask_type;
  p.bias_type = FA_NO_BIAS;
  p.softmax_type = FA_VANILLA_SOFTMAX;
  p.window_left = p.window_right = -1;
  p.scale = attrs.scale;
  p.heads_q = qd[rank - 2];
  p.heads_kv = kd[rank - 2];
  p.head_dim_qk = qd[rank - 1];
  p.head_dim_v = vd[rank - 1];
  if (kd[rank - 1] != qd[rank - 1])
    return Status::Invalid("small-seq: q and k must have the same head dim; got q " +
                           dims_str(qd) + ", k " + dims_str(kd));
  // Index arrays are [..., n] over the dims before a segment axis: THD's packs, or
  // BSHD's vmap dims (whose segment axis is the batch).
  const auto seg_lead = qd.first(rank - tail);
  int64_t seg_axis;  // entries of a lengths array along its last axis
  if (thd) {
    p.packs = product(qd, shared);
    p.tokens_q = qd[rank - 3];
    p.tokens_kv = kd[rank - 3];
    const auto od = q_offsets.dimensions();
    seg_axis = od.size() == seg_lead.size() + 1 ? od.back() - 1 : 0;
    if (seg_axis < 1)
      return Status::Invalid("small-seq: q_offsets: got shape " + dims_str(od) +
                             "; expected int32 " + dims_str(seg_lead) +
                             " + [num_segments + 1] with num_segments >= 1");
    p.num_segments = seg_axis;
    p.max_seqlen_q = 1;  // THD's promise of one query per segment is checked per segment
    p.max_seqlen_kv = attrs.max_seqlen_kv;
  } else {
    seg_axis = qd[rank - 4];
    p.packs = 1;
    p.num_segments = product(qd, shared);
    p.max_seqlen_q = qd[rank - 3];
    p.max_seqlen_kv = kd[rank - 3];
    if (attrs.max_seqlen_kv != p.max_seqlen_kv)
      return Status::Invalid("small-seq: max_seqlen_kv attribute " +
                             std::to_string(attrs.max_seqlen_kv) +
                             " differs from the BSHD key length " + std::to_string(p.max_seqlen_kv));
    p.tokens_q = p.num_segments * p.max_seqlen_q;
    p.tokens_kv = p.num_segments * p.max_seqlen_kv;
  }
  bool has_q_offsets = false, has_kv_offsets = false, has_q_lens = false, has_kv_lens = false;
  const int64_t offsets_axis = thd ? seg_axis + 1 : 0;
  Status s = expect_index_array("q_offsets", q_offsets, seg_lead, offsets_axis, &has_q_offsets);
  if (!s.ok()) return s;
  s = expect_index_array("kv_offsets", kv_offsets, seg_lead, offsets_axis, &has_kv_offsets);
  if (!s.ok()) return s;
  if (thd && !(has_q_offsets && has_kv_offsets))
    return Status::Invalid("small-seq: THD_THD_THD needs q_offsets and kv_offsets of " +
                           std::to_string(offsets_axis) + " entries per pack");
  s = expect_index_array("q_seqlens", q_lens, seg_lead, seg_axis, &has_q_lens);
  if (!s.ok()) return s;
  s = expect_index_array("kv_seqlens", kv_lens, seg_lead, seg_axis, &has_kv_lens);
  if (!s.ok()) return s;
  p.has_offsets = thd ? 1 : 0;
  p.has_q_seqlens = has_q_lens;
  p.has_kv_seqlens = has_kv_lens;
  s = small_seq::validate(p);
  if (!s.ok()) return s;

  auto ptr = [](const ffi::AnyBuffer& b, bool present) {
    return present ? static_cast<const int32_t*>(b.untyped_data()) : nullptr;
  };
  call->seg = small_seq::make_segments(p, ptr(q_lens, has_q_lens), ptr(kv_lens, has_kv_lens),
                                       ptr(q_offsets, has_q_offsets),
                                       ptr(kv_offsets, has_kv_offsets));
  call->q_dims = qd;
  return Status::Ok();
}

Status expect_small_seq_aux(const SmallSeqCall& call, const ffi::AnyBuffer& probs,
                            const ffi::AnyBuffer& stats) {
  const SmallSeqParams& p = call.p;
  // Everything before q's [Tq, H, D] (THD) or [B, 1, H, D] (BSHD, whose B is Tq).
  const size_t lead = call.q_dims.size() - (p.layout == FA_THD_THD_THD ? 3 : 4);
  const auto pre = call.q_dims.first(lead);
  const int64_t tq = p.layout == FA_THD_THD_THD ? p.tokens_q : call.q_dims[lead];
  Status s = expect_shape("probs", probs, ffi::DataType::F32, pre, {tq, p.heads_q, 1, p.max_seqlen_kv});
  if (!s.ok()) return s;
  return expect_shape("stats", stats, ffi::DataType::F32, pre, {tq, p.heads_q, 2});
}

Status expect_like(const char* name, const ffi::AnyBuffer& buf, const ffi::AnyBuffer& like) {
  const auto d = buf.dimensions(), l = like.dimensions();
  if (buf.element_type() == like.element_type() && d.size() == l.size() &&
      same_prefix(d, l, l.size()))
    return Status::Ok();
  return Status::Invalid(std::string("small-seq: ") + name + ": got shape " + dims_str(d) +
                         " with dtype code " + std::to_string(static_cast<int>(buf.element_type())) +
                         "; expected " + dims_str(l) + " with dtype code " +
                         std::to_string(static_cast<int>(like.element_type())));
}

}  // namespace fusedattn::ffi_glue
