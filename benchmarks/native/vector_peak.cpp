// One core's issue rate of the 512-bit multiply-adds the GEMMs are made of: vpdpbusd (u8 x s8, 64 MACs) and
// vfmadd (fp32, 16 MACs), each as 16 independent accumulators (more than latency x throughput on any x86 core, so
// the rate is the ports', not a chain's), nothing else in the loop. The ceiling benchmarks/gemm_peak.py sets a
// GEMM's GMAC/s against. Thread CPU time (on a shared machine: without the time the thread was descheduled).
// Built by benchmarks/gemm_peak.py with -mavx512f -mavx512bw -mavx512vnni, run only where the CPU has them.
//   vector_peak ITERATIONS REPS
// prints one JSON line: {"dpbusd_per_s": [...], "fma_per_s": [...]} (instructions a second, one per rep)
#include <immintrin.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

volatile double g_sink = 0;

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The multiply-adds timed, as one interface: a vector type, a starting value per accumulator, the operands, the
// instruction, and the reduction that makes the sums observable.
struct Dpbusd {
  using V = __m512i;
  static V start(int i) { return _mm512_set1_epi32(i); }
  static V a() { return _mm512_set1_epi32(0x01010101); }
  static V b() { return _mm512_set1_epi32(0x02020202); }
  static V step(V c, V a, V b) { return _mm512_dpbusd_epi32(c, a, b); }
  static double total(V s) { return static_cast<double>(_mm512_reduce_add_epi32(s)); }
};

struct Fma {
  using V = __m512;
  static V start(int i) { return _mm512_set1_ps(static_cast<float>(i)); }
  static V a() { return _mm512_set1_ps(0.999f); }  // bounded sums: no overflow, no subnormals
  static V b() { return _mm512_set1_ps(1e-3f); }
  static V step(V c, V a, V b) { return _mm512_fmadd_ps(c, a, b); }
  static double total(V s) { return static_cast<double>(_mm512_reduce_add_ps(s)); }
};

// Instructions a second: 16 accumulators with different starting values (equal chains would be computed once),
// fully unrolled so each stays in a register.
template <class Op>
double peak_rate(long iterations) {
  using V = typename Op::V;
  V c[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) c[j] = Op::start(j);
  V a = Op::a();
  const V b = Op::b();
  const double t0 = cpu_seconds();
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) c[j] = Op::step(c[j], a, b);
    __asm__("" : "+v"(a));  // keeps the operand a register the compiler cannot prove constant (no folding, hoisting)
  }
  const double t = cpu_seconds() - t0;
  double sum = 0;
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) sum += Op::total(c[j]);
  g_sink = g_sink + sum;  // the sums are used: nothing is dead code
  return 16.0 * static_cast<double>(iterations) / t;
}

std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: vector_peak ITERATIONS REPS\n");
    return 2;
  }
  const long iterations = std::atol(argv[1]);
  const int reps = std::atoi(argv[2]);
  std::vector<double> dp, fm;
  for (int r = 0; r < reps; ++r) {  // alternated: a neighbour's load falls on both alike
    dp.push_back(peak_rate<Dpbusd>(iterations));
    fm.push_back(peak_rate<Fma>(iterations));
  }
  std::printf("{\"dpbusd_per_s\": %s, \"fma_per_s\": %s}\n", json_list(dp).c_str(), json_list(fm).c_str());
  return 0;
}
