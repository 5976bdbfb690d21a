// Host entry points of the small-seq CUDA kernels (shapes in params.h / args.h).
// They only enqueue work on `stream`; p must have passed validate().
#pragma once

#include <cuda_runtime.h>

#include "fusedattn/core/status.h"
#include "fusedattn/small_seq/args.h"
#include "fusedattn/small_seq/params.h"

namespace fusedattn::small_seq::cuda {

Status small_seq_fwd(const SmallSeqParams& p, const FwdArgs& a, cudaStream_t stream);
Status small_seq_bwd(const SmallSeqParams& p, const BwdArgs& a, cudaStream_t stream);

}  // namespace fusedattn::small_seq::cuda
