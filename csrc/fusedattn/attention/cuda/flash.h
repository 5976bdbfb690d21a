// The generic CUDA flash-attention kernels (sm_80 and newer): every call that cuDNN and
// the Hopper forward decline runs here, forward and backward, with O(S) extra memory.
//
// It is the CPU engine (attention/cpu) on tensor cores: the same tiles (a query tile's
// rows stream the key tiles their kept ranges touch, online softmax, float32
// accumulation), the same per-element steps (mask.h's kept range per row, bias pre- or
// post-scale, the extra softmax logit, philox.h's dropout on global indices, index_base
// and blocks of a bigger call) and the same NaN rules (NaN in a row's kept scores makes
// its output, lse and max_logit NaN; a row that keeps nothing gives 0 and lse -inf).
//
// Matmuls: wmma fragments. 16-bit inputs multiply in their type (float32 accumulation);
// float32 inputs in 3xTF32 by default (a = a_hi + a_lo, each TF32; a.b = a_hi.b_hi +
// a_hi.b_lo + a_lo.b_hi, about float32's accuracy, so the GPU agrees with the CPU engine
// and the float32 reference), or plain TF32 (`f32_tf32`: FUSEDATTN_F32_MATMUL=tf32, about
// 3x less tensor-core work, 1e-3 relative error, what XLA's default precision does).
//
// Head dims: any up to 512 (q/k and v may differ); the query tile holds 64 rows (32 past
// Dv 256) and the backward's key tile 32 keys (16 past 256), so shared memory stays near
// 100-200 KB.
//
// Workspace (flash_workspace_bytes, carved by the handler): the per-row kept-key table
// [B, Sq], per-tile unions, the segments, and per-(b, h, tile) maxima; the backward adds
// delta [B, Hq, Sq], a float32 dq accumulator [B, Sq, Hq, D] and, for 16-bit dbias, a
// float32 dbias accumulator of the bias's size. All linear in S but dbias's (the result's
// own size).
//
// Determinism: dq, dbias over broadcast dims and d softmax_offset are summed with float32
// atomics (order may vary run to run, within float32 rounding); dk, dv and out are
// written by one block each.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "fusedattn/attention/mask.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/attention/tensors.h"
#include "fusedattn/core/status.h"

namespace fusedattn::cuda::flash {

// Which calls the kernels serve: backend.cc's flash_unsupported_reason (flash_rules.h's
// shapes against the device's shared memory).

// Workspace bytes of a call (forward or backward).
size_t workspace_bytes(const AttnParams& p, bool backward);

// p must have passed validate(); t holds its tensors as ffi_decode.h decodes them (the
// forward writes out, lse and max_logit; the backward dq, dk, dv and, where t has them,
// dbias and dsoftmax_offset); index_base with 6 or 8 columns makes the call a block of a
// bigger one (mask.h). f32_tf32: float32 matmuls in plain TF32 (options.h). The workspace
// must have workspace_bytes(p, ...) bytes, 256-byte aligned.
Status forward(const AttnParams& p, const AttnTensors& t, bool f32_tf32, void* workspace,
               cudaStream_t stream);
Status backward(const AttnParams& p, const AttnTensors& t, bool f32_tf32, void* workspace,
                cudaStream_t stream);

}  // namespace fusedattn::cuda::flash
