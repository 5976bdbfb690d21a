// Where a softmax row finds its mask row when the mask broadcasts.
//
// Rows are the flat index over logits dims[0:rank-1] (row-major); the mask has
// dims mask_dims, each 1 or the logits' one, and is row-major too. MaskRows keeps
// only the dimensions that matter: size-1 logits dims are dropped and neighbours
// that broadcast alike are merged, so the usual [B, 1, Sq, Skv] mask of
// [B, H, Sq, Skv] logits needs three (index, stride) steps per row, and a mask of
// the logits' own shape needs one. Shared by the CPU and CUDA kernels; the cost is
// per row, never per element.
#pragma once

#include <stdint.h>

#include "fusedattn/core/host_device.h"
#include "fusedattn/softmax/params.h"

namespace fusedattn::softmax {

struct MaskRows {
  int32_t n = 0;                             // steps, innermost first
  int64_t size[FA_SOFTMAX_MAX_RANK] = {};    // extent of the step's (merged) dims in the logits
  int64_t stride[FA_SOFTMAX_MAX_RANK] = {};  // mask elements per index of that step (0: broadcast)
  // The same steps in launch order: broadcast steps innermost, so that the rows that
  // share one mask row (the heads of a [B, 1, Sq, Skv] mask) run back to back and the
  // mask row is read from memory once, then from L2. row_stride: logits rows per index.
  int64_t launch_size[FA_SOFTMAX_MAX_RANK] = {};
  int64_t launch_row_stride[FA_SOFTMAX_MAX_RANK] = {};
  int64_t launch_stride[FA_SOFTMAX_MAX_RANK] = {};
};

// Element offset of row `row`'s mask row (of Skv elements). I is the index type:
// the CUDA kernels pass uint32_t when every row index fits, since a 64-bit
// division is a long emulated sequence and this runs once per row and thread.
template <class I>
FA_HOST_DEVICE inline int64_t mask_row_offset(const MaskRows& m, I row) {
  int64_t off = 0;
  for (int32_t d = 0; d < m.n; ++d) {
    const I size = static_cast<I>(m.size[d]);
    const I q = row / size;
    off += static_cast<int64_t>(row - q * size) * m.stride[d];
    row = q;
  }
  return off;
}

// The logits row that launch index t works on, and that row's mask row offset: the
// rows in an order where the rows sharing a mask row are consecutive (see MaskRows).
template <class I>
FA_HOST_DEVICE inline void locate_row(const MaskRows& m, I t, int64_t* row, int64_t* mask_off) {
  int64_t r = 0, off = 0;
  for (int32_t d = 0; d < m.n; ++d) {
    const I size = static_cast<I>(m.launch_size[d]);
    const I q = t / size;
    const int64_t idx = static_cast<int64_t>(t - q * size);
    r += idx * m.launch_row_stride[d];
    off += idx * m.launch_stride[d];
    t = q;
  }
  *row = r;
  *mask_off = off;
}

// Assumes validate(p) passed and p.has_mask.
inline MaskRows make_mask_rows(const SoftmaxParams& p) {
  MaskRows m;
  int64_t mask_stride = p.mask_dims[p.rank - 1];  // elements of the mask per index of dim d
  for (int d = p.rank - 2; d >= 0; --d) {
    const int64_t size = p.dims[d];
    const int64_t stride = p.mask_dims[d] == 1 ? 0 : mask_stride;
    mask_stride *= p.mask_dims[d];
    if (size == 1) continue;
    // The previous (inner) step continues into this dim when both broadcast, or
    // when both are full and the mask is contiguous across them.
    if (m.n > 0 && ((stride == 0 && m.stride[m.n - 1] == 0) ||
                    (stride != 0 && stride == m.stride[m.n - 1] * m.size[m.n - 1]))) {
      m.size[m.n - 1] *= size;
      continue;
    }
    m.size[m.n] = size;
    m.stride[m.n] = stride;
    ++m.n;
  }
  int64_t row_stride[FA_SOFTMAX_MAX_RANK], rows = 1;
  for (int32_t d = 0; d < m.n; ++d) row_stride[d] = rows, rows *= m.size[d];
  int32_t k = 0;
  for (int pass = 0; pass < 2; ++pass)  // broadcast steps first, then the others, each in order
    for (int32_t d = 0; d < m.n; ++d)
      if ((m.stride[d] == 0) == (pass == 0)) {
        m.launch_size[k] = m.size[d];
        m.launch_row_stride[k] = row_stride[d];
        m.launch_stride[k] = m.stride[d];
        ++k;
      }
  return m;
}

}  // namespace fusedattn::softmax
