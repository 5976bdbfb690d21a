#include "fusedattn/attention/backend.h"

#include <algorithm>
#include <sstream>

#include "fusedattn/attention/validate.h"

namespace fusedattn {
namespace {

constexpr int64_t kCudnnSinkVersion = 91300;  // sink tokens, max / sum_exp outputs

std::string fmt_version(int64_t v) {
  std::ostringstream os;
  os << v / 10000 << "." << (v / 100) % 100 << "." << v % 100;
  return os.str();
}

}  // namespace

std::string cudnn_unsupported_reason(const AttnParams& p, const PlatformInfo& info) {
  std::ostringstream os;
  if (!info.cuda_built) return "this build of fusedattn has no CUDA kernels";
  if (info.sm == 0) return "no CUDA device could be queried (" + info.device_error + ")";
  if (info.cudnn_version == 0) return info.cudnn_error.empty() ? "cuDNN is not loaded" : info.cudnn_error;
  if (info.cudnn_version < 90000)
    return "cuDNN " + fmt_version(info.cudnn_version) + " is older than 9.0";
  if (info.sm < 80) {
    os << "cuDNN attention needs compute capability 8.0 or newer; the device has "
       << info.sm / 10 << "." << info.sm % 10;
    return os.str();
  }
  if (p.dtype != FA_BFLOAT16 && p.dtype != FA_FLOAT16)
    return std::string("cuDNN attention takes bfloat16 or float16; got ") + dtype_name(p.dtype);
  if (p.head_dim_qk % 8 != 0 || p.head_dim_v % 8 != 0) {
    os << "cuDNN needs head dims that are multiples of 8; got " << p.head_dim_qk << " and "
       << p.head_dim_v;
    return os.str();
  }
  if (p.bias_type == FA_PRE_SCALE_BIAS)
    return "cuDNN adds the bias after the scale (POST_SCALE_BIAS); PRE_SCALE_BIAS is not served";
  if (p.bias_type != FA_NO_BIAS && is_thd(p.layout))
    return std::string("cuDNN has no bias for the THD layouts (") + layout_name(p.layout) + ")";
  if (p.softmax_type != FA_VANILLA_SOFTMAX && info.cudnn_version < kCudnnSinkVersion)
    return std::string(softmax_name(p.softmax_type)) + " needs cuDNN 9.13 or newer; loaded " +
           fmt_version(info.cudnn_version);
  // Without per-sequence lengths cuDNN checks the tensor extents (with them, its
  // graph validation decides at trace time).
  if (p.seqlen_q > p.seqlen_kv && !has_padding(p.mask_type) &&
      (is_causal_bottom_right(p.mask_type) || p.window_left >= 0)) {
    os << "cuDNN's bottom-right causal masks and sliding windows need Sq <= Skv; got Sq "
       << p.seqlen_q << " > Skv " << p.seqlen_kv;
    return os.str();
  }
  if (is_thd(p.layout)) {
    // Ragged offsets are int32 element offsets.
    const int64_t tokens = p.batch / (p.num_slices > 0 ? p.num_slices : 1) *
                           std::max(p.seqlen_q, p.seqlen_kv);
    const int64_t widest = 3 * std::max(p.heads_q, p.heads_kv) *
                           std::max(p.head_dim_qk, p.head_dim_v);
    if (tokens * widest >= (int64_t{1} << 31)) {
      os << "THD tensors of " << tokens * widest << " elements exceed cuDNN's int32 ragged offsets";
      return os.str();
    }
  }
  return "";
}

BackendChoice select_backend(const AttnParams& p, int32_t platform, const PlatformInfo& info) {
  BackendChoice choice;
  choice.status = validate(p);
  if (!choice.status.ok()) {
    choice.reason = "no backend serves this call: " + choice.status.message;
    return choice;
  }
  switch (platform) {
    case FA_PLATFORM_CPU:
      choice.backend = FA_BACKEND_CPU_FLASH;
      choice.reason = "cpu_flash: the tiled online-softmax CPU engine serves every valid call";
      return choice;
    case FA_PLATFORM_CUDA: {
      const std::string why_not = cudnn_unsupported_reason(p, info);
      if (why_not.empty()) {
        choice.backend = FA_BACKEND_CUDNN;
        choice.reason = "cudnn: a cuDNN " + fmt_version(info.cudnn_version) + " SDPA graph";
      } else {
        choice.backend = FA_BACKEND_XLA_REFERENCE;
        choice.reason = "xla_reference: cuDNN cannot serve this call (" + why_not +
                        "), so XLA computes the plain-JAX reference (materialized scores)";
      }
      return choice;
    }
  }
  choice.status = Status::Invalid("platform: got code " + std::to_string(platform) +
                                  "; allowed 0 (cpu) or 1 (cuda)");
  choice.reason = choice.status.message;
  return choice;
}

}  // namespace fusedattn
