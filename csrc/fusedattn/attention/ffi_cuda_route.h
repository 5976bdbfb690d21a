// The CUDA attention handlers' routes, apart from the handlers themselves (ffi_cuda.cc:
// decoding, the backend decision, the empty-row passes, the workspace's size):
//   ffi_cuda_hopper.cc: fusedattn's Hopper kernels (attention/hopper), forward and backward;
//   ffi_cuda_cudnn.cc:  cuDNN's SDPA graphs (attention/cudnn), a graph per slice;
//   ffi_cuda.cc:        the CUDA flash kernels (attention/cuda/flash.h) directly.
// Every route takes its temporaries from the handler's uint8 workspace result (XLA owns
// every byte; Python sizes it at trace time through attn_workspace_bytes).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fusedattn/attention/cudnn/fixup.h"
#include "fusedattn/attention/cudnn/sdpa_config.h"
#include "fusedattn/attention/ffi_decode.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/attention/tensors.h"
#include "fusedattn/core/regions.h"
#include "fusedattn/core/status.h"
#include "fusedattn/attention/backend.h"

namespace fusedattn::ffi_glue::cuda_route {

// Carves 256-byte aligned regions out of the workspace result (a uint8 buffer that
// Python sizes at trace time by asking workspace_bytes(), so XLA owns every byte).
class ScratchPlan {
 public:
  size_t add(size_t bytes) { return regions_.add(bytes); }
  // Bytes the workspace must have: the regions, plus slack to align its start.
  size_t bytes() const { return regions_.total + kRegionAlign - 1; }
  Status bind(ffi::AnyBuffer* workspace) {
    if (workspace->size_bytes() < bytes())
      return Status::Internal("workspace: got " + std::to_string(workspace->size_bytes()) +
                              " bytes, the call needs " + std::to_string(bytes()));
    const uintptr_t p = reinterpret_cast<uintptr_t>(workspace->untyped_data());
    base_ = reinterpret_cast<char*>(align_region_ptr(p));
    return Status::Ok();
  }
  template <class T>
  T* at(size_t offset) const { return reinterpret_cast<T*>(base_ + offset); }

 private:
  Regions regions_;
  char* base_ = nullptr;
};

// A score_mod call as the graph code takes it (null: none), checked against p.
struct SmArgs {
  const ScoreModCall* call = nullptr;
  cudnn::ScoreModSpec spec;
  const cudnn::ScoreModSpec* get() const { return call ? &spec : nullptr; }
};

// Zeros bytes at p on the stream (nothing for a null p or no bytes).
Status memset_async(void* p, size_t bytes, cudaStream_t stream, const char* what);

// finalize_forward's arguments for call p's out and lse (no max_logit: the caller adds it).
cuda::FinalizeArgs finalize_args(const AttnParams& p, const AttnTensors& t);

// ---- Hopper kernels (ffi_cuda_hopper.cc) ----

// Bytes of the Hopper forward's workspace (with the slack to align its start); flags: the
// call's backend_flags (kRequestMaskBias: a dense mask's classes and bits).
size_t hopper_fwd_workspace(const AttnParams& p, int32_t flags);

// Runs the Hopper flash forward, which select_backend() chose for this call (a softcap or
// ALiBi score_mod, form, or none); want_max: it writes max_logit [B, Hq] too.
Status hopper_fwd(const AttnParams& p, const AttnTensors& t, const SmArgs& sm,
                  const ScoreModForm& form, bool want_max, int32_t flags, int device,
                  ffi::AnyBuffer* workspace, cudaStream_t stream);

// Bytes of the Hopper backward's workspace result (with the slack to align its start; a
// bias's part sized as a folded mask's, the larger), with room for the deterministic dQ's
// counters (8 bytes a 64-row block) either way, and a broadcast bias's float32 dbias when
// want_dbias.
size_t hopper_bwd_workspace(const AttnParams& p, bool want_dbias);

// Runs the Hopper flash backward, which select_backend() chose (a bias's or dense mask's
// dbias, not wanted: zeros there, never read); dbias_bytes: the dbias result's size;
// mask_bias, keep_only: kRequestMaskBias, kRequestMaskKeepOnly; want_dslopes
// (kRequestScoreModGrads with ALiBi): the slopes' gradient into sm's operand gradient.
Status hopper_bwd(const AttnParams& p, const AttnTensors& t, size_t dbias_bytes,
                  ffi::AnyBuffer* workspace, int device, cudaStream_t stream, bool deterministic,
                  bool mask_bias, bool keep_only, bool want_dbias, const ScoreModForm& form,
                  const SmArgs& sm, bool want_dslopes);

// ---- cuDNN graphs (ffi_cuda_cudnn.cc) ----

// Bytes of the workspace cuDNN's graph for call p needs (its temporaries and the route's),
// building the graph (cached) now; an error where cuDNN cannot build it.
// dbias: the backward's graph writes dbias (not for a keep mask: kRequestMaskKeepOnly).
Status cudnn_workspace_bytes(const AttnParams& p, int device, bool want_lse, bool want_max_logit,
                             bool backward, bool deterministic, const cudnn::ScoreModSpec* sm,
                             bool dbias, int64_t* bytes);

// The forward by cuDNN's graph (and finalize_forward's max_logit and empty rows).
Status cudnn_fwd(cudaStream_t stream, int device, const AttnParams& p, const AttnTensors& t,
                 ffi::AnyBuffer* workspace, bool want_max, bool want_lse, const SmArgs& sm);

// The backward by cuDNN's graph; mask_bias: the bias is a folded mask (kRequestMaskBias),
// whose rows the Hopper forward may have left without keys (lse -inf: fixed first).
Status cudnn_bwd(cudaStream_t stream, int device, const AttnParams& p, const AttnTensors& t,
                 ffi::AnyBuffer* dq, ffi::AnyBuffer* dk, ffi::AnyBuffer* dv, ffi::AnyBuffer* dbias,
                 ffi::AnyBuffer* workspace, bool deterministic, bool mask_bias, const SmArgs& sm);

}  // namespace fusedattn::ffi_glue::cuda_route
