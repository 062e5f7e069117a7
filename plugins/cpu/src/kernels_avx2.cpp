// AVX2 + FMA kernels. Compiled with -mavx2 -mfma; only reached after isa.cpp has checked the CPU.
#include "simd_avx2.hpp"
#include "kernels_impl.hpp"
#include "ukernel_store.hpp"

namespace {

constexpr int MR = 6;    // 6 x 2 ymm accumulators + 2 B vectors + 1 broadcast = 15 of 16 registers
constexpr int NRV = 2;   // NR = 16 floats
constexpr int NR = NRV * 8;

void ukernel(i64 kc, const float* a, const float* b, float* c, i64 ldc, float alpha, float beta) {
  V acc[MR][NRV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NRV; ++v) acc[i][v] = _mm256_setzero_ps();
  for (int i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
  for (i64 k = 0; k < kc; ++k) {
    const V b0 = _mm256_loadu_ps(b);
    const V b1 = _mm256_loadu_ps(b + 8);
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * MR), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const V ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += MR;
    b += NR;
  }
  store_tile<MR, NRV>(acc, c, ldc, alpha, beta);
}

const hetero::Kernels table = {
    "avx2", MR, NR, /*kc*/ 256, /*mc*/ 120, /*nc*/ 1024,
    ukernel, k_smallm<NRV>, k_gemv_panels<NRV>, k_gemv_rows, k_gemv_dot, k_unary, k_binary, k_softmax_row, k_layernorm_row,
    k_rmsnorm_row, k_axpby, k_dw_row_accum, k_add_tanh_quantize_row, nullptr,
};

}  // namespace

namespace hetero {
const Kernels* kernels_avx2() { return &table; }
}  // namespace hetero
