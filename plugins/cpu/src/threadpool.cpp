// Persistent thread pool. Workers spin briefly after each job (back-to-back kernels in one inference step then
// start without a futex round trip; HETERO_POOL_SPIN_US, default 50) and then sleep on a condition variable.
// Optional statistics of the parallel regions (threadpool_stats.hpp).
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
#include "threadpool_stats.hpp"

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

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int env_spin_us() {
  const char* e = std::getenv("HETERO_POOL_SPIN_US");
  return e ? std::atoi(e) : 50;
}
std::atomic<int> g_spin_us{env_spin_us()};

// Pool statistics: relaxed counters (a benchmark reads them between calls, not during).
std::atomic<bool> g_stats_on{false};
struct AtomicStats {
  std::atomic<std::int64_t> calls{0}, tasks{0}, joins{0}, sleeps{0}, late{0}, serial_calls{0};
  std::atomic<std::int64_t> wall_ns{0}, busy_ns{0}, wake_ns{0}, tail_ns{0}, serial_ns{0};
} g_stats;
inline void add(std::atomic<std::int64_t>& a, std::int64_t v) { a.fetch_add(v, std::memory_order_relaxed); }

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
    const bool stats = g_stats_on.load(std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &f;
      ntasks_ = ntasks;
      max_joiners_ = max_threads - 1;
      joiners_ = 0;
      next_.store(0, std::memory_order_relaxed);
      done_.store(0, std::memory_order_relaxed);
      error_ = nullptr;
      post_ns_ = stats ? now_ns() : 0;
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    const std::int64_t mine_done = stats ? now_ns() : 0;
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
    if (stats) {
      const std::int64_t end = now_ns();
      add(g_stats.calls, 1);
      add(g_stats.tasks, ntasks);
      add(g_stats.wall_ns, end - post_ns_);
      add(g_stats.tail_ns, end - mine_done);
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  void work() {
    tl_in_pool_task = true;
    const bool stats = g_stats_on.load(std::memory_order_relaxed);
    std::int64_t busy = 0;
    for (;;) {
      i64 t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= ntasks_) break;
      const std::int64_t t0 = stats ? now_ns() : 0;
      try {
        (*fn_)(t);
      } catch (...) {
        std::lock_guard<std::mutex> lk(err_mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (stats) busy += now_ns() - t0;
      done_.fetch_add(1, std::memory_order_acq_rel);
    }
    if (stats) add(g_stats.busy_ns, busy);
    tl_in_pool_task = false;
  }

  void worker_loop() {
    // Generation 0 is the one the pool was built with: a job (or the stop signal) posted before this thread got
    // scheduled is still seen.
    std::uint64_t seen = 0;
    for (;;) {
      // Spin a while (g_spin_us), then sleep.
      auto t0 = std::chrono::steady_clock::now();
      const auto spin = std::chrono::microseconds(g_spin_us.load(std::memory_order_relaxed));
      while (gen_.load(std::memory_order_acquire) == seen) {
        HETERO_PAUSE();
        if (std::chrono::steady_clock::now() - t0 > spin) break;
      }
      const bool slept = gen_.load(std::memory_order_acquire) == seen;
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
      seen = gen_.load(std::memory_order_acquire);
      if (stop_) return;
      // Join only if the job still wants helpers (max_threads) and has work left.
      const bool stats = g_stats_on.load(std::memory_order_relaxed);
      if (fn_ == nullptr || joiners_ >= max_joiners_ || next_.load(std::memory_order_relaxed) >= ntasks_) {
        if (stats && fn_ != nullptr && joiners_ < max_joiners_) add(g_stats.late, 1);
        continue;
      }
      if (stats) {
        add(g_stats.joins, 1);
        add(g_stats.sleeps, slept ? 1 : 0);
        add(g_stats.wake_ns, now_ns() - post_ns_);
      }
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
  std::int64_t post_ns_ = 0;  // when the current call was posted (statistics only)
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

namespace {
void run_serial(i64 ntasks, const std::function<void(i64)>& f) {
  const bool stats = g_stats_on.load(std::memory_order_relaxed) && !tl_in_pool_task;
  const std::int64_t t0 = stats ? now_ns() : 0;
  for (i64 t = 0; t < ntasks; ++t) f(t);
  if (stats) {
    add(g_stats.serial_calls, 1);
    add(g_stats.serial_ns, now_ns() - t0);
  }
}
}  // namespace

void parallel_for(i64 ntasks, int max_threads, const std::function<void(i64)>& f) {
  if (ntasks <= 0) return;
  if (ntasks == 1 || max_threads <= 1 || tl_in_pool_task) return run_serial(ntasks, f);
  std::shared_ptr<Pool> pool = get_pool();
  if (pool && pool->run(ntasks, max_threads, f)) return;
  run_serial(ntasks, f);
}

void pool_stats_enable(bool on) { g_stats_on.store(on, std::memory_order_relaxed); }

PoolStats pool_stats(bool reset) {
  auto take = [reset](std::atomic<std::int64_t>& a) {
    return reset ? a.exchange(0, std::memory_order_relaxed) : a.load(std::memory_order_relaxed);
  };
  PoolStats s;
  s.calls = take(g_stats.calls);
  s.tasks = take(g_stats.tasks);
  s.joins = take(g_stats.joins);
  s.sleeps = take(g_stats.sleeps);
  s.late = take(g_stats.late);
  s.serial_calls = take(g_stats.serial_calls);
  s.wall_s = take(g_stats.wall_ns) * 1e-9;
  s.busy_s = take(g_stats.busy_ns) * 1e-9;
  s.wake_s = take(g_stats.wake_ns) * 1e-9;
  s.tail_s = take(g_stats.tail_ns) * 1e-9;
  s.serial_s = take(g_stats.serial_ns) * 1e-9;
  return s;
}

void set_pool_spin_us(int us) {
  if (us < 0) throw std::invalid_argument("set_pool_spin_us: us must be >= 0, got " + std::to_string(us));
  g_spin_us.store(us, std::memory_order_relaxed);
}
int pool_spin_us() { return g_spin_us.load(std::memory_order_relaxed); }

AlignedBuf& tl_buf(int slot) {
  thread_local AlignedBuf bufs[TL_NSLOTS];
  return bufs[slot];
}

}  // namespace hetero
