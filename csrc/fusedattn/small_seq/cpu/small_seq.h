// The CPU small-seq kernels: per segment, scores, masked softmax and output in one
// pass (float32 math); the backward reads the saved attention weights P and
// recomputes them from the saved log-sum-exp only where P cannot hold them (a
// segment with more q rows or kv rows than promised). Shapes in params.h / args.h.
#pragma once

#include "fusedattn/small_seq/args.h"
#include "fusedattn/small_seq/params.h"

namespace fusedattn::small_seq::cpu {

// p must have passed validate().
void small_seq_fwd(const SmallSeqParams& p, const FwdArgs& a);
void small_seq_bwd(const SmallSeqParams& p, const BwdArgs& a);

}  // namespace fusedattn::small_seq::cpu
