// extern "C" queries of the softmax for Python (ctypes): the same validate()
// and choose_kernel() the FFI handlers use, so softmax() rejects a bad call at
// trace time with the engine's message and picks the path the engine would.
#include <string>

#include "fusedattn/softmax/validate.h"
#include "fusedattn/core/messages.h"

using fusedattn::copy_message;

extern "C" {

int fa_softmax_params_size() { return static_cast<int>(sizeof(FaSoftmaxParams)); }

const char* fa_softmax_type_name(int type) { return fusedattn::softmax_type_name(type); }

// Returns an FaStatus; the message (if any) goes to msg.
int fa_softmax_validate(const FaSoftmaxParams* p, char* msg, int msg_len) {
  const fusedattn::Status s = fusedattn::softmax::validate(*p);
  copy_message(s.message, msg, msg_len);
  return s.code;
}

// Returns 1 when our kernel serves the call on `platform` (FaPlatform), else 0
// (the pure-JAX fallback runs, or the call is invalid: then *status is not FA_OK).
int fa_softmax_kernel_available(const FaSoftmaxParams* p, int platform, int* status, char* reason,
                                int reason_len) {
#ifdef FUSEDATTN_WITH_CUDA
  constexpr bool kCudaBuilt = true;
#else
  constexpr bool kCudaBuilt = false;
#endif
  const fusedattn::softmax::KernelChoice c =
      fusedattn::softmax::choose_kernel(*p, platform, kCudaBuilt);
  if (status) *status = c.status.code;
  copy_message(c.reason, reason, reason_len);
  return c.available ? 1 : 0;
}

}  // extern "C"
