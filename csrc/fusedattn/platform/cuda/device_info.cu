// CUDA device queries for Python and select_backend(): the runtime version and
// a device's compute capability, with the CUDA error code on failure.
#include <cuda_runtime.h>

extern "C" {

int fa_cuda_runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : -1;
}

// Returns a cudaError_t (0 on success).
int fa_cuda_device_capability(int device, int* major, int* minor) {
  cudaError_t e = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
  return static_cast<int>(e);
}

}  // extern "C"
