// Philox4x32-10 against the published known-answer vectors (Random123's
// kat_vectors), and the dropout keep rule built on it: its keep rate, and that
// masks of different heads, batches and seeds are independent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "fusedattn/attention/cpu/philox_lanes.h"
#include "fusedattn/core/philox.h"

namespace fusedattn {
namespace {

TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const Philox4 got =
        philox4x32_10(Philox4{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], k.out[i]) << "word " << i;
  }
}

// The engine's batched Philox (AVX2 where built for it) gives the scalar words.
TEST(Philox, LanesMatchScalar) {
  std::mt19937 rng(3);
  for (int rep = 0; rep < 50; ++rep) {
    uint32_t c[4][cpu::kPhiloxLanes];
    for (auto& row : c)
      for (uint32_t& x : row) x = uint32_t(rng());
    const uint32_t k0 = uint32_t(rng()), k1 = uint32_t(rng());
    uint32_t out[4][cpu::kPhiloxLanes];
    std::memcpy(out, c, sizeof(c));
    cpu::philox_lanes(out[0], out[1], out[2], out[3], k0, k1);
    for (int l = 0; l < cpu::kPhiloxLanes; ++l) {
      const Philox4 want = philox4x32_10(Philox4{{c[0][l], c[1][l], c[2][l], c[3][l]}}, k0, k1);
      for (int w = 0; w < 4; ++w) ASSERT_EQ(out[w][l], want.v[w]) << "lane " << l << " word " << w;
    }
  }
}

TEST(Philox, ThresholdEdges) {
  EXPECT_EQ(dropout_threshold(0.0f), 0u);  // p = 0 keeps every word
  EXPECT_EQ(dropout_threshold(0.5f), 0x80000000u);
  EXPECT_EQ(dropout_threshold(0.25f), 0x40000000u);
  EXPECT_EQ(dropout_threshold(std::nextafter(1.0f, 0.0f)), 0xFFFFFF00u);
}

// Keep rate over many (query, key) draws of one head: within 5 sigma of 1 - p.
TEST(Philox, KeepRate) {
  const uint32_t seed[2] = {1234, 5678};
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t thr = dropout_threshold(p);
    int64_t kept = 0, n = 0;
    for (int64_t i = 0; i < 512; ++i)
      for (int64_t g = 0; g < 256; ++g) {
        const Philox4 w = dropout_words(seed, 3, 5, i, g);
        for (uint32_t x : w.v) kept += x >= thr, ++n;
      }
    const double rate = double(kept) / n, sigma = std::sqrt(p * (1.0 - p) / n);
    EXPECT_NEAR(rate, 1.0 - p, 5 * sigma) << "p " << p;
  }
}

// Masks of two heads (or batches, or seeds) agree on a fraction p^2 + (1-p)^2 of
// the elements when independent; identical masks would agree everywhere.
TEST(Philox, MasksOfHeadsBatchesAndSeedsAreIndependent) {
  const float p = 0.5f;
  const uint32_t thr = dropout_threshold(p);
  const uint32_t s1[2] = {7, 0}, s2[2] = {8, 0};
  struct Pair {
    const uint32_t *seed_a, *seed_b;
    int64_t b_a, h_a, b_b, h_b;
  };
  const Pair pairs[] = {{s1, s1, 0, 0, 0, 1}, {s1, s1, 0, 0, 1, 0}, {s1, s2, 0, 0, 0, 0}};
  for (const Pair& pr : pairs) {
    int64_t agree = 0, n = 0;
    for (int64_t i = 0; i < 256; ++i)
      for (int64_t g = 0; g < 64; ++g) {
        const Philox4 a = dropout_words(pr.seed_a, pr.b_a, pr.h_a, i, g);
        const Philox4 b = dropout_words(pr.seed_b, pr.b_b, pr.h_b, i, g);
        for (int t = 0; t < 4; ++t) agree += (a.v[t] >= thr) == (b.v[t] >= thr), ++n;
      }
    const double expect = p * p + (1 - p) * (1 - p), sigma = std::sqrt(expect * (1 - expect) / n);
    EXPECT_NEAR(double(agree) / n, expect, 5 * sigma);
  }
}

}  // namespace
}  // namespace fusedattn
