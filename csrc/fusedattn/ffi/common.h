// Helpers every XLA FFI handler of fusedattn shares: Status -> ffi::Error, dtype
// codes, and a shape check that names the buffer in its message.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"
#include "xla/ffi/api/ffi.h"

namespace fusedattn::ffi_glue {

namespace ffi = xla::ffi;

// Returns the FFI error of a Status from the enclosing handler.
#define FA_RETURN_IF_ERROR(expr)                                     \
  do {                                                               \
    ::fusedattn::Status _fa_s = (expr);                              \
    if (!_fa_s.ok()) return ::fusedattn::ffi_glue::to_ffi_error(_fa_s); \
  } while (0)

ffi::Error to_ffi_error(const Status& s);

// FaDType <-> ffi::DataType; fa_dtype() is -1 for a type the engine does not take.
ffi::DataType ffi_dtype(int32_t fa_dtype);
int32_t fa_dtype(ffi::DataType t);

std::string dims_str(ffi::AnyBuffer::Dimensions d);

// Checks that `buf` has dtype `dtype` and dimensions `lead` + `tail`, naming it in errors.
Status expect_shape(const char* name, const ffi::AnyBuffer& buf, ffi::DataType dtype,
                    ffi::AnyBuffer::Dimensions lead, std::initializer_list<int64_t> tail);

}  // namespace fusedattn::ffi_glue
