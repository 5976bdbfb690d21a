// Decoding and interpretation of score_mod programs (score_mod.h).
#include "fusedattn/score_mod/program.h"

#include "fusedattn/platform/cpu/fast_math.h"

#include <algorithm>
#include <limits>

namespace fusedattn {
namespace {

// Reads one program at data[*pos]: checks its header and every register index.
Status read_program(const int32_t* data, int64_t n, int64_t* pos, int32_t want_inputs,
                    const char* what, std::vector<float>* consts, ScoreModProgram* prog,
                    std::vector<std::pair<ScoreModProgram*, int64_t>>* fixups) {
  auto bad = [&](const std::string& why) {
    return Status::Invalid(std::string("score_mod: the ") + what + " program: " + why);
  };
  if (*pos >= n) return bad("missing");
  const int64_t n_words = data[(*pos)++];
  if (n_words < 4 || *pos + n_words > n) return bad("truncated");
  const int32_t* w = data + *pos;
  if (w[0] != kScoreModVersion) return bad("version " + std::to_string(w[0]) + ", expected 1");
  if (w[1] != want_inputs)
    return bad(std::to_string(w[1]) + " inputs, expected " + std::to_string(want_inputs));
  if (w[2] < 0 || w[2] > kMaxScoreModInstr || n_words != 4 + 4 * int64_t{w[2]})
    return bad("bad instruction count");
  const int32_t n_regs = w[1] + w[2];
  if (w[3] < 0 || w[3] >= n_regs) return bad("bad output register");
  *pos += n_words;
  if (*pos >= n) return bad("missing constants");
  const int64_t n_consts = data[(*pos)++];
  if (n_consts < 0 || *pos + n_consts > n) return bad("truncated constants");
  for (int32_t i = 0; i < w[2]; ++i) {
    const int32_t* ins = w + 4 + 4 * i;
    const int32_t self = w[1] + i;  // an instruction reads only earlier registers
    if (ins[0] < 0 || ins[0] >= SM_NUM_OPS) return bad("unknown opcode " + std::to_string(ins[0]));
    const int32_t op = ins[0];
    const bool binary = (op >= SM_ADD && op <= SM_MIN) || (op >= SM_LT && op <= SM_NE) ||
                        op == SM_POW || op == SM_REM;
    const int n_args = op == SM_CONST ? 0 : op == SM_SELECT ? 3 : binary ? 2 : 1;
    if (op == SM_CONST && (ins[1] < 0 || ins[1] >= n_consts))
      return bad("constant index out of range");
    for (int a = 0; a < 3; ++a) {
      const int32_t r = ins[1 + a];
      if (a < n_args && (r < 0 || r >= self)) return bad("register index out of range");
      if (a >= n_args && a > 0 && r != 0) return bad("an unused operand field is not 0");
    }
  }
  prog->words = w;
  prog->n_consts = static_cast<int32_t>(n_consts);
  fixups->push_back({prog, static_cast<int64_t>(consts->size())});
  for (int64_t i = 0; i < n_consts; ++i) {
    float f;
    std::memcpy(&f, data + *pos + i, sizeof f);
    consts->push_back(f);
  }
  *pos += n_consts;
  return Status::Ok();
}

}  // namespace

Status decode_score_mod(const int32_t* data, int64_t n, const int64_t extents[4], ScoreMod* out) {
  if (n < 1) return Status::Invalid("score_mod: empty program attribute");
  int64_t pos = 0;
  const int32_t n_ops = data[pos++];
  if (n_ops < 0 || n_ops > kMaxScoreModOperands)
    return Status::Invalid("score_mod: " + std::to_string(n_ops) +
                                   " array operands; at most 16");
  if (pos + 4 * int64_t{n_ops} > n) return Status::Invalid("score_mod: truncated shapes");
  out->n_operands = n_ops;
  static const char* kDims[4] = {"B", "Hq", "Sq", "Skv"};
  for (int32_t i = 0; i < n_ops; ++i)
    for (int d = 0; d < 4; ++d) {
      const int64_t e = data[pos++];
      if (e != 1 && e != extents[d])
        return Status::Invalid("score_mod: operand " + std::to_string(i) + " dimension " +
                                       kDims[d] + " is " + std::to_string(e) + "; allowed 1 or " +
                                       std::to_string(extents[d]));
      out->shape[i][d] = e;
    }
  std::vector<std::pair<ScoreModProgram*, int64_t>> fixups;
  const int32_t in_fwd = kScoreModIndexInputs + n_ops;
  FA_RETURN_IF_NOT_OK(read_program(data, n, &pos, in_fwd, "forward", &out->const_storage,
                                  &out->fwd, &fixups));
  FA_RETURN_IF_NOT_OK(read_program(data, n, &pos, in_fwd + 1, "backward", &out->const_storage,
                                  &out->bwd, &fixups));
  for (int32_t i = 0; i < n_ops; ++i)
    FA_RETURN_IF_NOT_OK(read_program(data, n, &pos, in_fwd + 1, "operand gradient",
                                    &out->const_storage, &out->grad[i], &fixups));
  if (pos != n) return Status::Invalid("score_mod: trailing words in the attribute");
  for (auto& [prog, start] : fixups) prog->consts = out->const_storage.data() + start;
  return Status::Ok();
}

const float* eval_score_mod(const ScoreModProgram& prog, const float* const* in, float* regs,
                            int64_t lo, int64_t hi) {
  const int32_t n_in = prog.n_inputs();
  auto row = [&](int32_t r) -> const float* {
    return r < n_in ? in[r] : regs + int64_t{r - n_in} * kMaxLanes;
  };
  for (int32_t i = 0; i < prog.n_instr(); ++i) {
    const int32_t* ins = prog.instr(i);
    float* o = regs + int64_t{i} * kMaxLanes;
    const int32_t op = ins[0];
    if (op == SM_CONST) {
      std::fill(o + lo, o + hi, prog.consts[ins[1]]);
      continue;
    }
    // Unused operand fields are 0 (decode checked): register 0, a valid row.
    const float* x = row(ins[1]);
    const float* y = row(ins[2]);
    const float* z = row(ins[3]);
#define FA_SM_LOOP(expr) \
  for (int64_t c = lo; c < hi; ++c) o[c] = (expr); \
  break
    switch (op) {
      case SM_ADD: FA_SM_LOOP(x[c] + y[c]);
      case SM_SUB: FA_SM_LOOP(x[c] - y[c]);
      case SM_MUL: FA_SM_LOOP(x[c] * y[c]);
      case SM_DIV: FA_SM_LOOP(x[c] / y[c]);
      case SM_MAX: FA_SM_LOOP(std::isnan(x[c]) || std::isnan(y[c]) ? std::numeric_limits<float>::quiet_NaN() : std::max(x[c], y[c]));
      case SM_MIN: FA_SM_LOOP(std::isnan(x[c]) || std::isnan(y[c]) ? std::numeric_limits<float>::quiet_NaN() : std::min(x[c], y[c]));
      case SM_NEG: FA_SM_LOOP(-x[c]);
      case SM_ABS: FA_SM_LOOP(std::fabs(x[c]));
      case SM_EXP: FA_SM_LOOP(cpu::exact_edges_exp(x[c]));
      case SM_LOG: FA_SM_LOOP(std::log(x[c]));
      case SM_TANH: FA_SM_LOOP(cpu::fast_tanh(x[c]));
      case SM_SIGMOID: FA_SM_LOOP(cpu::fast_sigmoid(x[c]));
      case SM_LT: FA_SM_LOOP(x[c] < y[c] ? 1.0f : 0.0f);
      case SM_LE: FA_SM_LOOP(x[c] <= y[c] ? 1.0f : 0.0f);
      case SM_GT: FA_SM_LOOP(x[c] > y[c] ? 1.0f : 0.0f);
      case SM_GE: FA_SM_LOOP(x[c] >= y[c] ? 1.0f : 0.0f);
      case SM_EQ: FA_SM_LOOP(x[c] == y[c] ? 1.0f : 0.0f);
      case SM_NE: FA_SM_LOOP(x[c] != y[c] ? 1.0f : 0.0f);
      case SM_SELECT: FA_SM_LOOP(x[c] != 0.0f ? y[c] : z[c]);
      case SM_SQRT: FA_SM_LOOP(std::sqrt(x[c]));
      case SM_RSQRT: FA_SM_LOOP(1.0f / std::sqrt(x[c]));
      case SM_SIGN: FA_SM_LOOP(x[c] > 0.0f ? 1.0f : x[c] < 0.0f ? -1.0f : x[c]);
      case SM_LOG1P: FA_SM_LOOP(std::log1p(x[c]));
      case SM_EXPM1: FA_SM_LOOP(std::expm1(x[c]));
      case SM_POW: FA_SM_LOOP(std::pow(x[c], y[c]));
      case SM_FLOOR: FA_SM_LOOP(std::floor(x[c]));
      case SM_CEIL: FA_SM_LOOP(std::ceil(x[c]));
      case SM_TRUNC: FA_SM_LOOP(std::trunc(x[c]));
      case SM_REM: FA_SM_LOOP(std::fmod(x[c], y[c]));
      case SM_EXP2: FA_SM_LOOP(std::exp2(x[c]));
      case SM_SIN: FA_SM_LOOP(std::sin(x[c]));
      case SM_COS: FA_SM_LOOP(std::cos(x[c]));
      case SM_ERF: FA_SM_LOOP(std::erf(x[c]));
      default: break;  // decode_score_mod rejected every other opcode
    }
#undef FA_SM_LOOP
  }
  return row(prog.out_reg());
}

bool match_softcap(const ScoreModProgram& prog, float* k1, float* k2) {
  const int32_t n_in = prog.n_inputs();
  auto def = [&](int32_t r) -> const int32_t* { return r >= n_in ? prog.instr(r - n_in) : nullptr; };
  auto constant = [&](int32_t r, float* v) {
    const int32_t* d = def(r);
    if (!d || d[0] != SM_CONST) return false;
    *v = prog.consts[d[1]];
    return std::isfinite(*v);
  };
  // One of the product's two arguments is a constant; `other` gets the rest.
  auto product = [&](const int32_t* d, float* c, int32_t* other) {
    if (!d || d[0] != SM_MUL) return false;
    if (constant(d[1], c)) return *other = d[2], true;
    if (constant(d[2], c)) return *other = d[1], true;
    return false;
  };
  int32_t t = 0, z = 0, s = 0;
  float outer = 0.0f, inner = 0.0f;
  if (!product(def(prog.out_reg()), &outer, &t) || !(outer > 0.0f)) return false;
  const int32_t* tanh_def = def(t);
  if (!tanh_def || tanh_def[0] != SM_TANH) return false;
  z = tanh_def[1];
  const int32_t* z_def = def(z);
  if (z_def && z_def[0] == SM_DIV && constant(z_def[2], &inner) && inner != 0.0f) {
    s = z_def[1];
    inner = 1.0f / inner;
  } else if (!product(z_def, &inner, &s)) {
    return false;
  }
  if (s != 0 || inner == 0.0f || !std::isfinite(inner)) return false;  // register 0: the score
  *k1 = outer;
  *k2 = inner;
  return true;
}

bool match_alibi(const ScoreMod& sm, AlibiForm* form) {
  if (sm.n_operands != 1 || sm.shape[0][0] != 1 || sm.shape[0][2] != 1 || sm.shape[0][3] != 1)
    return false;
  const ScoreModProgram& prog = sm.fwd;
  const int32_t n_in = prog.n_inputs();
  constexpr int32_t kScore = 0, kQ = 3, kKv = 4, kSlopes = kScoreModIndexInputs;
  auto def = [&](int32_t r) -> const int32_t* { return r >= n_in ? prog.instr(r - n_in) : nullptr; };
  // out = score + m or score - m
  const int32_t* out = def(prog.out_reg());
  if (!out || (out[0] != SM_ADD && out[0] != SM_SUB)) return false;
  int32_t m = 0;
  float sign = 1.0f;
  if (out[1] == kScore && out[2] != kScore) {
    m = out[2];
    if (out[0] == SM_SUB) sign = -1.0f;
  } else if (out[0] == SM_ADD && out[2] == kScore && out[1] != kScore) {
    m = out[1];
  } else {
    return false;
  }
  // m = slopes * d, either way round
  const int32_t* md = def(m);
  if (!md || md[0] != SM_MUL) return false;
  int32_t d = 0;
  if (md[1] == kSlopes && md[2] != kSlopes)
    d = md[2];
  else if (md[2] == kSlopes && md[1] != kSlopes)
    d = md[1];
  else
    return false;
  // d = kv - q, q - kv, or the abs of either
  const int32_t* dd = def(d);
  bool abs = false;
  if (dd && dd[0] == SM_ABS) {
    abs = true;
    dd = def(dd[1]);
  }
  if (!dd || dd[0] != SM_SUB) return false;
  if (dd[1] == kQ && dd[2] == kKv) {
    if (!abs) sign = -sign;
  } else if (!(dd[1] == kKv && dd[2] == kQ)) {
    return false;
  }
  form->sign = sign;
  form->abs = abs;
  return true;
}

}  // namespace fusedattn
