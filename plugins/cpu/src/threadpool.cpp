// Persistent thread pool. Workers spin briefly after each job (back-to-back kernels in one inference step then
// start without a futex round trip) and then sleep on a condition variable.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define HETERO_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define HETERO_PAUSE() asm volatile("yield")
#else
#define HETERO_PAUSE() ((void)0)
#endif

namespace hetero {
namespace {

thread_local bool tl_in_pool_task = false;

class Pool {
 public:
  explicit Pool(int nthreads) : nthreads_(nthreads < 1 ? 1 : nthreads) {
    for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return nthreads_; }

  // Returns false (nothing run) when the pool is busy with another caller.
  bool run(i64 ntasks, int max_threads, const std::function<void(i64)>& f) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &f;
      ntasks_ = ntasks;
      max_joiners_ = max_threads - 1;
      joiners_ = 0;
      next_.store(0, std::memory_order_relaxed);
      done_.store(0, std::memory_order_relaxed);
      error_ = nullptr;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    // Wait for every task to finish and for every worker that joined to have let go of fn_.
    for (int spin = 0; spin < 20000; ++spin) {
      if (done_.load(std::memory_order_acquire) == ntasks && in_flight_.load(std::memory_order_acquire) == 0) break;
      HETERO_PAUSE();
    }
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_done_.wait(lk, [&] {
        return done_.load(std::memory_order_acquire) == ntasks && in_flight_.load(std::memory_order_acquire) == 0;
      });
      fn_ = nullptr;
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void work() {
    tl_in_pool_task = true;
    for (;;) {
      i64 t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= ntasks_) break;
      try {
        (*fn_)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu_);
        if (!error_) error_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
    tl_in_pool_task = false;
  }

  void worker_loop() {
    // Generation 0 is the one the pool was built with: a job (or the stop signal) posted before this thread got
    // scheduled is still seen.
    std::uint64_t seen = 0;
    for (;;) {
      // Spin ~50 us, then sleep.
      auto t0 = std::chrono::steady_clock::now();
      while (gen_.load(std::memory_order_acquire) == seen) {
        HETERO_PAUSE();
        if (std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(50)) break;
      }
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      // Join only if the job still wants helpers (max_threads) and has work left.
      if (fn_ == nullptr || joiners_ >= max_joiners_ || next_.load(std::memory_order_relaxed) >= ntasks_) continue;
      ++joiners_;
      in_flight_.fetch_add(1, std::memory_order_acq_rel);
      lk.unlock();
      work();
      lk.lock();
      if (in_flight_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_done_.notify_all();
    }
  }

  int nthreads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_, cv_done_;
  std::atomic<std::uint64_t> gen_{0};
  bool stop_ = false;
  const std::function<void(i64)>* fn_ = nullptr;
  i64 ntasks_ = 0;
  int max_joiners_ = 0, joiners_ = 0;
  std::atomic<i64> next_{0}, done_{0};
  std::atomic<int> in_flight_{0};
  std::mutex err_mu_;
  std::exception_ptr error_;
};

int default_threads() {
  if (const char* env = std::getenv("HETERO_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

std::mutex g_pool_mu;
std::shared_ptr<Pool> g_pool;  // created lazily; replaced by set_num_threads
int g_nthreads = 0;

std::shared_ptr<Pool> get_pool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (g_nthreads == 0) g_nthreads = default_threads();
  if (!g_pool && g_nthreads > 1) g_pool = std::make_shared<Pool>(g_nthreads);
  return g_pool;
}

}  // namespace

int num_threads() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (g_nthreads == 0) g_nthreads = default_threads();
  return g_nthreads;
}

void set_num_threads(int n) {
  if (n < 1) throw std::invalid_argument("set_num_threads: n must be >= 1, got " + std::to_string(n));
  std::shared_ptr<Pool> old;
  {
    std::lock_guard<std::mutex> lk(g_pool_mu);
    g_nthreads = n;
    old = std::move(g_pool);  // joined below (or by the last user still holding it)
  }
  old.reset();
}

void parallel_for(i64 ntasks, int max_threads, const std::function<void(i64)>& f) {
  if (ntasks <= 0) return;
  if (ntasks == 1 || max_threads <= 1 || tl_in_pool_task) {
    for (i64 t = 0; t < ntasks; ++t) f(t);
    return;
  }
  std::shared_ptr<Pool> pool = get_pool();
  if (pool && pool->run(ntasks, max_threads, f)) return;
  for (i64 t = 0; t < ntasks; ++t) f(t);
}

AlignedBuf& tl_buf(int slot) {
  thread_local AlignedBuf bufs[TL_NSLOTS];
  return bufs[slot];
}

}  // namespace hetero
