// jax's rows that keep nothing on the GPU (backend.h: kRequestAverageEmptyRows), around
// whichever kernel serves the call (the Hopper kernels, cuDNN, the CUDA flash kernels): the
// CPU engine's rule (cpu/empty_rows.h). A query row below its sequence's length whose lse
// is at most `threshold` gets the average of all Skv values of its kv head; its gradient
// reaches dv only (dout / Skv to every key of the kv head). BSHD layouts: lse [B, Hq, Sq]
// contiguous. Every kernel returns at once where no row is empty, so a call with none
// pays a scan of lse and a few launches.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/attention/tensors.h"
#include "fusedattn/core/status.h"

namespace fusedattn::cuda {

struct EmptyRowsArgs {
  int64_t batch, seqlen_q, seqlen_kv, heads_q, heads_kv, head_dim_v;
  int32_t dtype;    // of v, out, dout, dv: float32, bf16 or fp16
  float threshold;  // a row is empty when its lse is at most this
  AttnMask mask;    // the query lengths (padding masks)
  const float* lse;  // [B, Hq, Sq]
  const void* v;
  ViewStrides sv;
};

// Bytes of scratch (256-byte aligned inside) the backward's passes take (the forward's
// take none).
size_t empty_rows_bwd_scratch_bytes(const AttnParams& p);

// After the forward's kernel: empty rows of out get the average of their values.
Status average_empty_rows_fwd(const EmptyRowsArgs& a, void* out, ViewStrides so,
                              cudaStream_t stream);

// Before the backward's kernel: *lse_out, in scratch, is a's lse with +inf at the empty
// rows (P = 0 there on every route), and the sums of their dout are kept for the finish.
Status empty_rows_bwd_prepare(const EmptyRowsArgs& a, const void* dout, ViewStrides sdo,
                              void* scratch, const float** lse_out, cudaStream_t stream);

// After the backward's kernel: dv += (the kv head's sum of empty rows' dout) / Skv, in a
// fixed order (bitwise repeatable).
Status empty_rows_bwd_finish(const EmptyRowsArgs& a, void* dv, ViewStrides sdv, void* scratch,
                             cudaStream_t stream);

}  // namespace fusedattn::cuda
