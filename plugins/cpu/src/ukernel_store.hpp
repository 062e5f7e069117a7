// Shared tail of the register-blocked micro-kernels: write the MR x NRV accumulator tile back to C as
// c = alpha * acc + beta * c. Included by the ISA files after their traits header.
#pragma once

namespace {

template <int MR, int NRV>
inline void store_tile(V (&acc)[MR][NRV], float* c, hetero::i64 ldc, float alpha, float beta) {
  const V va = SIMD::set1(alpha);
  if (beta == 0.f) {
    if (alpha == 1.f) {
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < NRV; ++v) SIMD::store(c + i * ldc + v * W, acc[i][v]);
    } else {
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < NRV; ++v) SIMD::store(c + i * ldc + v * W, SIMD::mul(va, acc[i][v]));
    }
  } else if (beta == 1.f) {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int v = 0; v < NRV; ++v) {
        float* p = c + i * ldc + v * W;
        SIMD::store(p, SIMD::fma(va, acc[i][v], SIMD::load(p)));
      }
  } else {
    const V vb = SIMD::set1(beta);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int v = 0; v < NRV; ++v) {
        float* p = c + i * ldc + v * W;
        SIMD::store(p, SIMD::fma(va, acc[i][v], SIMD::mul(vb, SIMD::load(p))));
      }
  }
}

}  // namespace
