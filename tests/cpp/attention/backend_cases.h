// The backend tests' common pieces (test_backend.cc, test_backend_hopper.cc): a call the
// Hopper kernels can take, a request with a score_mod's form, and the kernels a choice names.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fusedattn/attention/backend.h"
#include "fusedattn/attention/params.h"
#include "attention/plain_call.h"

namespace fusedattn::test {

// A bf16 causal call the Hopper forward can take when its score_mod is softcap or ALiBi:
// q [2, 512, 8, 128], k/v [2, 512, 2, 128].
inline AttnParams hopper_params() {
  AttnParams p = plain_call(2, 512, 512, 8, 2, 128, 128, 0.088f);
  p.mask_type = FA_CAUSAL_MASK;
  p.is_training = 1;
  return p;
}

inline BackendRequest with(ScoreModKind kind) {
  BackendRequest r;
  r.score_mod.kind = kind;
  return r;
}

inline bool has(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

inline void expect_kernels(const BackendChoice& c, int32_t backend, int32_t forward, int32_t backward) {
  EXPECT_TRUE(c.status.ok()) << c.status.message;
  EXPECT_STREQ(backend_name(c.backend), backend_name(backend)) << c.reason;
  EXPECT_STREQ(backend_name(c.forward), backend_name(forward)) << c.reason;
  EXPECT_STREQ(backend_name(c.backward), backend_name(backward)) << c.reason;
}

}  // namespace fusedattn::test
