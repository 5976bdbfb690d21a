// Tensor maps for the Hopper kernels (tma_map.h).
#include "fusedattn/attention/hopper/tma_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <string>

namespace fusedattn::cuda::hopper {
namespace {
// cuTensorMapEncodeTiled from the driver the runtime already loaded (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool rows16(std::initializer_list<const void*> ptrs, std::initializer_list<int64_t> strides) {
  for (const void* t : ptrs)
    if (reinterpret_cast<uintptr_t>(t) % 16 != 0) return false;
  for (int64_t s : strides)
    if (s % 8 != 0) return false;
  return true;
}

Status make_map(CUtensorMap* map, const void* base, bool bf16, int64_t D, int64_t S, int64_t H,
                int64_t B, int64_t s_s, int64_t s_h, int64_t s_b, uint32_t rows, const char* name) {
  auto fn = encode_fn();
  if (!fn) return Status::Internal("cuTensorMapEncodeTiled is not available from the driver");
  const int64_t span_s = S * s_s, span_h = H > 1 ? H * s_h : span_s;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(S),
                              static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(s_s * 2),
                                 static_cast<cuuint64_t>((H > 1 ? s_h : span_s) * 2),
                                 static_cast<cuuint64_t>((B > 1 ? s_b : span_h) * 2)};
  const cuuint32_t box[4] = {64, rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = fn(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                        4, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Internal(std::string("cuTensorMapEncodeTiled(") + name + ") failed: error " +
                            std::to_string(static_cast<int>(r)));
  return Status::Ok();
}

}  // namespace fusedattn::cuda::hopper
