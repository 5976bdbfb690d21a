#include "attn_decode.h"

#include <sstream>

#include "../validate.h"

namespace fusedattn::ffi_glue {
namespace {

std::string dims_str(const ffi::AnyBuffer::Dimensions& d) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < d.size(); ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

int32_t fa_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return FA_FLOAT32;
    case ffi::DataType::BF16: return FA_BFLOAT16;
    case ffi::DataType::F16: return FA_FLOAT16;
    default: return -1;
  }
}

}  // namespace

ffi::DataType ffi_dtype(int32_t fa) {
  switch (fa) {
    case FA_BFLOAT16: return ffi::DataType::BF16;
    case FA_FLOAT16: return ffi::DataType::F16;
    default: return ffi::DataType::F32;
  }
}

ffi::Error to_ffi_error(const Status& s) {
  if (s.ok()) return ffi::Error::Success();
  const auto code = s.code == FA_UNIMPLEMENTED ? ffi::ErrorCode::kUnimplemented
                                               : ffi::ErrorCode::kInvalidArgument;
  return ffi::Error(code, "fusedattn: " + s.message);
}

Status expect_shape(const char* name, const ffi::AnyBuffer& buf, ffi::DataType dtype,
                    const ffi::AnyBuffer::Dimensions& lead, std::initializer_list<int64_t> tail) {
  const auto d = buf.dimensions();
  bool ok = buf.element_type() == dtype && d.size() == lead.size() + tail.size();
  for (size_t i = 0; ok && i < lead.size(); ++i) ok = d[i] == lead[i];
  size_t i = lead.size();
  for (int64_t t : tail) ok = ok && d[i++] == t;
  if (ok) return Status::Ok();
  std::ostringstream os;
  os << name << ": got shape " << dims_str(d) << " with dtype code "
     << static_cast<int>(buf.element_type()) << "; expected leading dims " << dims_str(lead)
     << " then [";
  i = 0;
  for (int64_t t : tail) os << (i++ ? ", " : "") << t;
  os << "] with dtype code " << static_cast<int>(dtype);
  return Status::Invalid(os.str());
}

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
