#include "fusedattn/ffi/common.h"

#include <sstream>

namespace fusedattn::ffi_glue {

std::string dims_str(ffi::AnyBuffer::Dimensions d) {
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
    case ffi::DataType::F64: return FA_FLOAT64;
    default: return -1;
  }
}

ffi::DataType ffi_dtype(int32_t fa) {
  switch (fa) {
    case FA_BFLOAT16: return ffi::DataType::BF16;
    case FA_FLOAT16: return ffi::DataType::F16;
    case FA_FLOAT64: return ffi::DataType::F64;
    default: return ffi::DataType::F32;
  }
}

ffi::Error to_ffi_error(const Status& s) {
  if (s.ok()) return ffi::Error::Success();
  ffi::ErrorCode code = ffi::ErrorCode::kInvalidArgument;
  if (s.code == FA_UNIMPLEMENTED) code = ffi::ErrorCode::kUnimplemented;
  if (s.code == FA_INTERNAL) code = ffi::ErrorCode::kInternal;
  return ffi::Error(code, "fusedattn: " + s.message);
}

Status expect_shape(const char* name, const ffi::AnyBuffer& buf, ffi::DataType dtype,
                    ffi::AnyBuffer::Dimensions lead, std::initializer_list<int64_t> tail) {
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

}  // namespace fusedattn::ffi_glue
