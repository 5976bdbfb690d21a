// The CPU softmax kernels (semantics in params.h). Multi-threaded over rows
// through cpu/thread_pool.h; the inner loops are written for the compiler's
// vectorizer (fixed-width lane arrays, no branches).
#pragma once

#include <cstdint>

#include "fusedattn/softmax/params.h"

namespace fusedattn::softmax {

// x, y: p.dims, p.dtype; mask: p.mask_dims bool (1 byte, nonzero = masked out),
// or null unless p.has_mask. Assumes validate(p) passed.
void cpu_softmax_fwd(const SoftmaxParams& p, const void* x, const uint8_t* mask, void* y);

// y, dy, dx: p.dims, p.dtype; y is the forward output. Causal rows skip the
// masked half (dx is 0 there). Assumes validate(p) passed.
void cpu_softmax_bwd(const SoftmaxParams& p, const void* y, const void* dy, void* dx);

}  // namespace fusedattn::softmax
