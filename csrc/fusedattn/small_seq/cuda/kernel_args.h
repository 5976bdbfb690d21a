// What a small-seq CUDA kernel receives (by value): the buffers of args.h, the
// segment tables and the few sizes the kernels index with. Shapes in params.h;
// T = the storage type of q, k, v, out, dout, dq, dk, dv.
#pragma once

#include <stdint.h>

#include "fusedattn/small_seq/segments.h"

namespace fusedattn::small_seq::cuda {

struct KernelArgs {
  const void* q;          // [packs, Tq, Hq, D]
  const void* k;          // [packs, Tkv, Hkv, D]
  const void* v;          // [packs, Tkv, Hkv, D]
  const void* o;          // backward: the forward's out [packs, Tq, Hq, D]
  const void* dout;       // backward: [packs, Tq, Hq, D]
  const float* probs_in;  // backward: P [packs, Tq, Hq, W]
  const float* stats_in;  // backward: [packs, Tq, Hq, 2] (row max, log-sum-exp)
  void* out;              // forward: [packs, Tq, Hq, D]
  float* probs;           // forward: P, written when save_aux
  float* stats;           // forward: written when save_aux
  void* dq;               // backward: [packs, Tq, Hq, D]
  void* dk;               // backward: [packs, Tkv, Hkv, D]
  void* dv;               // backward: [packs, Tkv, Hkv, D]
  SideTable qs, kvs;
  int32_t segments;  // per pack
  int32_t units;     // work items: packs * segments * (Hq forward, Hkv backward)
  int32_t heads_q, heads_kv, group, width, mask, save_aux;
  float scale;
};

}  // namespace fusedattn::small_seq::cuda
