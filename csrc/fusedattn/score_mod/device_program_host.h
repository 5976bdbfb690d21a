// Host side of device_program.h: a decoded ScoreMod packed into the fixed-size
// DeviceScoreMod a CUDA kernel takes by value.
#pragma once

#include <string>
#include <type_traits>

#include "fusedattn/core/status.h"
#include "fusedattn/score_mod/device_program.h"
#include "fusedattn/score_mod/program.h"

namespace fusedattn {

static_assert(std::is_trivially_copyable<DeviceScoreMod>::value, "a kernel parameter");

// Copies sm (decoded by decode_score_mod, so every index is valid) into *out: the shapes,
// offsets and total, every program into the instruction pool, the constants its SM_CONST
// instructions read into the constant pool (each distinct value once). A program past a
// limit of device_program.h gives Invalid, naming the program, its size and the limit
// (kDevMaxRegs, kDevMaxInstr or kDevMaxConsts); *out is then unspecified.
Status pack_device_score_mod(const ScoreMod& sm, DeviceScoreMod* out);

// Whether pack_device_score_mod would succeed; if not and why is given, *why gets its
// message.
bool device_score_mod_fits(const ScoreMod& sm, std::string* why);

}  // namespace fusedattn
