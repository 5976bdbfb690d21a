// extern "C" queries of the small-seq backend for Python (ctypes): the same
// validate() and eligibility rule the FFI handlers use. Kept beside c_api.cc so the
// backend's C surface lives with the backend.
#include <string>

#include "fusedattn/small_seq/validate.h"
#include "fusedattn/core/messages.h"

namespace {

bool built_with_cuda() {
#ifdef FUSEDATTN_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace

using fusedattn::copy_message;

extern "C" {

int fa_small_seq_params_size() { return static_cast<int>(sizeof(FaSmallSeqParams)); }

// Returns an FaStatus; the message (if any) goes to msg.
int fa_small_seq_validate(const FaSmallSeqParams* p, char* msg, int msg_len) {
  const fusedattn::Status s = fusedattn::small_seq::validate(*p);
  copy_message(s.message, msg, msg_len);
  return s.code;
}

// Returns 1 when the small-seq backend serves the call on `platform` (FaPlatform),
// else 0; *status gets validate()'s code, reason why it serves or why not.
int fa_small_seq_eligible(const FaSmallSeqParams* p, int platform, int* status, char* reason,
                          int reason_len) {
  const auto e = fusedattn::small_seq::eligibility(*p, platform, built_with_cuda());
  if (status) *status = e.status.code;
  copy_message(e.reason, reason, reason_len);
  return e.served ? 1 : 0;
}

}  // extern "C"
