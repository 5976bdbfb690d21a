// From an AttnParams to the cuDNN graph that serves it. Everything here is a pure
// function of the params, so the trace-time support check (c_api.cc) and the FFI
// handlers describe the very same graph.
#pragma once

#include "fusedattn/attention/params.h"
#include "fusedattn/core/status.h"
#include "fusedattn/attention/cudnn/sdpa_graph.h"

namespace fusedattn::cudnn {

// A call's score_mod (flex attention): the packed program attribute (score_mod.h).
struct ScoreModSpec {
  const int32_t* attr = nullptr;
  int64_t n = 0;
};

// Whether the graph covers all vmap slices at once (batch folded) or one slice per
// execution: per-slice inputs (seed, softmax offset, a batch-broadcast bias, score_mod
// operands and batch indices) cannot be told apart inside one graph.
bool graph_per_slice(const AttnParams& p, const ScoreModSpec* sm = nullptr);

// The graph of p. The forward writes the lse when want_lse (else nothing: inference),
// and the row max and sum of exponentials when want_max_logit (the lse is then derived
// from them: cuDNN 9.19 cannot write both kinds of statistics in one graph). The
// backward graph ignores both flags. The graph batch is the folded batch (or one
// slice's), times M segments for THD.
// With sm, the graph runs the score_mod (the masks move into it).
SdpaConfig make_config(const AttnParams& p, bool want_max_logit, bool want_lse,
                       const ScoreModSpec* sm = nullptr);

// The backward graph of p (make_config's, which the backward ignores the statistics'
// flags of), with cuDNN's deterministic algorithm when asked (kRequestDeterministic).
SdpaConfig make_bwd_config(const AttnParams& p, bool deterministic, const ScoreModSpec* sm = nullptr);

// Whether some query row may keep no key, so the forward must be followed by the
// row fix-up (zero out, lse -inf) and the backward must read the fixed lse.
bool rows_may_be_empty(const AttnParams& p);

}  // namespace fusedattn::cudnn
