// AArch64 NEON kernels (compiled only when CMAKE_SYSTEM_PROCESSOR is aarch64/arm64).
#include "simd_neon.hpp"
#include "kernels_impl.hpp"
#include "ukernel_store.hpp"

namespace {

constexpr int MR = 8;    // 8 x 3 q-register accumulators + 3 B + 2 A = 29 of 32 registers
constexpr int NRV = 3;   // NR = 12 floats
constexpr int NR = NRV * 4;

template <int L>
inline void row_fma(V (&acc)[MR][NRV], int i, float32x4_t av, const V& b0, const V& b1, const V& b2) {
  acc[i][0] = vfmaq_laneq_f32(acc[i][0], b0, av, L);
  acc[i][1] = vfmaq_laneq_f32(acc[i][1], b1, av, L);
  acc[i][2] = vfmaq_laneq_f32(acc[i][2], b2, av, L);
}

void ukernel(i64 kc, const float* a, const float* b, float* c, i64 ldc, float alpha, float beta) {
  V acc[MR][NRV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NRV; ++v) acc[i][v] = vdupq_n_f32(0.f);
  for (i64 k = 0; k < kc; ++k) {
    const V b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8);
    const float32x4_t a0 = vld1q_f32(a), a1 = vld1q_f32(a + 4);
    // Lane-indexed FMAs take the A value straight from the vector register: no broadcasts needed.
    row_fma<0>(acc, 0, a0, b0, b1, b2);
    row_fma<1>(acc, 1, a0, b0, b1, b2);
    row_fma<2>(acc, 2, a0, b0, b1, b2);
    row_fma<3>(acc, 3, a0, b0, b1, b2);
    row_fma<0>(acc, 4, a1, b0, b1, b2);
    row_fma<1>(acc, 5, a1, b0, b1, b2);
    row_fma<2>(acc, 6, a1, b0, b1, b2);
    row_fma<3>(acc, 7, a1, b0, b1, b2);
    a += MR;
    b += NR;
  }
  store_tile<MR, NRV>(acc, c, ldc, alpha, beta);
}

const hetero::Kernels table = {
    "neon", MR, NR, /*kc*/ 256, /*mc*/ 128, /*nc*/ 1024,
    ukernel, k_smallm<NRV>, k_gemv_panels<NRV>, k_gemv_rows, k_gemv_dot, k_unary, k_binary, k_softmax_row, k_layernorm_row,
    k_rmsnorm_row, k_axpby, k_dw_row_accum, k_add_tanh_quantize_row, nullptr,
};

}  // namespace

namespace hetero {
const Kernels* kernels_neon() { return &table; }
}  // namespace hetero
