// extern "C" queries for Python (ctypes): version, build features, and the
// same validate() / select_backend() the FFI handlers use, so Python can
// reject bad calls at trace time with the C++ engine's own message.
#include <string>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/options.h"
#include "fusedattn/attention/cpu/score_ops.h"
#include "fusedattn/platform/cpu/thread_pool.h"
#include "fusedattn/attention/validate.h"
#include "fusedattn/core/messages.h"
#ifdef FUSEDATTN_WITH_CUDA
#include "fusedattn/attention/cudnn/sdpa_config.h"
#include "fusedattn/attention/hopper/flash_fwd.h"
#include "fusedattn/attention/hopper/flash_bwd.h"
#include "fusedattn/platform/cuda/platform_info.h"
#include "fusedattn/attention/ffi_cuda.h"
#endif

using fusedattn::copy_message;

extern "C" {

const char* fa_version() { return FUSEDATTN_VERSION; }

int fa_params_size() { return static_cast<int>(sizeof(FaAttnParams)); }

int fa_built_with_cuda() {
#ifdef FUSEDATTN_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

// Returns an FaStatus; the message (if any) goes to msg.
int fa_validate(const FaAttnParams* p, char* msg, int msg_len) {
  const fusedattn::Status s = fusedattn::validate(*p);
  copy_message(s.message, msg, msg_len);
  return s.code;
}

// Returns the FaBackend that serves the call (whose FFI handler runs it: cpu_flash, cudnn
// for the CUDA handler, xla_reference or none); *forward and *backward get the kernels
// that run inside (e.g. hopper and cudnn), *status validate()'s code, reason the
// explanation. `device` is the CUDA device whose capabilities decide a CUDA platform
// query. score_mod: the packed program attribute (score_mod.h) of a flex-attention call,
// or null; want_max_logit: the forward returns max_logit; flags: BackendRequest's
// (backend.h: kRequestIndexBase, kRequestCudnnRejected).
int fa_select_backend(const FaAttnParams* p, int platform, int device, const int32_t* score_mod,
                      int64_t score_mod_len, int want_max_logit, int flags, int* forward,
                      int* backward, int* status, char* reason, int reason_len) {
  fusedattn::PlatformInfo info;
#ifdef FUSEDATTN_WITH_CUDA
  if (platform == FA_PLATFORM_CUDA) {
    const fusedattn::Status s = fusedattn::cuda::platform_info(device, &info);
    if (!s.ok()) {
      info.cuda_built = true;
      info.device_error = s.message;
    }
  }
#endif
  fusedattn::BackendRequest req = fusedattn::request_from_flags(flags);
  req.want_max_logit = want_max_logit != 0;
  fusedattn::BackendChoice c;
  fusedattn::Status decoded;
  if (score_mod && !fusedattn::validate(*p).ok())  // select_backend names what is wrong
    req.score_mod.kind = fusedattn::ScoreModKind::kOther;
  else
    decoded = fusedattn::recognize_score_mod_program(*p, score_mod, score_mod_len, &req.score_mod);
  if (decoded.ok()) {
    c = fusedattn::select_backend(*p, platform, info, req);
  } else {
    c.status = decoded;
    c.reason = "no backend serves this call: score_mod: " + decoded.message;
  }
  if (forward) *forward = c.forward;
  if (backward) *backward = c.backward;
  if (status) *status = c.status.code;
  copy_message(c.reason, reason, reason_len);
  return c.backend;
}

// Builds (or finds in the cache) the cuDNN graph that will serve p on `device`, forward
// or backward: the last word on whether cuDNN supports a call. score_mod: the packed
// program attribute (score_mod.h) of a flex-attention call, or null; flags as
// fa_select_backend's (kRequestDeterministic: the deterministic backward graph). Returns an
// FaStatus.
int fa_cudnn_check(const FaAttnParams* p, int device, int want_lse, int want_max_logit,
                   int backward, int flags, const int32_t* score_mod, int64_t score_mod_len,
                   char* msg, int msg_len) {
#ifdef FUSEDATTN_WITH_CUDA
  const fusedattn::cudnn::ScoreModSpec spec{score_mod, score_mod_len};
  const fusedattn::cudnn::ScoreModSpec* sm = score_mod ? &spec : nullptr;
  fusedattn::Status s;
  if (sm && p->bias_type != FA_NO_BIAS) {
    s = fusedattn::Status::Unimplemented("score_mod with a bias on cuDNN");
  } else {
    std::shared_ptr<const fusedattn::cudnn::BuiltGraph> g;
    const bool det = (flags & fusedattn::kRequestDeterministic) != 0;
    s = fusedattn::cudnn::get_graph(
        backward ? fusedattn::cudnn::make_bwd_config(*p, det, sm)
                 : fusedattn::cudnn::make_config(*p, want_max_logit != 0, want_lse != 0, sm),
        backward != 0, device, &g);
  }
  copy_message(s.message, msg, msg_len);
  return s.code;
#else
  (void)score_mod, (void)score_mod_len, (void)flags;
  copy_message("this build of fusedattn has no CUDA kernels", msg, msg_len);
  return FA_UNIMPLEMENTED;
#endif
}

// Bytes of the uint8 workspace result of the CUDA attention forward (backward) of p
// (score_mod as fa_cudnn_check; flags as fa_select_backend's). Returns an FaStatus; the
// message (if any) goes to msg.
int fa_cuda_attn_workspace_bytes(const FaAttnParams* p, int device, int want_lse,
                                 int want_max_logit, int backward, int flags,
                                 const int32_t* score_mod, int64_t score_mod_len, int64_t* bytes,
                                 char* msg, int msg_len) {
#ifdef FUSEDATTN_WITH_CUDA
  const fusedattn::cudnn::ScoreModSpec spec{score_mod, score_mod_len};
  const fusedattn::Status s = fusedattn::ffi_glue::attn_workspace_bytes(
      *p, device, want_lse != 0, want_max_logit != 0, backward != 0, flags, bytes,
      score_mod ? &spec : nullptr);
  copy_message(s.message, msg, msg_len);
  return s.code;
#else
  (void)score_mod, (void)score_mod_len, (void)flags;
  copy_message("this build of fusedattn has no CUDA kernels", msg, msg_len);
  return FA_UNIMPLEMENTED;
#endif
}

// cuDNN graphs built so far in this process (0 without CUDA).
int64_t fa_cudnn_graphs_built() {
#ifdef FUSEDATTN_WITH_CUDA
  return fusedattn::cudnn::built_graph_count();
#else
  return 0;
#endif
}

// Hopper flash forward launches so far in this process (tests: which kernel ran).
int64_t fa_hopper_fwd_launches() {
#ifdef FUSEDATTN_WITH_CUDA
  return fusedattn::cuda::hopper::launch_count();
#else
  return 0;
#endif
}

// Hopper flash backward calls so far in this process (tests: which kernel ran).
int64_t fa_hopper_bwd_launches() {
#ifdef FUSEDATTN_WITH_CUDA
  return fusedattn::cuda::hopper::bwd_launch_count();
#else
  return 0;
#endif
}

// options.h's set_hopper_fwd_override: 0 off, 1 always, 2 by the measurement, < 0 the
// environment's (FUSEDATTN_HOPPER_FWD).
void fa_set_hopper_fwd(int mode) { fusedattn::set_hopper_fwd_override(mode); }
// The same for the Hopper backward (FUSEDATTN_HOPPER_BWD).
void fa_set_hopper_bwd(int mode) { fusedattn::set_hopper_bwd_override(mode); }

const char* fa_backend_name(int backend) { return fusedattn::backend_name(backend); }

void fa_set_num_threads(int n) { fusedattn::cpu::set_num_threads(n); }
int fa_num_threads() { return fusedattn::cpu::max_slots(); }

// The bias a folded boolean mask puts at dropped keys for an FaDType (cpu::masked_bias,
// backend.h's kRequestMaskBias); 0 for an unknown code.
float fa_masked_bias_value(int dtype) {
  using namespace fusedattn::cpu;
  switch (dtype) {
    case FA_FLOAT32: return masked_bias<float>();
    case FA_BFLOAT16: return masked_bias<bf16>();
    case FA_FLOAT16: return masked_bias<fp16>();
    case FA_FLOAT64: return masked_bias<double>();
  }
  return 0.0f;
}

// backend.h's kRequest* bit of a name ("mask_bias" for kRequestMaskBias, ...); -1 for an
// unknown name. Python keeps its own REQUEST_* constants; a test compares them with these.
int32_t fa_request_flag(const char* name) {
  using namespace fusedattn;
  const std::string n = name ? name : "";
  if (n == "index_base") return kRequestIndexBase;
  if (n == "cudnn_rejected") return kRequestCudnnRejected;
  if (n == "f32_exact") return kRequestF32Exact;
  if (n == "mask_bias") return kRequestMaskBias;
  if (n == "no_dbias") return kRequestNoDbias;
  if (n == "score_mod_grads") return kRequestScoreModGrads;
  if (n == "dropout_broadcast") return kRequestDropoutBroadcast;
  if (n == "deterministic") return kRequestDeterministic;
  if (n == "average_empty_rows") return kRequestAverageEmptyRows;
  if (n == "mask_keep_only") return kRequestMaskKeepOnly;
  return -1;
}

}  // extern "C"
