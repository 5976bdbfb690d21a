// Status: the result of a check, with a message a user can act on.
#pragma once

#include <stdint.h>

#include <string>

#include "fusedattn/core/codes.h"

namespace fusedattn {

struct Status {
  int32_t code = FA_OK;  // FaStatus
  std::string message;

  bool ok() const { return code == FA_OK; }
  static Status Ok() { return {}; }
  static Status Invalid(std::string msg) { return {FA_INVALID_ARGUMENT, std::move(msg)}; }
  static Status Unimplemented(std::string msg) { return {FA_UNIMPLEMENTED, std::move(msg)}; }
  // A failure of the machinery (CUDA, cuDNN), not of the caller's arguments.
  static Status Internal(std::string msg) { return {FA_INTERNAL, std::move(msg)}; }
};

}  // namespace fusedattn

// Returns a failed Status from the enclosing function (which returns Status).
#define FA_RETURN_IF_NOT_OK(expr)          \
  do {                                     \
    ::fusedattn::Status _fa_st = (expr);   \
    if (!_fa_st.ok()) return _fa_st;       \
  } while (0)
