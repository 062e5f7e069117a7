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

// The empty asm keeps the operand a register the compiler cannot prove constant (no folding, no hoisting).
#define PEAK_STEP(OP, T, A, B)                                                                                     \
  T##0 = OP(T##0, A, B); T##1 = OP(T##1, A, B); T##2 = OP(T##2, A, B); T##3 = OP(T##3, A, B);                   \
  T##4 = OP(T##4, A, B); T##5 = OP(T##5, A, B); T##6 = OP(T##6, A, B); T##7 = OP(T##7, A, B);                   \
  T##8 = OP(T##8, A, B); T##9 = OP(T##9, A, B); T##a = OP(T##a, A, B); T##b = OP(T##b, A, B);                   \
  T##c = OP(T##c, A, B); T##d = OP(T##d, A, B); T##e = OP(T##e, A, B); T##f = OP(T##f, A, B);

double dpbusd_rate(long iterations) {
  __m512i c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, ca, cb, cc, cd, ce, cf;
  // different starting values: equal chains would be computed once
  c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2), c3 = _mm512_set1_epi32(3);
  c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5), c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7);
  c8 = _mm512_set1_epi32(8), c9 = _mm512_set1_epi32(9), ca = _mm512_set1_epi32(10), cb = _mm512_set1_epi32(11);
  cc = _mm512_set1_epi32(12), cd = _mm512_set1_epi32(13), ce = _mm512_set1_epi32(14), cf = _mm512_set1_epi32(15);
  __m512i a = _mm512_set1_epi32(0x01010101), b = _mm512_set1_epi32(0x02020202);
  const double t0 = cpu_seconds();
  for (long i = 0; i < iterations; ++i) {
    PEAK_STEP(_mm512_dpbusd_epi32, c, a, b)
    __asm__("" : "+v"(a));
  }
  const double t = cpu_seconds() - t0;
  __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                               _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
  s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(ca, cb)),
                                           _mm512_add_epi32(_mm512_add_epi32(cc, cd), _mm512_add_epi32(ce, cf))));
  g_sink = g_sink + static_cast<double>(_mm512_reduce_add_epi32(s));  // the sums are used: nothing is dead code
  return 16.0 * static_cast<double>(iterations) / t;
}

double fma_rate(long iterations) {
  __m512 c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, ca, cb, cc, cd, ce, cf;
  c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2), c3 = _mm512_set1_ps(3);
  c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5), c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7);
  c8 = _mm512_set1_ps(8), c9 = _mm512_set1_ps(9), ca = _mm512_set1_ps(10), cb = _mm512_set1_ps(11);
  cc = _mm512_set1_ps(12), cd = _mm512_set1_ps(13), ce = _mm512_set1_ps(14), cf = _mm512_set1_ps(15);
  __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);  // bounded sums: no overflow, no subnormals
  const double t0 = cpu_seconds();
  for (long i = 0; i < iterations; ++i) {
    PEAK_STEP(_mm512_fmadd_ps, c, a, b)
    __asm__("" : "+v"(a));
  }
  const double t = cpu_seconds() - t0;
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(ca, cb)),
                                     _mm512_add_ps(_mm512_add_ps(cc, cd), _mm512_add_ps(ce, cf))));
  g_sink = g_sink + static_cast<double>(_mm512_reduce_add_ps(s));
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
    dp.push_back(dpbusd_rate(iterations));
    fm.push_back(fma_rate(iterations));
  }
  std::printf("{\"dpbusd_per_s\": %s, \"fma_per_s\": %s}\n", json_list(dp).c_str(), json_list(fm).c_str());
  return 0;
}
