// pack_device_score_mod: ScoreMod -> DeviceScoreMod (device_program_host.h).
#include "fusedattn/score_mod/device_program_host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

namespace fusedattn {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::string program_name(int k) {  // k: -2 forward, -1 backward, else operand k's gradient
  return k == -2 ? "forward" : k == -1 ? "backward" : "operand " + std::to_string(k) + " gradient";
}

// Whether got is expected up to float32 rounding of a few operations (the traced
// derivative multiplies in its own order); a different derivative is off by far more.
bool near(float got, float expected, float scale) {
  return std::fabs(got - expected) <= 1e-5f * (std::fabs(expected) + scale) + 1e-30f;
}

// DeviceScoreMod::form: the forward matches a family and, on probe inputs, the packed
// backward and gradient programs give the family's derivatives.
void set_closed_form(const ScoreMod& sm, DeviceScoreMod* out) {
  out->form = kDevFormNone, out->form_a = out->form_b = 0.0f, out->form_abs = 0;
  float k1 = 0.0f, k2 = 0.0f;
  AlibiForm alibi;
  int32_t form = kDevFormNone;
  if (sm.n_operands == 0 && match_softcap(sm.fwd, &k1, &k2))
    form = kDevFormSoftcap;
  else if (match_alibi(sm, &alibi))
    form = kDevFormAlibi;
  if (form == kDevFormNone) return;
  const float scores[] = {-9.75f, -2.5f, -0.3125f, 0.0f, 0.4375f, 1.75f, 11.5f};
  const float positions[][2] = {{0.0f, 0.0f}, {3.0f, 17.0f}, {17.0f, 5.0f}, {250.0f, 4.0f}};
  const float slopes[] = {-0.375f, 0.0625f}, dss[] = {1.5f, -0.6875f};
  float in[kDevMaxInputs] = {}, regs[kDevMaxRegs];
  for (float s : scores)
    for (const auto& qk : positions)
      for (float slope : slopes)
        for (float ds : dss) {
          in[0] = s, in[3] = qk[0], in[4] = qk[1];
          in[kScoreModIndexInputs] = slope;
          in[kScoreModIndexInputs + sm.n_operands] = ds;
          float fwd, bwd, grad = 0.0f, scale;
          if (form == kDevFormSoftcap) {
            const float t = fast_tanh(k2 * s);
            fwd = k1 * t, bwd = ds * k1 * k2 * (1.0f - t * t), scale = std::fabs(ds * k1 * k2);
          } else {
            const float d = alibi.abs ? std::fabs(qk[1] - qk[0]) : qk[1] - qk[0];
            fwd = s + alibi.sign * slope * d, bwd = ds, grad = ds * alibi.sign * d;
            scale = std::fabs(s) + std::fabs(slope * d) + std::fabs(ds * d);
          }
          if (!near(eval_program_element(*out, out->fwd, in, regs), fwd, scale) ||
              !near(eval_program_element(*out, out->bwd, in, regs), bwd, scale) ||
              (form == kDevFormAlibi &&
               !near(eval_program_element(*out, out->grad[0], in, regs), grad, scale)))
            return;
        }
  out->form = form;
  out->form_a = form == kDevFormSoftcap ? k1 : alibi.sign;
  out->form_b = k2;
  out->form_abs = alibi.abs ? 1 : 0;
}

}  // namespace

Status pack_device_score_mod(const ScoreMod& sm, DeviceScoreMod* out) {
  std::vector<std::pair<const ScoreModProgram*, DeviceProgram*>> progs = {{&sm.fwd, &out->fwd},
                                                                          {&sm.bwd, &out->bwd}};
  for (int32_t k = 0; k < sm.n_operands; ++k) progs.push_back({&sm.grad[k], &out->grad[k]});

  // The limits, checked before anything is written.
  int64_t total_instr = 0;
  std::string per_program;
  std::vector<uint32_t> consts;  // distinct constant bits, in order of first use
  for (size_t j = 0; j < progs.size(); ++j) {
    const ScoreModProgram& p = *progs[j].first;
    const std::string name = program_name(int(j) - 2);
    if (p.n_regs() > kDevMaxRegs)
      return Status::Invalid("score_mod: the " + name + " program needs " +
                             std::to_string(p.n_regs()) + " registers (" +
                             std::to_string(p.n_inputs()) + " inputs + " +
                             std::to_string(p.n_instr()) +
                             " instructions); the CUDA score_mod interpreter allows at most "
                             "kDevMaxRegs = " + std::to_string(kDevMaxRegs) + " per program");
    total_instr += p.n_instr();
    per_program += (j ? ", " : "") + name + " " + std::to_string(p.n_instr());
    for (int32_t i = 0; i < p.n_instr(); ++i) {
      const int32_t* ins = p.instr(i);
      if (ins[0] != SM_CONST) continue;
      const uint32_t u = bits_of(p.consts[ins[1]]);
      bool seen = false;
      for (uint32_t c : consts) seen = seen || c == u;
      if (!seen) consts.push_back(u);
    }
  }
  if (total_instr > kDevMaxInstr)
    return Status::Invalid("score_mod: the programs have " + std::to_string(total_instr) +
                           " instructions together (" + per_program +
                           "); the CUDA score_mod interpreter's pool holds at most "
                           "kDevMaxInstr = " + std::to_string(kDevMaxInstr));
  if (consts.size() > size_t(kDevMaxConsts))
    return Status::Invalid("score_mod: the programs have " + std::to_string(consts.size()) +
                           " distinct constants together; the CUDA score_mod interpreter's "
                           "pool holds at most kDevMaxConsts = " +
                           std::to_string(kDevMaxConsts));

  out->n_operands = sm.n_operands;
  for (int32_t k = 0; k < kMaxScoreModOperands; ++k) {
    const bool used = k < sm.n_operands;
    for (int d = 0; d < 4; ++d) out->shape[k][d] = used ? sm.shape[k][d] : 0;
    out->offset[k] = used ? sm.offset(k) : 0;
    if (!used) out->grad[k] = DeviceProgram{};
  }
  out->total = sm.total_size();
  out->n_consts = int32_t(consts.size());
  for (int32_t c = 0; c < kDevMaxConsts; ++c) {
    const uint32_t u = c < out->n_consts ? consts[c] : 0u;
    std::memcpy(&out->consts[c], &u, sizeof u);
  }
  int32_t pos = 0, max_regs = 0;
  for (auto& [p, d] : progs) {
    d->n_inputs = p->n_inputs();
    d->n_instr = p->n_instr();
    d->out_reg = p->out_reg();
    d->start = pos;
    max_regs = std::max(max_regs, p->n_regs());
    for (int32_t i = 0; i < p->n_instr(); ++i) {
      const int32_t* ins = p->instr(i);
      int32_t a = ins[1];
      if (ins[0] == SM_CONST) {
        const uint32_t u = bits_of(p->consts[a]);
        a = 0;
        while (consts[a] != u) ++a;
      }
      out->instr[pos++] = DeviceInstr{uint8_t(ins[0]), uint8_t(a), uint8_t(ins[2]), uint8_t(ins[3])};
    }
  }
  for (int32_t i = pos; i < kDevMaxInstr; ++i) out->instr[i] = DeviceInstr{0, 0, 0, 0};
  out->n_instr = pos;
  out->max_regs = max_regs;
  set_closed_form(sm, out);
  return Status::Ok();
}

bool device_score_mod_fits(const ScoreMod& sm, std::string* why) {
  auto tmp = std::make_unique<DeviceScoreMod>();
  const Status s = pack_device_score_mod(sm, tmp.get());
  if (!s.ok() && why) *why = s.message;
  return s.ok();
}

}  // namespace fusedattn
