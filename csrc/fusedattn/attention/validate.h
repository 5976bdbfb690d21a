// validate(): every check of an AttnParams, run once at the boundary (the FFI
// handlers and the Python query API both call it); kernels assume valid input.
#pragma once

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace fusedattn {

Status validate(const AttnParams& p);

// The values of index_base [p.num_slices, cols] int32 (cols 2, 6 or 8; ffi_decode.h),
// read on the host, for a call p that passed validate(): (batch_base, head_base) >= 0;
// with 6 or 8 columns (a block of a bigger call, mask.h: q_pos, kv_pos, q_extent,
// kv_extent[, stripe, stride]) stripe >= 1, stride a multiple of stripe, positions >= 0,
// every local token's global token inside the extents, and under dropout kv_pos and (a
// striped block, stripe < stride) stripe multiples of 4.
Status validate_index_base(const AttnParams& p, const int32_t* index_base, int64_t cols);

// Whether call p (passed validate()) allows backend.h's kRequestAverageEmptyRows: a BSHD
// layout, vanilla softmax, no dropout, and no block positions (index_cols of its
// index_base: 0 without one, 2, or 6 / 8 with positions). InvalidArgument names what does
// not.
Status validate_average_empty_rows(const AttnParams& p, int64_t index_cols);

}  // namespace fusedattn
