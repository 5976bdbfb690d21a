// Runs CUDA kernels on the host, for tests on machines without a GPU.
//
// A block's threads are real std::threads (one per CUDA thread), which run the
// blocks one after another, so a kernel's __shared__ arrays (static here) belong to
// the running block. __syncthreads is a barrier of the block's threads; __shfl_xor_sync is an
// exchange through a slot array between two barriers of the warp, which is exact
// as long as all 32 lanes of the warp reach every shuffle (what the full mask
// 0xffffffff promises the hardware). __ldcs/__ldg are plain loads
// and ex2.approx is exp2f (kernels.cuh picks it without __CUDA_ARCH__). What this
// checks: indexing, vector units, masks, reductions and their synchronization, the
// launch configuration; not timing, not the ex2.approx rounding.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <math.h>  // fmaxf, exp2f, INFINITY in the global namespace, as in device code

#include <condition_variable>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// CUDA's host_defines.h makes these GCC attributes; the emulation needs their meaning.
#undef __global__
#define __global__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

struct EmuDim3 {
  unsigned int x = 0, y = 0, z = 0;
};
inline thread_local EmuDim3 threadIdx, blockIdx;

namespace cuda_emu {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  int64_t gen_ = 0;
};

struct Block {
  explicit Block(int threads) : barrier(threads), slots(threads) {
    for (int w = 0; w < (threads + 31) / 32; ++w)
      warps.emplace_back(new Barrier(std::min(32, threads - 32 * w)));
  }
  Barrier barrier;                              // __syncthreads
  std::vector<std::unique_ptr<Barrier>> warps;  // a shuffle waits for its warp only
  std::vector<float> slots;
};

inline Block*& current_block() {
  static Block* block = nullptr;
  return block;
}

// kernel<<<blocks, threads>>>(args), run to completion: one team of `threads`
// std::threads runs the blocks in turn, with a barrier between blocks (so the
// next block's writes to __shared__ wait until this one is done with it).
template <class Kernel, class Args>
void launch(Kernel kernel, unsigned int blocks, unsigned int threads, const Args& args) {
  Block block(static_cast<int>(threads));
  current_block() = &block;
  std::vector<std::thread> team;
  team.reserve(threads);
  for (unsigned int t = 0; t < threads; ++t)
    team.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned int b = 0; b < blocks; ++b) {
        blockIdx.x = b;
        kernel(args);
        block.barrier.wait();
      }
    });
  for (auto& th : team) th.join();
  current_block() = nullptr;
}

}  // namespace cuda_emu

inline void __syncthreads() { cuda_emu::current_block()->barrier.wait(); }

inline float __shfl_xor_sync(unsigned int, float v, int lane_mask) {
  cuda_emu::Block& b = *cuda_emu::current_block();
  const unsigned int t = threadIdx.x;
  cuda_emu::Barrier& warp = *b.warps[t / 32];
  b.slots[t] = v;
  warp.wait();
  const float r = b.slots[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned int>(lane_mask))];
  warp.wait();
  return r;
}

template <class T>
inline T __ldcs(const T* p) {
  return *p;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
