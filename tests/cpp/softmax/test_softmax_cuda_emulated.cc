// The CUDA softmax kernels (kernels.cuh, with config.h's launch configuration),
// run on the host by cuda_emulation.h and checked against the double-precision
// reference of softmax_check.h: every configuration switch of the row length,
// 16-byte and scalar units, masks, causal rows, dead rows in partly filled
// blocks. A GPU run (tests/python/test_softmax_gpu.py) checks the real thing; this
// catches indexing and synchronization mistakes on a machine without one.
#include "cuda_emulation.h"  // first: the CUDA built-ins kernels.cuh uses

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "fusedattn/softmax/cuda/config.h"
#include "fusedattn/softmax/cuda/kernels.cuh"
#include "softmax_check.h"

namespace fusedattn::softmax {
namespace {

using namespace check;  // NOLINT: the shared checks of softmax_check.h

template <class T, bool kFwd, class Args>
Status emulate(const Args& a, const void* p0, const void* p1, const void* p2, const uint8_t* mask) {
  return cuda::with_config(int64_t{a.skv} * int64_t{sizeof(T)}, [&](auto tpr, auto bpt) -> Status {
    constexpr int TPR = decltype(tpr)::value, BPT = decltype(bpt)::value;
    constexpr int E = BPT / sizeof(T), kVec = 16 / sizeof(T);
    using G = cuda::Group<TPR>;
    const auto blocks = [](const auto& args) {
      return static_cast<unsigned int>((cuda::row_groups(args) + G::kRows - 1) / G::kRows);
    };
    const bool vec = kFwd ? cuda::vectorizable<T>(a.skv, {p0, p1}, mask)
                          : cuda::vectorizable<T>(a.skv, {p0, p1, p2}, nullptr);
    if constexpr (kFwd) {
      if (vec) {
        const cuda::FwdArgs k = cuda::for_kernel<TPR, kVec>(a);
        return cuda_emu::launch(cuda::fwd_kernel<T, TPR, E, kVec>(k), blocks(k), G::kBlock, k),
               Status::Ok();
      }
      if constexpr (cuda::kScalarServed<T, TPR, BPT>) {
        const cuda::FwdArgs k = cuda::for_kernel<TPR, 1>(a);
        return cuda_emu::launch(cuda::fwd_kernel<T, TPR, E, 1>(k), blocks(k), G::kBlock, k),
               Status::Ok();
      }
    } else {
      if (vec)
        return cuda_emu::launch(cuda::softmax_bwd_kernel<T, TPR, E, kVec>, blocks(a), G::kBlock, a),
               Status::Ok();
      if constexpr (cuda::kScalarServed<T, TPR, BPT>)
        return cuda_emu::launch(cuda::softmax_bwd_kernel<T, TPR, E, 1>, blocks(a), G::kBlock, a),
               Status::Ok();
    }
    return cuda::scalar_not_served(a.skv);
  });
}

template <class F>
void with_type(int32_t dtype, F&& f) {
  if (dtype == FA_FLOAT32)
    f(float{});
  else if (dtype == FA_BFLOAT16)
    f(__nv_bfloat16{});
  else
    f(__half{});
}

// The kernels as launch.cuh runs them; min_groups as make_fwd_args takes it (1: a
// broadcast mask's rows always share their row group, so small calls run the loop).
Kernels emulated(int64_t min_groups) {
  return {[=](const SoftmaxParams& p, const void* x, const uint8_t* mask, void* y) {
            ASSERT_TRUE(choose_kernel(p, FA_PLATFORM_CUDA, true).available);
            const cuda::FwdArgs a = cuda::make_fwd_args(p, x, mask, y, min_groups);
            with_type(p.dtype, [&](auto t) {
              const Status s = emulate<decltype(t), true>(a, x, y, nullptr, a.mask);
              ASSERT_TRUE(s.ok()) << s.message;
            });
          },
          [](const SoftmaxParams& p, const void* y, const void* dy, void* dx) {
            const cuda::BwdArgs a = cuda::make_bwd_args(p, y, dy, dx);
            with_type(p.dtype, [&](auto t) {
              const Status s = emulate<decltype(t), false>(a, y, dy, dx, nullptr);
              ASSERT_TRUE(s.ok()) << s.message;
            });
          }};
}
const Kernels kEmulated = emulated(cuda::kMinGroups);
const Kernels kEmulatedShared = emulated(1);

const int32_t kKinds[] = {FA_SOFTMAX_SCALED, FA_SOFTMAX_SCALED_MASKED,
                          FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED};

Case make_case(std::vector<int64_t> dims, int32_t kind, float scale = 0.7f) {
  std::vector<int64_t> mask;
  if (kind == FA_SOFTMAX_SCALED_MASKED) {  // [B, 1, Sq, Skv]: broadcast over heads
    mask = dims;
    mask[1] = 1;
  }
  return {std::move(dims), std::move(mask), kind, scale};
}

// Row lengths around every switch of config.h (in bytes: 16, 32, ..., 64 KiB), aligned
// (16-byte units) and odd (scalar units); the kind rotates so each meets each. Rows
// of a block each (past 2 KiB) come two to a call: every emulated lane is a thread,
// and 1024-thread blocks are slow to emulate.
void check_lengths(int32_t dtype, const std::vector<int64_t>& lengths) {
  uint32_t seed = 1000 + dtype;
  int i = 0;
  for (int64_t skv : lengths) {
    const int32_t kind = kKinds[i++ % 3];
    const bool block_rows = skv * dtype_bytes(dtype) > 2048;
    check_case(kEmulated, make_case({1, 2, block_rows ? 1 : 3, skv}, kind), dtype, seed++);
  }
}

TEST(EmulatedCudaSoftmax, Float32RowLengths) {
  check_lengths(FA_FLOAT32,
                {1,   3,   4,   5,   8,    9,    16,   31,   32,   64,   100,  128,   129,
                 256, 257, 500, 512, 1000, 1024, 1025, 2048, 4096, 4097, 8192, 16383, 16384});
}

TEST(EmulatedCudaSoftmax, Bfloat16RowLengths) {
  check_lengths(FA_BFLOAT16,
                {1,   2,    7,    8,    15,   16,   17,   64,    128,   250,   256,  512,
                 513, 1024, 2048, 2049, 4096, 8192, 8200, 16383, 16384, 16392, 32768});
}

TEST(EmulatedCudaSoftmax, Float16RowLengths) {
  check_lengths(FA_FLOAT16, {1, 9, 64, 255, 1024, 2050, 4096, 16384, 24576, 32768});
}

TEST(EmulatedCudaSoftmax, EveryKindAtTheLongestRows) {
  for (int32_t kind : kKinds) {
    check_case(kEmulated, make_case({1, 2, 1, 32768}, kind), FA_BFLOAT16, 2000 + kind);
    check_case(kEmulated, make_case({1, 2, 1, 16384}, kind), FA_FLOAT32, 2010 + kind);
    check_case(kEmulated, make_case({1, 2, 1, 16383}, kind), FA_FLOAT16, 2020 + kind);
  }
}

// Many short rows: several blocks, the last one partly filled (dead row groups).
TEST(EmulatedCudaSoftmax, ManyRowsPerBlock) {
  check_case(kEmulated, make_case({3, 7, 11, 3}, FA_SOFTMAX_SCALED_MASKED), FA_FLOAT32, 3000);
  check_case(kEmulated, make_case({5, 100, 24}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED), FA_BFLOAT16,
             3001);
  check_case(kEmulated, make_case({2, 3, 45, 40}, FA_SOFTMAX_SCALED), FA_FLOAT16, 3002);
}

TEST(EmulatedCudaSoftmax, CausalSquare) {
  for (int64_t s : {40, 300})
    check_case(kEmulated, make_case({2, s, s}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED), FA_BFLOAT16,
               4000 + static_cast<uint32_t>(s));
  check_case(kEmulated, make_case({1, 260, 260}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED, 0.2f),
             FA_FLOAT32, 4100);  // 1040-byte rows: a warp per row, 2 units a lane
  check_case(kEmulated, make_case({1, 80, 1100}, FA_SOFTMAX_SCALED_UPPER_TRIANG_MASKED, 0.2f),
             FA_FLOAT32, 4101);  // 4400-byte rows: one 256-thread block per row
}

TEST(EmulatedCudaSoftmax, MaskBroadcasts) {
  uint32_t seed = 5000;
  for (const Kernels* k : {&kEmulated, &kEmulatedShared}) {
    for (const auto& md : std::vector<std::vector<int64_t>>{
             {2, 3, 5, 264}, {2, 1, 5, 264}, {1, 3, 1, 264}, {1, 1, 1, 264}, {2, 3, 1, 264}})
      check_case(*k, {{2, 3, 5, 264}, md, FA_SOFTMAX_SCALED_MASKED, 0.5f}, FA_BFLOAT16, seed++);
    check_case(*k, {{2, 3, 4, 6, 72}, {2, 1, 4, 1, 72}, FA_SOFTMAX_SCALED_MASKED, 1.0f},
               FA_FLOAT32, seed++);
  }
}

// Row groups that loop over the rows sharing a mask row (the heads of a [B, 1, Sq,
// Skv] mask), at every group width: several groups per block with a partly filled
// last block, one warp per row, and block-wide groups reusing the shared reductions.
TEST(EmulatedCudaSoftmax, RowGroupsShareTheMask) {
  uint32_t seed = 5100;
  for (int64_t skv : {3, 24, 100, 256, 1000, 2048, 4100, 16384})
    for (int32_t dtype : {FA_FLOAT32, FA_BFLOAT16}) {
      const bool block_rows = skv * dtype_bytes(dtype) > 2048;
      check_case(kEmulatedShared,
                 make_case({block_rows ? 1 : 3, 6, block_rows ? 1 : 5, skv},
                           FA_SOFTMAX_SCALED_MASKED),
                 dtype, seed++);
    }
}

TEST(EmulatedCudaSoftmax, RowGroupSizes) {
  MaskRows m;  // [B=2, H=12, Sq=5] rows of a [2, 1, 5, Skv] mask: 12 rows share each
  m.n = 2;
  m.launch_size[0] = 12, m.launch_stride[0] = 0;
  m.launch_size[1] = 10, m.launch_stride[1] = 64;
  EXPECT_EQ(cuda::mask_reps(m, 120, 1), 12);
  EXPECT_EQ(cuda::mask_reps(m, 120, 20), 6);   // 20 groups of 6
  EXPECT_EQ(cuda::mask_reps(m, 120, 121), 1);  // too few rows to share
  m.launch_size[0] = 17;                       // never more than 16 a group
  EXPECT_EQ(cuda::mask_reps(m, 170, 1), 1);    // 17 is prime: no divisor <= 16 but 1
  m.launch_size[0] = 32;
  EXPECT_EQ(cuda::mask_reps(m, 320, 1), 16);
  m.launch_stride[0] = 64;  // no broadcast step: nothing to share
  EXPECT_EQ(cuda::mask_reps(m, 320, 1), 1);
}

}  // namespace
}  // namespace fusedattn::softmax
