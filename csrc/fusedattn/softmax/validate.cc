#include "fusedattn/softmax/validate.h"

#include <cmath>
#include <sstream>

namespace fusedattn {

const char* softmax_type_name(int32_t type) {
  switch (type) {
    case FA_SOFTMAX_SCALED:
      return "SCALED";
    case FA_SOFTMAX_SCALED_MASKED:
      return "SCALED_MASKED";
    case FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED:
      return "SCALED_UPPER_TRIANG_MASKED";
  }
  return "unknown";
}

namespace softmax {
namespace {

// Above this many elements int64 index arithmetic (offsets times strides) could
// come near overflow; no real call is that large.
constexpr int64_t kMaxElements = int64_t{1} << 48;

std::string shape_str(const int64_t* d, int n) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

bool kernel_dtype(int32_t dtype) {
  return dtype == FA_FLOAT32 || dtype == FA_BFLOAT16 || dtype == FA_FLOAT16;
}

// Everything but the dtype.
Status validate_call(const SoftmaxParams& p) {
  std::ostringstream os;
  if (p.softmax_type < FA_SOFTMAX_SCALED ||
      p.softmax_type > FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED) {
    os << "softmax_type: got code " << p.softmax_type << ", not a SoftmaxFusionType";
    return Status::Invalid(os.str());
  }
  if (p.rank < 2 || p.rank > FA_SOFTMAX_MAX_RANK) {
    os << "logits: got rank " << p.rank << "; allowed 2.." << FA_SOFTMAX_MAX_RANK
       << " ([..., q_seqlen, kv_seqlen])";
    return Status::Invalid(os.str());
  }
  const std::string shape = shape_str(p.dims, p.rank);
  int64_t elements = 1;
  for (int i = 0; i < p.rank; ++i) {
    if (p.dims[i] < 1) {
      os << "logits: got shape " << shape << "; every dimension must be at least 1";
      return Status::Invalid(os.str());
    }
    if (p.dims[i] > kMaxElements / elements) {
      os << "logits: got shape " << shape << "; at most 2^48 elements are allowed";
      return Status::Invalid(os.str());
    }
    elements *= p.dims[i];
  }
  if (softmax_kv(p) > kMaxSeqLen || softmax_q(p) > kMaxSeqLen) {
    os << "logits: got shape " << shape << "; q_seqlen and kv_seqlen (the last two dimensions) "
       << "allowed 1.." << kMaxSeqLen;
    return Status::Invalid(os.str());
  }
  if (!std::isfinite(p.scale)) {
    os << "scale_factor: got " << p.scale << "; must be finite";
    return Status::Invalid(os.str());
  }
  const bool masked = p.softmax_type == FA_SOFTMAX_SCALED_MASKED;
  if (masked && !p.has_mask)
    return Status::Invalid("mask: softmax_type=SCALED_MASKED needs a mask");
  if (!masked && p.has_mask) {
    os << "mask: softmax_type=" << softmax_type_name(p.softmax_type)
       << " takes no mask; use SCALED_MASKED for a mask";
    return Status::Invalid(os.str());
  }
  if (masked) {
    bool ok = p.mask_dims[p.rank - 1] == softmax_kv(p);
    for (int i = 0; ok && i + 1 < p.rank; ++i)
      ok = p.mask_dims[i] == 1 || p.mask_dims[i] == p.dims[i];
    if (!ok) {
      os << "mask: shape " << shape_str(p.mask_dims, p.rank) << " does not broadcast to logits "
         << shape << ": each mask dimension must be 1 or the logits' one, and the last "
         << "(kv_seqlen) must equal the logits' one";
      return Status::Invalid(os.str());
    }
  }
  return Status::Ok();
}

}  // namespace

Status validate(const SoftmaxParams& p) {
  if (!kernel_dtype(p.dtype)) {
    std::ostringstream os;
    os << "dtype: got code " << p.dtype << "; logits must be float32, bfloat16 or float16";
    return Status::Invalid(os.str());
  }
  return validate_call(p);
}

KernelChoice choose_kernel(const SoftmaxParams& p, int32_t platform, bool cuda_built) {
  KernelChoice c;
  c.status = validate_call(p);
  if (!c.status.ok()) {
    c.reason = "invalid call: " + c.status.message;
    return c;
  }
  if (platform != FA_PLATFORM_CPU && platform != FA_PLATFORM_CUDA) {
    c.status = Status::Invalid("platform: got code " + std::to_string(platform) +
                               "; allowed 0 (cpu) or 1 (cuda)");
    c.reason = c.status.message;
    return c;
  }
  if (!kernel_dtype(p.dtype)) {
    c.reason = "the kernels take float32, bfloat16 and float16 only; the pure-JAX fallback runs";
    return c;
  }
  if (platform == FA_PLATFORM_CPU) {
    c.available = true;
    c.reason = "the CPU kernel serves every valid call";
    return c;
  }
  if (!cuda_built) {
    c.reason = "this build of fusedattn has no CUDA kernels; the pure-JAX fallback runs";
    return c;
  }
  const int64_t skv = softmax_kv(p), bytes = dtype_bytes(p.dtype);
  const int64_t max_kv = kCudaSoftmaxMaxRowBytes / bytes;
  std::ostringstream os;
  if (skv > max_kv) {
    os << "kv_seqlen " << skv << " exceeds the CUDA kernel's " << max_kv << " for "
       << dtype_name(p.dtype) << " (a row is held in registers); the pure-JAX fallback runs";
    c.reason = os.str();
    return c;
  }
  // 2-byte rows past half the limit need 16-byte units, kv_seqlen % 8 == 0
  // (launch.cuh: the scalar kernel would spill there).
  if (bytes == 2 && skv * bytes > kCudaSoftmaxMaxRowBytes / 2 && skv % 8 != 0) {
    os << "kv_seqlen " << skv << " in " << dtype_name(p.dtype) << ": rows over "
       << kCudaSoftmaxMaxRowBytes / 4 << " elements need kv_seqlen % 8 == 0 for the CUDA "
       << "kernel; the pure-JAX fallback runs";
    c.reason = os.str();
    return c;
  }
  c.available = true;
  os << "the CUDA kernel serves kv_seqlen up to " << max_kv << " in " << dtype_name(p.dtype);
  c.reason = os.str();
  return c;
}

}  // namespace softmax
}  // namespace fusedattn
