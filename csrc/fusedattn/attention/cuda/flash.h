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
// Two sets of kernels: for head dims up to 128 with rows of whole 16-byte chunks,
// flash_mma.cu / flash_mma_bwd.cu (mma.sync with S, P, O and dK, dV in registers,
// cp.async double buffers: FlashAttention-2's layout); for the rest flash.cu's wmma
// kernels (any head dim up to 512, q/k and v may differ; a query tile of 64 rows, 32 past
// Dv 256, and a backward key tile of 32 keys, 16 past 256). 16-bit inputs multiply in
// their type (float32 accumulation); float32 inputs in plain TF32 (`f32_tf32`: jax's
// default matmul precision, as XLA's own float32 matmuls; 1e-3 relative error) or 3xTF32
// (a = a_hi + a_lo, each TF32; a.b = a_hi.b_hi + a_hi.b_lo + a_lo.b_hi, about float32's
// accuracy, ~3x the tensor-core work: jax's "highest" / "float32" precision; options.h).
//
// Workspace (flash_workspace_bytes, carved by the handler): the per-row kept-key table
// [B, Sq], per-tile unions, the segments, and per-(b, h, tile) maxima; the backward adds
// delta [B, Hq, Sq], a float32 dq accumulator [B, Sq, Hq, D] and, for 16-bit dbias, a
// float32 dbias accumulator of the bias's size; a float32 call, room for q, k, v (and dout)
// rounded to TF32 once (a TF32 call reads them there). All linear in S but dbias's (the
// result's own size).
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
#include "fusedattn/score_mod/device_program.h"

namespace fusedattn::cuda::flash {

// Which calls the kernels serve: backend.cc's flash_unsupported_reason (flash_rules.h's
// shapes against the device's shared memory).

// A score_mod (flex attention) of a call: the packed program (host memory; null: none),
// the operands [V, total] and, in the backward, their gradients (float32 [V, total],
// overwritten; null: not wanted). The register-resident kernels run the program on each
// kept score (after scale and bias, as the CPU engine), its derivative in the backward and
// the operands' gradients in-kernel (a thread sums its elements' gradients while they go
// to the same operand element, then one float32 atomic); the wmma kernels run none, so a
// call whose rows they would take fails with Unimplemented.
struct ScoreModArgs {
  const DeviceScoreMod* program = nullptr;
  const float* operands = nullptr;
  float* doperands = nullptr;
};

// Workspace bytes of a call (forward or backward; score_mod: it has one).
size_t workspace_bytes(const AttnParams& p, bool backward, bool score_mod = false);

// p must have passed validate(); t holds its tensors as ffi_decode.h decodes them (the
// forward writes out, lse and max_logit; the backward dq, dk, dv and, where t has them,
// dbias and dsoftmax_offset); index_base with 6 or 8 columns makes the call a block of a
// bigger one (mask.h). f32_tf32: float32 matmuls in plain TF32, else 3xTF32 (options.h).
// drop_broadcast: one dropout mask for every batch entry and head (backend.h's
// kRequestDropoutBroadcast). The workspace must have workspace_bytes(p, ...) bytes, 256-byte
// aligned.
Status forward(const AttnParams& p, const AttnTensors& t, bool f32_tf32, void* workspace,
               cudaStream_t stream, const ScoreModArgs& sm = {}, bool drop_broadcast = false);
Status backward(const AttnParams& p, const AttnTensors& t, bool f32_tf32, void* workspace,
                cudaStream_t stream, const ScoreModArgs& sm = {}, bool drop_broadcast = false);

}  // namespace fusedattn::cuda::flash
