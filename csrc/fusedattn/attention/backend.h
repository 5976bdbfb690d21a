// select_backend(): the one decision of which kernels serve an AttnParams on a platform,
// forward and backward, and why the others cannot. Python asks the same function
// (c_api.cc) and the FFI handlers run what it returns, so the kernels a user is told
// about are the ones that run.
//
// The kernels: the CPU engine (attention/cpu), cuDNN SDPA graphs (attention/cudnn), the
// Hopper flash forward (attention/hopper: score_mods, dense masks and plain calls where
// measured faster; head dims 64, 128, 256; sm_90) and backward (dense masks, score_mods,
// biases and plain calls where measured faster; head dims 64, 128, 256), the generic CUDA flash kernels (attention/cuda: every call
// cuDNN declines, forward and backward, O(S) memory), and, where none serves a GPU call
// (a score_mod cuDNN cannot run), XLA's plain-JAX reference.
#pragma once

#include <string>

#include "fusedattn/attention/options.h"
#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"
#include "fusedattn/score_mod/program.h"

namespace fusedattn {

// What a call's score_mod is, as far as the kernels care.
enum class ScoreModKind : int32_t {
  kNone = 0,     // no score_mod
  kSoftcap = 1,  // k1 tanh(k2 s), no operands
  kAlibi = 2,    // s + sign slopes[h] (kv - q) or |kv - q|, slopes the one operand
  kOther = 3,    // any other program (cuDNN runs it as pointwise nodes)
};

struct ScoreModForm {
  ScoreModKind kind = ScoreModKind::kNone;
  float softcap_k1 = 0.0f, softcap_k2 = 0.0f;  // kSoftcap
  AlibiForm alibi;                              // kAlibi
  // Why the CUDA flash kernels cannot take the program (device_program_host.h's limits);
  // empty: they can.
  std::string device_limit;
};

// The form of sm (null: no score_mod).
ScoreModForm recognize_score_mod(const ScoreMod* sm);

// The form of a packed score_mod program (score_mod.h's attribute, n int32 words; null: no
// score_mod) decoded at p's extents; the decoder's error when it does not decode.
Status recognize_score_mod_program(const AttnParams& p, const int32_t* program, int64_t n,
                                   ScoreModForm* form);

// What a call asks beyond its AttnParams, where a kernel's choice depends on it.
struct BackendRequest {
  ScoreModForm score_mod;
  bool want_max_logit = false;  // the forward returns max_logit
  // The call is a shard whose index_base a kernel must honour: a block's positions (6 or
  // 8 columns), or a batch / head base with dropout or a score_mod. cuDNN and the Hopper
  // forward count from 0 and take no positions.
  bool index_base = false;
  // cuDNN's own support check (the graph build) rejected the call's graphs.
  bool cudnn_rejected = false;
  // The caller takes the gradient of the score_mod's array operands (a learnable ALiBi
  // slope, a bias table): cuDNN's backward computes none (XLA's reference would, over the
  // materialized scores); the CUDA flash kernels compute it in-kernel.
  bool score_mod_grads = false;
  // The bias is a folded boolean mask (kRequestMaskBias): the Hopper forward drops those
  // keys and skips the key tiles they empty (any other bias it adds), and the Hopper
  // backward takes no other bias.
  bool mask_bias = false;
  // The caller wants no dbias (kRequestNoDbias): the Hopper backward computes none.
  bool no_dbias = false;
  // One dropout mask shared by the batch and the heads (kRequestDropoutBroadcast): cuDNN
  // draws one per batch entry and head.
  bool dropout_broadcast = false;
  // The caller asks for a bitwise repeatable backward (kRequestDeterministic): the Hopper
  // backward with its ordered dQ wherever it can run, else cuDNN's deterministic backward;
  // the CUDA flash kernels sum dq with float32 atomics, so such a call gets no backward.
  bool deterministic = false;
};

// BackendRequest's flags as one int (the C API's `flags`), and one that only the CUDA
// flash kernels read (not a routing matter): kRequestF32Exact, the call's float32 matmuls
// at float32 accuracy (jax's matmul precision "highest" / "float32" when it was traced;
// options.h's f32_tf32).
constexpr int32_t kRequestIndexBase = 1, kRequestCudnnRejected = 2, kRequestF32Exact = 4;
// BackendRequest::score_mod_grads.
constexpr int32_t kRequestScoreModGrads = 32;
// The bias is a folded boolean mask (fusedattn's dot_product_attention): it holds
// cpu::masked_bias<T>() at the keys the mask drops (BackendRequest::mask_bias). The CPU
// engine and the Hopper forward then drop those keys as a -inf bias would and skip the key
// tiles whose every kept key a query tile's rows drop so; the other kernels add the bias
// as any other, which gives the same result (those keys' weights underflow to 0 in every
// row that keeps a key; rows that keep none are the caller's, dot_product_attention's).
constexpr int32_t kRequestMaskBias = 8;
// The caller wants no dbias (the bias has no tangent: a constant or a folded mask;
// fusedattn/_autodiff.py's specialize; BackendRequest::no_dbias). The CPU engine and the
// CUDA flash kernels skip it and write zeros (one memset: the result is never read, but an
// unwritten buffer could hold NaN bits that jax_debug_nans would see); cuDNN's graph
// computes it regardless; the Hopper backward takes a folded mask only when it is set.
constexpr int32_t kRequestNoDbias = 16;
// Dropout's mask is shared by every batch entry and head (Flax's broadcast_dropout): the
// Philox counter takes batch 0 and head 0 for all of them (index_base's bases too), so the
// mask of query i, key j is the same everywhere (BackendRequest::dropout_broadcast). The
// CPU engine and the CUDA flash kernels do it; cuDNN cannot.
constexpr int32_t kRequestDropoutBroadcast = 64;
// A bitwise repeatable backward (fusedattn.deterministic(); BackendRequest::deterministic).
constexpr int32_t kRequestDeterministic = 128;
// jax.nn.dot_product_attention's rows that keep nothing (fusedattn's dot_product_attention
// asks): a query row below its sequence's length whose lse is at most half the folded
// mask's value (no key kept, or only keys at that value) gets the plain average of all Skv
// values of its kv head, which jax's softmax over equal masked logits gives; its gradient
// reaches only dv (dout / Skv to every key of the kv head). Every backend does it after
// its kernel (forward) or around it (backward: the row's lse goes to +inf, P = 0 there),
// on the CPU (cpu/empty_rows.h) and the GPU (cuda/empty_rows.h) alike; not a routing
// matter. BSHD layouts, vanilla softmax, no dropout, no block positions
// (validate.h: validate_average_empty_rows).
constexpr int32_t kRequestAverageEmptyRows = 256;
// The bias operand is a boolean mask itself (bool, one byte a key, nonzero keeps it:
// dot_product_attention's mask when no bias came beside it), taking no gradient (its dbias
// result is not written). The handlers fold it into the masked value (cuda/keep_mask.h,
// ffi_cpu.cc) for every kernel but the Hopper ones, whose tile classification reads its
// bytes; the Hopper backward at head dim 64 then takes 128-query blocks (no bias tiles to
// stage). Needs kRequestMaskBias. Not a routing matter.
constexpr int32_t kRequestMaskKeepOnly = 512;

// BackendRequest's routing fields from the flags (everything but score_mod and
// want_max_logit, which the callers know otherwise).
BackendRequest request_from_flags(int32_t flags, BackendRequest req = {});

struct BackendChoice {
  // Who serves the call, which is whose FFI handler runs it (Python routes by it):
  // cpu_flash, cudnn (the CUDA handler, whatever kernels run inside), xla_reference, none.
  int32_t backend = FA_BACKEND_NONE;  // FaBackend
  int32_t forward = FA_BACKEND_NONE;  // the kernel of the forward (e.g. hopper)
  int32_t backward = FA_BACKEND_NONE;  // the kernel of the backward
  Status status;                      // not ok when no backend serves the call
  std::string reason;                 // why these kernels, and why not the others
};

// What the CUDA rules depend on (cuda/platform.h reads it off a device).
struct PlatformInfo {
  bool cuda_built = false;     // this library has its CUDA kernels
  int64_t cudnn_version = 0;   // loaded cuDNN (e.g. 91900); 0: none could be loaded
  int32_t sm = 0;              // compute capability * 10 (90 for an H100); 0: no device
  int64_t smem_optin = 0;      // shared memory a block may opt into (bytes)
  std::string device_error;    // why the device could not be queried
  std::string cudnn_error;     // why no cuDNN could be loaded
};

BackendChoice select_backend(const AttnParams& p, int32_t platform, const PlatformInfo& info = {},
                             const BackendRequest& req = {},
                             const BackendOptions& opts = backend_options());

// Why cuDNN cannot serve p (empty when it can, as far as static rules tell: the
// graph's own support check, run at trace time, has the last word).
std::string cudnn_unsupported_reason(const AttnParams& p, const PlatformInfo& info);

// Why the Hopper flash forward cannot serve p (empty when it can). These are the
// kernel's rules on the call (hopper::flash_fwd_unsupported checks them again, with the
// buffers' alignment, which XLA's buffers and head dim 128 always meet).
std::string hopper_fwd_unsupported_reason(const AttnParams& p, const BackendRequest& req,
                                          const PlatformInfo& info);

// Why the Hopper flash backward cannot serve p (empty when it can): calls without THD at
// head dims 64, 128 and 256 whose forward the Hopper kernel's rules take, with no score_mod
// or softcap / ALiBi (a bias beside them as tiles, dbias and the slopes' gradient too),
// sinks (a learnable one's gradient included), a dense mask (whose tiles it skips; cuDNN's
// backward adds the mask over every tile) or a bias with dbias. Whether a plain call takes
// it is the measurement's (hopper_plain_measured).
std::string hopper_bwd_unsupported_reason(const AttnParams& p, const BackendRequest& req,
                                          const PlatformInfo& info);

// Why a plain call (no score_mod) the Hopper forward (backward: the Hopper backward) can
// run stays on cuDNN by the measurement (hopper/measured.h; measured_bwd.h); empty when the
// Hopper kernel was measured faster.
std::string hopper_plain_measured(const AttnParams& p, bool backward = false);

// Why the generic CUDA flash kernels cannot serve p (empty when they can).
std::string flash_unsupported_reason(const AttnParams& p, const BackendRequest& req,
                                     const PlatformInfo& info);

}  // namespace fusedattn
