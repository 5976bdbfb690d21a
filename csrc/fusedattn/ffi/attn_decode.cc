#include "attn_decode.h"

#include "../validate.h"

namespace fusedattn::ffi_glue {

Status decode_params(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                     const ffi::AnyBuffer& q_lens, const ffi::AnyBuffer& kv_lens,
                     const AttnAttrs& attrs, AttnParams* p) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  const size_t rank = qd.size();
  if (rank < 4)
    return Status::Invalid("q: got shape " + dims_str(qd) + "; expected [B, Sq, H, D] (rank >= 4)");
  if (kd.size() != rank || vd.size() != rank)
    return Status::Invalid("k, v: got shapes " + dims_str(kd) + " and " + dims_str(vd) +
                           "; expected the same rank as q " + dims_str(qd));
  const auto lead = qd.first(rank - 3);
  int64_t batch = 1;
  for (size_t i = 0; i < rank - 3; ++i) {
    if (kd[i] != qd[i] || vd[i] != qd[i])
      return Status::Invalid("q, k, v: batch dimensions differ: " + dims_str(qd) + ", " +
                             dims_str(kd) + ", " + dims_str(vd));
    batch *= qd[i];
  }
  if (kd[rank - 3] != vd[rank - 3] || kd[rank - 2] != vd[rank - 2])
    return Status::Invalid("k, v: sequence length and heads must match: k " + dims_str(kd) +
                           ", v " + dims_str(vd));
  if (kd[rank - 1] != qd[rank - 1])
    return Status::Invalid("q, k: head dims must match: q " + dims_str(qd) + ", k " + dims_str(kd));
  const int32_t dt = fa_dtype(q.element_type());
  if (dt < 0 || k.element_type() != q.element_type() || v.element_type() != q.element_type())
    return Status::Invalid("dtype: q, k and v must share one dtype among float32, bfloat16 and "
                           "float16");
  for (auto* lens : {&q_lens, &kv_lens}) {
    Status s = expect_shape(lens == &q_lens ? "q_seqlens" : "kv_seqlens", *lens,
                            ffi::DataType::S32, lead, {});
    if (!s.ok()) return s;
  }

  *p = AttnParams{};
  p->batch = batch;
  p->seqlen_q = qd[rank - 3];
  p->heads_q = qd[rank - 2];
  p->head_dim_qk = qd[rank - 1];
  p->seqlen_kv = kd[rank - 3];
  p->heads_kv = kd[rank - 2];
  p->head_dim_v = vd[rank - 1];
  p->dtype = dt;
  p->layout = attrs.layout;
  p->mask_type = attrs.mask_type;
  p->bias_type = attrs.bias_type;
  p->softmax_type = attrs.softmax_type;
  p->is_training = attrs.is_training;
  p->scale = attrs.scale;
  p->dropout = attrs.dropout;
  p->window_left = attrs.window_left;
  p->window_right = attrs.window_right;
  return validate(*p);
}

}  // namespace fusedattn::ffi_glue
