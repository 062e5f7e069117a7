// fp32 GEMM register tiles alone, hot in cache: the shapes issue 17 asked about for PP-LCNet's 1x1 convs (K = 128-512,
// N = 240-400 columns, M = 256-512 rows) against the plugin's 12 x 32 tile (onnx_impl.hpp x_conv_tile_t: per k,
// NRV vector loads of B, MR broadcasts of A, MR x NRV FMAs; bias-free HardSwish in registers before the stores).
// A model of that kernel (the same loop, written here), not the plugin's code: it asks whether another tile shape or
// FMAs with A broadcast from memory ({1to16} operands, no broadcast register) would run closer to the FMA peak.
// The conv's loop order: column panels of B (K x 32 packed) outside, row panels of A (K x MR packed) inside, 4 images.
// Thread CPU time, the best of 15 passes (on a shared machine a neighbour only ever subtracts). AVX-512 only.
//   g++ -O3 -mavx512f -mfma benchmarks/native/fp32_tile_shapes.cpp -o /tmp/fp32_tile_shapes
//   /tmp/fp32_tile_shapes M K N      (e.g. 256 256 400, 512 512 240)
// One line a variant: ms, GFLOP/s on the M x N x K asked and on the padded tiles (the tile's own rate).
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using i64 = long long;
using V = __m512;
constexpr int W = 16;

double thread_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// c[r][j] = hardswish(sum_k a[k * MR + r] * b[off[k] + j]); BCST: each FMA takes A's value as a {1to16} memory operand
template <int MR, int NRV, bool BCST>
__attribute__((noinline)) void tile(i64 K, const float* a, const float* b, const i64* off, float* c, i64 ldc) {
  V acc[MR][NRV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NRV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (i64 k = 0; k < K; ++k) {
    const float* bp = b + off[k];
    V bv[NRV];
    for (int v = 0; v < NRV; ++v) bv[v] = _mm512_loadu_ps(bp + v * W);
    const float* ak = a + k * MR;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      if constexpr (BCST) {
        for (int v = 0; v < NRV; ++v)
          __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc[r][v]) : "v"(bv[v]), "m"(ak[r]));
      } else {
        const V ar = _mm512_set1_ps(ak[r]);
        for (int v = 0; v < NRV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
      }
    }
  }
  const V three = _mm512_set1_ps(3.f), six = _mm512_set1_ps(6.f), sixth = _mm512_set1_ps(1.f / 6);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NRV; ++v) {
      const V x = acc[r][v];
      const V t = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(x, three), _mm512_setzero_ps()), six);
      _mm512_storeu_ps(c + r * ldc + v * W, _mm512_mul_ps(_mm512_mul_ps(x, t), sixth));
    }
}

template <int MR, int NRV, bool BCST>
void run(int M, int K, int N) {
  constexpr int NR = NRV * W;
  const int mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
  std::vector<float> a(static_cast<size_t>(mp) * MR * K), b(static_cast<size_t>(np) * NR * K);
  std::vector<float> c(static_cast<size_t>(mp) * MR * np * NR);
  for (float& x : a) x = static_cast<float>(rand() % 100) / 100.f - 0.5f;
  for (float& x : b) x = static_cast<float>(rand() % 100) / 100.f - 0.5f;
  std::vector<i64> off(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) off[static_cast<size_t>(k)] = static_cast<i64>(k) * NR;
  const i64 ldc = static_cast<i64>(np) * NR;
  double best = 1e30;
  for (int rep = 0; rep < 15; ++rep) {
    const double t0 = thread_seconds();
    for (int img = 0; img < 4; ++img)
      for (int j = 0; j < np; ++j)
        for (int r = 0; r < mp; ++r)
          tile<MR, NRV, BCST>(K, a.data() + static_cast<size_t>(r) * MR * K, b.data() + static_cast<size_t>(j) * NR * K,
                              off.data(), c.data() + static_cast<size_t>(r) * MR * ldc + j * NR, ldc);
    best = std::min(best, thread_seconds() - t0);
  }
  const double flops = 2.0 * 4 * M * N * K, padded = 2.0 * 4 * mp * MR * np * NR * K;
  std::printf("%2d x %2d%s  M=%d K=%d N=%d: %.3f ms  %.1f GFLOP/s (padded tiles %.1f)\n", MR, NR,
              BCST ? " bcst" : "     ", M, K, N, best * 1e3, flops / best / 1e9, padded / best / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: fp32_tile_shapes M K N\n");
    return 2;
  }
  const int M = std::atoi(argv[1]), K = std::atoi(argv[2]), N = std::atoi(argv[3]);
  run<12, 2, false>(M, K, N);  // the plugin's tile
  run<12, 2, true>(M, K, N);
  run<14, 2, false>(M, K, N);
  run<8, 3, false>(M, K, N);
  run<6, 4, false>(M, K, N);
  run<6, 4, true>(M, K, N);
  return 0;
}
