#include "fusedattn/softmax/ffi_decode.h"

#include <sstream>

#include "fusedattn/softmax/validate.h"

namespace fusedattn::ffi_glue {
namespace {

// Returns a failed Status from the enclosing Status-returning function.
#define FA_RETURN_IF_NOT_OK(expr)        \
  do {                                   \
    ::fusedattn::Status _fa_st = (expr); \
    if (!_fa_st.ok()) return _fa_st;     \
  } while (0)

Status fill_dims(const char* name, const ffi::AnyBuffer& buf, int64_t* dims, int32_t* rank) {
  const auto d = buf.dimensions();
  if (d.size() < 2 || d.size() > FA_SOFTMAX_MAX_RANK) {
    std::ostringstream os;
    os << name << ": got shape " << dims_str(d) << "; allowed rank 2.." << FA_SOFTMAX_MAX_RANK
       << " ([..., q_seqlen, kv_seqlen])";
    return Status::Invalid(os.str());
  }
  for (size_t i = 0; i < d.size(); ++i) dims[i] = d[i];
  *rank = static_cast<int32_t>(d.size());
  return Status::Ok();
}

Status get_arg(const ffi::RemainingArgs& rest, size_t i, const char* name, ffi::AnyBuffer* out) {
  auto buf = rest.get<ffi::AnyBuffer>(i);
  if (!buf.has_value()) return Status::Invalid(std::string(name) + ": not a buffer");
  *out = *buf;
  return Status::Ok();
}

// The optional trailing out_init: the output's shape and dtype, and its memory.
Status check_out_init(const ffi::RemainingArgs& rest, size_t first, const ffi::AnyBuffer& out,
                      const char* out_name) {
  if (rest.size() == first) return Status::Ok();
  if (rest.size() > first + 1) {
    std::ostringstream os;
    os << "got " << rest.size() - first << " arguments after the inputs; allowed: at most one "
       << "(out_init, aliased to " << out_name << ")";
    return Status::Invalid(os.str());
  }
  ffi::AnyBuffer init = out;
  FA_RETURN_IF_NOT_OK(get_arg(rest, first, "out_init", &init));
  FA_RETURN_IF_NOT_OK(expect_shape("out_init", init, out.element_type(), out.dimensions(), {}));
  if (init.untyped_data() != out.untyped_data())
    return Status::Invalid(std::string("out_init: must be aliased to ") + out_name +
                           " (input_output_aliases)");
  return Status::Ok();
}

SoftmaxParams base_params(int32_t softmax_type, float scale) {
  SoftmaxParams p{};
  p.softmax_type = softmax_type;
  p.scale = scale;
  return p;
}

}  // namespace

Status decode_softmax_fwd(const ffi::AnyBuffer& x, const ffi::RemainingArgs& rest,
                          const ffi::AnyBuffer& y, int32_t softmax_type, float scale,
                          SoftmaxFwdCall* call) {
  SoftmaxParams p = base_params(softmax_type, scale);
  FA_RETURN_IF_NOT_OK(fill_dims("logits", x, p.dims, &p.rank));
  p.dtype = fa_dtype(x.element_type());
  const bool masked = softmax_type == FA_SOFTMAX_SCALED_MASKED;
  ffi::AnyBuffer mask = x;
  if (masked && rest.size() > 0) {
    FA_RETURN_IF_NOT_OK(get_arg(rest, 0, "mask", &mask));
    if (mask.element_type() != ffi::DataType::PRED)
      return Status::Invalid("mask: got dtype code " +
                             std::to_string(static_cast<int>(mask.element_type())) +
                             "; must be bool (True = masked out)");
    int32_t mask_rank = 0;
    FA_RETURN_IF_NOT_OK(fill_dims("mask", mask, p.mask_dims, &mask_rank));
    if (mask_rank != p.rank)
      return Status::Invalid("mask: got shape " + dims_str(mask.dimensions()) + " for logits " +
                             dims_str(x.dimensions()) + "; the ranks must be equal");
    p.has_mask = 1;
  }
  FA_RETURN_IF_NOT_OK(softmax::validate(p));
  FA_RETURN_IF_NOT_OK(expect_shape("y", y, x.element_type(), x.dimensions(), {}));
  FA_RETURN_IF_NOT_OK(check_out_init(rest, masked ? 1 : 0, y, "y"));
  call->p = p;
  call->x = x.untyped_data();
  call->mask = masked ? static_cast<const uint8_t*>(mask.untyped_data()) : nullptr;
  call->y = y.untyped_data();
  return Status::Ok();
}

Status decode_softmax_bwd(const ffi::AnyBuffer& y, const ffi::AnyBuffer& dy,
                          const ffi::RemainingArgs& rest, const ffi::AnyBuffer& dx,
                          int32_t softmax_type, float scale, SoftmaxBwdCall* call) {
  // The backward reads y, which is already 0 where the mask was: no mask needed.
  if (softmax_type == FA_SOFTMAX_SCALED_MASKED) softmax_type = FA_SOFTMAX_SCALED;
  SoftmaxParams p = base_params(softmax_type, scale);
  FA_RETURN_IF_NOT_OK(fill_dims("softmax_output", y, p.dims, &p.rank));
  p.dtype = fa_dtype(y.element_type());
  FA_RETURN_IF_NOT_OK(softmax::validate(p));
  FA_RETURN_IF_NOT_OK(expect_shape("dy", dy, y.element_type(), y.dimensions(), {}));
  FA_RETURN_IF_NOT_OK(expect_shape("dx", dx, y.element_type(), y.dimensions(), {}));
  FA_RETURN_IF_NOT_OK(check_out_init(rest, 0, dx, "dx"));
  call->p = p;
  call->y = y.untyped_data();
  call->dy = dy.untyped_data();
  call->dx = dx.untyped_data();
  return Status::Ok();
}

#undef FA_RETURN_IF_NOT_OK

}  // namespace fusedattn::ffi_glue
