// The buffers of a small-seq call, as the CPU and CUDA kernels receive them
// (shapes in params.h; element type of q, k, v, out, dout, dq, dk, dv is p.dtype).
#pragma once

#include <stdint.h>

#include "fusedattn/small_seq/params.h"
#include "fusedattn/small_seq/segments.h"

namespace fusedattn::small_seq {

struct Segments {
  SideTable q, kv;
};

// Fills the segment tables from the params and the (optional) length/offset arrays.
inline Segments make_segments(const SmallSeqParams& p, const int32_t* q_lens,
                              const int32_t* kv_lens, const int32_t* q_offsets,
                              const int32_t* kv_offsets) {
  Segments s;
  s.q = {q_lens, q_offsets, static_cast<int32_t>(p.tokens_q), static_cast<int32_t>(p.max_seqlen_q)};
  s.kv = {kv_lens, kv_offsets, static_cast<int32_t>(p.tokens_kv),
          static_cast<int32_t>(p.max_seqlen_kv)};
  return s;
}

struct FwdArgs {
  const void* q;     // [packs, Tq, Hq, D]
  const void* k;     // [packs, Tkv, Hkv, D]
  const void* v;     // [packs, Tkv, Hkv, D]
  Segments seg;
  void* out;         // [packs, Tq, Hq, D]
  float* probs;      // [packs, Tq, Hq, W]; written only when save_aux
  float* stats;      // [packs, Tq, Hq, 2] (row max, log-sum-exp); written only when save_aux
  bool save_aux;
};

struct BwdArgs {
  const void* q;
  const void* k;
  const void* v;
  const void* out;     // the forward's out [packs, Tq, Hq, D]: delta = dout . out
  const void* dout;    // [packs, Tq, Hq, D]
  const float* probs;  // [packs, Tq, Hq, W] from the forward
  const float* stats;  // [packs, Tq, Hq, 2] from the forward
  Segments seg;
  void* dq;            // [packs, Tq, Hq, D]
  void* dk;            // [packs, Tkv, Hkv, D]
  void* dv;            // [packs, Tkv, Hkv, D]
};

}  // namespace fusedattn::small_seq
