#include "backend.h"

#include "validate.h"

namespace fusedattn {

BackendChoice select_backend(const AttnParams& p, int32_t platform) {
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
    case FA_PLATFORM_CUDA:
      // The cuDNN backend is the next step; until it exists XLA runs the
      // reference on the GPU, which is correct for every valid call.
      choice.backend = FA_BACKEND_XLA_REFERENCE;
      choice.reason =
          "xla_reference: this build has no CUDA attention kernel yet, so XLA computes the "
          "plain-JAX reference (materialized scores, O(S^2) memory)";
      return choice;
  }
  choice.status = Status::Invalid("platform: got code " + std::to_string(platform) +
                                  "; allowed 0 (cpu) or 1 (cuda)");
  choice.reason = choice.status.message;
  return choice;
}

}  // namespace fusedattn
