// Status: the result of a check, with a message a user can act on.
#pragma once

#include <stdint.h>

#include <string>

#include "params.h"

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
