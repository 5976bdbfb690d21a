#include "fusedattn/platform/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fusedattn::cpu {
namespace {

struct Job {
  const TaskFn* fn;
  int64_t n;
  std::atomic<int64_t> next{0};
  std::atomic<int> next_slot{1};  // slot 0 belongs to the calling thread
  int active = 0;                 // helpers inside run(); guarded by Pool::mu
  std::condition_variable helpers_done;

  void run(int slot) {
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) (*fn)(t, slot);
  }
};

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static teardown
    return *pool;
  }

  int slots() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }

  void resize(int n) {
    if (n < 1) n = std::max(1u, std::thread::hardware_concurrency());
    std::lock_guard<std::mutex> lock(mu_);
    // Threads only grow; extra slots beyond `limit_` are simply not handed out.
    while (static_cast<int>(workers_.size()) + 1 < n)
      workers_.emplace_back([this] { worker_loop(); });
    limit_ = n;
  }

  void parallel_for(int64_t n, const TaskFn& fn) {
    if (n <= 0) return;
    Job job;
    job.fn = &fn;
    job.n = n;
    int helpers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      helpers = static_cast<int>(std::min<int64_t>(n - 1, limit_ - 1));
      for (int i = 0; i < helpers; ++i) tickets_.push_back(&job);
    }
    if (helpers > 0) wake_.notify_all();
    job.run(0);
    std::unique_lock<std::mutex> lock(mu_);
    // Tickets nobody picked up must not outlive the job.
    tickets_.erase(std::remove(tickets_.begin(), tickets_.end(), &job), tickets_.end());
    job.helpers_done.wait(lock, [&] { return job.active == 0; });
  }

 private:
  Pool() {
    limit_ = 1;
    resize(0);
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return !tickets_.empty(); });
      Job* job = tickets_.front();
      tickets_.pop_front();
      ++job->active;
      lock.unlock();
      job->run(job->next_slot.fetch_add(1));
      lock.lock();
      if (--job->active == 0) job->helpers_done.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Job*> tickets_;
  std::vector<std::thread> workers_;
  int limit_;
};

}  // namespace

int max_slots() { return Pool::get().slots(); }
void set_num_threads(int n) { Pool::get().resize(n); }
void parallel_for(int64_t n, const TaskFn& fn) { Pool::get().parallel_for(n, fn); }

}  // namespace fusedattn::cpu
