// Persistent thread pool. Workers spin briefly after each job (back-to-back kernels in one inference step then
// start without a futex round trip; HETERO_POOL_SPIN_US) and then sleep on a condition variable.
// Optional statistics of the parallel regions (threadpool_stats.hpp).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#endif

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

int env_linger_us() {
  const char* e = std::getenv("HETERO_POOL_LINGER_US");
  return e ? std::atoi(e) : 1000;
}
std::atomic<int> g_linger_us{env_linger_us()};
// now_ns() before which idle workers keep spinning (pool_linger), whatever g_spin_us says.
std::atomic<std::int64_t> g_linger_until{0};

// Pool statistics: relaxed counters (a benchmark reads them between calls, not during).
std::atomic<bool> g_stats_on{false};
struct AtomicStats {
  std::atomic<std::int64_t> calls{0}, tasks{0}, joins{0}, sleeps{0}, late{0}, serial_calls{0};
  std::atomic<std::int64_t> wall_ns{0}, busy_ns{0}, wake_ns{0}, tail_ns{0}, serial_ns{0}, idle_ns{0};
} g_stats;
inline void add(std::atomic<std::int64_t>& a, std::int64_t v) { a.fetch_add(v, std::memory_order_relaxed); }

// Dispatch without locks on the hot path: a call is published by bumping gen_ to an odd value (the job's fields
// written before, release); a spinning worker sees it, pins the job (in_flight_) and takes tasks from next_; the
// caller, having run tasks itself, spins until every task is done, closes the job (gen_ even) and waits for the
// pinned workers to let go of it. Only a worker that spun g_spin_us without a new job sleeps on the condition
// variable, and only then does a call take the mutex (to notify it). Sequentially consistent atomics order the
// pin against the close (a worker pins, then re-checks gen_; the caller closes, then reads in_flight_) and the
// sleep against the post (a worker counts itself in sleepers_, then re-checks gen_ under the mutex).
class Pool {
 public:
  explicit Pool(int nthreads) : nthreads_(nthreads < 1 ? 1 : nthreads) {
    for (int i = 1; i < nthreads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~Pool() {
    stop_.store(true);
    gen_.fetch_add(2);  // wakes spinners (a new value) without posting a job (parity unchanged)
    {
      std::lock_guard<std::mutex> lk(mu_);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return nthreads_; }
  // The workers' CPU-time clocks (Linux; elsewhere none can be read: -1 in pool_cpu_ns).
  std::vector<std::int64_t> cpu_ns(std::int64_t (*read)(clockid_t)) {
    std::vector<std::int64_t> out;
    for (auto& t : workers_) {
#if defined(__linux__)
      clockid_t c;
      out.push_back(pthread_getcpuclockid(t.native_handle(), &c) == 0 ? read(c) : -1);
#else
      (void)t;
      (void)read;
      out.push_back(-1);
#endif
    }
    return out;
  }
  bool all_asleep() const { return sleepers_.load(std::memory_order_relaxed) >= nthreads_ - 1; }

  // Wakes sleeping workers without posting a job (gen_ moves by 2: its parity, "idle", stays), so that they spin
  // again (pool_linger). Nothing when a call holds the pool or none sleeps.
  void wake_idle() {
    if (sleepers_.load() == 0) return;
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return;
    gen_.fetch_add(2);
    { std::lock_guard<std::mutex> lk(mu_); }
    cv_.notify_all();
  }

  // Returns false (nothing run) when the pool is busy with another caller.
  bool run(i64 ntasks, int max_threads, const std::function<void(i64)>& f) {
    std::unique_lock<std::mutex> busy(run_mu_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    const bool stats = g_stats_on.load(std::memory_order_relaxed);
    fn_ = &f;
    ntasks_ = ntasks;
    max_joiners_ = max_threads - 1;
    joiners_.store(0, std::memory_order_relaxed);
    next_.store(0, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    if (stats) {
      fin_max_.store(0, std::memory_order_relaxed);
      fin_sum_.store(0, std::memory_order_relaxed);
      fin_n_.store(0, std::memory_order_relaxed);
    }
    post_ns_ = stats ? now_ns() : 0;
    gen_.fetch_add(1);  // odd: the job is open
    if (sleepers_.load() > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }  // a worker between counting itself and waiting holds mu_
      cv_.notify_all();
    }
    work();
    const std::int64_t mine_done = stats ? now_ns() : 0;
    wait_until([&] { return done_.load(std::memory_order_acquire) == ntasks; });
    gen_.fetch_add(1);  // even: closed; no worker pins it from now on
    wait_until([&] { return in_flight_.load() == 0; });
    fn_ = nullptr;
    if (stats) {
      const std::int64_t end = now_ns();
      add(g_stats.calls, 1);
      add(g_stats.tasks, ntasks);
      add(g_stats.wall_ns, end - post_ns_);
      add(g_stats.tail_ns, end - mine_done);
      // every thread that ran tasks waits from its own last task's end to the last one's: the end spread
      add(g_stats.idle_ns, fin_n_.load() * fin_max_.load() - fin_sum_.load());
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  // Spin on cond; after ~20k pauses yield the core (a descheduled worker may need it to finish its task).
  template <class C>
  static void wait_until(const C& cond) {
    for (int spin = 0; !cond(); ++spin) {
      if (spin < 20000) {
        HETERO_PAUSE();
      } else {
        std::this_thread::yield();
      }
    }
  }

  // Takes tasks until none is left; the tasks it ran are counted into done_ once, when it runs out (one shared
  // write per thread and call instead of one per task: the caller only needs the total).
  void work() {
    tl_in_pool_task = true;
    const bool stats = g_stats_on.load(std::memory_order_relaxed);
    std::int64_t busy = 0;
    i64 ran = 0;
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
      ++ran;
    }
    if (stats && ran) {  // this thread's finish, relative to the post (the end spread, idle_ns)
      const std::int64_t fin = now_ns() - post_ns_;
      std::int64_t m = fin_max_.load(std::memory_order_relaxed);
      while (m < fin && !fin_max_.compare_exchange_weak(m, fin, std::memory_order_relaxed)) {
      }
      fin_sum_.fetch_add(fin, std::memory_order_relaxed);
      fin_n_.fetch_add(1, std::memory_order_relaxed);
    }
    if (ran) done_.fetch_add(ran, std::memory_order_acq_rel);  // release: the tasks' writes before the count
    if (stats) add(g_stats.busy_ns, busy);
    tl_in_pool_task = false;
  }

  // Waits (spinning g_spin_us, then asleep) for gen_ to differ from seen; returns the new value.
  std::uint64_t await_change(std::uint64_t seen, bool& slept) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto spin = std::chrono::microseconds(g_spin_us.load(std::memory_order_relaxed));
    std::uint64_t g;
    for (int i = 1;; ++i) {
      g = gen_.load(std::memory_order_acquire);
      if (g != seen) return g;
      HETERO_PAUSE();
      if ((i & 63) == 0 && std::chrono::steady_clock::now() - t0 > spin &&
          now_ns() >= g_linger_until.load(std::memory_order_relaxed))
        break;
    }
    slept = true;
    std::unique_lock<std::mutex> lk(mu_);
    sleepers_.fetch_add(1);
    cv_.wait(lk, [&] { return gen_.load() != seen; });
    sleepers_.fetch_sub(1);
    return gen_.load(std::memory_order_acquire);
  }

  void worker_loop() {
    // Generation 0 is the idle state the pool was built in: a job posted before this thread got scheduled (1) is
    // still seen.
    std::uint64_t seen = 0;
    for (;;) {
      bool slept = false;
      const std::uint64_t g = await_change(seen, slept);
      seen = g;
      if (stop_.load()) return;
      if ((g & 1) == 0) continue;  // a close: keep waiting (the spin starts over)
      in_flight_.fetch_add(1);     // pin the job, then check that it is still the one seen open
      if (gen_.load() != g) {
        in_flight_.fetch_sub(1);
        continue;
      }
      const bool stats = g_stats_on.load(std::memory_order_relaxed);
      // Join only if the job still wants helpers (max_threads) and has work left.
      if (joiners_.fetch_add(1, std::memory_order_relaxed) >= max_joiners_) {
        // not wanted (max_threads)
      } else if (next_.load(std::memory_order_relaxed) >= ntasks_) {
        if (stats) add(g_stats.late, 1);
      } else {
        if (stats) {
          add(g_stats.joins, 1);
          add(g_stats.sleeps, slept ? 1 : 0);
          add(g_stats.wake_ns, now_ns() - post_ns_);
        }
        work();
      }
      in_flight_.fetch_sub(1, std::memory_order_release);
    }
  }

  int nthreads_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;  // only for sleeping workers
  std::condition_variable cv_;
  // Cache lines apart: gen_ (what spinning workers poll), the job (read-only while it is open), the task counter
  // (every claim writes it), and the counts the caller waits on, so a write to one does not take the others' line
  // away from the thread reading them.
  alignas(64) std::atomic<std::uint64_t> gen_{0};  // odd: a job is open; even: idle
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  // The job: written by the caller before gen_ turns odd, read by workers that pinned it.
  alignas(64) const std::function<void(i64)>* fn_ = nullptr;
  i64 ntasks_ = 0;
  std::int64_t post_ns_ = 0;  // when the current call was posted (statistics only)
  int max_joiners_ = 0;
  alignas(64) std::atomic<i64> next_{0};
  alignas(64) std::atomic<i64> done_{0};
  std::atomic<int> joiners_{0};
  std::atomic<int> in_flight_{0};
  std::mutex err_mu_;
  std::exception_ptr error_;
  // statistics only: the latest finish of a thread's tasks (ns after the post), their sum and count
  alignas(64) std::atomic<std::int64_t> fin_max_{0}, fin_sum_{0}, fin_n_{0};
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

namespace {
// While a linger is under way (pool_linger: a replayed run ended less than pool_linger_us ago), each call moves its
// end to pool_linger_us from now, so the workers spin through the next run's serial stretches (its last millisecond
// too) instead of falling asleep after g_spin_us in one and paying a futex wake at the next parallel call. Off again
// pool_linger_us after the last call.
void extend_linger() {
  const std::int64_t until = g_linger_until.load(std::memory_order_relaxed);
  if (until == 0) return;
  const std::int64_t now = now_ns();
  if (now < until)
    g_linger_until.store(now + std::int64_t{g_linger_us.load(std::memory_order_relaxed)} * 1000,
                         std::memory_order_relaxed);
}
}  // namespace

void parallel_for_pooled(i64 ntasks, int max_threads, const std::function<void(i64)>& f, bool wake_sleepers) {
  if (ntasks <= 0) return;
  if (max_threads > 1 && !tl_in_pool_task) extend_linger();
  if (ntasks == 1 || max_threads <= 1 || tl_in_pool_task) return run_serial(ntasks, f);
  std::shared_ptr<Pool> pool = get_pool();
  if (pool && (wake_sleepers || !pool->all_asleep()) && pool->run(ntasks, max_threads, f)) return;
  run_serial(ntasks, f);
}

void pool_stats_enable(bool on) { g_stats_on.store(on, std::memory_order_relaxed); }
bool pool_stats_enabled() { return g_stats_on.load(std::memory_order_relaxed); }

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
  s.idle_s = take(g_stats.idle_ns) * 1e-9;
  return s;
}

void set_pool_spin_us(int us) {
  if (us < 0) throw std::invalid_argument("set_pool_spin_us: us must be >= 0, got " + std::to_string(us));
  g_spin_us.store(us, std::memory_order_relaxed);
}
int pool_spin_us() { return g_spin_us.load(std::memory_order_relaxed); }

void pool_linger() {
  const int us = g_linger_us.load(std::memory_order_relaxed);
  if (us <= 0) return;
  g_linger_until.store(now_ns() + static_cast<std::int64_t>(us) * 1000, std::memory_order_relaxed);
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard<std::mutex> lk(g_pool_mu);
    pool = g_pool;
  }
  if (pool) pool->wake_idle();
}
void set_pool_linger_us(int us) {
  if (us < 0) throw std::invalid_argument("set_pool_linger_us: us must be >= 0, got " + std::to_string(us));
  g_linger_us.store(us, std::memory_order_relaxed);
  if (us == 0) g_linger_until.store(0, std::memory_order_relaxed);  // off: a linger under way ends too
}
int pool_linger_us() { return g_linger_us.load(std::memory_order_relaxed); }

std::vector<std::int64_t> pool_cpu_ns() {
  std::int64_t (*read)(clockid_t) = [](clockid_t c) -> std::int64_t {
    timespec ts;
    if (clock_gettime(c, &ts) != 0) return -1;
    return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  };
  std::vector<std::int64_t> out{read(CLOCK_THREAD_CPUTIME_ID)};
  if (std::shared_ptr<Pool> pool = get_pool())
    for (std::int64_t v : pool->cpu_ns(read)) out.push_back(v);
  return out;
}

AlignedBuf& tl_buf(int slot) {
  thread_local AlignedBuf bufs[TL_NSLOTS];
  return bufs[slot];
}

}  // namespace hetero
