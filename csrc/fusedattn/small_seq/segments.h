// Where a segment's rows are, and which keys a query row keeps: the one
// definition the CPU and CUDA kernels share (host and device). The kept keys
// follow the rule of every backend, attention/mask.h; only the slots below are
// small-seq's own (its descriptors are cu_seqlens-style slots, see small_seq.py).
//
// Segment s of a pack owns the q rows [q_offsets[s], q_offsets[s+1]) (its slot;
// BSHD: [s, s+1)) and uses the first q_len of them (the whole slot when no
// lengths are given); likewise for kv. Offsets are clamped to the pack's token
// range and a slot never ends before it starts, and lengths are clamped to the
// slot, so no input makes a kernel read or write outside its tensors. Rows of a
// slot past the length ("padded tails"), and rows before the first and after the
// last slot, belong to no segment: their outputs and gradients are zero (the
// first and last segment of a pack write those edge rows).
// Offsets must be non-decreasing for every row to have exactly one owner: small_seq.py
// hands the kernels rule_slots() of small_seq_reference.py, the descriptor rule of every
// backend (attention/mask.h: a segment ends at the next offset, which clamping to the
// slot already does; one whose offset is below an earlier one is empty) as non-decreasing
// offsets and lengths.
//
// Query row r (0-based in its segment) keeps the keys [0, hi) of mask.h's
// segment_keys: small-seq serves no window (validate()), so every range starts
// at key 0.
#pragma once

#include <stdint.h>

#include "fusedattn/attention/mask.h"
#include "fusedattn/core/host_device.h"
#include "fusedattn/small_seq/params.h"

namespace fusedattn::small_seq {

// Every row index here fits in int32 (validate() caps tokens and segments at 2^31 - 2),
// which keeps the kernels' registers few.

// Segment metadata of one tensor side (q or kv).
struct SideTable {
  const int32_t* lens;     // [packs, n] or null: every segment uses its whole slot
  const int32_t* offsets;  // [packs, n + 1] or null: slot s is [s * stride, (s + 1) * stride)
  int32_t tokens;          // rows per pack
  int32_t stride;          // rows per slot when offsets is null (BSHD: Sq or Skv)
};

// Token indices are relative to the pack.
struct Rows {
  int32_t begin;      // first row of the segment
  int32_t len;        // rows it uses
  int32_t own_begin;  // rows [own_begin, own_end) are this segment's to write
  int32_t own_end;
};

FA_HOST_DEVICE FA_INLINE int32_t clamp_i32(int32_t x, int32_t lo, int32_t hi) {
  return x < lo ? lo : (x > hi ? hi : x);
}

// A segment's offsets and length as stored, before any clamping: a kernel loads
// them for many segments at once and does the arithmetic later.
struct RawRows {
  int32_t start, next, len;
};

FA_HOST_DEVICE FA_INLINE RawRows load_rows(const SideTable& t, int64_t pack, int32_t n,
                                           int32_t s) {
  RawRows r;
  if (t.offsets) {
    const int32_t* o = t.offsets + pack * (int64_t{n} + 1);
    r.start = o[s];
    r.next = o[s + 1];
  } else {
    r.start = s * t.stride;  // < tokens: validate() checks tokens == n * stride
    r.next = r.start + t.stride;
  }
  r.len = t.lens ? t.lens[pack * n + s] : 0;
  return r;
}

FA_HOST_DEVICE FA_INLINE Rows clamp_rows(const SideTable& t, const RawRows& raw, int32_t n,
                                         int32_t s) {
  const int32_t start = clamp_i32(raw.start, 0, t.tokens);
  const int32_t next = clamp_i32(raw.next, start, t.tokens);
  Rows r;
  r.begin = start;
  r.len = t.lens ? clamp_i32(raw.len, 0, next - start) : next - start;
  r.own_begin = s == 0 ? 0 : start;
  r.own_end = s == n - 1 ? t.tokens : next;
  return r;
}

FA_HOST_DEVICE FA_INLINE Rows segment_rows(const SideTable& t, int64_t pack, int32_t n,
                                           int32_t s) {
  return clamp_rows(t, load_rows(t, pack, n, s), n, s);
}

FA_HOST_DEVICE FA_INLINE int32_t row_hi(int32_t mask, int32_t r, int32_t q_len, int32_t kv_len) {
  return int32_t(segment_keys(mask_rule(mask, -1, -1), r, q_len, kv_len).hi);
}

// The kernels' fast path: one query row and every key within the width of P.
// Anything else (a broken promise) takes the per-segment general path.
FA_HOST_DEVICE FA_INLINE bool fast_segment(int32_t q_len, int32_t kv_len, int32_t width) {
  return q_len <= 1 && kv_len <= width;
}

}  // namespace fusedattn::small_seq
