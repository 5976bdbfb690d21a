// extern "C" queries for Python (ctypes): version, build features, and the
// same validate() / select_backend() the FFI handlers use, so Python can
// reject bad calls at trace time with the C++ engine's own message.
#include <cstring>
#include <string>

#include "backend.h"
#include "cpu/thread_pool.h"
#include "validate.h"

namespace {

void copy_message(const std::string& msg, char* buf, int buf_len) {
  if (!buf || buf_len <= 0) return;
  const size_t n = std::min(msg.size(), static_cast<size_t>(buf_len - 1));
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}

}  // namespace

extern "C" {

const char* fa_version() { return FUSEDATTN_VERSION; }

int fa_params_size() { return static_cast<int>(sizeof(FaAttnParams)); }

int fa_built_with_cuda() {
#ifdef FUSEDATTN_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

// Returns an FaStatus; the message (if any) goes to msg.
int fa_validate(const FaAttnParams* p, char* msg, int msg_len) {
  const fusedattn::Status s = fusedattn::validate(*p);
  copy_message(s.message, msg, msg_len);
  return s.code;
}

// Returns an FaBackend; *status gets validate()'s code, reason the explanation.
int fa_select_backend(const FaAttnParams* p, int platform, int* status, char* reason,
                      int reason_len) {
  const fusedattn::BackendChoice c = fusedattn::select_backend(*p, platform);
  if (status) *status = c.status.code;
  copy_message(c.reason, reason, reason_len);
  return c.backend;
}

const char* fa_backend_name(int backend) { return fusedattn::backend_name(backend); }

void fa_set_num_threads(int n) { fusedattn::cpu::set_num_threads(n); }
int fa_num_threads() { return fusedattn::cpu::max_slots(); }

}  // extern "C"
