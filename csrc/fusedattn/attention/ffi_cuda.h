// The CUDA attention handlers' workspace: Python sizes the handlers' uint8 workspace
// result at trace time with this (through c_api.cc), building the cuDNN graph then.
#pragma once

#include <cstdint>

#include "fusedattn/attention/cudnn/sdpa_config.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace fusedattn::ffi_glue {

// Bytes of workspace the forward (backward) of p needs on `device`; want_lse /
// want_max_logit are the forward's attributes, backend_flags the call's BackendRequest
// flags (backend.h), sm the score_mod (null: none).
Status attn_workspace_bytes(const AttnParams& p, int device, bool want_lse, bool want_max_logit,
                            bool backward, int32_t backend_flags, int64_t* bytes,
                            const cudnn::ScoreModSpec* sm = nullptr);

}  // namespace fusedattn::ffi_glue
