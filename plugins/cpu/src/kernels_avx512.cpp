// AVX-512F kernels. Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mfma (see CMakeLists.txt); only
// reached after isa.cpp has checked __builtin_cpu_supports("avx512f").
#include "simd_avx512.hpp"
#include "kernels_impl.hpp"
#include "ukernel_store.hpp"

namespace {

constexpr int MR = 12;   // 12 x 2 zmm accumulators + 2 B vectors + 1 broadcast = 27 of 32 registers
constexpr int NRV = 2;   // NR = 32 floats
constexpr int NR = NRV * 16;

// C tile (12 x 32) += A panel (kc x 12, k-major) x B panel (kc x 32, k-major).
void ukernel(i64 kc, const float* a, const float* b, float* c, i64 ldc, float alpha, float beta) {
  V acc[MR][NRV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NRV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int i = 0; i < MR; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
  // Without this barrier GCC keeps the twelve row addresses of C from the prefetches live through the k loop (for
  // store_tile): out of general registers, it parks them in zmm28-31 and spills b1 to the stack, so every other FMA
  // reads its B operand from memory (the loop ran at ~60 % of the FMA rate). Hiding c's value here makes it
  // recompute the addresses after the loop.
  asm volatile("" : "+r"(c));
  for (i64 k = 0; k < kc; ++k) {
    const V b0 = _mm512_loadu_ps(b);
    const V b1 = _mm512_loadu_ps(b + 16);
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * MR), _MM_HINT_T0);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const V ai = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += MR;
    b += NR;
  }
  store_tile<MR, NRV>(acc, c, ldc, alpha, beta);
}

const hetero::Kernels table = {
    "avx512", MR, NR, /*kc*/ 256, /*mc*/ 144, /*nc*/ 1024,
    ukernel, k_smallm<NRV>, k_gemv_panels<NRV>, k_gemv_rows, k_gemv_dot, k_unary, k_binary, k_softmax_row, k_layernorm_row,
    k_rmsnorm_row, k_axpby, k_dw_row_accum, k_add_tanh_quantize_row,
};

}  // namespace

namespace hetero {
const Kernels* kernels_avx512() { return &table; }
}  // namespace hetero
