// The pieces the CUDA flash kernels share (flash.cu's wmma kernels, flash_mma.cu's
// register-resident ones): the kept-key table's rows, element conversions, and the
// per-element steps of attention/cpu/score_ops.h (bias, sink, dropout) on the device.
// Internal to attention/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <limits>

#include "fusedattn/attention/cuda/flash.h"
#include "fusedattn/attention/cuda/mma.cuh"
#include "fusedattn/core/fast_math.h"
#include "fusedattn/core/philox.h"
#include "fusedattn/platform/cuda/elements.cuh"
#include "fusedattn/score_mod/device_program.h"

namespace fusedattn::cuda::flash::detail {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A row of the kept-key table: keys [lo, hi) (mask.h), and the first query / key token
// of its sequence (q_base < 0: a padding row).
struct RowInfo {
  int32_t lo, hi, q_base, kv_base;
};
struct TileRange {
  int32_t lo, hi;  // union of a tile's rows' kept keys; lo >= hi: none
};


// ---- element types: to_f / from_f (platform/cuda/elements.cuh) ------------------------

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---- per-element steps (attention/cpu/score_ops.h) ------------------------------------

// The inputs every kernel reads besides q, k, v: p, a and what follows from them.
struct Call {
  AttnParams p;
  AttnTensors a;
  AttnMask mask;
  int64_t Dp, Dvp, bs;  // head dims rounded up to 16; batch entries per slice
  float bmul;           // bias factor: scale for PRE_SCALE_BIAS, else 1
  uint32_t threshold;   // dropout
  float inv_keep;
  bool drop_broadcast;  // one mask for every batch entry and head (kRequestDropoutBroadcast)
  RowInfo* rows;        // [B, Sq]
  TileRange* tiles;     // [B, n_tiles]
  // score_mod (flash.h's ScoreModArgs; sm null: none): the program (in the workspace), the
  // operands [V, total] and, in the backward, their float32 gradients (null: not wanted).
  const DeviceScoreMod* sm = nullptr;
  const float* sm_ops = nullptr;
  float* sm_dops = nullptr;
  bool sm_local_ops = false;  // a BSHD block: operands indexed by local tokens
};

// Dropout's keep factor of query i, key j (local tokens) of folded batch entry b, head h:
// philox.h's rule on the global indices (index_base; a block's global tokens).
struct Drop {
  bool on = false;
  uint32_t seed[2] = {0, 0};
  int64_t b = 0, h = 0;
  StripeMap q{0, 1, 1}, kv{0, 1, 1};
  uint32_t threshold = 0;
  float inv_keep = 1.0f;

  __device__ Drop(const Call& c, int64_t bb, int64_t hh) {
    on = c.p.is_training && c.p.dropout > 0.0f;
    if (!on) return;
    const int64_t slice = bb / c.bs;
    seed[0] = c.a.seed[2 * slice];
    seed[1] = c.a.seed[2 * slice + 1];
    b = bb % c.bs;
    h = hh;
    if (c.a.index_base) {
      const int32_t* r = c.a.index_base + c.a.index_cols * slice;
      b += r[0];
      h += r[1];
      if (c.a.index_cols > 2) {
        const BlockPos pos = block_pos(r, c.a.index_cols);
        q = pos.q;
        kv = pos.kv;
      }
    }
    if (c.drop_broadcast) b = h = 0;  // one mask for every batch entry and head
    threshold = c.threshold;
    inv_keep = c.inv_keep;
  }
  __device__ __forceinline__ float z(int64_t i, int64_t j) const {
    const int64_t gi = global_token(q, i), gj = global_token(kv, j);
    const Philox4 w = dropout_words(seed, b, h, gi, gj / 4);
    return w.v[gj % 4] >= threshold ? inv_keep : 0.0f;
  }
};

// ---- score_mod (attention/cpu/score_ops.h's ScoreModRows, one element at a time) ------

// The score_mod of folded batch entry b, q head h: the program's batch / head inputs
// (global: index_base added), the operands' local indices, the maps from local to global
// tokens (a block of a bigger call) and this slice's operands.
struct SmHead {
  const DeviceScoreMod* prog = nullptr;  // null: no score_mod
  const float* ops = nullptr;            // this slice's operands
  float* dops = nullptr;                 // their gradients (null: not wanted)
  const RowInfo* rows = nullptr;         // batch entry b's rows: q_base, kv_base
  int64_t b = 0, h = 0;                  // local: the operands' indices
  float b_in = 0.0f, h_in = 0.0f;        // global: the program's inputs
  StripeMap q{0, 1, 1}, kv{0, 1, 1};
  bool local_ops = false;  // a BSHD block: operands indexed by local tokens
  // The program's closed form (DeviceScoreMod::form), run as compiled code: softcap's
  // a, b; ALiBi's sign * slope of this head (a), its sign (b) and its slope's gradient
  // element (dslope).
  int32_t form = kDevFormNone;
  float fa = 0.0f, fb = 0.0f;
  bool fabs_d = false;
  float* dslope = nullptr;
};

__device__ __forceinline__ SmHead sm_head(const Call& c, int64_t bb, int64_t hh) {
  SmHead x;
  if (!c.sm) return x;
  const int64_t slice = bb / c.bs;
  x.prog = c.sm;
  x.ops = c.sm_ops + slice * c.sm->total;
  x.dops = c.sm_dops ? c.sm_dops + slice * c.sm->total : nullptr;
  x.rows = c.rows + bb * c.p.seqlen_q;
  x.b = bb % c.bs;
  x.h = hh;
  int64_t gb = 0, gh = 0;
  if (c.a.index_base) {
    const int32_t* r = c.a.index_base + c.a.index_cols * slice;
    gb = r[0], gh = r[1];
    if (c.a.index_cols > 2) {
      const BlockPos pos = block_pos(r, c.a.index_cols);
      x.q = pos.q, x.kv = pos.kv;
      x.local_ops = c.sm_local_ops;
    }
  }
  x.b_in = float(x.b + gb);
  x.h_in = float(hh + gh);
  x.form = c.sm->form;
  if (x.form == kDevFormSoftcap) {
    x.fa = c.sm->form_a, x.fb = c.sm->form_b;
  } else if (x.form == kDevFormAlibi) {
    const int64_t at = operand_element(*c.sm, 0, x.b, x.h, 0, 0);
    x.fa = c.sm->form_a * x.ops[at];
    x.fb = c.sm->form_a;
    x.fabs_d = c.sm->form_abs != 0;
    x.dslope = x.dops ? x.dops + at : nullptr;
  }
  return x;
}

// A thread's running sums of operand gradients, one per operand: an element's gradient
// joins its operand's sum while it goes to the same element (a broadcast operand: whole
// tiles), else the sum is added to memory (a float32 atomic) and a new one starts.
struct SmGradSums {
  float* at[kMaxScoreModOperands];  // the element the sum goes to; null: none
  float sum[kMaxScoreModOperands];
};

// v joins operand k's sum, which goes to at (a new element: the old sum is added first).
__device__ __forceinline__ void sm_sum_add(SmGradSums& g, int k, float* at, float v) {
  if (g.at[k] != at) {
    if (g.at[k]) atomicAdd(g.at[k], g.sum[k]);
    g.at[k] = at, g.sum[k] = 0.0f;
  }
  g.sum[k] += v;
}

__device__ __forceinline__ void sm_sums_init(SmGradSums& g) {
  for (int k = 0; k < kMaxScoreModOperands; ++k) g.at[k] = nullptr, g.sum[k] = 0.0f;
}

static __device__ __noinline__ void sm_sums_flush(SmGradSums& g) {
  for (int k = 0; k < kMaxScoreModOperands; ++k)
    if (g.at[k]) atomicAdd(g.at[k], g.sum[k]), g.at[k] = nullptr, g.sum[k] = 0.0f;
}

// Four elements of a thread's tile at once (one mma n-tile fragment): the interpreter
// decodes each instruction once for the four, its scratch moves as float4 (one local load
// or store for four values) and the four evaluations' latencies overlap, where one call
// per element serialized them. Element e: query i[e], key j[e] (local tokens), its score
// s[e] and ds[e] (bwd / grad programs); bit e of live: evaluated (the others get zero
// inputs, their results unused: a masked key's operand element is never read).
struct Sm4 {
  int64_t i[4], j[4];
  float s[4], ds[4];
  uint32_t live;
};

__device__ __forceinline__ float& lane4(float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}
__device__ __forceinline__ float lane4(const float4& v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// The program's inputs for the four elements into regs: score, batch, head, the q and kv
// positions in the row's sequence, the operands' elements, ds; operand k's element index
// (into this slice's operands and their gradients) of element e into idx[k][e].
__device__ __forceinline__ void sm_inputs4(const SmHead& x, const Sm4& q, float4* regs,
                                           int64_t (*idx)[4]) {
  const DeviceScoreMod& sm = *x.prog;
  const int n_in = kScoreModIndexInputs + sm.n_operands + 1;
  for (int r = 0; r < n_in; ++r) regs[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (!((q.live >> e) & 1u)) continue;
    const int64_t i = q.i[e], j = q.j[e];
    const RowInfo ri = x.rows[i];
    const int64_t qi = global_token(x.q, i) - ri.q_base, kj = global_token(x.kv, j) - ri.kv_base;
    lane4(regs[0], e) = q.s[e];
    lane4(regs[1], e) = x.b_in;
    lane4(regs[2], e) = x.h_in;
    lane4(regs[3], e) = float(qi);
    lane4(regs[4], e) = float(kj);
    const int64_t oi = x.local_ops ? i : qi, oj = x.local_ops ? j : kj;
    for (int k = 0; k < sm.n_operands; ++k) {
      idx[k][e] = operand_element(sm, k, x.b, x.h, oi, oj);
      lane4(regs[kScoreModIndexInputs + k], e) = x.ops[idx[k][e]];
    }
    lane4(regs[kScoreModIndexInputs + sm.n_operands], e) = q.ds[e];
  }
}

// eval_program_regs (device_program.h) over four elements: regs[n_inputs, n_regs()).
__device__ __forceinline__ float4 eval_program4(const DeviceScoreMod& sm, const DeviceProgram& prog,
                                                float4* regs) {
  const DeviceInstr* code = sm.instr + prog.start;
  float4* out = regs + prog.n_inputs;
  for (int32_t i = 0; i < prog.n_instr; ++i) {
    const DeviceInstr ins = code[i];
    float4 x;
    if (ins.op == SM_CONST) {
      const float k = sm.consts[ins.a];
      x = make_float4(k, k, k, k);
    } else {
      x = regs[ins.a];
    }
    const float4 y = regs[ins.b], z = regs[ins.c];
    out[i] = make_float4(score_mod_op(ins.op, x.x, y.x, z.x), score_mod_op(ins.op, x.y, y.y, z.y),
                         score_mod_op(ins.op, x.z, y.z, z.z), score_mod_op(ins.op, x.w, y.w, z.w));
  }
  return regs[prog.out_reg];
}

// The closed forms (DeviceScoreMod::form), inline on one score: no call, nothing in local
// memory (the interpreter's Sm4 is built only where it runs). Results as eval_program's up
// to float32 rounding.
// ALiBi's distance kv - q (|kv - q|) in the row's sequence: qpos = the query's position
// there, kv_base = its row's first key (RowInfo); j a local key.
__device__ __forceinline__ float sm_alibi_dist(const SmHead& x, int64_t qpos, int64_t kv_base,
                                               int64_t j) {
  const float d = float(global_token(x.kv, j) - kv_base) - float(qpos);
  return x.fabs_d ? fabsf(d) : d;
}
__device__ __forceinline__ int64_t sm_qpos(const SmHead& x, int64_t i, const RowInfo& ri) {
  return global_token(x.q, i) - ri.q_base;
}
// softcap: a tanh(b s), and the factor its derivative puts on ds.
__device__ __forceinline__ float sm_softcap(const SmHead& x, float s) {
  return x.fa * fast_tanh(x.fb * s);
}
__device__ __forceinline__ float sm_softcap_grad(const SmHead& x, float s) {
  const float t = fast_tanh(x.fb * s);
  return x.fa * x.fb * (1.0f - t * t);
}

// The backward's n-tile as an Sm4: element e is query q_first + e % 2, key j0 + 8 (e / 2),
// raw score s[e]; nothing live yet.
__device__ __forceinline__ Sm4 bwd_sm4(int64_t q_first, int j0, const float (&s)[4]) {
  Sm4 q;
  q.live = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) q.i[e] = q_first + (e & 1), q.j[e] = j0 + 8 * (e >> 1), q.s[e] = s[e];
  return q;
}

// fn(s) of the four elements (the live ones' results are meaningful).
static __device__ __noinline__ float4 sm_forward4(const SmHead& x, const Sm4& q) {
  float4 regs[kDevMaxRegs];
  int64_t idx[kMaxScoreModOperands][4];
  sm_inputs4(x, q, regs, idx);
  return eval_program4(*x.prog, x.prog->fwd, regs);
}

// ds (of the modified score; the live elements', != 0) -> ds of the raw score s; each
// operand's gradient of a live element joins g (when x.dops), in element order.
static __device__ __noinline__ float4 sm_backward4(const SmHead& x, const Sm4& q, SmGradSums& g) {
  float4 regs[kDevMaxRegs];
  int64_t idx[kMaxScoreModOperands][4];
  sm_inputs4(x, q, regs, idx);
  const DeviceScoreMod& sm = *x.prog;
  if (x.dops) {
    for (int k = 0; k < sm.n_operands; ++k) {
      float4 d = eval_program4(sm, sm.grad[k], regs);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if ((q.live >> e) & 1u) sm_sum_add(g, k, x.dops + idx[k][e], lane4(d, e));
      }
    }
  }
  return eval_program4(sm, sm.bwd, regs);
}

template <class T>
__device__ __forceinline__ const T* bias_plane(const Call& c, int64_t b, int64_t h) {
  if (!c.a.bias) return nullptr;
  return static_cast<const T*>(c.a.bias) + (b / c.bs) * c.a.bias_slice + (b % c.bs) * c.a.bias_b +
         h * c.a.bias_h;
}

__device__ __forceinline__ float sink_logit(const Call& c, int64_t b, int64_t h) {
  if (c.p.softmax_type == FA_OFF_BY_ONE_SOFTMAX) return 0.0f;
  if (c.p.softmax_type == FA_LEARNABLE_SOFTMAX)
    return c.a.softmax_offset[(b / c.bs) * c.p.heads_q + h];
  return -kInf;
}

// ---- the register-resident kernels (flash_mma.cu, flash_mma_bwd.cu) -----------------

// ---- their backward's shared steps (a block = one key tile of 64 keys, 4 warps of 16 keys;
// query tiles of kBMQ = 64 rows, the tables' tile)

// The first work item u' >= u of a key tile [k0, k0 + 64) of batch entry b (u = q head in
// the GQA group * n_qt + query tile; n_u items) whose query tile keeps one of its keys
// (TileRange depends on the tile only).
__device__ __forceinline__ int64_t next_bwd_tile(const Call& c, int64_t b, int64_t n_qt, int64_t n_u,
                                                 int64_t k0, int64_t u) {
  for (; u < n_u; ++u) {
    const TileRange tr = c.tiles[b * n_qt + u % n_qt];
    if ((tr.lo > k0 ? tr.lo : k0) < (tr.hi < k0 + 64 ? tr.hi : k0 + 64)) break;
  }
  return u;
}

// Rows q0 .. q0 + 63 of query head h: kept keys (lo, hi), lse and delta into shared
// memory (past Sq: no keys, lse -inf, delta 0). The block's threads share the rows.
__device__ __forceinline__ void load_bwd_rows(const Call& c, const float* delta, int64_t b, int64_t h, int64_t q0,
                                              int2* keys, float* lse, float* dl) {
  const int64_t Sq = c.p.seqlen_q, rows = Sq - q0 < 64 ? Sq - q0 : 64;
  for (int r = threadIdx.x; r < 64; r += blockDim.x) {
    const int64_t i = q0 + r;
    const RowInfo ri = r < rows ? c.rows[b * Sq + i] : RowInfo{-1, -1, -1, -1};
    keys[r] = make_int2(ri.lo, ri.hi);
    lse[r] = r < rows ? c.a.lse[b * c.a.slse.b + h * c.a.slse.h + i * c.a.slse.s] : -kInf;
    dl[r] = r < rows ? delta[(b * c.p.heads_q + h) * Sq + i] : 0.0f;
  }
}

// Dropout's keep bits of a warp's 16 keys x 64 queries (mma C layout, thread (g, t)):
// bit 4 n + e is query q0 + 8 n + 2t + e % 2, key j0 + 8 (e / 2) (j0 = the warp's first
// key + g); drop.z's rule (its value is inv_keep or 0).
__device__ __forceinline__ uint32_t bwd_drop_bits(const Drop& drop, int64_t q0, int64_t j0, int t) {
  uint32_t bits = 0;
  if (!drop.on) return bits;
#pragma unroll 1
  for (int x = 0; x < 32; ++x) {
    const int n = x >> 2, e = x & 3;
    if (drop.z(q0 + 8 * n + 2 * t + (e & 1), j0 + 8 * (e >> 1)) != 0.0f) bits |= 1u << x;
  }
  return bits;
}

// The backward's element step (attention/cpu's bwd.cc row loop) over a warp's 16 keys x
// NH n-tiles of queries, in mma C layout: st[n][e], dpt[n][e] are key j0 + 8 (e / 2),
// query column col0 + 8 n + 2t + e % 2 of the query tile (its rows' kept keys, lse and
// delta at kept, lse, dl). S^T (q.k) becomes P^T dropped out (z P) in st, dP^T (dO.v)
// becomes dS^T = P (z dP - delta) in dpt; zeros for keys a row does not keep, dead rows
// (lse +-inf) and where the bias is -inf (the rule). bq / dbq: the bias / dbias element
// of query col0 + 2t, key j0 (bias row stride bs; null without), stepped 8 queries per
// n-tile; zbits: bwd_drop_bits's, shifted so that bit 4 n + e is this call's element.
// SM: the score_mod sm (the tile's first query q0): P from fn(s), the rule that a score fn
// sets to -inf keeps nothing, dS^T of the raw score, operand gradients into sums.
template <class T, int NH, bool SM>
__device__ __forceinline__ void bwd_elements(float (&st)[NH][4], float (&dpt)[NH][4], const Call& c, int j0,
                                             int col0, int t, const int2* kept, const float* lse_rows,
                                             const float* dl_rows, const T* bq, float* dbq, int64_t bs,
                                             bool drop_on, float inv_keep, uint32_t zbits,
                                             const SmHead& sm, int64_t q0, SmGradSums& sums) {
  if constexpr (!SM) {  // one element at a time (the kernels' codegen as before score_mod)
#pragma unroll
    for (int n = 0; n < NH; ++n) {
#pragma unroll
      for (int cc = 0; cc < 2; ++cc) {
        const int col = col0 + 8 * n + 2 * t + cc;
        const float lse = lse_rows[col], dl = dl_rows[col];
        const bool live = lse != -kInf && lse != kInf;
        const int2 kr = kept[col];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 2 * r + cc, j = j0 + 8 * r;
          float pt = 0.0f, ds = 0.0f;
          if (live && j >= kr.x && j < kr.y) {
            float s = st[n][e] * c.p.scale;
            float bv = 0.0f;
            if (bq) bv = to_f(bq[cc * bs + 8 * r]), s += c.bmul * bv;
            const float pr = mma::exp_approx(s - lse);
            const float dp = dpt[n][e];
            if (drop_on) {
              const float z = (zbits >> (4 * n + e)) & 1u ? inv_keep : 0.0f;
              pt = z != 0.0f ? z * pr : 0.0f;
              ds = pr * (z * dp - dl);
            } else {
              pt = pr;
              ds = pr * (dp - dl);
            }
            if (bq && bv == -kInf && lse == lse) pt = ds = 0.0f;
            if (dbq) atomicAdd(dbq + cc * bs + 8 * r, c.bmul * ds);
          }
          st[n][e] = pt;
          dpt[n][e] = ds;
        }
      }
      if (bq) bq += 8 * bs;
      if (dbq) dbq += 8 * bs;
    }
  } else {  // SM: the n-tile's four elements through the programs at once (Sm4)
#pragma unroll
    for (int n = 0; n < NH; ++n) {
      // Element e = 2 r + cc: query col0 + 8 n + 2 t + cc, key j0 + 8 r.
      float s[4], s_raw[4], lse[4], dl[4], bv[4];
      bool keep[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int cc = e & 1, r = e >> 1;
        const int col = col0 + 8 * n + 2 * t + cc, j = j0 + 8 * r;
        lse[e] = lse_rows[col], dl[e] = dl_rows[col];
        const int2 kr = kept[col];
        keep[e] = lse[e] != -kInf && lse[e] != kInf && j >= kr.x && j < kr.y;
        s[e] = st[n][e] * c.p.scale;
        bv[e] = 0.0f;
        if (bq && keep[e]) bv[e] = to_f(bq[cc * bs + 8 * r]), s[e] += c.bmul * bv[e];
        s_raw[e] = s[e];
      }
      const int64_t q_first = q0 + col0 + 8 * n + 2 * t;  // element e's query: + e % 2
      float dist[4];  // ALiBi's distances (its slope gradient reuses them)
      if (sm.form == kDevFormSoftcap) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[e] = sm_softcap(sm, s_raw[e]);
      } else if (sm.form == kDevFormAlibi) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t i = q_first + (e & 1);
          const RowInfo ri = sm.rows[i];
          dist[e] = keep[e] ? sm_alibi_dist(sm, sm_qpos(sm, i, ri), ri.kv_base, j0 + 8 * (e >> 1)) : 0.0f;
          s[e] = s_raw[e] + sm.fa * dist[e];
        }
      } else {
        Sm4 q = bwd_sm4(q_first, j0, s_raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) q.live |= uint32_t(keep[e]) << e;
        if (q.live) {
          const float4 r = sm_forward4(sm, q);
#pragma unroll
          for (int e = 0; e < 4; ++e) s[e] = lane4(r, e);
        }
      }
      float pt[4], ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        pt[e] = ds[e] = 0.0f;
        if (keep[e]) {
          const float pr = mma::exp_approx(s[e] - lse[e]);
          const float dp = dpt[n][e];
          if (drop_on) {
            const float z = (zbits >> (4 * n + e)) & 1u ? inv_keep : 0.0f;
            pt[e] = z != 0.0f ? z * pr : 0.0f;
            ds[e] = pr * (z * dp - dl[e]);
          } else {
            pt[e] = pr;
            ds[e] = pr * (dp - dl[e]);
          }
          if (bq && bv[e] == -kInf && lse[e] == lse[e]) pt[e] = ds[e] = 0.0f;
          if (s[e] == -kInf && lse[e] == lse[e]) pt[e] = ds[e] = 0.0f;
        }
      }
      if (sm.form == kDevFormSoftcap) {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (keep[e]) ds[e] *= sm_softcap_grad(sm, s_raw[e]);
      } else if (sm.form == kDevFormAlibi) {  // ds passes unchanged; the slope's gradient
        if (sm.dslope) {
          float part = 0.0f;
#pragma unroll
          for (int e = 0; e < 4; ++e) part += ds[e] * sm.fb * dist[e];
          sm_sum_add(sums, 0, sm.dslope, part);  // the head's slope
        }
      } else {
        Sm4 q = bwd_sm4(q_first, j0, s_raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) q.ds[e] = ds[e], q.live |= uint32_t(keep[e] && ds[e] != 0.0f) << e;
        if (q.live) {
          const float4 d = sm_backward4(sm, q, sums);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if ((q.live >> e) & 1u) ds[e] = lane4(d, e);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (dbq && keep[e]) atomicAdd(dbq + (e & 1) * bs + 8 * (e >> 1), c.bmul * ds[e]);
        st[n][e] = pt[e];
        dpt[n][e] = ds[e];
      }
      if (bq) bq += 8 * bs;
      if (dbq) dbq += 8 * bs;
    }
  }
}

// dst[0..1] += (x0, x1) (float32 accumulators; dst 8-byte aligned): one float2 atomic on
// sm_90, two float ones before.
__device__ __forceinline__ void atomic_add2(float* dst, float x0, float x1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x0, x1));
#else
  atomicAdd(dst, x0);
  atomicAdd(dst + 1, x1);
#endif
}

// The backward kernels' dQ step (flash_mma_bwd.cu, flash_mma_bwd_wide.cu): dQ += dS K for
// 16 queries and DC head-dim columns, added into the float32 accumulator with atomics. sDS:
// dS^T's 16 query columns ([key][query], rows of LD); sK: K's DC columns (rows of LDK); dq:
// the first query's first column in dq_acc, its rows rs floats apart; rows, cols: the
// queries and columns left in the call (those past them are not added). acc[dn][e] is query
// g + 8 (e / 2), column 8 dn + 2t + e % 2.
template <class T, int LD, int KEYS, int DC, bool EXACT, bool RAW, int LDK = LD>
__device__ __forceinline__ void add_dq_rows(float* dq, int64_t rs, int64_t rows, int64_t cols, const T* sDS,
                                            const T* sK, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float acc[DC / 8][4];
#pragma unroll
  for (int dn = 0; dn < DC / 8; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dn][e] = 0.0f;
  mma::mma_atb<T, LD, KEYS, DC, EXACT, RAW, LDK>(acc, sDS, sK, lane);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (g + 8 * r >= rows) continue;
    float* dst = dq + (g + 8 * r) * rs + 2 * t;
#pragma unroll
    for (int dn = 0; dn < DC / 8; ++dn)
      if (8 * dn + 2 * t < cols) atomic_add2(dst + 8 * dn, acc[dn][2 * r], acc[dn][2 * r + 1]);
  }
}

// Their head-dim tile: both head dims zero-padded to 64 or 128.
inline int64_t mma_head_dim_tile(const AttnParams& p) {
  return (p.head_dim_qk > p.head_dim_v ? p.head_dim_qk : p.head_dim_v) <= 64 ? 64 : 128;
}
// Whether they can read a call whose operands are `views` at `ptrs`: rows of whole 16-byte
// chunks (head dims and strides multiples of 16 / element bytes, pointers 16-byte
// aligned), and smem bytes of shared memory per block within the device's opt-in limit.
// (The head-dim bounds are each kernel's.)
bool mma_rows_fit(const AttnParams& p, std::initializer_list<ViewStrides> views,
                  std::initializer_list<const void*> ptrs, size_t smem);
// The shared memory a block may opt into on the current device (0 when it cannot be read),
// or FUSEDATTN_CUDA_SMEM_LIMIT's bytes where less (options.h: an H100 picks kernels as an
// sm_80 does).
size_t smem_optin();

// Whether flash_mma.cu's forwards serve a call: both head dims <= 512 (past 128 the wide
// kernel), rows of whole 16-byte chunks (head dims and the q, k, v strides multiples of
// 16 / element bytes, the pointers 16-byte aligned), shared memory within the limit. Else
// flash.cu's wmma kernel runs it.
bool mma_fwd_fits(const AttnParams& p, const AttnTensors& a);
// The forward on c (make_call's), query tiles of kMmaBM rows (8 warps of 16; c.tiles and
// tile_max per such tile).
constexpr int kMmaBM = 128;
template <class T, bool EXACT>
Status mma_fwd(const Call& c, float* tile_max, cudaStream_t stream);

// Whether flash_mma_bwd.cu's backward serves a call: mma_fwd_fits's rule with dout's
// strides and pointer too, and its shared memory (per head dim and dtype) within the
// device's opt-in limit. Else flash.cu's wmma bwd_kernel runs it.
bool mma_bwd_fits(const AttnParams& p, const AttnTensors& a);
// bwd_kernel's work on c (make_call's; tables built with query tiles of kBMQ = 64 rows):
// key tiles of 64, dq_acc [B, Sq, Hq, Dp] and dbias_acc (or null) accumulated with
// atomics, dk and dv written. delta [B, Hq, Sq] from flash.cu's delta_kernel.
template <class T, bool EXACT>
Status mma_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream);

// Whether flash_mma_bwd_wide.cu's backward serves a call: the larger head dim in
// (128, 512], mma_bwd_fits's rows rule, its shared memory (per dtype) within the limit.
bool mma_wide_bwd_fits(const AttnParams& p, const AttnTensors& a);
// mma_bwd's work for such a call (the same tables, dq_acc, dbias_acc, delta).
template <class T, bool EXACT>
Status mma_wide_bwd(const Call& c, const float* delta, float* dq_acc, float* dbias_acc, cudaStream_t stream);

}  // namespace fusedattn::cuda::flash::detail
