// libcudnn is loaded at run time (dlopen), so libfusedattn.so links no cuDNN and
// loads on machines without one. The process's own copy (jax's, from the
// nvidia-cudnn wheel) is preferred, so both use one library. cudnn-frontend
// reads every symbol through the handle set here (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING).
#pragma once

#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <cstdint>

#include "fusedattn/core/status.h"

namespace fusedattn::cudnn {

// Loads libcudnn once per process; not ok (with the dlopen error) when none is found.
Status load_library();
// The loaded library's cudnnGetVersion() (e.g. 91900), or 0 when none could be loaded.
int64_t version();

// cudnnCreate / cudnnSetStream through the loaded library (load_library() must be ok).
Status create_handle(cudnnHandle_t* handle);
Status set_stream(cudnnHandle_t handle, cudaStream_t stream);

}  // namespace fusedattn::cudnn
