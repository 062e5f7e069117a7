// What the native benchmarks share: a spin barrier that starts N threads' passes together, the passes' wall times
// as the threads themselves saw them, and buffers on 2 MiB pages (as hetero's repacked weights,
// plugins/cpu/src/llm.cpp's WeightArena). Header-only, no -m flags.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <thread>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace bench {

// A sense-reversing spin barrier: the threads start each pass together, so the pass time is the slowest thread's.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
    } else {
      while (gen_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0}, gen_{0};
};

// The wall time of each pass of N threads: every thread stamps its own start and end, a pass lasts from the first
// start to the last end. Only the worker threads take part: a timing thread of its own (the previous design) was a
// third runnable thread on a 2-core machine, and when it was scheduled late its start stamp fell after the workers'
// pass (a 2-thread probe of 64 MiB once read "1303 GB/s") while its spinning took a core from them.
class PassClock {
 public:
  PassClock(int threads, int passes)
      : passes_(passes), start_(static_cast<std::size_t>(threads * passes)), end_(start_.size()) {}
  void start(int thread, int pass) { start_[slot(thread, pass)] = now(); }
  void end(int thread, int pass) { end_[slot(thread, pass)] = now(); }
  // After the threads are joined: the pass's seconds.
  double seconds(int pass) const {
    double first = 1e300, last = -1e300;
    for (std::size_t i = static_cast<std::size_t>(pass); i < start_.size(); i += static_cast<std::size_t>(passes_))
      first = std::min(first, start_[i]), last = std::max(last, end_[i]);
    return last - first;
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  std::size_t slot(int thread, int pass) const { return static_cast<std::size_t>(thread * passes_ + pass); }
  const int passes_;
  std::vector<double> start_, end_;
};

// A buffer of at least `bytes`, 2 MiB-aligned; huge: ask Linux for transparent huge pages (advice only: a refusal
// leaves ordinary pages). Free with std::free.
inline void* page_alloc(std::size_t bytes, bool huge) {
  const std::size_t page = std::size_t{1} << 21, size = (bytes + page - 1) / page * page;
  void* p = std::aligned_alloc(page, size);
  if (!p) std::abort();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) madvise(p, size, MADV_HUGEPAGE);
#else
  (void)huge;
#endif
  return p;
}

}  // namespace bench
