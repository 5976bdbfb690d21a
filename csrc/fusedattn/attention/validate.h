// validate(): every check of an AttnParams, run once at the boundary (the FFI
// handlers and the Python query API both call it); kernels assume valid input.
#pragma once

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace fusedattn {

Status validate(const AttnParams& p);

// The values of index_base [p.num_slices, cols] int32 (cols 2 or 6; ffi_decode.h), read
// on the host, for a call p that passed validate(): (batch_base, head_base) >= 0; with 6
// columns (a block of a bigger call: q_pos, kv_pos, q_extent, kv_extent) a BSHD layout,
// positions >= 0, the block inside the extents, and kv_pos a multiple of 4 under dropout.
Status validate_index_base(const AttnParams& p, const int32_t* index_base, int64_t cols);

}  // namespace fusedattn
