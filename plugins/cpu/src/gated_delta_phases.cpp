// Per-phase profile of the chunked gated delta rule (gated_delta_impl.hpp's chunk()), a developer tool: not part of
// the plugin build. It defines the GD_PHASE hook to add up each phase's thread CPU time (immune to time slices lost
// to other processes, not to a busy sibling hyperthread), runs Hv heads x T positions on one thread, and prints
// the medians over the repetitions in µs per head and chunk, then the chunked and recurrent totals. Build for one
// ISA with that file's flags, e.g. from plugins/cpu:
//
//   g++ -O3 -std=gnu++17 -fno-math-errno -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma
//       src/gated_delta_phases.cpp -o /tmp/gd_phases && /tmp/gd_phases [gate] [dk]
//
// gate: scale of the per-token log gates (default 3: Qwen3.5-like, cumulative gates far below -87 within a chunk);
// dk: head size (default 128, dv = dk). The window is allocated on huge pages when the kernel allows (numpy does
// the same for large arrays), since 4 KiB pages make every window row a TLB miss.
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {
unsigned long long g_last, g_acc[8];
unsigned long long cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}
}  // namespace

#define GD_PHASE(i)                \
  do {                             \
    unsigned long long n = cpu_ns(); \
    g_acc[(i)] += n - g_last;      \
    g_last = n;                    \
  } while (0)
#include "gated_delta_impl.hpp"

using namespace hetero::gd;

int main(int argc, char** argv) {
  const float gate = argc > 1 ? static_cast<float>(std::atof(argv[1])) : 3.f;
  const i64 d = argc > 2 ? std::atoi(argv[2]) : 128;
  const i64 T = 512, hk = 16, hv = 16, C = 2 * hk * d + hv * d, K = 4, CH = 64, reps = 15;
  const char* names[7] = {"conv + SiLU + L2 norm, gates, K^T", "K K^T, Q K^T (lower)", "decay masks",
                          "(b e^G K) S, (e^G Q) S", "triangular solve", "P U + gated norm", "state update"};
  const std::size_t wbytes = ((static_cast<std::size_t>((T + K - 1) * C) * 4 >> 21) + 1) << 21;
  float* win = static_cast<float*>(std::aligned_alloc(1 << 21, wbytes));
  madvise(win, wbytes, MADV_HUGEPAGE);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> taps(K * C), g(T * hv), beta(T * hv), z(T * hv * d), nw(d, 1.f), state(hv * d * d),
      out(T * hv * d);
  for (i64 i = 0; i < (T + K - 1) * C; ++i) win[i] = nd(rng);
  for (auto& v : taps) v = 0.5f * nd(rng);
  for (auto& v : g) v = -std::fabs(nd(rng)) * gate;
  for (auto& v : beta) v = 1.f / (1.f + std::exp(-nd(rng)));
  for (auto& v : z) v = nd(rng);
  Problem p{};
  p.T = T, p.hk = hk, p.hv = hv, p.dk = d, p.dv = d, p.kernel = K, p.window = win, p.z = z.data();
  p.norm_w = nw.data(), p.state = state.data(), p.out = out.data(), p.scale = 1.f / std::sqrt(static_cast<float>(d));
  p.l2norm = p.conv_silu = true, p.l2_eps = p.norm_eps = 1e-6f;
  std::vector<float> scratch(4 * CH * d + 4 * CH * d + 2 * CH * CH + 1024);
  const FlushDenormals ftz;
  static_cast<void>(&head_impl);  // (the plugin's entry; the phases call chunk() / recurrent() directly)
  for (i64 chunk_size : {CH, i64{0}}) {
    p.chunk = chunk_size, p.first = chunk_size ? chunk_size : 1;
    std::vector<std::vector<double>> phase(7);
    std::vector<double> total;
    for (int rep = 0; rep < reps; ++rep) {
      std::fill(state.begin(), state.end(), 0.f);
      unsigned long long before[8];
      std::copy(g_acc, g_acc + 8, before);
      const unsigned long long t0 = cpu_ns();
      for (i64 h = 0; h < hv; ++h) {
        HeadArgs a{&p, taps.data(), g.data(), beta.data(), h, scratch.data()};
        if (!chunk_size) recurrent(a, 0, T);
        for (i64 t = 0; chunk_size && t < T; t += CH) {
          g_last = cpu_ns();
          chunk(a, t, CH);
        }
      }
      total.push_back((cpu_ns() - t0) * 1e-9);
      for (int i = 0; i < 7; ++i) phase[i].push_back((g_acc[i] - before[i]) * 1e-3 / (hv * T / CH));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    if (chunk_size)
      for (int i = 0; i < 7; ++i) std::printf("%-36s %7.1f us per head-chunk\n", names[i], median(phase[i]));
    std::printf("%s: %.0f tokens/s (%lld heads of %lld, 1 thread, median of %lld)\n",
                chunk_size ? "chunked" : "recurrent", T / median(total), static_cast<long long>(hv),
                static_cast<long long>(d), static_cast<long long>(reps));
  }
  std::free(win);
}
