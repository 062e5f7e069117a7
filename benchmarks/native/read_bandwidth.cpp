// Read-bandwidth probe: N threads of one process each stream their own buffer (first touched by that thread)
// and sum it; prints one JSON line per repetition set. The ceiling a decode step at N threads can reach.
// Built and run by benchmarks/read_bandwidth.py (g++ -O3, no -march flags: 16-byte loads, 8 independent sums,
// are enough to keep a core's misses in flight; the prefetchers do the rest). PAGES: 4k (the allocator's ordinary
// pages) or 2m (2 MiB-aligned buffers that ask Linux for transparent huge pages, as hetero's repacked weights do:
// fewer TLB misses, which cost a two-level page walk under a hypervisor).
//   read_bandwidth THREADS MIB_PER_THREAD REPS [PAGES]
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_threads.hpp"

namespace {

std::uint64_t sum_buffer(const std::uint64_t* p, std::size_t n) {
  std::uint64_t s[8] = {};
  for (std::size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[i + j];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

double cpu_seconds() {  // this thread's CPU time: on a shared machine, the pass without the time it was descheduled
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s THREADS MIB_PER_THREAD REPS [4k|2m]\n", argv[0]);
    return 2;
  }
  const bool huge = argc == 5 && std::strcmp(argv[4], "2m") == 0;
  const int nt = std::atoi(argv[1]), reps = std::atoi(argv[3]);
  const std::size_t words = static_cast<std::size_t>(std::atol(argv[2])) * (1u << 20) / 8;
  if (nt < 1 || reps < 1 || words < 8) return 2;
  bench::Barrier barrier(nt);
  bench::PassClock clock(nt, reps);
  std::vector<double> cpu(static_cast<std::size_t>(reps), 0.0);  // the slowest thread's
  std::mutex cpu_mu;
  std::atomic<std::uint64_t> sink{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < nt; ++t)
    threads.emplace_back([&, t] {
      auto* buf = static_cast<std::uint64_t*>(bench::page_alloc(words * 8, huge));
      for (std::size_t i = 0; i < words; ++i) buf[i] = static_cast<std::uint64_t>(t) + 1;  // first touch: this thread
      for (int r = 0; r < reps; ++r) {
        barrier.wait();
        clock.start(t, r);
        const double c0 = cpu_seconds();
        sink.fetch_add(sum_buffer(buf, words), std::memory_order_relaxed);
        const double c1 = cpu_seconds() - c0;
        clock.end(t, r);
        {
          std::lock_guard<std::mutex> lock(cpu_mu);
          cpu[static_cast<std::size_t>(r)] = std::max(cpu[static_cast<std::size_t>(r)], c1);
        }
        barrier.wait();
      }
      std::free(buf);
    });
  for (auto& th : threads) th.join();
  std::printf("{\"threads\": %d, \"bytes_per_pass\": %.0f, \"seconds\": [", nt, 8.0 * words * nt);
  for (int r = 0; r < reps; ++r) std::printf("%s%.6f", r ? ", " : "", clock.seconds(r));
  std::printf("], \"cpu_seconds\": [");
  for (int r = 0; r < reps; ++r) std::printf("%s%.6f", r ? ", " : "", cpu[static_cast<std::size_t>(r)]);
  std::printf("], \"checksum\": %llu}\n", static_cast<unsigned long long>(sink.load()));
  return 0;
}
