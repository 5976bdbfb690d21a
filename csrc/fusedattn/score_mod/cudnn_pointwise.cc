// Lowering of score_mod programs to cuDNN pointwise nodes (cudnn_pointwise.h).
#include "fusedattn/score_mod/cudnn_pointwise.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <tuple>

namespace fusedattn {
namespace {

float nan_max(float a, float b, bool max) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return max ? std::max(a, b) : std::min(a, b);
}

// One node's operation on its inputs' values (booleans as 0.0 / 1.0).
float apply(PwOp op, float x, float y, float z) {
  float r = 0.0f;
  switch (op) {
    case PwOp::kInput: case PwOp::kConst: break;  // not operations
    case PwOp::kAdd: r = x + y; break;
    case PwOp::kSub: r = x - y; break;
    case PwOp::kMul: r = x * y; break;
    case PwOp::kDiv: r = x / y; break;
    case PwOp::kMax: r = nan_max(x, y, true); break;
    case PwOp::kMin: r = nan_max(x, y, false); break;
    case PwOp::kPow: r = std::pow(x, y); break;
    case PwOp::kNeg: r = -x; break;
    case PwOp::kAbs: r = std::fabs(x); break;
    case PwOp::kExp: r = std::exp(x); break;
    case PwOp::kLog: r = std::log(x); break;
    case PwOp::kTanh: r = std::tanh(x); break;
    case PwOp::kSigmoid: r = 1.0f / (1.0f + std::exp(-x)); break;
    case PwOp::kSqrt: r = std::sqrt(x); break;
    case PwOp::kRsqrt: r = 1.0f / std::sqrt(x); break;
    case PwOp::kFloor: r = std::floor(x); break;
    case PwOp::kCeil: r = std::ceil(x); break;
    case PwOp::kSin: r = std::sin(x); break;
    case PwOp::kCos: r = std::cos(x); break;
    case PwOp::kErf: r = std::erf(x); break;
    case PwOp::kCmpLt: r = x < y; break;
    case PwOp::kCmpLe: r = x <= y; break;
    case PwOp::kCmpGt: r = x > y; break;
    case PwOp::kCmpGe: r = x >= y; break;
    case PwOp::kCmpEq: r = x == y; break;
    case PwOp::kCmpNe: r = x != y; break;
    case PwOp::kSelect: r = x != 0.0f ? y : z; break;
  }
  return r;
}

class Lowering {
 public:
  Lowering(const ScoreModProgram& prog, int32_t n_operands, PwProgram* out)
      : prog_(prog), n_operands_(n_operands), out_(out), node_of_(prog.n_regs(), -1) {}

  Status run() {
    out_->nodes.clear();
    // Registers the output depends on, so that dead code makes no nodes.
    std::vector<bool> live(prog_.n_regs(), false);
    live[prog_.out_reg()] = true;
    const int32_t n_in = prog_.n_inputs();
    for (int32_t i = prog_.n_instr() - 1; i >= 0; --i) {
      if (!live[n_in + i]) continue;
      const int32_t* ins = prog_.instr(i);
      for (int k = 0; k < args(ins[0]); ++k) live[ins[1 + k]] = true;
    }
    for (int32_t i = 0; i < prog_.n_instr(); ++i) {
      if (!live[n_in + i]) continue;
      int32_t node = -1;
      FA_RETURN_IF_NOT_OK(lower(prog_.instr(i), &node));
      node_of_[n_in + i] = node;
    }
    out_->out = as_float(reg(prog_.out_reg()));
    return Status::Ok();
  }

 private:
  static int args(int32_t op) {
    if (op == SM_CONST) return 0;
    if (op == SM_SELECT) return 3;
    const bool binary = (op >= SM_ADD && op <= SM_MIN) || (op >= SM_LT && op <= SM_NE) ||
                        op == SM_POW || op == SM_REM;
    return binary ? 2 : 1;
  }

  int32_t add(PwNode n) {
    out_->nodes.push_back(n);
    return static_cast<int32_t>(out_->nodes.size()) - 1;
  }
  // A node; its first input is made computed (header): c - x becomes -x + c, symmetric
  // nodes swap their inputs, the others take the input through the computed zero.
  int32_t node(PwOp op, int32_t a = -1, int32_t b = -1, int32_t c = -1) {
    if (op != PwOp::kSelect && !(op >= PwOp::kCmpLt && op <= PwOp::kCmpNe) && is_const(a) &&
        (b < 0 || is_const(b)))  // folded: every element would compute the same number
      return constant(apply(op, value(a), b >= 0 ? value(b) : 0.0f, 0.0f));
    if (op == PwOp::kSelect) {
      b = computed(b);
    } else if (!is_computed(a)) {
      const bool b_computed = b >= 0 && is_computed(b);
      if (b_computed && op == PwOp::kSub) return node(PwOp::kAdd, node(PwOp::kNeg, b), a);
      if (b_computed && swaps(&op)) std::swap(a, b);
      else a = computed(a);
    } else if (b >= 0 && !is_scored(a) && is_scored(b)) {
      // Both computed, only b from the score: the score first (index terms second). cuDNN's
      // backward gave q and k gradients of 1e11 for (kv - q) * slope + s (H100, cuDNN 9.19;
      // dev/score_mod/alibi_bwd_probe.py), and right ones for s + (kv - q) * slope.
      if (op == PwOp::kSub) return node(PwOp::kAdd, node(PwOp::kNeg, b), a);
      if (swaps(&op)) std::swap(a, b);
    }
    PwNode n;
    n.op = op, n.a = a, n.b = b, n.c = c;
    n.boolean = op >= PwOp::kCmpLt && op <= PwOp::kCmpNe;
    n.computed = true;
    n.scored = (a >= 0 && is_scored(a)) || (b >= 0 && is_scored(b)) || (c >= 0 && is_scored(c));
    return add(n);
  }
  // Whether op(a, b) == op'(b, a); sets op to op'.
  static bool swaps(PwOp* op) {
    switch (*op) {
      case PwOp::kAdd: case PwOp::kMul: case PwOp::kMax: case PwOp::kMin:
      case PwOp::kCmpEq: case PwOp::kCmpNe:
        return true;
      case PwOp::kCmpLt: *op = PwOp::kCmpGt; return true;
      case PwOp::kCmpGt: *op = PwOp::kCmpLt; return true;
      case PwOp::kCmpLe: *op = PwOp::kCmpGe; return true;
      case PwOp::kCmpGe: *op = PwOp::kCmpLe; return true;
      default:
        return false;
    }
  }
  bool is_computed(int32_t n) const { return out_->nodes[n].computed; }
  bool is_scored(int32_t n) const { return out_->nodes[n].scored; }
  bool is_const(int32_t n) const { return out_->nodes[n].op == PwOp::kConst; }
  float value(int32_t n) const { return out_->nodes[n].value; }
  // n as a computed value: zero + n, zero = q index * 0 (made once).
  int32_t computed(int32_t n) {
    if (is_computed(n)) return n;
    if (zero_ < 0) zero_ = node(PwOp::kMul, reg(3), constant(0.0f));
    return node(PwOp::kAdd, zero_, n);
  }
  int32_t constant(float v) {
    PwNode n;
    n.op = PwOp::kConst, n.value = v;
    return add(n);
  }
  // The node of program register r (inputs are made on first use).
  int32_t reg(int32_t r) {
    if (node_of_[r] < 0) {
      PwNode n;
      n.op = PwOp::kInput, n.input = r;
      n.computed = r < kScoreModIndexInputs || r >= kScoreModIndexInputs + n_operands_;
      n.scored = r == 0 || r >= kScoreModIndexInputs + n_operands_;  // score, dscore
      node_of_[r] = add(n);
    }
    return node_of_[r];
  }
  bool is_bool(int32_t n) const { return out_->nodes[n].boolean; }
  // A boolean as the number 0.0 / 1.0, as the interpreter has it.
  int32_t as_float(int32_t n) {
    if (!is_bool(n)) return n;
    return node(PwOp::kSelect, n, constant(1.0f), constant(0.0f));
  }
  // A number as a select condition: nonzero is true.
  int32_t as_bool(int32_t n) {
    if (is_bool(n)) return n;
    return node(PwOp::kCmpNe, n, constant(0.0f));
  }
  // trunc(x) = x < 0 ? ceil(x) : floor(x)
  int32_t trunc(int32_t x) {
    return node(PwOp::kSelect, node(PwOp::kCmpLt, x, constant(0.0f)), node(PwOp::kCeil, x),
                node(PwOp::kFloor, x));
  }

  Status lower(const int32_t* ins, int32_t* result) {
    const int32_t op = ins[0];
    if (op == SM_CONST) {
      *result = constant(prog_.consts[ins[1]]);
      return Status::Ok();
    }
    const int n_args = args(op);
    int32_t x = reg(ins[1]);
    int32_t y = n_args > 1 ? reg(ins[2]) : -1;
    int32_t z = n_args > 2 ? reg(ins[3]) : -1;
    if (op == SM_SELECT) {
      *result = node(PwOp::kSelect, as_bool(x), as_float(y), as_float(z));
      return Status::Ok();
    }
    x = as_float(x);
    if (y >= 0) y = as_float(y);
    static const PwOp kDirect[SM_NUM_OPS] = {
        PwOp::kConst, PwOp::kAdd,  PwOp::kSub,  PwOp::kMul,     PwOp::kDiv,   PwOp::kMax,
        PwOp::kMin,   PwOp::kNeg,  PwOp::kAbs,  PwOp::kExp,     PwOp::kLog,   PwOp::kTanh,
        PwOp::kSigmoid, PwOp::kCmpLt, PwOp::kCmpLe, PwOp::kCmpGt, PwOp::kCmpGe, PwOp::kCmpEq,
        PwOp::kCmpNe, PwOp::kSelect, PwOp::kSqrt, PwOp::kRsqrt, PwOp::kConst /* sign */,
        PwOp::kConst /* log1p */, PwOp::kConst /* expm1 */, PwOp::kPow, PwOp::kFloor,
        PwOp::kCeil, PwOp::kConst /* trunc */, PwOp::kConst /* rem */, PwOp::kConst /* exp2 */,
        PwOp::kSin, PwOp::kCos, PwOp::kErf};
    switch (op) {
      case SM_SIGN: {  // x > 0 ? 1 : x < 0 ? -1 : x  (0 and NaN stay)
        const int32_t neg = node(PwOp::kSelect, node(PwOp::kCmpLt, x, constant(0.0f)),
                                 constant(-1.0f), x);
        *result = node(PwOp::kSelect, node(PwOp::kCmpGt, x, constant(0.0f)), constant(1.0f), neg);
        return Status::Ok();
      }
      case SM_LOG1P:
        *result = node(PwOp::kLog, node(PwOp::kAdd, x, constant(1.0f)));
        return Status::Ok();
      case SM_EXPM1:
        *result = node(PwOp::kSub, node(PwOp::kExp, x), constant(1.0f));
        return Status::Ok();
      case SM_EXP2:
        *result = node(PwOp::kExp, node(PwOp::kMul, x, constant(0.69314718055994531f)));
        return Status::Ok();
      case SM_TRUNC:
        *result = trunc(x);
        return Status::Ok();
      case SM_REM:  // fmod: x - trunc(x / y) * y
        *result = node(PwOp::kSub, x, node(PwOp::kMul, trunc(node(PwOp::kDiv, x, y)), y));
        return Status::Ok();
      default:
        break;
    }
    if (op <= SM_CONST || op >= SM_NUM_OPS || kDirect[op] == PwOp::kConst)
      return Status::Unimplemented("score_mod: opcode " + std::to_string(op) +
                                   " has no cuDNN pointwise form");
    if (op == SM_DIV && out_->nodes[y].op == PwOp::kConst && std::isnormal(out_->nodes[y].value) &&
        std::isnormal(1.0f / out_->nodes[y].value)) {  // x * (1 / c): cuDNN's DIV is slower
      *result = node(PwOp::kMul, x, constant(1.0f / out_->nodes[y].value));
      return Status::Ok();
    }
    *result = node(kDirect[op], x, y);
    return Status::Ok();
  }

  const ScoreModProgram& prog_;
  const int32_t n_operands_;
  PwProgram* out_;
  std::vector<int32_t> node_of_;  // program register -> node (-1: not made yet)
  int32_t zero_ = -1;             // the computed zero (-1: not made yet)
};

}  // namespace

int32_t first_input(const PwNode& n) { return n.op == PwOp::kSelect ? n.b : n.a; }

Status lower_to_pointwise(const ScoreModProgram& prog, int32_t n_operands, PwProgram* out) {
  return Lowering(prog, n_operands, out).run();
}

std::vector<int32_t> same_nodes(const PwProgram& a, const PwProgram& b) {
  // Value numbering: a node's number names (operation, constant or input, its inputs'
  // numbers); numbering a's nodes first, b's node gets a's node where its number is one
  // of theirs.
  using Key = std::tuple<int32_t, int32_t, uint32_t, int32_t, int32_t, int32_t>;
  std::map<Key, int32_t> number;  // key -> value number
  std::vector<int32_t> node_of;   // value number -> node of a (-1: b's own)
  auto numbers = [&](const PwProgram& p, bool is_a) {
    std::vector<int32_t> vn(p.nodes.size());
    for (size_t i = 0; i < p.nodes.size(); ++i) {
      const PwNode& n = p.nodes[i];
      uint32_t bits = 0;
      std::memcpy(&bits, &n.value, sizeof bits);
      auto in = [&](int32_t k) { return k >= 0 ? vn[k] : -1; };
      const Key key{int32_t(n.op), n.input, n.op == PwOp::kConst ? bits : 0u, in(n.a), in(n.b),
                    in(n.c)};
      auto [it, added] = number.try_emplace(key, int32_t(node_of.size()));
      if (added) node_of.push_back(is_a ? int32_t(i) : -1);
      vn[i] = it->second;
    }
    return vn;
  };
  numbers(a, true);
  std::vector<int32_t> same = numbers(b, false);
  for (int32_t& v : same) v = node_of[v];
  return same;
}

namespace {

// A node's values over all inputs without NaN: within [lo, hi] (infinite ends: unbounded),
// and 0 wherever dscore is (zero).
struct Range {
  double lo = -INFINITY, hi = INFINITY;
  bool zero = false;
  bool finite() const { return std::fabs(lo) < 1e30 && std::fabs(hi) < 1e30; }
};

Range span(double a, double b, double c, double d) {
  Range r;
  const double v[4] = {a, b, c, d};
  r.lo = r.hi = v[0];
  for (double x : v) {
    if (std::isnan(x)) return Range{};  // inf - inf, 0 * inf: unbounded
    r.lo = std::min(r.lo, x), r.hi = std::max(r.hi, x);
  }
  return r;
}

Range range_of(const PwNode& n, const std::vector<Range>& r, int32_t dscore) {
  static const Range kAny;
  const Range& a = n.a >= 0 ? r[n.a] : kAny;
  const Range& b = n.b >= 0 ? r[n.b] : kAny;
  const Range& c = n.c >= 0 ? r[n.c] : kAny;
  Range out;
  switch (n.op) {
    case PwOp::kInput:
      if (n.input >= 1 && n.input < kScoreModIndexInputs) out.lo = 0, out.hi = 2147483647.0;
      out.zero = n.input == dscore;
      return out;
    case PwOp::kConst:
      out.lo = out.hi = n.value;
      out.zero = n.value == 0.0f;
      return out;
    case PwOp::kAdd:
    case PwOp::kSub:
      out = n.op == PwOp::kAdd ? span(a.lo + b.lo, a.hi + b.hi, a.lo + b.lo, a.hi + b.hi)
                               : span(a.lo - b.hi, a.hi - b.lo, a.lo - b.hi, a.hi - b.lo);
      out.zero = a.zero && b.zero;
      return out;
    case PwOp::kMul:
      out = span(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi);
      out.zero = (a.zero && b.finite()) || (b.zero && a.finite());
      return out;
    case PwOp::kDiv:  // by a constant other than 0 (a denormal's reciprocal overflows)
      if (b.lo == b.hi && std::fabs(b.lo) >= 1e-30) {
        out = span(a.lo / b.lo, a.hi / b.lo, a.lo / b.lo, a.hi / b.lo);
        out.zero = a.zero;
      }
      return out;
    case PwOp::kMax:
    case PwOp::kMin:
      out = span(a.lo, a.hi, b.lo, b.hi);
      out.zero = a.zero && b.zero;
      return out;
    case PwOp::kSelect:
      out = span(b.lo, b.hi, c.lo, c.hi);
      out.zero = b.zero && c.zero;
      return out;
    case PwOp::kNeg:
      out = span(-a.hi, -a.lo, -a.hi, -a.lo);
      out.zero = a.zero;
      return out;
    case PwOp::kAbs:
      out = a.lo >= 0 ? a : span(0, std::max(-a.lo, a.hi), 0, 0);
      out.zero = a.zero;
      return out;
    case PwOp::kTanh:
    case PwOp::kSin:
    case PwOp::kErf:  // odd, within [-1, 1]: 0 at 0
      out.lo = -1, out.hi = 1;
      out.zero = a.zero;
      return out;
    case PwOp::kCos:
      out.lo = -1, out.hi = 1;
      return out;
    case PwOp::kSigmoid:
      out.lo = 0, out.hi = 1;
      return out;
    case PwOp::kExp:
      if (a.hi < 80) out.lo = 0, out.hi = std::exp(a.hi);
      return out;
    case PwOp::kCmpLt: case PwOp::kCmpLe: case PwOp::kCmpGt: case PwOp::kCmpGe:
    case PwOp::kCmpEq: case PwOp::kCmpNe:
      out.lo = 0, out.hi = 1;
      return out;
    default:  // log, sqrt, pow, floor, ...: unbounded, not known to be 0
      return out;
  }
}

}  // namespace

bool zero_where_dscore_is(const PwProgram& p, int32_t dscore) {
  std::vector<Range> r(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) r[i] = range_of(p.nodes[i], r, dscore);
  return r[p.out].zero;
}

float eval_pointwise(const PwProgram& p, const float* in) {
  std::vector<float> v(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PwNode& n = p.nodes[i];
    if (n.op == PwOp::kInput) {
      v[i] = in[n.input];
    } else if (n.op == PwOp::kConst) {
      v[i] = n.value;
    } else {
      v[i] = apply(n.op, n.a >= 0 ? v[n.a] : 0.0f, n.b >= 0 ? v[n.b] : 0.0f,
                   n.c >= 0 ? v[n.c] : 0.0f);
    }
  }
  return v[p.out];
}

}  // namespace fusedattn
