// Hand-written score_mod programs for the C++ tests, in the packed form of score_mod.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "fusedattn/score_mod/program.h"

namespace fusedattn::test {

inline int32_t float_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

// One program [n_words, version, n_inputs, n_instr, out, instr..., n_consts, consts...];
// out defaults to the last instruction's register.
inline std::vector<int32_t> program(int32_t n_inputs,
                                    const std::vector<std::vector<int32_t>>& instr,
                                    const std::vector<float>& consts, int32_t out = -1) {
  std::vector<int32_t> w = {kScoreModVersion, n_inputs, int32_t(instr.size()),
                            out >= 0 ? out : n_inputs + int32_t(instr.size()) - 1};
  for (const auto& i : instr) w.insert(w.end(), i.begin(), i.end());
  std::vector<int32_t> p = {int32_t(w.size())};
  p.insert(p.end(), w.begin(), w.end());
  p.push_back(int32_t(consts.size()));
  for (float c : consts) p.push_back(float_bits(c));
  return p;
}

}  // namespace fusedattn::test
