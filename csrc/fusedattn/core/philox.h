// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011) and the dropout keep rule built on it.
//
// The keep mask of attention dropout is a pure function of
// (seed, batch, head, query, key): forward and backward recompute it instead
// of storing it, and a fixed seed reproduces it bitwise. One Philox call gives
// four 32-bit words, so four consecutive keys share a call:
//   counter = (key / 4, query, head, batch), key words = (seed[0], seed[1]),
//   word    = output[key % 4],  kept when word >= dropout_threshold(p).
// `batch` is the index within one vmap slice (params.h), so vmap(f)(x)[n]
// equals f(x[n]); a sharded call adds its index_base (attention/ffi_decode.h) to
// batch and head, and a block of a bigger call along the sequence takes its tokens'
// global query and key (attention/mask.h: global_token; kv_pos and a striped block's
// stripe are multiples of 4, so its key groups are the whole call's), so each shard draws
// what the whole call draws there.
// python/fusedattn/reference.py implements the same rule.
// Plain C++ that nvcc compiles for the device too (FA_HOST_DEVICE).
#pragma once

#include <stdint.h>

#include "fusedattn/core/host_device.h"

namespace fusedattn {

struct Philox4 {
  uint32_t v[4];
};

constexpr uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;

// One round on one counter (round r uses the key bumped r times by the Weyl constants).
FA_HOST_DEVICE FA_INLINE void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2,
                                           uint32_t& c3, uint32_t key0, uint32_t key1) {
  const uint64_t p0 = uint64_t{kPhiloxMul0} * c0;
  const uint64_t p1 = uint64_t{kPhiloxMul1} * c2;
  const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ key0;
  const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ key1;
  c1 = uint32_t(p1);
  c3 = uint32_t(p0);
  c0 = n0;
  c2 = n2;
}

FA_HOST_DEVICE FA_INLINE Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    philox_round(ctr.v[0], ctr.v[1], ctr.v[2], ctr.v[3], key0, key1);
    key0 += kPhiloxWeyl0;
    key1 += kPhiloxWeyl1;
  }
  return ctr;
}

// Words at or above this threshold keep their element: keep probability
// (2^32 - threshold) / 2^32 = 1 - p to within 2^-32.
FA_HOST_DEVICE FA_INLINE uint32_t dropout_threshold(float p) {
  const double t = double(p) * 4294967296.0;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : uint32_t(t);
}

// The four words that decide keys 4 * key_group .. 4 * key_group + 3.
FA_HOST_DEVICE FA_INLINE Philox4 dropout_words(const uint32_t seed[2], int64_t batch, int64_t head,
                                               int64_t query, int64_t key_group) {
  return philox4x32_10(
      Philox4{{uint32_t(key_group), uint32_t(query), uint32_t(head), uint32_t(batch)}}, seed[0],
      seed[1]);
}

}  // namespace fusedattn
