// Turns the FFI buffers and attributes of a softmax call into a SoftmaxParams
// and the pointers a kernel takes, checking every buffer. Shared by the CPU and
// CUDA handlers, so both accept and reject exactly the same calls.
//
// Forward:  logits [..., Sq, Skv], then the remaining args: mask [..., Sq|1, Skv]
//           bool (SCALED_MASKED only), then optionally out_init -> y (same shape).
// Backward: y, dy [..., Sq, Skv], then optionally out_init -> dx.
// out_init is for tests: aliased to the output (input_output_aliases), it lets a
// test fill the output with NaN first, so an element the kernel misses shows.
#pragma once

#include <cstdint>

#include "fusedattn/softmax/params.h"
#include "fusedattn/core/status.h"
#include "fusedattn/ffi/common.h"

namespace fusedattn::ffi_glue {

struct SoftmaxFwdCall {
  SoftmaxParams p;
  const void* x;
  const uint8_t* mask;  // null unless SCALED_MASKED
  void* y;
};

struct SoftmaxBwdCall {
  SoftmaxParams p;  // SCALED_MASKED comes back as SCALED: its backward needs no mask
  const void* y;
  const void* dy;
  void* dx;
};

Status decode_softmax_fwd(const ffi::AnyBuffer& x, const ffi::RemainingArgs& rest,
                          const ffi::AnyBuffer& y, int32_t softmax_type, float scale,
                          SoftmaxFwdCall* call);

Status decode_softmax_bwd(const ffi::AnyBuffer& y, const ffi::AnyBuffer& dy,
                          const ffi::RemainingArgs& rest, const ffi::AnyBuffer& dx,
                          int32_t softmax_type, float scale, SoftmaxBwdCall* call);

}  // namespace fusedattn::ffi_glue
