#include "fusedattn/platform/cuda/cudnn_loader.h"

#include <dlfcn.h>

#include <string>

// cudnn-frontend's dynamic loading reads every cuDNN symbol through this handle
// (declared `extern void* cudnn_dlhandle` in cudnn_frontend_shim.h).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace fusedattn::cudnn {
namespace {

struct Library {
  Status status;
  int64_t version = 0;
  cudnnStatus_t (*create)(cudnnHandle_t*) = nullptr;
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t) = nullptr;
  const char* (*error_string)(cudnnStatus_t) = nullptr;
};

template <class Fn>
bool find(void* h, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(h, name));
  return *fn != nullptr;
}

Library load_once() {
  Library r;
  void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    const char* err = dlerror();
    r.status = Status::Unimplemented(std::string("cuDNN is not available (dlopen libcudnn.so.9: ") +
                                     (err ? err : "failed") +
                                     "); install nvidia-cudnn-cu13, which jax[cuda13] brings");
    return r;
  }
  size_t (*get_version)() = nullptr;
  if (!find(h, "cudnnGetVersion", &get_version) || !find(h, "cudnnCreate", &r.create) ||
      !find(h, "cudnnSetStream", &r.set_stream) ||
      !find(h, "cudnnGetErrorString", &r.error_string)) {
    r.status = Status::Internal("the loaded libcudnn.so.9 lacks a cuDNN 9 entry point");
    return r;
  }
  cudnn_frontend::cudnn_dlhandle = h;
  r.version = static_cast<int64_t>(get_version());
  return r;
}

const Library& lib() {
  static const Library r = load_once();
  return r;
}

Status check(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(std::string(what) + " failed: " + lib().error_string(s));
}

}  // namespace

Status load_library() { return lib().status; }
int64_t version() { return lib().status.ok() ? lib().version : 0; }

Status create_handle(cudnnHandle_t* handle) { return check(lib().create(handle), "cudnnCreate"); }
Status set_stream(cudnnHandle_t handle, cudaStream_t stream) {
  return check(lib().set_stream(handle, stream), "cudnnSetStream");
}

}  // namespace fusedattn::cudnn
