#include "fusedattn/attention/backend.h"

#include <algorithm>
#include <sstream>

#include "fusedattn/attention/cuda/flash_rules.h"
#include "fusedattn/attention/hopper/band.h"
#include "fusedattn/attention/hopper/measured.h"
#include "fusedattn/attention/hopper/measured_bwd.h"
#include "fusedattn/attention/validate.h"
#include "fusedattn/score_mod/device_program_host.h"

namespace fusedattn {
namespace {

constexpr int64_t kCudnnSinkVersion = 91300;  // sink tokens, max / sum_exp outputs

// The Hopper forward's head dims and tile shape (hopper/fwd_kernel.cuh) and tile limit: its
// blocks count tiles in int and step by the grid size (t += gridDim.x, up to twice the tile
// count), so tiles stay at most 2^30.
constexpr int64_t kHopperBlockM = 128;
constexpr int64_t kHopperMaxTiles = int64_t{1} << 30;

// cuDNN's SDPA graphs fail to run with a batch of 65536 or more (a 16-bit batch extent:
// pytorch/pytorch#181235, measured with cuDNN 9.2 on an H100).
constexpr int64_t kCudnnMaxBatch = 65535;
// The elements cuDNN indexes in one tensor (python/fusedattn/_gpu_route.py's _CUDNN_MAX_ELEMENTS).
constexpr int64_t kCudnnMaxElements = (int64_t{1} << 31) - 1;

std::string fmt_version(int64_t v) {
  std::ostringstream os;
  os << v / 10000 << "." << (v / 100) % 100 << "." << v % 100;
  return os.str();
}

}  // namespace

std::string cudnn_unsupported_reason(const AttnParams& p, const PlatformInfo& info) {
  std::ostringstream os;
  if (!info.cuda_built) return "this build of fusedattn has no CUDA kernels";
  if (info.sm == 0) return "no CUDA device could be queried (" + info.device_error + ")";
  if (info.cudnn_version == 0) return info.cudnn_error.empty() ? "cuDNN is not loaded" : info.cudnn_error;
  if (info.cudnn_version < 90000)
    return "cuDNN " + fmt_version(info.cudnn_version) + " is older than 9.0";
  if (info.sm < 80) {
    os << "cuDNN attention needs compute capability 8.0 or newer; the device has "
       << info.sm / 10 << "." << info.sm % 10;
    return os.str();
  }
  if (p.dtype != FA_BFLOAT16 && p.dtype != FA_FLOAT16)
    return std::string("cuDNN attention takes bfloat16 or float16; got ") + dtype_name(p.dtype);
  if (p.head_dim_qk % 8 != 0 || p.head_dim_v % 8 != 0) {
    os << "cuDNN needs head dims that are multiples of 8; got " << p.head_dim_qk << " and "
       << p.head_dim_v;
    return os.str();
  }
  if (p.bias_type == FA_PRE_SCALE_BIAS)
    return "cuDNN adds the bias after the scale (POST_SCALE_BIAS); PRE_SCALE_BIAS is not served";
  if (p.bias_type != FA_NO_BIAS && is_thd(p.layout))
    return std::string("cuDNN has no bias for the THD layouts (") + layout_name(p.layout) + ")";
  // cuDNN indexes a tensor in 32 bits (Python runs larger calls in batch chunks under it:
  // _gpu_route._cudnn_chunk), but a bias that broadcasts over the batch, or one batch entry of
  // it, cannot be split so.
  if (p.bias_type != FA_NO_BIAS && p.bias_heads * p.seqlen_q * p.seqlen_kv > kCudnnMaxElements) {
    os << "cuDNN indexes at most 2^31 - 1 elements of a tensor, and one batch entry of the bias "
       << "has " << p.bias_heads * p.seqlen_q * p.seqlen_kv;
    return os.str();
  }
  if (p.softmax_type != FA_VANILLA_SOFTMAX && info.cudnn_version < kCudnnSinkVersion)
    return std::string(softmax_name(p.softmax_type)) + " needs cuDNN 9.13 or newer; loaded " +
           fmt_version(info.cudnn_version);
  // Without per-sequence lengths cuDNN checks the tensor extents (with them, its
  // graph validation decides at trace time).
  if (p.seqlen_q > p.seqlen_kv && !has_padding(p.mask_type) &&
      (is_causal_bottom_right(p.mask_type) || p.window_left >= 0)) {
    os << "cuDNN's bottom-right causal masks and sliding windows need Sq <= Skv; got Sq "
       << p.seqlen_q << " > Skv " << p.seqlen_kv;
    return os.str();
  }
  // The graph's batch: the rows (THD: each row's segments are sequences of their own).
  // Counted over every vmap slice, since one graph serves them all unless
  // graph_per_slice (cudnn/sdpa_config.h) splits it.
  const int64_t graph_batch = p.batch * (is_thd(p.layout) ? p.max_segments : 1);
  if (graph_batch > kCudnnMaxBatch) {
    os << "cuDNN runs at most " << kCudnnMaxBatch << " sequences in one graph; got "
       << graph_batch << (is_thd(p.layout) ? " (batch x max_segments_per_seq)" : " (batch)");
    return os.str();
  }
  if (is_thd(p.layout)) {
    // Ragged offsets are int32 element offsets, over every slice's rows (as above): the
    // last one is the token count times the token stride (at most 3 H D, packed).
    const int64_t tokens = p.batch * std::max(p.seqlen_q, p.seqlen_kv);
    const int64_t widest = 3 * std::max(p.heads_q, p.heads_kv) *
                           std::max(p.head_dim_qk, p.head_dim_v);
    if (tokens * widest >= (int64_t{1} << 31)) {
      os << "THD tensors of " << tokens * widest << " elements exceed cuDNN's int32 ragged offsets";
      return os.str();
    }
  }
  return "";
}

ScoreModForm recognize_score_mod(const ScoreMod* sm) {
  ScoreModForm f;
  if (!sm) return f;
  device_score_mod_fits(*sm, &f.device_limit);
  if (sm->n_operands == 0 && match_softcap(sm->fwd, &f.softcap_k1, &f.softcap_k2))
    f.kind = ScoreModKind::kSoftcap;
  else if (match_alibi(*sm, &f.alibi))
    f.kind = ScoreModKind::kAlibi;
  else
    f.kind = ScoreModKind::kOther;
  return f;
}

Status recognize_score_mod_program(const AttnParams& p, const int32_t* program, int64_t n,
                                   ScoreModForm* form) {
  *form = ScoreModForm{};
  if (!program) return Status::Ok();
  ScoreMod sm;
  const int64_t ext[4] = {slice_batch(p), p.heads_q, p.seqlen_q, p.seqlen_kv};
  FA_RETURN_IF_NOT_OK(decode_score_mod(program, n, ext, &sm));
  *form = recognize_score_mod(&sm);
  return Status::Ok();
}

namespace {

// hopper_bwd_unsupported_reason with its forward's verdict (hopper_fwd_unsupported_reason)
// given: select_backend has it already.
std::string hopper_bwd_reason(const AttnParams& p, const BackendRequest& req, const std::string& fwd_no) {
  if (req.score_mod.kind == ScoreModKind::kOther)
    return "its backward's score_mods are softcap and ALiBi only";
  // A bias beside a score_mod: softcap's and ALiBi's (the dense variants, dbias too).
  if (is_thd(p.layout)) return "its backward takes no THD layout yet";
  // Its forward's rules (the backward recomputes the forward's tiles from its lse).
  if (!fwd_no.empty()) return fwd_no;
  // dbias: dS where the bias has the call's extents, float32 atomic sums where it broadcasts
  if (p.bias_type != FA_NO_BIAS && !req.no_dbias && req.deterministic &&
      (p.bias_batch < p.batch || p.bias_heads < p.heads_q))
    return "its dbias of a broadcast bias sums with float32 atomics (not bitwise repeatable)";
  if (p.head_dim_qk != 64 && p.head_dim_qk != 128 && p.head_dim_qk != 256)
    return "its backward takes head dims 64, 128 and 256 (got " + std::to_string(p.head_dim_qk) + ")";
  if (p.bias_batch * p.bias_heads > 65535 || p.seqlen_q > 65535 * 64)
    return "its backward's mask takes at most 65535 (batch, head) planes and 65535 x 64 query rows";
  if (p.batch > 65535 || p.heads_kv > 65535) return "its backward's grid takes at most 65535 batch rows and kv heads";
  return "";
}

}  // namespace

// A bias the Hopper forward reads as tiles through the copy engine (FlashFwdParams::bias_tile):
// rows of whole 16-byte units (the FFI passes it contiguous: Skv a multiple of 8). Measured
// against cuDNN's forward with the same post-scale bias (H200, 2026-11-29, bf16, S 4096, bias
// [1, H, S, S]): 1.14 / 1.04x at head dim 64 (causal / full), 1.35 / 1.32x at 128, 2.04 /
// 2.00x at 256; with a pre-scale bias 2.40-3.65x the CUDA flash kernels' forward
// (bench/RESULTS.md). Other biases are read a score at a time: slower than either.
namespace {
bool hopper_bias_tiles(const AttnParams& p) {
  return p.bias_type != FA_NO_BIAS && p.seqlen_kv % 8 == 0;
}
}  // namespace

std::string hopper_bwd_unsupported_reason(const AttnParams& p, const BackendRequest& req,
                                          const PlatformInfo& info) {
  return hopper_bwd_reason(p, req, hopper_fwd_unsupported_reason(p, req, info));
}

std::string hopper_fwd_unsupported_reason(const AttnParams& p, const BackendRequest& req,
                                          const PlatformInfo& info) {
  std::ostringstream os;
  const ScoreModKind kind = req.score_mod.kind;
  if (kind == ScoreModKind::kOther) return "its score_mods are softcap and ALiBi only";
  if (kind == ScoreModKind::kAlibi && p.num_slices != 1)
    return "its ALiBi takes one vmap slice";
  // Its softmax keeps q.k's order (the max of q.k is the max score), which needs scale > 0.
  if (kind == ScoreModKind::kNone && !(p.scale > 0.0f))
    return "it takes scale > 0 without a score_mod (got " + std::to_string(p.scale) + ")";
  // A bias (pre- or post-scale) or a dense mask (a folded one). With softcap or ALiBi: as
  // tiles only (WithBiasTile: they join the raw scores before the modifier, the order the
  // engine defines).
  if (p.bias_type != FA_NO_BIAS && kind != ScoreModKind::kNone) {
    const char* mod = kind == ScoreModKind::kSoftcap ? "softcap" : "ALiBi";
    if (req.mask_bias || !hopper_bias_tiles(p))
      return std::string("its ") + mod + " takes a bias as tiles only: no dense mask, Skv a multiple of 8";
    if (p.bias_type == FA_POST_SCALE_BIAS && p.scale == 0.0f)
      return std::string("its ") + mod + " with a post-scale bias needs scale != 0";
  }
  if (p.bias_type != FA_NO_BIAS && (is_thd(p.layout) || p.num_slices != 1))
    return "its bias takes no THD layout and one vmap slice";
  if (req.mask_bias && p.bias_type != FA_NO_BIAS &&
      (p.bias_batch * p.bias_heads > 65535 || p.seqlen_q > 65535 * 128))
    return "its dense mask takes at most 65535 (batch, head) planes and 65535 x 128 query rows";
  if (has_dropout(p)) return "it has no dropout";
  if (p.dtype != FA_BFLOAT16 && p.dtype != FA_FLOAT16)
    return std::string("it takes bfloat16 or float16; got ") + dtype_name(p.dtype);
  if (is_thd(p.layout) && (p.batch * p.seqlen_q >= (int64_t{1} << 31) ||
                           p.batch * p.seqlen_kv >= (int64_t{1} << 31)))
    return "its THD token indices are int32 (B * S < 2^31)";
  if (const char* empty = hopper_rules::band_empty_rows(p, hopper_rules::band(p)); *empty)
    return empty;
  if ((p.head_dim_qk != 64 && p.head_dim_qk != 128 && p.head_dim_qk != 256) ||
      p.head_dim_v != p.head_dim_qk) {
    os << "it takes head dims 64, 128 and 256 (the same for q, k and v); got " << p.head_dim_qk
       << " and " << p.head_dim_v;
    return os.str();
  }
  if (info.sm != 90) {
    os << "it needs compute capability 9.0 (wgmma, sm_90a); the device has " << info.sm / 10
       << "." << info.sm % 10;
    return os.str();
  }
  const int64_t segments = is_thd(p.layout) ? p.max_segments : 1;
  if ((p.seqlen_q + kHopperBlockM - 1) / kHopperBlockM * p.heads_q >
      kHopperMaxTiles / std::max<int64_t>(1, p.batch) / std::max<int64_t>(1, segments))
    return "more than 2^30 tiles of 128 query rows (batch x segments x heads x ceil(Sq / 128))";
  return "";
}

std::string hopper_plain_measured(const AttnParams& p, bool backward) {
  using namespace hopper_rules;
  const Band b = band(p);
  const int32_t mask = is_thd(p.layout) ? kThd : b.left_bound ? kWindow : b.causal ? kCausal : kFull;
  const char* names[] = {"full", "causal", "windowed", "THD"};
  const Measured* table = backward ? kMeasuredBwd : kMeasured;
  const int rows = backward ? kMeasuredBwdRows : kMeasuredRows;
  const char* on = backward ? kMeasuredBwdOn : kMeasuredOn;
  const char* file = backward ? "hopper/measured_bwd.h" : "hopper/measured.h";
  const char* what = backward ? "backward" : "forward";
  // The largest measured length <= Sq of the mask's class at the call's head dim.
  const Measured* row = nullptr;
  for (int i = 0; i < rows; ++i)
    if (table[i].mask == mask && table[i].head_dim == p.head_dim_qk && table[i].seqlen <= p.seqlen_q &&
        (!row || table[i].seqlen > row->seqlen))
      row = &table[i];
  std::ostringstream os;
  if (!row) {
    os << "no measurement of " << names[mask] << " calls' " << what << " at head dim " << p.head_dim_qk
       << " and Sq <= " << p.seqlen_q << " (" << file << ": " << on << ")";
    return os.str();
  }
  if (row->ratio < hopper_rules::kMargin) {
    os << "cuDNN's " << what << " measured as fast or faster on " << names[mask] << " calls at head dim "
       << row->head_dim << ", S " << row->seqlen << " (Hopper " << row->ratio << "x cuDNN, " << on << ")";
    return os.str();
  }
  return "";
}

std::string flash_unsupported_reason(const AttnParams& p, const BackendRequest& req,
                                     const PlatformInfo& info) {
  std::ostringstream os;
  if (!info.cuda_built) return "this build of fusedattn has no CUDA kernels";
  if (info.sm == 0) return "no CUDA device could be queried (" + info.device_error + ")";
  if (info.sm < 80) {
    os << "they need compute capability 8.0 or newer; the device has " << info.sm / 10 << "."
       << info.sm % 10;
    return os.str();
  }
  if (req.score_mod.kind != ScoreModKind::kNone) {
    // The register-resident kernels run it; the wmma ones (rows not of 16-byte chunks) not.
    const int64_t v = p.dtype == FA_FLOAT32 ? 4 : 8;
    if (p.head_dim_qk % v || p.head_dim_v % v || std::max(p.head_dim_qk, p.head_dim_v) > 512) {
      os << "they run a score_mod only for head dims up to 512 that are multiples of " << v << " in "
         << dtype_name(p.dtype) << "; got " << p.head_dim_qk << " and " << p.head_dim_v;
      return os.str();
    }
    if (!req.score_mod.device_limit.empty())
      return "its score_mod program does not fit them: " + req.score_mod.device_limit;
  }
  if (p.seqlen_q >= (int64_t{1} << 31) || p.seqlen_kv >= (int64_t{1} << 31))
    return "their kept-key table holds int32 token indices";
  const int64_t blocks = std::max(p.batch * p.heads_q * ((p.seqlen_q + 31) / 32),
                                  p.batch * p.heads_kv * ((p.seqlen_kv + 15) / 16));
  if (blocks >= (int64_t{1} << 31) - 1) return "more than 2^31 - 1 blocks";
  const int elem = p.dtype == FA_FLOAT32 ? 4 : 2;
  const size_t need = cuda::flash::smem_need(p.head_dim_qk, p.head_dim_v, elem);
  if (int64_t(need) > info.smem_optin) {
    os << "they need " << need << " bytes of shared memory per block for head dims "
       << p.head_dim_qk << " / " << p.head_dim_v << " in " << dtype_name(p.dtype)
       << "; the device offers " << info.smem_optin;
    return os.str();
  }
  return "";
}

BackendRequest request_from_flags(int32_t flags, BackendRequest req) {
  req.index_base = (flags & kRequestIndexBase) != 0;
  req.cudnn_rejected = (flags & kRequestCudnnRejected) != 0;
  req.score_mod_grads = (flags & kRequestScoreModGrads) != 0;
  req.mask_bias = (flags & kRequestMaskBias) != 0;
  req.no_dbias = (flags & kRequestNoDbias) != 0;
  req.dropout_broadcast = (flags & kRequestDropoutBroadcast) != 0;
  req.deterministic = (flags & kRequestDeterministic) != 0;
  return req;
}

BackendChoice select_backend(const AttnParams& p, int32_t platform, const PlatformInfo& info,
                             const BackendRequest& req, const BackendOptions& opts) {
  BackendChoice choice;
  choice.status = validate(p);
  if (!choice.status.ok()) {
    choice.reason = "no backend serves this call: " + choice.status.message;
    return choice;
  }
  switch (platform) {
    case FA_PLATFORM_CPU:
      if (p.dtype == FA_FLOAT64 && req.score_mod.kind != ScoreModKind::kNone) {
        choice.backend = choice.forward = choice.backward = FA_BACKEND_XLA_REFERENCE;
        choice.reason = "xla_reference: float64 with a score_mod: the CPU engine runs float64 in "
                        "double, but its score_mod interpreter computes in float32, so XLA "
                        "computes the plain-JAX reference in float64 (materialized scores)";
        return choice;
      }
      choice.backend = choice.forward = choice.backward = FA_BACKEND_CPU_FLASH;
      if (p.dtype == FA_FLOAT64) {
        choice.reason = "cpu_flash: the tiled online-softmax CPU engine, in double for float64";
        return choice;
      }
      choice.reason = "cpu_flash: the tiled online-softmax CPU engine serves every valid call";
      return choice;
    case FA_PLATFORM_CUDA: {
      if (p.dtype == FA_FLOAT64) {  // Python casts float64 calls to float32 for the GPU
        choice.status = Status::Unimplemented(
            "dtype: float64 has no CUDA kernel; fused_attn runs float64 calls as float32 on the "
            "GPU (cast in Python), so ask with float32");
        choice.reason = "no backend serves this call: " + choice.status.message;
        return choice;
      }
      const bool sm_call = req.score_mod.kind != ScoreModKind::kNone;
      std::string why_not = cudnn_unsupported_reason(p, info);
      if (why_not.empty() && req.index_base)
        why_not = "it counts dropout's and score_mod's batch / head indices from 0 and takes no "
                  "block positions, and this shard's index_base needs them";
      if (why_not.empty() && sm_call && p.bias_type != FA_NO_BIAS)
        why_not = "it would apply the bias after the score_mod";
      if (why_not.empty() && req.cudnn_rejected) why_not = "its graph support check rejected the call";
      if (why_not.empty() && req.dropout_broadcast && has_dropout(p))
        why_not = "it draws a dropout mask per batch entry and head, and this call shares one "
                  "over them (dropout_broadcast)";
      // (With the flash kernels' score_mod path on: else cuDNN runs it and XLA's reference
      // gives the operands' gradient.)
      if (why_not.empty() && sm_call && req.score_mod_grads && opts.flash_score_mod)
        why_not = "its backward computes no gradient of the score_mod's operands (XLA's reference "
                  "would, over the materialized scores)";
      if (!why_not.empty()) {
        std::string flash_no = flash_unsupported_reason(p, req, info);
        if (flash_no.empty() && sm_call && !opts.flash_score_mod)
          flash_no = "their score_mod path is off (FUSEDATTN_FLASH_SCORE_MOD=0)";
        if (flash_no.empty()) {
          choice.backend = choice.forward = choice.backward = FA_BACKEND_CUDA_FLASH;
          choice.reason = "cuda_flash: fusedattn's CUDA flash kernels, O(S) memory (cuDNN "
                          "cannot serve this call: " + why_not + ")";
          // The Hopper forward can run the forward of such a call without a score_mod (a
          // PRE_SCALE_BIAS, a bias with a window, a graph cuDNN rejected), the flash kernels
          // the backward from its lse. A bias it reads as tiles (hopper_bias_tiles): always
          // (2.40-3.65x the flash kernels' forward); read a score at a time, it ran a
          // PRE_SCALE_BIAS at 1.26-1.38x the flash kernels' speed at head dim 256, 0.45-0.86x
          // below (H200, session 30). Plain graphs cuDNN rejected: FUSEDATTN_HOPPER_FWD=1.
          // softcap or ALiBi (a bias beside it, ALiBi's slopes' gradient taken): always, where
          // the bias comes as tiles (H200, bf16, S 4096, D 128, causal: alibi + bias 6x the
          // flash kernels' forward, softcap + bias 7.6x, 8.0x forward+backward with the
          // Hopper backward: bench/RESULTS.md).
          const bool bias_tiles = hopper_bias_tiles(p);
          // (hopper_fwd_unsupported_reason takes a score_mod's bias as tiles only.)
          const bool closed = (req.score_mod.kind == ScoreModKind::kAlibi ||
                               req.score_mod.kind == ScoreModKind::kSoftcap) &&
                              (p.bias_type == FA_NO_BIAS || opts.hopper_bias_tile);
          const bool alibi = closed && req.score_mod.kind == ScoreModKind::kAlibi;
          const bool measured_pre =
              (bias_tiles || closed || (p.bias_type == FA_PRE_SCALE_BIAS && p.head_dim_qk == 256)) &&
              opts.hopper_fwd == HopperMode::kMeasured;
          const std::string fwd_rules = hopper_fwd_unsupported_reason(p, req, info);
          if ((req.score_mod.kind == ScoreModKind::kNone || closed) && !req.index_base &&
              (opts.hopper_fwd == HopperMode::kAlways || measured_pre) && fwd_rules.empty()) {
            choice.forward = FA_BACKEND_HOPPER_FWD;
            choice.reason = std::string("forward hopper: the Hopper flash forward (") +
                            (!measured_pre ? "FUSEDATTN_HOPPER_FWD=1"
                             : closed      ? std::string(alibi ? "ALiBi" : "softcap") +
                                                 " in the kernel, measured faster than the CUDA "
                                                 "flash kernels' forward"
                             : bias_tiles  ? "its bias tiles measured faster than the CUDA flash "
                                             "kernels' forward"
                                           : "measured faster than the CUDA flash kernels with a "
                                             "PRE_SCALE_BIAS at head dim 256") +
                            "; cuDNN cannot serve this call: " + why_not + ")";
          }
          // The Hopper backward takes the backward of those it can run (a pre-scale bias, a
          // graph cuDNN rejected; no dbias wanted, no score_mod): faster than the flash
          // kernels' (bench/RESULTS.md), with a deterministic dQ.
          std::string bwd_no = hopper_bwd_reason(p, req, fwd_rules);
          // softcap or ALiBi (a bias beside it, its dbias too), ALiBi's slopes' gradient too
          // (summed in the kernel with float32 atomics: not in deterministic mode).
          if (bwd_no.empty() && req.index_base) bwd_no = "an index_base";
          if (bwd_no.empty() && sm_call && !closed)
            bwd_no = "a score_mod other than softcap and ALiBi with its bias as tiles";
          if (bwd_no.empty() && alibi && req.score_mod_grads && req.deterministic)
            bwd_no = "the slopes' gradient, which it sums with float32 atomics (not bitwise repeatable)";
          if (bwd_no.empty() && opts.hopper_bwd == HopperMode::kOff) bwd_no = "FUSEDATTN_HOPPER_BWD=0";
          if (bwd_no.empty()) {
            choice.backward = FA_BACKEND_HOPPER_BWD;
            choice.reason += std::string("; backward hopper: the Hopper flash backward, from this forward's lse") +
                             (alibi && req.score_mod_grads ? " (the slopes' gradient summed in the kernel)" : "");
          } else if (choice.forward == FA_BACKEND_HOPPER_FWD) {
            choice.reason += "; backward cuda_flash: fusedattn's CUDA flash kernels, O(S) memory";
          }
          // The flash kernels' backward sums dq (and dbias, d softmax_offset, the score_mod
          // operands' gradients) with float32 atomics: a deterministic call gets no backward
          // there.
          if (req.deterministic && choice.backward == FA_BACKEND_CUDA_FLASH) {
            choice.backward = FA_BACKEND_NONE;
            choice.reason += "; no deterministic backward: the CUDA flash kernels' backward sums "
                             "dq with float32 atomics (not bitwise repeatable), and neither the "
                             "Hopper backward nor cuDNN serves this call";
          }
        } else {
          choice.backend = choice.forward = choice.backward = FA_BACKEND_XLA_REFERENCE;
          choice.reason = "xla_reference: cuDNN cannot serve this call (" + why_not +
                          ") nor can the CUDA flash kernels (" + flash_no +
                          "), so XLA computes the plain-JAX reference (materialized scores)";
        }
        return choice;
      }
      choice.backend = choice.forward = choice.backward = FA_BACKEND_CUDNN;
      const std::string cudnn = "a cuDNN " + fmt_version(info.cudnn_version) + " SDPA graph";
      // The Hopper forward takes the forward where it can: its score_mods always, plain
      // calls where the measurement found it faster.
      const ScoreModKind kind = req.score_mod.kind;
      if (kind == ScoreModKind::kOther) {
        choice.reason = "cudnn: " + cudnn + (req.deterministic ? " (its backward's deterministic algorithm)" : "");
        return choice;
      }
      const char* what = kind == ScoreModKind::kSoftcap ? "softcap"
                         : kind == ScoreModKind::kAlibi ? "ALiBi" : "plain";
      const std::string fwd_rules = hopper_fwd_unsupported_reason(p, req, info);
      std::string hopper_no = fwd_rules;
      if (hopper_no.empty() && opts.hopper_fwd == HopperMode::kOff)
        hopper_no = "FUSEDATTN_HOPPER_FWD=0 keeps it off";
      std::string measured;
      // A dense mask: cuDNN adds it over every tile, the Hopper forward skips those it empties.
      // A bias: where it reads it as tiles (hopper_bias_tiles: faster than cuDNN's forward).
      if (hopper_no.empty() && kind == ScoreModKind::kNone && !req.mask_bias)
        measured = p.bias_type == FA_NO_BIAS ? hopper_plain_measured(p)
                   : hopper_bias_tiles(p)
                       ? ""
                       : "a bias of rows not in 16-byte units (Skv not a multiple of 8): read a "
                         "score at a time, measured slower than cuDNN's (bench/RESULTS.md)";
      if (hopper_no.empty() && opts.hopper_fwd == HopperMode::kMeasured && !measured.empty())
        hopper_no = measured;
      // The backward, decided alike (either forward's lse serves it): a dense mask's always
      // (the Hopper backward skips the tiles it empties), plain calls by the measurement.
      // A deterministic call takes the Hopper backward (its ordered dQ: O(S) memory)
      // wherever it can run, whatever the measurement: cuDNN's deterministic backward on
      // sm90 writes dP to a [B, H, Sq, Skv] workspace.
      std::string bwd_no = hopper_bwd_reason(p, req, fwd_rules);
      if (bwd_no.empty() && opts.hopper_bwd == HopperMode::kOff) bwd_no = "FUSEDATTN_HOPPER_BWD=0 keeps it off";
      // softcap's and ALiBi's backward: always (cuDNN's runs its score_mod graph; softcap's a
      // second tanh there).
      std::string bwd_measured;
      // A bias without dbias: always (forward+backward 1.15-1.24x cuDNN's backward at head
      // dims 64 and 128, S 4096, H200: bench/RESULTS.md).
      if (bwd_no.empty() && kind == ScoreModKind::kNone && !req.mask_bias && !req.deterministic &&
          p.bias_type == FA_NO_BIAS)
        bwd_measured = hopper_plain_measured(p, /*backward=*/true);
      // A bias's gradient: where dbias has the call's extents and whole 16-byte rows (each
      // element written once, a tile row at a time: forward+backward 1.10-1.24x cuDNN at head
      // dims 64 and 128, S 4096, H200); a broadcast bias's float32 sums measured slower
      // (0.90-1.04x), as rows of other lengths (bench/RESULTS.md).
      if (bwd_no.empty() && p.bias_type != FA_NO_BIAS && !req.mask_bias && !req.no_dbias && !req.deterministic &&
          (p.bias_batch < p.batch || p.bias_heads < p.heads_q || p.seqlen_kv % 8 != 0))
        bwd_measured = "a broadcast bias's gradient (or rows not in 16-byte units): its dbias measured slower "
                       "than cuDNN's (bench/RESULTS.md)";
      // Head dim 256's dbias (stored a pair of keys at a time, no tile rows there): with a
      // band, forward+backward measured 0.90x cuDNN's (causal, S 4096, bias [B, H, S, S],
      // H200); without one 1.17x (bench/RESULTS.md).
      const hopper_rules::Band bd = hopper_rules::band(p);
      if (bwd_no.empty() && p.head_dim_qk == 256 && p.bias_type != FA_NO_BIAS && !req.mask_bias &&
          !req.no_dbias && (bd.causal || bd.left_bound))
        bwd_measured = "head dim 256's dbias with a causal mask or window: measured slower than cuDNN's "
                       "(bench/RESULTS.md)";
      if (bwd_no.empty() && opts.hopper_bwd == HopperMode::kMeasured && !bwd_measured.empty())
        bwd_no = bwd_measured;
      std::string bwd;
      if (bwd_no.empty()) {
        choice.backward = FA_BACKEND_HOPPER_BWD;
        bwd = std::string("; backward hopper: the Hopper flash backward") +
              (req.deterministic ? " with its deterministic dQ (added in key-block order)" : "") +
              (req.mask_bias              ? ", skipping the mask's empty tiles"
               : kind != ScoreModKind::kNone ? std::string(" with ") + what + " in the kernel"
               : p.bias_type != FA_NO_BIAS
                   ? std::string(req.no_dbias ? " adding the bias (no dbias)" : " adding the bias, with dbias")
               : req.deterministic    ? ""
               : bwd_measured.empty() ? " (measured faster than cuDNN: hopper/measured_bwd.h)"
                                      : " (FUSEDATTN_HOPPER_BWD=1)");
      } else {
        bwd = std::string("; backward cudnn") +
              (req.deterministic ? " with its deterministic algorithm (on sm90 a [B, H, Sq, Skv] "
                                   "dP workspace)"
                                 : "") +
              " (not the Hopper flash backward: " + bwd_no + ")";
      }
      if (hopper_no.empty()) {
        choice.forward = FA_BACKEND_HOPPER_FWD;
        choice.reason = std::string("forward hopper: the Hopper flash forward runs this ") + what +
                        " call" +
                        (kind != ScoreModKind::kNone ? " with its score_mod in the kernel"
                         : req.mask_bias ? " with its dense mask (skipping the key tiles it empties)"
                         : p.bias_type != FA_NO_BIAS && measured.empty()
                             ? " adding the bias's tiles (measured faster than cuDNN's forward with a bias)"
                         : measured.empty() ? " (measured faster than cuDNN: hopper/measured.h)"
                                            : " (FUSEDATTN_HOPPER_FWD=1)") +
                        bwd;
      } else {
        choice.reason = "cudnn: " + cudnn + " (not the Hopper flash forward: " + hopper_no + ")" + bwd;
      }
      return choice;
    }
  }
  choice.status = Status::Invalid("platform: got code " + std::to_string(platform) +
                                  "; allowed 0 (cpu) or 1 (cuda)");
  choice.reason = choice.status.message;
  return choice;
}

}  // namespace fusedattn
