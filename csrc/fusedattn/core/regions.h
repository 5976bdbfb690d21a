// One scratch buffer carved into 256-byte aligned regions, in order: the GPU routes'
// workspaces (ffi_cuda_route.h's ScratchPlan, the CUDA flash kernels' and the empty-row
// passes' scratch). Host code; sizes in bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusedattn {

constexpr size_t kRegionAlign = 256;

constexpr size_t align_region(size_t bytes) { return (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

// A pointer rounded up to the next region boundary.
inline uintptr_t align_region_ptr(uintptr_t p) { return (p + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

struct Regions {
  size_t total = 0;  // bytes of the regions so far (a multiple of kRegionAlign)
  // A region of `bytes`: its offset.
  size_t add(size_t bytes) {
    const size_t at = total;
    total += align_region(bytes);
    return at;
  }
};

}  // namespace fusedattn
