// What the native benchmarks share: a spin barrier that starts N threads' passes together, and buffers on 2 MiB
// pages (as hetero's repacked weights, plugins/cpu/src/llm.cpp's WeightArena). Header-only, no -m flags.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <thread>
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
