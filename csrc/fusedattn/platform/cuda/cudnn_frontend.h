// The one include of cudnn-frontend (its headers are heavy: only the graph code
// includes this). cuDNN symbols are resolved at run time through loader.h.
#pragma once

#ifndef NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#endif
#include <cudnn_frontend.h>

#include <string>

#include "fusedattn/core/status.h"

namespace fusedattn::cudnn {

namespace fe = cudnn_frontend;

// A cudnn-frontend error as a Status naming what failed.
inline Status fe_status(fe::error_t e, const char* what) {
  if (e.is_good()) return Status::Ok();
  return Status::Internal(std::string("cuDNN ") + what + ": " + e.get_message());
}

}  // namespace fusedattn::cudnn

#define FA_FE_RETURN_IF_ERROR(expr, what)                                        \
  do {                                                                           \
    ::fusedattn::Status _fa_fs = ::fusedattn::cudnn::fe_status((expr), (what));  \
    if (!_fa_fs.ok()) return _fa_fs;                                             \
  } while (0)
