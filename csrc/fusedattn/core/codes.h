// The codes every op shares across the C ABI: element types, platforms and the
// status of a check. Plain C enums: Python mirrors them with ctypes (each op's
// params.h builds on these) and checks the values against fa_enum_value().
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// FA_FLOAT64: attention on the CPU only (its engine computes in double; the GPU runs
// float64 calls as float32, cast by Python).
enum FaDType { FA_FLOAT32 = 0, FA_BFLOAT16 = 1, FA_FLOAT16 = 2, FA_FLOAT64 = 3 };

enum FaPlatform { FA_PLATFORM_CPU = 0, FA_PLATFORM_CUDA = 1 };

enum FaStatus { FA_OK = 0, FA_INVALID_ARGUMENT = 1, FA_UNIMPLEMENTED = 2, FA_INTERNAL = 3 };

#ifdef __cplusplus
}  // extern "C"

namespace fusedattn {

// The largest sequence length the engine accepts (keeps every index in int64
// arithmetic far from overflow and rejects shapes that are surely mistakes).
constexpr int64_t kMaxSeqLen = int64_t{1} << 20;

inline const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case FA_FLOAT32: return "float32";
    case FA_BFLOAT16: return "bfloat16";
    case FA_FLOAT16: return "float16";
    case FA_FLOAT64: return "float64";
  }
  return "unknown";
}

inline bool is_float_dtype(int32_t dtype) {
  return dtype == FA_FLOAT32 || dtype == FA_BFLOAT16 || dtype == FA_FLOAT16;
}

}  // namespace fusedattn
#endif
