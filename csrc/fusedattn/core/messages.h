// The message helpers every op's validation and C API share: a streamed message
// that becomes a Status, and the copy of a message into a caller's C buffer.
#pragma once

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "fusedattn/core/status.h"

namespace fusedattn {

// Streams a message; `prefix` names the op ("small-seq: ") where the caller's
// message would otherwise not say which op refused.
//   return (Msg() << "head_dim: got " << d << "; allowed 1.." << kMax).invalid();
struct Msg {
  explicit Msg(const char* prefix = "") : prefix_(prefix) {}
  template <class T>
  Msg& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  std::string str() const { return prefix_ + os_.str(); }
  Status invalid() const { return Status::Invalid(str()); }
  Status unimplemented() const { return Status::Unimplemented(str()); }

 private:
  std::string prefix_;
  std::ostringstream os_;
};

// Copies msg into buf (buf_len bytes, always NUL-terminated, truncated to fit);
// a null buf or a non-positive length copies nothing.
inline void copy_message(const std::string& msg, char* buf, int buf_len) {
  if (!buf || buf_len <= 0) return;
  const size_t n = std::min(msg.size(), static_cast<size_t>(buf_len - 1));
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}

}  // namespace fusedattn
