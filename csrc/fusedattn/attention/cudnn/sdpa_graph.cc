#include "fusedattn/attention/cudnn/sdpa_graph.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "fusedattn/attention/options.h"
#include "fusedattn/score_mod/program.h"
#include "fusedattn/score_mod/cudnn_pointwise.h"
#include "fusedattn/platform/cuda/check.h"
#include "fusedattn/platform/cuda/cudnn_frontend.h"
#include "fusedattn/platform/cuda/cudnn_handle.h"

namespace fusedattn::cudnn {
namespace {

using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;
using fe::graph::Tensor_attributes;

int64_t float_bits(float f) {
  int32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

fe::DataType_t io_type(int32_t dtype) {
  return dtype == FA_FLOAT16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// Builds one graph's tensors; every token tensor of a THD config carries its ragged offsets.
class Builder {
 public:
  explicit Builder(const SdpaConfig& c) : c_(c), g_(std::make_shared<fe::graph::Graph>()) {
    g_->set_io_data_type(io_type(c.dtype))
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  }

  std::shared_ptr<fe::graph::Graph> graph() const { return g_; }

  Tensor input(const char* name, Uid uid, int64_t heads, int64_t seq, int64_t dim, const View& v,
               Uid ragged_uid) {
    auto t = g_->tensor(Tensor_attributes().set_name(name).set_uid(uid));
    set_layout(t, heads, seq, dim, v, ragged_uid);
    return t;
  }

  // A graph output created by the SDPA node, given its uid, layout and ragged offsets.
  void output(const Tensor& t, Uid uid, int64_t heads, int64_t seq, int64_t dim, const View& v,
              Uid ragged_uid) {
    t->set_output(true).set_uid(uid);
    set_layout(t, heads, seq, dim, v, ragged_uid);
  }

  // [B, Hq, Sq, 1] float32 rows (stats, max, sum_exp), ragged like q under THD.
  Tensor row_stat(const char* name, Uid uid) {
    auto t = g_->tensor(Tensor_attributes().set_name(name).set_uid(uid));
    t->set_output(true).set_data_type(fe::DataType_t::FLOAT);
    set_layout(t, c_.heads_q, c_.seq_q, 1, c_.lse, kRagStats);
    return t;
  }

  Tensor int_vector(const char* name, Uid uid, int64_t n) {
    return g_->tensor(Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({n, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT32));
  }

  Tensor bias() {
    return g_->tensor(Tensor_attributes()
                          .set_name("bias")
                          .set_uid(kBias)
                          .set_dim({c_.bias_b, c_.bias_h, c_.seq_q, c_.seq_kv})
                          .set_stride({c_.bias_view.b, c_.bias_view.h, c_.bias_view.s, 1}));
  }

  Tensor head_vector(const char* name, Uid uid) {
    return g_->tensor(Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, c_.heads_q, 1, 1})
                          .set_stride({c_.heads_q, 1, 1, 1})
                          .set_data_type(fe::DataType_t::FLOAT));
  }

  // Philox seed (device, the caller's 8 seed bytes) and offset (host value 0).
  std::pair<Tensor, Tensor> dropout_rng() {
    auto seed = g_->tensor(Tensor_attributes()
                               .set_name("seed")
                               .set_uid(kSeed)
                               .set_dim({1, 1, 1, 1})
                               .set_stride({1, 1, 1, 1})
                               .set_data_type(fe::DataType_t::INT64));
    auto offset = g_->tensor(Tensor_attributes()
                                 .set_name("offset")
                                 .set_uid(kOffset)
                                 .set_dim({1, 1, 1, 1})
                                 .set_stride({1, 1, 1, 1})
                                 .set_is_pass_by_value(true)
                                 .set_data_type(fe::DataType_t::INT64));
    return {seed, offset};
  }

 private:
  void set_layout(const Tensor& t, int64_t heads, int64_t seq, int64_t dim, const View& v,
                  Uid ragged_uid) {
    t->set_dim({c_.batch, heads, seq, dim}).set_stride({v.b, v.h, v.s, 1});
    if (c_.ragged) t->set_ragged_offset(ragged(ragged_uid));
  }

  Tensor ragged(Uid uid) {
    auto it = ragged_.find(uid);
    if (it != ragged_.end()) return it->second;
    return ragged_[uid] = int_vector("ragged_offset", uid, c_.batch + 1);
  }

  const SdpaConfig& c_;
  std::shared_ptr<fe::graph::Graph> g_;
  std::map<Uid, Tensor> ragged_;
};

fe::PointwiseMode_t pointwise_mode(PwOp op) {
  using M = fe::PointwiseMode_t;
  switch (op) {
    case PwOp::kAdd: return M::ADD;
    case PwOp::kSub: return M::SUB;
    case PwOp::kMul: return M::MUL;
    case PwOp::kDiv: return M::DIV;
    case PwOp::kMax: return M::MAX;
    case PwOp::kMin: return M::MIN;
    case PwOp::kPow: return M::POW;
    case PwOp::kNeg: return M::NEG;
    case PwOp::kAbs: return M::ABS;
    case PwOp::kExp: return M::EXP;
    case PwOp::kLog: return M::LOG;
    case PwOp::kTanh: return M::TANH_FWD;
    case PwOp::kSigmoid: return M::SIGMOID_FWD;
    case PwOp::kSqrt: return M::SQRT;
    case PwOp::kRsqrt: return M::RSQRT;
    case PwOp::kFloor: return M::FLOOR;
    case PwOp::kCeil: return M::CEIL;
    case PwOp::kSin: return M::SIN;
    case PwOp::kCos: return M::COS;
    case PwOp::kErf: return M::ERF;
    case PwOp::kCmpLt: return M::CMP_LT;
    case PwOp::kCmpLe: return M::CMP_LE;
    case PwOp::kCmpGt: return M::CMP_GT;
    case PwOp::kCmpGe: return M::CMP_GE;
    case PwOp::kCmpEq: return M::CMP_EQ;
    case PwOp::kCmpNe: return M::CMP_NEQ;
    case PwOp::kSelect: return M::BINARY_SELECT;
    case PwOp::kInput:
    case PwOp::kConst: break;
  }
  return M::NOT_SET;
}

// A config's score_mod as cuDNN subgraph code (SdpaConfig::score_mod). The forward
// modifier runs the program on the scaled scores, then the masks; the backward one
// runs the derived program on dS, reading the raw scores and every value it shares with
// the forward program (same_nodes) from the forward modifier of the same (backward)
// graph, and keeps dS = 0 where it was 0 (masked keys: a derivative that is NaN there
// must not leak) unless the program provably does so itself (zero_where_dscore_is).
// Shared by both lambdas of a graph.
class ScoreModGraph {
 public:
  // Decodes and lowers the programs; seq_q / seq_kv: the length tensors (padding).
  Status init(const SdpaConfig& c, Tensor seq_q, Tensor seq_kv) {
    c_ = &c;
    seq_q_ = std::move(seq_q);
    seq_kv_ = std::move(seq_kv);
    const int64_t ext[4] = {c.sm_batch, c.heads_q, c.seq_q, c.seq_kv};
    FA_RETURN_IF_NOT_OK(
        decode_score_mod(c.score_mod.data(), int64_t(c.score_mod.size()), ext, &sm_));
    for (int32_t i = 0; i < sm_.n_operands && c.segments > 1; ++i)
      if (sm_.shape[i][0] > 1)  // the graph's batch counts THD segments, not rows
        return Status::Unimplemented("score_mod operand " + std::to_string(i) +
                                     " has a batch dimension; cuDNN's THD graphs take "
                                     "operands that broadcast over the batch only");
    FA_RETURN_IF_NOT_OK(lower_to_pointwise(sm_.fwd, sm_.n_operands, &fwd_));
    FA_RETURN_IF_NOT_OK(lower_to_pointwise(sm_.bwd, sm_.n_operands, &bwd_));
    shared_ = same_nodes(fwd_, bwd_);
    guard_free_ = zero_where_dscore_is(bwd_, kScoreModIndexInputs + sm_.n_operands);
    return Status::Ok();
  }

  // The operands as graph inputs, [1|B, 1|Hq, 1|Sq, 1|Skv] f32 row-major.
  void make_operands(fe::graph::Graph& g) {
    for (int32_t i = 0; i < sm_.n_operands; ++i) {
      const int64_t* d = sm_.shape[i];
      operands_.push_back(g.tensor(Tensor_attributes()
                                       .set_name("score_mod_operand_" + std::to_string(i))
                                       .set_uid(kScoreModOperand + i)
                                       .set_dim({d[0], d[1], d[2], d[3]})
                                       .set_stride({d[1] * d[2] * d[3], d[2] * d[3], d[3], 1})
                                       .set_data_type(fe::DataType_t::FLOAT)));
    }
  }

  Tensor forward(const std::shared_ptr<fe::graph::Graph>& g, const Tensor& score) {
    raw_ = score;
    Tensor s = emit(g, fwd_, score, nullptr, &fwd_t_);
    namespace sm = fe::graph::attn::score_modifiers;
    const SdpaConfig& c = *c_;
    if (c.padding) s = sm::padding_mask(g, s, seq_kv_, seq_q_);
    if (c.diag != Diag::kNone || c.left_bound >= 0 || c.right_bound >= 0) {
      const auto align = c.diag == Diag::kBottomRight ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                      : fe::DiagonalAlignment_t::TOP_LEFT;
      std::optional<int64_t> left, right;
      if (c.left_bound >= 0) left = c.left_bound;
      if (c.right_bound >= 0) right = c.right_bound;
      s = sm::sliding_window_mask(g, s, align, left, right, c.seq_q, c.seq_kv,
                                  c.padding ? seq_q_ : nullptr, c.padding ? seq_kv_ : nullptr,
                                  nullptr, nullptr);
    }
    return s;
  }

  Tensor backward(const std::shared_ptr<fe::graph::Graph>& g, const Tensor& ds) {
    std::vector<Tensor> t;
    Tensor d = emit(g, bwd_, raw_, ds, &t);
    // Without padding every score comes from real rows of q and k, so where the program
    // gives 0 for dS = 0 at any finite score (softcap, ALiBi), the guard has nothing to do.
    // Padded rows may hold anything (NaN scores): those graphs keep it.
    if (!c_->padding && guard_free_) return d;
    auto zero = std::make_shared<Tensor_attributes>(0.0f);
    auto nonzero = g->pointwise(ds, zero, pw(fe::PointwiseMode_t::CMP_NEQ, "ds_nonzero"));
    nonzero->set_data_type(fe::DataType_t::BOOLEAN);
    // (the first input is the computed one: cuDNN's rule, score_mod_pointwise.h)
    return g->pointwise(d, zero, nonzero, pw(fe::PointwiseMode_t::BINARY_SELECT, "ds_keep_zero"));
  }

 private:
  static fe::graph::Pointwise_attributes pw(fe::PointwiseMode_t mode, const std::string& name) {
    return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode);
  }

  // Program input register r: score, batch, head, q, kv, operands, then dscore.
  Tensor input(const std::shared_ptr<fe::graph::Graph>& g, int32_t r, const Tensor& score,
               const Tensor& ds) {
    if (r == 0) return score;
    if (r >= kScoreModIndexInputs) {
      const int32_t k = r - kScoreModIndexInputs;
      return k < sm_.n_operands ? operands_[k] : ds;
    }
    auto idx = g->pointwise(score, pw(fe::PointwiseMode_t::GEN_INDEX, "score_mod_index")
                                       .set_axis(r - 1)
                                       .set_compute_data_type(fe::DataType_t::INT32));
    idx->set_data_type(fe::DataType_t::INT32);
    if (r == 1 && c_->segments > 1) {  // THD: graph batch = row * segments + segment
      auto seg = std::make_shared<Tensor_attributes>(float(c_->segments));
      idx = g->pointwise(g->pointwise(idx, seg, pw(fe::PointwiseMode_t::DIV, "batch_div")),
                         pw(fe::PointwiseMode_t::FLOOR, "batch_floor"));
    }
    return idx;
  }

  // Emits prog's nodes (their tensors into *t) and returns its output. The backward
  // program (ds given) takes the nodes it shares with the forward one from fwd_t_.
  Tensor emit(const std::shared_ptr<fe::graph::Graph>& g, const PwProgram& prog,
              const Tensor& score, const Tensor& ds, std::vector<Tensor>* tensors) {
    std::vector<Tensor>& t = *tensors;
    t.assign(prog.nodes.size(), nullptr);
    const bool backward = ds != nullptr;
    for (size_t i = 0; i < prog.nodes.size(); ++i) {
      const PwNode& n = prog.nodes[i];
      const std::string name = (backward ? "score_mod_bwd_" : "score_mod_") + std::to_string(i);
      const int32_t same = backward ? shared_[i] : -1;
      if (same >= 0 && same < int32_t(fwd_t_.size()) && fwd_t_[same]) {
        t[i] = fwd_t_[same];
      } else if (n.op == PwOp::kInput) {
        t[i] = input(g, n.input, score, ds);
      } else if (n.op == PwOp::kConst) {
        t[i] = std::make_shared<Tensor_attributes>(n.value);
      } else if (n.op == PwOp::kSelect) {  // BINARY_SELECT(in0, in1, mask) = mask ? in0 : in1
        t[i] = g->pointwise(t[n.b], t[n.c], t[n.a], pw(pointwise_mode(n.op), name));
      } else if (n.b < 0) {
        t[i] = g->pointwise(t[n.a], pw(pointwise_mode(n.op), name));
      } else {
        t[i] = g->pointwise(t[n.a], t[n.b], pw(pointwise_mode(n.op), name)
                                                .set_compute_data_type(fe::DataType_t::FLOAT));
      }
      if (n.boolean) t[i]->set_data_type(fe::DataType_t::BOOLEAN);
    }
    return t[prog.out];
  }

  const SdpaConfig* c_ = nullptr;
  ScoreMod sm_;
  PwProgram fwd_, bwd_;
  std::vector<int32_t> shared_;  // backward node -> the forward node of its value, or -1
  std::vector<Tensor> fwd_t_;    // the forward program's tensors in the current graph
  bool guard_free_ = false;      // the backward program is 0 wherever dS is
  std::vector<Tensor> operands_;
  Tensor seq_q_, seq_kv_, raw_;
};

// Sets score_mod (and its backward) on o: the masks move into the modifier.
template <class Attrs>
Status set_score_mod(const SdpaConfig& c, Builder& b, Attrs& o, Tensor seq_q, Tensor seq_kv,
                     bool backward) {
  auto smg = std::make_shared<ScoreModGraph>();
  FA_RETURN_IF_NOT_OK(smg->init(c, std::move(seq_q), std::move(seq_kv)));
  smg->make_operands(*b.graph());
  o.set_score_mod([smg](std::shared_ptr<fe::graph::Graph> g, Tensor s) {
    return smg->forward(g, s);
  });
  if constexpr (std::is_same_v<Attrs, fe::graph::SDPA_backward_attributes>) {
    if (backward)
      o.set_score_mod_bprop([smg](std::shared_ptr<fe::graph::Graph> g, Tensor ds) {
        return smg->backward(g, ds);
      });
  }
  return Status::Ok();
}

// cuDNN's own diagonal band: causal alignment and window bounds.
template <class Attrs>
void band_options(const SdpaConfig& c, Attrs& o) {
  if (c.diag != Diag::kNone)
    o.set_diagonal_alignment(c.diag == Diag::kBottomRight ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                          : fe::DiagonalAlignment_t::TOP_LEFT);
  if (c.left_bound >= 0) o.set_diagonal_band_left_bound(static_cast<int>(c.left_bound));
  if (c.right_bound >= 0) o.set_diagonal_band_right_bound(static_cast<int>(c.right_bound));
}

template <class Attrs>
void extra_options(const SdpaConfig& c, Builder& b, Attrs& o) {
  if (c.bias) o.set_bias(b.bias());
  if (c.sink) o.set_sink_token(b.head_vector("sink", kSink));
  if (c.dropout > 0.0f) {
    auto [seed, offset] = b.dropout_rng();
    o.set_dropout(c.dropout, seed, offset);
  }
}

// The options both directions share: scale, padding, diagonal band, bias, sink, dropout
// (with a score_mod, the modifier builds the masks).
template <class Attrs>
Status common_options(const SdpaConfig& c, Builder& b, Attrs& o, bool backward) {
  o.set_attn_scale(c.scale);
  Tensor seq_q, seq_kv;
  if (c.padding) {
    seq_q = b.int_vector("seq_len_q", kSeqQ, c.batch);
    seq_kv = b.int_vector("seq_len_kv", kSeqKV, c.batch);
    o.set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
  }
  if (!c.score_mod.empty()) {
    FA_RETURN_IF_NOT_OK(set_score_mod(c, b, o, seq_q, seq_kv, backward));
  } else {
    if (c.padding) o.set_padding_mask(true);
    band_options(c, o);
  }
  extra_options(c, b, o);
  return Status::Ok();
}

Status forward_graph(const SdpaConfig& c, std::shared_ptr<fe::graph::Graph>* out) {
  Builder b(c);
  auto q = b.input("q", kQ, c.heads_q, c.seq_q, c.dim_qk, c.q, kRagQ);
  auto k = b.input("k", kK, c.heads_kv, c.seq_kv, c.dim_qk, c.k, kRagK);
  auto v = b.input("v", kV, c.heads_kv, c.seq_kv, c.dim_v, c.v, kRagV);
  auto opts = fe::graph::SDPA_attributes().set_name("sdpa_fwd").set_generate_stats(c.gen_stats);
  FA_RETURN_IF_NOT_OK(common_options(c, b, opts, /*backward=*/false));
  if (c.max_sum) {
    opts.set_logit_max(b.row_stat("max", kMax));
    opts.set_score_sum_exp(b.row_stat("sum_exp", kSumExp));
  }
  auto [o, stats] = b.graph()->sdpa(q, k, v, std::move(opts));
  b.output(o, kO, c.heads_q, c.seq_q, c.dim_v, c.o, kRagO);
  if (c.gen_stats) {
    stats->set_data_type(fe::DataType_t::FLOAT);
    b.output(stats, kStats, c.heads_q, c.seq_q, 1, c.lse, kRagStats);
  }
  *out = b.graph();
  return Status::Ok();
}

Status backward_graph(const SdpaConfig& c, std::shared_ptr<fe::graph::Graph>* out) {
  Builder b(c);
  auto q = b.input("q", kQ, c.heads_q, c.seq_q, c.dim_qk, c.q, kRagQ);
  auto k = b.input("k", kK, c.heads_kv, c.seq_kv, c.dim_qk, c.k, kRagK);
  auto v = b.input("v", kV, c.heads_kv, c.seq_kv, c.dim_v, c.v, kRagV);
  auto o = b.input("o", kO, c.heads_q, c.seq_q, c.dim_v, c.o, kRagO);
  auto dO = b.input("dO", kDO, c.heads_q, c.seq_q, c.dim_v, c.o, kRagO);
  auto stats = b.input("stats", kStats, c.heads_q, c.seq_q, 1, c.lse, kRagStats);
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto opts = fe::graph::SDPA_backward_attributes().set_name("sdpa_bwd").set_deterministic_algorithm(
      c.deterministic);
  FA_RETURN_IF_NOT_OK(common_options(c, b, opts, /*backward=*/true));
  if (c.ragged) opts.set_max_total_seq_len_q(c.total_q).set_max_total_seq_len_kv(c.total_kv);
  if (c.bias && c.dbias) {
    auto db = b.graph()->tensor(Tensor_attributes()
                                    .set_name("dbias")
                                    .set_uid(kDBias)
                                    .set_dim({c.bias_b, c.bias_h, c.seq_q, c.seq_kv})
                                    .set_stride({c.bias_view.b, c.bias_view.h, c.bias_view.s, 1}));
    opts.set_dbias(db);
  }
  if (c.sink) opts.set_dsink_token(b.head_vector("dsink", kDSink));
  auto [dq, dk, dv] = b.graph()->sdpa_backward(q, k, v, o, dO, stats, std::move(opts));
  b.output(dq, kDQ, c.heads_q, c.seq_q, c.dim_qk, c.q, kRagQ);
  b.output(dk, kDK, c.heads_kv, c.seq_kv, c.dim_qk, c.k, kRagK);
  b.output(dv, kDV, c.heads_kv, c.seq_kv, c.dim_v, c.v, kRagV);
  *out = b.graph();
  return Status::Ok();
}

// Tuning diagnostics (dev/cudnn/cudnn_plans.sh): the cuDNN knobs of BackendOptions
// (attention/options.h) pick the heuristics' list, a plan of it or an engine's plan.
fe::HeurMode_t heur_mode(const BackendOptions& o) {
  switch (o.cudnn_heur) {
    case CudnnHeur::kB: return fe::HeurMode_t::B;
    case CudnnHeur::kFallback: return fe::HeurMode_t::FALLBACK;
    case CudnnHeur::kA: break;
  }
  return fe::HeurMode_t::A;
}

Status build_chosen_plan(fe::graph::Graph& g, DeviceHandle* h, bool backward,
                         const BackendOptions& o) {
  if (!o.cudnn_plan) {
    FA_FE_RETURN_IF_ERROR(g.build_plans(h->handle), "plan build");
  } else {
    FA_FE_RETURN_IF_ERROR(g.build_plan_at_index(h->handle, *o.cudnn_plan),
                          "plan build (FUSEDATTN_CUDNN_PLAN)");
  }
  if (o.cudnn_plan_log) {
    const int64_t n = g.get_execution_plan_count();
    std::string names, built;
    for (int64_t i = 0; i < n; ++i) {
      std::string name;
      if (g.get_plan_name_at_index(i, name).is_good())
        names += " [" + std::to_string(i) + "] " + name;
    }
    (void)g.get_plan_name(built);
    int64_t engines = 0;
    if (g.get_engine_count(engines).is_good()) {
      for (int64_t e = 0; e < engines; ++e) {
        std::vector<fe::Knob> knobs;
        if (!g.get_knobs_for_engine(e, knobs).is_good()) continue;
        names += "; engine " + std::to_string(e) + " knobs:";
        for (const fe::Knob& k : knobs)
          names += " type " + std::to_string(int64_t(k.type)) + " [" + std::to_string(k.minValue) +
                   ", " + std::to_string(k.maxValue) + "] by " + std::to_string(k.stride);
      }
    }
    std::fprintf(stderr, "fusedattn cudnn %s graph: %lld plans:%s; built: %s\n",
                 backward ? "backward" : "forward", static_cast<long long>(n), names.c_str(),
                 built.c_str());
  }
  return Status::Ok();
}

Status build(const SdpaConfig& c, bool backward, DeviceHandle* h, BuiltGraph* out) {
  try {
    std::shared_ptr<fe::graph::Graph> g;
    FA_RETURN_IF_NOT_OK(backward ? backward_graph(c, &g) : forward_graph(c, &g));
    std::lock_guard<std::mutex> lock(h->mu);
    FA_FE_RETURN_IF_ERROR(g->validate(), "graph validation");
    FA_FE_RETURN_IF_ERROR(g->build_operation_graph(h->handle), "operation graph");
    const BackendOptions& o = backend_options();
    if (o.cudnn_engine) {
      std::unordered_map<fe::KnobType_t, int64_t> knobs;
      if (o.cudnn_kernel_cfg) knobs[fe::KnobType_t::KERNEL_CFG] = *o.cudnn_kernel_cfg;
      FA_FE_RETURN_IF_ERROR(g->create_execution_plan(*o.cudnn_engine, knobs),
                            "execution plan (FUSEDATTN_CUDNN_ENGINE)");
    } else {
      FA_FE_RETURN_IF_ERROR(g->create_execution_plans({heur_mode(o)}), "execution plans");
    }
    FA_FE_RETURN_IF_ERROR(g->check_support(h->handle), "support check");
    FA_RETURN_IF_NOT_OK(build_chosen_plan(*g, h, backward, o));
    int64_t ws = 0;
    FA_FE_RETURN_IF_ERROR(g->get_workspace_size(ws), "workspace size");
    out->graph = std::move(g);
    out->workspace_bytes = ws;
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cuDNN graph build threw: ") + e.what());
  }
}

std::atomic<int64_t> g_built{0};

struct CacheEntry {
  std::once_flag once;
  Status status;
  std::shared_ptr<const BuiltGraph> graph;
};

}  // namespace

std::vector<int64_t> SdpaConfig::key() const {
  std::vector<int64_t> words = {dtype, batch, heads_q, heads_kv, seq_q, seq_kv, dim_qk, dim_v,
          q.b, q.h, q.s, k.b, k.h, k.s, v.b, v.h, v.s, o.b, o.h, o.s, lse.b, lse.h, lse.s,
          ragged, total_q, total_kv, padding, static_cast<int64_t>(diag), left_bound, right_bound,
          float_bits(scale), bias, bias_b, bias_h, bias_view.b, bias_view.h, bias_view.s, sink,
          float_bits(dropout), gen_stats, max_sum, sm_batch, segments, deterministic, dbias,
          static_cast<int64_t>(score_mod.size())};
  words.insert(words.end(), score_mod.begin(), score_mod.end());  // the program is in the graph
  return words;
}

int64_t built_graph_count() { return g_built.load(); }

Status get_graph(const SdpaConfig& cfg, bool backward, int device,
                 std::shared_ptr<const BuiltGraph>* out) {
  static std::mutex mu;
  static auto* cache = new std::map<std::vector<int64_t>, std::shared_ptr<CacheEntry>>();
  std::vector<int64_t> key = cfg.key();
  key.push_back(backward);
  key.push_back(device);
  std::shared_ptr<CacheEntry> entry;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = (*cache)[key];
    if (!slot) slot = std::make_shared<CacheEntry>();
    entry = slot;
  }
  // Other keys build concurrently; callers of this key wait for its one build.
  std::call_once(entry->once, [&] {
    DeviceHandle* h = nullptr;
    entry->status = device_handle(device, &h);
    if (!entry->status.ok()) return;
    auto built = std::make_shared<BuiltGraph>();
    int current = 0;
    entry->status = cuda::cuda_status(cudaGetDevice(&current), "cudaGetDevice");
    if (!entry->status.ok()) return;
    if (current != device) cudaSetDevice(device);
    entry->status = build(cfg, backward, h, built.get());
    if (current != device) cudaSetDevice(current);
    if (entry->status.ok()) {
      entry->graph = std::move(built);
      ++g_built;
    }
  });
  if (!entry->status.ok()) return entry->status;
  *out = entry->graph;
  return Status::Ok();
}

Status execute(const BuiltGraph& g, int device, cudaStream_t stream,
               std::unordered_map<int64_t, void*> pack, void* workspace) {
  DeviceHandle* h = nullptr;
  Status s = device_handle(device, &h);
  if (!s.ok()) return s;
  static int64_t kDropoutOffset = 0;  // pass-by-value: the Philox stream is the seed's alone
  pack[kOffset] = &kDropoutOffset;
  std::lock_guard<std::mutex> lock(h->mu);
  s = set_stream(h->handle, stream);
  if (!s.ok()) return s;
  try {
    return fe_status(g.graph->execute(h->handle, pack, workspace), "graph execution");
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cuDNN graph execution threw: ") + e.what());
  }
}

}  // namespace fusedattn::cudnn
