// Dispatch over the storage dtype: the one place that maps FaDType to a C++ type.
#pragma once

#include "fusedattn/attention/params.h"
#include "fusedattn/platform/cpu/dtypes.h"

namespace fusedattn::cpu {

template <class F>
auto dispatch_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case FA_BFLOAT16: return f(bf16{});
    case FA_FLOAT16: return f(fp16{});
    default: return f(float{});
  }
}

}  // namespace fusedattn::cpu
