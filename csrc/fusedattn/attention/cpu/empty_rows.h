// jax's rows that keep nothing on the CPU engine (backend.h: kRequestAverageEmptyRows).
// A query row below its sequence's length whose lse is at most `threshold` (half the
// folded mask's value: it kept no key, or only keys at that value) gets the plain average
// of all Skv values of its kv head, as jax's softmax over equal masked logits gives; rows
// past the length stay 0. Its gradient: no dq, dk or dbias from the row, and dv of every
// key of its kv head gains dout / Skv. BSHD layouts (one segment a row), vanilla softmax,
// no dropout (validate_request checks).
#pragma once

#include <vector>

#include "fusedattn/attention/cpu/attention.h"

namespace fusedattn::cpu {

// After attention_fwd: writes those rows of a.out.
void average_empty_rows_fwd(const AttnParams& p, const FwdArgs& a, double threshold);

// What the backward needs around attention_bwd: lse with +inf at those rows (its P is
// then 0 everywhere: no gradient from them) and, per (batch, kv head), the sum of their
// dout. lse is float32 (float64 calls: double), [B, Hq, Sq] contiguous.
class EmptyRowsBwd {
 public:
  // Before attention_bwd: reads a.lse and a.dout; a.lse must then point at lse().
  EmptyRowsBwd(const AttnParams& p, const BwdArgs& a, double threshold);
  const void* lse() const;
  Strides lse_strides() const;
  // After attention_bwd: dv += the sums / Skv (nothing when no row was empty).
  void finish(const AttnParams& p, const BwdArgs& a) const;

 private:
  std::vector<float> lse32_;
  std::vector<double> lse64_, dsum_;  // dsum_ [B, Hkv, Dv]
  bool any_ = false;
  int64_t sq_ = 0, hq_ = 0;
};

}  // namespace fusedattn::cpu
