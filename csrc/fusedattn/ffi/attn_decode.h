// Turns FFI buffers and attributes into an AttnParams, checking every shape
// against every other one. Shared by the CPU handlers (and the CUDA ones to come).
#pragma once

#include <cstdint>
#include <string>

#include "../params.h"
#include "../status.h"
#include "common.h"

namespace fusedattn::ffi_glue {

// The attributes every attention handler takes (Python passes them by name).
struct AttnAttrs {
  int32_t layout;
  int32_t mask_type;
  int32_t bias_type;
  int32_t softmax_type;
  int32_t is_training;
  float scale;
  float dropout;
  int64_t window_left;
  int64_t window_right;
};

// q [..., Sq, Hq, D], k [..., Skv, Hkv, D], v [..., Skv, Hkv, Dv], q_lens/kv_lens [...]:
// every leading dimension is batch (vmap adds leading dimensions).
Status decode_params(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                     const ffi::AnyBuffer& q_lens, const ffi::AnyBuffer& kv_lens,
                     const AttnAttrs& attrs, AttnParams* p);

}  // namespace fusedattn::ffi_glue

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    fusedattn::ffi_glue::AttnAttrs, ::xla::ffi::StructMember<int32_t>("layout"),
    ::xla::ffi::StructMember<int32_t>("mask_type"), ::xla::ffi::StructMember<int32_t>("bias_type"),
    ::xla::ffi::StructMember<int32_t>("softmax_type"),
    ::xla::ffi::StructMember<int32_t>("is_training"), ::xla::ffi::StructMember<float>("scale"),
    ::xla::ffi::StructMember<float>("dropout"), ::xla::ffi::StructMember<int64_t>("window_left"),
    ::xla::ffi::StructMember<int64_t>("window_right"));
