// Dispatch over the storage dtype: the one place that maps FaDType to a C++ type.
#pragma once

#include <utility>

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

// dispatch_dtype with float64 too: the attention engine's storage types (its float64
// form computes in double; the other ops take float32, bf16 and fp16 only).
template <class F>
auto dispatch_dtype_f64(int32_t dtype, F&& f) {
  if (dtype == FA_FLOAT64) return f(double{});
  return dispatch_dtype(dtype, std::forward<F>(f));
}

}  // namespace fusedattn::cpu
