// A small persistent thread pool for the CPU kernels.
//
// parallel_for(n, fn) runs fn(task, slot) for task in [0, n) and returns when
// all are done. `slot` is in [0, max_slots()) and is unique among the threads
// working on one call at a time, so a kernel can keep per-slot scratch (for
// example a private dQ accumulator) without locks. Several threads may call
// parallel_for at once (XLA runs independent custom calls concurrently); each
// call is its own job and the calling thread always works on its own job.
#pragma once

#include <cstdint>
#include <functional>

namespace fusedattn::cpu {

using TaskFn = std::function<void(int64_t task, int slot)>;

// Number of threads (the caller included) one call may use: the current setting.
int max_slots();
// Sets the number of threads; n < 1 means one per hardware thread.
void set_num_threads(int n);
void parallel_for(int64_t n, const TaskFn& fn);

}  // namespace fusedattn::cpu
