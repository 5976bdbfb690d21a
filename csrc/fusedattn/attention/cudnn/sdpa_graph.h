// cuDNN SDPA graphs: the description of one graph (SdpaConfig), how it is built
// (forward or backward), and the process-wide cache that builds each distinct
// graph once per device.
//
// Tensor views are cuDNN's [batch, heads, seq, dim] order with element strides:
//   q [B, Hq, Sq, Dqk], k [B, Hkv, Skv, Dqk], v [B, Hkv, Skv, Dv], o / dO [B, Hq, Sq, Dv],
//   stats (lse) / max / sum_exp [B, Hq, Sq, 1] f32, bias [1|B, 1|Hq, Sq, Skv],
//   sink [1, Hq, 1, 1] f32, seq_len_q / seq_len_kv [B] i32,
//   ragged offsets [B + 1] i32 (THD: B counts segments, offsets are in elements).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"

namespace cudnn_frontend::graph {
class Graph;
}

namespace fusedattn::cudnn {

// Element strides of a [batch, heads, seq, dim] view whose dim stride is 1.
struct View {
  int64_t b = 0, h = 0, s = 0;
};

enum class Diag : int32_t { kNone = 0, kTopLeft = 1, kBottomRight = 2 };

// Everything a graph depends on. Two calls with equal configs share one graph.
struct SdpaConfig {
  int32_t dtype = FA_BFLOAT16;  // FA_BFLOAT16 or FA_FLOAT16
  int64_t batch = 0;            // sequences the graph sees: B, or B * M segments for THD
  int64_t heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, dim_qk = 0, dim_v = 0;
  View q, k, v, o, lse;         // dq/dk/dv share q/k/v's views; dO shares o's
  bool ragged = false;          // THD: every token tensor is addressed through ragged offsets
  int64_t total_q = 0, total_kv = 0;  // THD: tokens in all rows (the token axis' capacity)
  bool padding = false;         // per-sequence lengths (seq_len_q / seq_len_kv)
  Diag diag = Diag::kNone;
  int64_t left_bound = -1;      // cuDNN's bounds: keep j > i - left, j <= i + right; -1 = none
  int64_t right_bound = -1;
  float scale = 1.0f;
  bool bias = false;
  int64_t bias_b = 0, bias_h = 0;  // the bias extents: 1 or batch, 1 or heads_q
  View bias_view;               // its strides ([.., Sq, Skv] row-major, 0 on broadcast dims)
  bool sink = false;            // an extra logit per head (off-by-one: zeros; learnable)
  float dropout = 0.0f;
  // Forward outputs: stats = lse; max_sum = row max + row sum of exp (max_logit needs them).
  bool gen_stats = false, max_sum = false;
  // score_mod (flex attention): the packed program attribute of score_mod.h (empty:
  // none). Its graphs run the program on the scaled scores, then build the masks
  // themselves (cuDNN builds none beside a score_mod: padding, diag and bounds above
  // say which); operand i is the f32 tensor kScoreModOperand + i of its decoded shape,
  // batch extent sm_batch. THD: batch_idx is the graph batch / segments.
  std::vector<int32_t> score_mod;
  int64_t sm_batch = 0, segments = 1;
  // The backward with cuDNN's deterministic algorithm (a deterministic call: backend.h's
  // kRequestDeterministic). On sm90 cuDNN then writes dP to a [B, H, Sq, Skv] workspace.
  bool deterministic = false;
  // The backward writes dbias (with bias): off for a keep mask's fold, whose gradient
  // nobody takes (kRequestMaskKeepOnly), so cuDNN skips the dS reduction.
  bool dbias = true;

  std::vector<int64_t> key() const;
};

// Tensor UIDs of the graphs (the variant pack is keyed by them).
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kMax, kSumExp, kBias, kSeqQ, kSeqKV,
  kRagQ, kRagK, kRagV, kRagO, kRagStats, kSeed, kOffset, kSink,
  kDO, kDQ, kDK, kDV, kDBias, kDSink,
  kScoreModOperand = 64,  // + operand index (< kMaxScoreModOperands)
};

struct BuiltGraph {
  std::shared_ptr<cudnn_frontend::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

// The graph of (config, direction) on `device`: built on first request (and its
// failure remembered, so an unsupported config is not rebuilt on every call).
Status get_graph(const SdpaConfig& cfg, bool backward, int device,
                 std::shared_ptr<const BuiltGraph>* out);

// Graphs built so far (successful builds, all devices): tests check the cache with it.
int64_t built_graph_count();

// Enqueues the graph on `stream` with the tensors of `pack` (uid -> device pointer;
// the dropout offset is bound here) and `workspace` (workspace_bytes of device memory).
Status execute(const BuiltGraph& g, int device, cudaStream_t stream,
               std::unordered_map<int64_t, void*> pack, void* workspace);

}  // namespace fusedattn::cudnn
