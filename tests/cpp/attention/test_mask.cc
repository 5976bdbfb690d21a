// attention/mask.h against a brute-force per-element rule, written here from
// python/fusedattn/reference.py (segment_mask), not from the header:
//   segment s of row b, each side: THD begin = clamp(offset[s], 0, S), end = the least of
//   begin + clamped length (padding masks), clamp(offset[s + 1], 0, S) and S, and empty when
//   begin is below an earlier segment's begin (offsets out of order); BSHD begin = 0, end =
//   the clamped length under padding masks, S otherwise. A query belongs to the one
//   segment holding it (the rule keeps segments disjoint; checked here) and keeps key j of
//   that segment's key range when, with local li, lj and
//   diag = 0 or kv_len - q_len (bottom-right), li + diag - left <= lj <= li + diag + right
//   (a negative side unbounded, causal: right = 0), evaluated in 128-bit integers so
//   that no window, INT64_MAX included, can overflow.
// Every test checks the kept keys form exactly the header's range [lo, hi), and the CPU
// engine's RowRanges and the small-seq row rule against the same brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "fusedattn/attention/cpu/row_ranges.h"
#include "fusedattn/attention/mask.h"
#include "fusedattn/small_seq/segments.h"

namespace fusedattn {
namespace {

using i128 = __int128;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

const int32_t kMasks[] = {FA_NO_MASK,
                          FA_PADDING_MASK,
                          FA_CAUSAL_MASK,
                          FA_PADDING_CAUSAL_MASK,
                          FA_CAUSAL_BOTTOM_RIGHT_MASK,
                          FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK};
// -1 is the sentinel; other negatives mean the same to the rule (validate() rejects them).
const int64_t kSides[] = {-1, -7, 0, 1, 2, 5, 1 << 20, int64_t{1} << 40, kMax - 1, kMax};

bool causal(int32_t m) { return m >= FA_CAUSAL_MASK; }
bool bottom_right(int32_t m) {
  return m == FA_CAUSAL_BOTTOM_RIGHT_MASK || m == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
bool padding(int32_t m) {
  return m == FA_PADDING_MASK || m == FA_PADDING_CAUSAL_MASK ||
         m == FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}

int64_t clip(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// The per-element rule inside one segment.
bool keeps(int32_t mask, int64_t left, int64_t right, i128 li, i128 lj, i128 q_len, i128 kv_len) {
  const i128 pos = li + (bottom_right(mask) ? kv_len - q_len : 0);
  if (causal(mask)) right = 0;
  if (left >= 0 && lj < pos - left) return false;
  if (right >= 0 && lj > pos + right) return false;
  return true;
}

// The kept keys of a row as a range, or a failure when they are not contiguous.
::testing::AssertionResult is_range(const std::vector<bool>& kept, KeyRange r,
                                    int64_t empty_at) {
  int64_t lo = -1, hi = -1;
  for (int64_t j = 0; j < int64_t(kept.size()); ++j) {
    if (!kept[j]) continue;
    if (lo < 0) lo = j;
    else if (hi != j) return ::testing::AssertionFailure() << "kept keys are not contiguous";
    hi = j + 1;
  }
  if (lo < 0) lo = hi = empty_at;
  if (r.lo != lo || r.hi != hi)
    return ::testing::AssertionFailure()
           << "header [" << r.lo << ", " << r.hi << "), brute force [" << lo << ", " << hi << ")";
  return ::testing::AssertionSuccess();
}

TEST(MaskRule, SegmentKeysMatchElementRule) {
  for (int32_t mask : kMasks)
    for (int64_t left : kSides)
      for (int64_t right : kSides)
        for (int64_t q_len = 1; q_len <= 7; ++q_len)
          for (int64_t kv_len = 0; kv_len <= 7; ++kv_len)
            for (int64_t li = 0; li < q_len; ++li) {
              std::vector<bool> kept(kv_len);
              for (int64_t lj = 0; lj < kv_len; ++lj)
                kept[lj] = keeps(mask, left, right, li, lj, q_len, kv_len);
              const KeyRange r = segment_keys(mask_rule(mask, left, right), li, q_len, kv_len);
              ASSERT_TRUE(is_range(kept, r, 0))
                  << "mask " << mask << " window (" << left << ", " << right << ") q_len "
                  << q_len << " kv_len " << kv_len << " row " << li;
            }
}

// Rows far from key 0 (the engine's longest sequences, small-seq's int32 lengths) with
// windows near INT64_MAX: the range is checked at its edges instead of element by element.
TEST(MaskRule, LongSegmentsAndHugeWindows) {
  const int64_t lens[] = {1, 2, 1 << 20, (int64_t{1} << 31) - 2};
  for (int32_t mask : kMasks)
    for (int64_t left : kSides)
      for (int64_t right : kSides)
        for (int64_t q_len : lens)
          for (int64_t kv_len : lens)
            for (int64_t li : {int64_t{0}, q_len / 2, q_len - 1}) {
              const KeyRange r = segment_keys(mask_rule(mask, left, right), li, q_len, kv_len);
              ASSERT_LE(0, r.lo);
              ASSERT_LE(r.lo, r.hi);
              ASSERT_LE(r.hi, kv_len);
              auto kept = [&](int64_t j) { return keeps(mask, left, right, li, j, q_len, kv_len); };
              if (r.lo == r.hi) {
                ASSERT_EQ(r.lo, 0);
                // A band holding the diagonal key pos and any key of [0, kv_len) also
                // holds pos clamped into [0, kv_len).
                const int64_t pos = li + (bottom_right(mask) ? kv_len - q_len : 0);
                ASSERT_FALSE(kept(clip(pos, 0, kv_len - 1)));
                continue;
              }
              ASSERT_TRUE(kept(r.lo) && kept(r.hi - 1));
              if (r.lo > 0) ASSERT_FALSE(kept(r.lo - 1));
              if (r.hi < kv_len) ASSERT_FALSE(kept(r.hi));
            }
}

// The small-seq kernels' rule: keys [0, row_hi) without a window.
TEST(MaskRule, SmallSeqRowHi) {
  for (int32_t mask : kMasks)
    for (int32_t q_len : {1, 2, 5, (1 << 30), std::numeric_limits<int32_t>::max() - 1})
      for (int32_t kv_len : {0, 1, 3, 64, std::numeric_limits<int32_t>::max() - 1})
        for (int32_t r : {0, 1, q_len / 2, q_len - 1}) {
          if (r >= q_len) continue;
          const int64_t hi = small_seq::row_hi(mask, r, q_len, kv_len);
          ASSERT_LE(0, hi);
          ASSERT_LE(hi, kv_len);
          if (hi > 0) ASSERT_TRUE(keeps(mask, -1, -1, r, 0, q_len, kv_len) &&
                                  keeps(mask, -1, -1, r, hi - 1, q_len, kv_len));
          if (hi < kv_len) ASSERT_FALSE(keeps(mask, -1, -1, r, hi, q_len, kv_len));
        }
}

// --- whole calls: descriptors, segments, padding -----------------------------

struct Call {
  AttnParams p{};
  std::vector<int32_t> q_lens, kv_lens, q_offsets, kv_offsets;
  SeqArgs seq() const {
    return {q_lens.empty() ? nullptr : q_lens.data(), kv_lens.empty() ? nullptr : kv_lens.data(),
            q_offsets.empty() ? nullptr : q_offsets.data(),
            kv_offsets.empty() ? nullptr : kv_offsets.data()};
  }
};

// Brute force of reference.py's segment tables: (begin, length) per segment and side.
struct RefSegments {
  std::vector<int64_t> qb, ql, kb, kl;  // [B, M]
};

// One side of the rule: (begin, length) of each segment of row b.
void ref_side(const std::vector<int32_t>& offs, const std::vector<int32_t>& lens, bool thd,
              bool pad, int64_t b, int64_t M, int64_t S, std::vector<int64_t>* begin,
              std::vector<int64_t>* len) {
  for (int64_t s = 0; s < M; ++s) {
    int64_t lo = 0, end = S;
    if (thd) {
      lo = clip(offs[b * (M + 1) + s], 0, S);
      end = std::min(end, clip(offs[b * (M + 1) + s + 1], 0, S));
      for (int64_t t = 0; t < s; ++t)
        if (clip(offs[b * (M + 1) + t], 0, S) > lo) end = lo;
    }
    if (pad) end = std::min(end, lo + clip(lens[b * M + s], 0, S));
    begin->push_back(lo);
    len->push_back(std::max<int64_t>(end - lo, 0));
  }
}

RefSegments ref_segments(const Call& c) {
  const AttnParams& p = c.p;
  const int64_t B = p.batch, M = p.max_segments;
  const bool thd = is_thd(p.layout), pad = padding(p.mask_type);
  RefSegments r;
  for (int64_t b = 0; b < B; ++b) {
    ref_side(c.q_offsets, c.q_lens, thd, pad, b, M, p.seqlen_q, &r.qb, &r.ql);
    ref_side(c.kv_offsets, c.kv_lens, thd, pad, b, M, p.seqlen_kv, &r.kb, &r.kl);
  }
  return r;
}

// The segment of token t (-1: padding); fails the test when two segments hold it.
int64_t owner(const std::vector<int64_t>& begin, const std::vector<int64_t>& len, int64_t b,
              int64_t M, int64_t t) {
  int64_t o = -1;
  for (int64_t s = 0; s < M; ++s)
    if (t >= begin[b * M + s] && t < begin[b * M + s] + len[b * M + s]) {
      EXPECT_EQ(o, -1) << "segments " << o << " and " << s << " of row " << b
                       << " both hold token " << t;
      o = s;
    }
  return o;
}

void check_call(const Call& c) {
  const AttnParams& p = c.p;
  const int64_t B = p.batch, M = p.max_segments, Sq = p.seqlen_q, Skv = p.seqlen_kv;
  const RefSegments ref = ref_segments(c);
  const AttnMask m = attn_mask(p, c.seq());
  const cpu::RowRanges table = cpu::build_row_ranges(p, c.seq(), 4);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < Skv; ++j) owner(ref.kb, ref.kl, b, M, j);  // keys disjoint too
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i) {
      const int64_t qs = owner(ref.qb, ref.ql, b, M, i);
      std::vector<bool> kept(Skv, false);
      for (int64_t j = 0; j < Skv && qs >= 0; ++j) {
        const int64_t k = b * M + qs;
        if (j < ref.kb[k] || j >= ref.kb[k] + ref.kl[k]) continue;
        kept[j] = keeps(p.mask_type, p.window_left, p.window_right, i - ref.qb[k],
                        j - ref.kb[k], ref.ql[k], ref.kl[k]);
      }
      Segment g{};
      const bool found = find_segment(m, b, i, &g);
      ASSERT_EQ(found, qs >= 0) << "row " << b << " query " << i;
      ASSERT_EQ(bool(table.real[table.row(b, i)]), qs >= 0) << "row " << b << " query " << i;
      if (!found) {
        EXPECT_EQ(table.lo[table.row(b, i)], table.hi[table.row(b, i)]);
        continue;
      }
      ASSERT_EQ(g.q_begin, ref.qb[b * M + qs]);
      const Segment alone = segment(m, b, qs);
      ASSERT_EQ(alone.q_len, ref.ql[b * M + qs]);
      ASSERT_EQ(alone.kv_begin, ref.kb[b * M + qs]);
      ASSERT_EQ(alone.kv_len, ref.kl[b * M + qs]);
      ASSERT_EQ(g.kv_begin, ref.kb[b * M + qs]);
      const KeyRange r = row_keys(m, g, i);
      ASSERT_TRUE(is_range(kept, r, g.kv_begin))
          << "mask " << p.mask_type << " window (" << p.window_left << ", " << p.window_right
          << ") row " << b << " query " << i;
      const KeyRange t{table.lo[table.row(b, i)], table.hi[table.row(b, i)]};
      ASSERT_EQ(t.lo, r.lo);
      ASSERT_EQ(t.hi, r.hi);
      ASSERT_EQ(table.q_base[table.row(b, i)], g.q_begin);
      ASSERT_EQ(table.kv_base[table.row(b, i)], g.kv_begin);
    }
}

Call make_call(int32_t layout, int32_t mask, int64_t B, int64_t Sq, int64_t Skv, int64_t M,
               int64_t left, int64_t right) {
  Call c;
  c.p.batch = B;
  c.p.seqlen_q = Sq;
  c.p.seqlen_kv = Skv;
  c.p.max_segments = M;
  c.p.layout = layout;
  c.p.mask_type = mask;
  c.p.window_left = left;
  c.p.window_right = right;
  return c;
}

TEST(MaskRule, BshdCallsWithPadding) {
  std::mt19937 rng(19);
  for (int32_t mask : kMasks)
    for (int64_t left : kSides)
      for (int64_t right : {int64_t{-1}, int64_t{0}, int64_t{2}, kMax}) {
        const int64_t Sq = 1 + rng() % 9, Skv = 1 + rng() % 9;
        Call c = make_call(FA_BSHD_BSHD_BSHD, mask, 3, Sq, Skv, 1, left, right);
        // Lengths in range, zero, negative and past the extent.
        c.q_lens = {int32_t(Sq) - 1, -3, int32_t(Sq) + 5};
        c.kv_lens = {int32_t(Skv), 0, int32_t(Skv) - 1};
        check_call(c);
      }
}

TEST(MaskRule, ThdCallsWithGapsOverlapsAndBadDescriptors) {
  std::mt19937 rng(3);
  const int32_t masks[] = {FA_PADDING_MASK, FA_PADDING_CAUSAL_MASK,
                           FA_PADDING_CAUSAL_BOTTOM_RIGHT_MASK};
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t B = 2, M = 1 + rng() % 4, Sq = 1 + rng() % 16, Skv = 1 + rng() % 16;
    const int64_t left = kSides[rng() % std::size(kSides)];
    const int64_t right = kSides[rng() % std::size(kSides)];
    Call c = make_call(FA_THD_THD_THD, masks[trial % 3], B, Sq, Skv, M, left, right);
    auto draw = [&](int64_t S) { return int32_t(int64_t(rng() % (S + 6)) - 3); };
    for (int64_t b = 0; b < B; ++b) {
      // Mostly increasing offsets with padded tails; sometimes anything (overlaps,
      // out-of-range values).
      const bool wild = trial % 5 == 0;
      int32_t oq = 0, ok = 0;
      for (int64_t s = 0; s <= M; ++s) {
        c.q_offsets.push_back(wild ? draw(Sq) : oq);
        c.kv_offsets.push_back(wild ? draw(Skv) : ok);
        oq += int32_t(rng() % (Sq / M + 2));
        ok += int32_t(rng() % (Skv / M + 2));
      }
      for (int64_t s = 0; s < M; ++s) {
        c.q_lens.push_back(draw(Sq / M + 2));
        c.kv_lens.push_back(draw(Skv / M + 2));
      }
    }
    check_call(c);
  }
}

// Issue 20's descriptor: lengths [[8, 4]], offsets [[0, 4, 8]] on both sides. Segment 0
// ends at segment 1's offset: queries and keys [0, 4); segment 1 is [4, 8).
TEST(MaskRule, OverlappingSegmentEndsAtTheNextOffset) {
  Call c = make_call(FA_THD_THD_THD, FA_PADDING_MASK, 1, 8, 8, 2, -1, -1);
  c.q_lens = c.kv_lens = {8, 4};
  c.q_offsets = c.kv_offsets = {0, 4, 8};
  const AttnMask m = attn_mask(c.p, c.seq());
  const Segment g0 = segment(m, 0, 0), g1 = segment(m, 0, 1);
  EXPECT_EQ(g0.q_begin, 0);
  EXPECT_EQ(g0.q_len, 4);
  EXPECT_EQ(g0.kv_len, 4);
  EXPECT_EQ(g1.q_begin, 4);
  EXPECT_EQ(g1.kv_len, 4);
  const KeyRange k = row_keys(m, g0, 0);
  EXPECT_EQ(k.lo, 0);
  EXPECT_EQ(k.hi, 4);
  check_call(c);
}

// Offsets out of order: offsets [0, 6, 2, 8] with lengths [2, 2, 2]. Segment 2 starts
// below segment 1's offset: empty; segment 1 ends at segment 2's offset 2 < 6: empty.
TEST(MaskRule, SegmentBelowAnEarlierOffsetIsEmpty) {
  Call c = make_call(FA_THD_THD_THD, FA_PADDING_MASK, 1, 8, 8, 3, -1, -1);
  c.q_lens = c.kv_lens = {2, 2, 2};
  c.q_offsets = c.kv_offsets = {0, 6, 2, 8};
  const AttnMask m = attn_mask(c.p, c.seq());
  EXPECT_EQ(segment(m, 0, 0).q_len, 2);
  EXPECT_EQ(segment(m, 0, 1).q_len, 0);
  EXPECT_EQ(segment(m, 0, 2).q_len, 0);
  Segment g;
  EXPECT_FALSE(find_segment(m, 0, 2, &g));
  EXPECT_FALSE(find_segment(m, 0, 6, &g));
  check_call(c);
}

}  // namespace
}  // namespace fusedattn
