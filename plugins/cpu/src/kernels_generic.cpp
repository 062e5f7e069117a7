// Portable kernels (plain C++, left to the compiler's baseline auto-vectorisation). Always available; also the
// reference path the tests force with set_isa("generic").
#include "simd_generic.hpp"
#include "kernels_impl.hpp"

namespace {

constexpr int MR = 4;
constexpr int NR = 16;

void ukernel(i64 kc, const float* a, const float* b, float* c, i64 ldc, float alpha, float beta) {
  float acc[MR][NR] = {};
  for (i64 k = 0; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      const float ai = a[i];
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[j];
    }
    a += MR;
    b += NR;
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float* p = c + i * ldc + j;
      *p = beta == 0.f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * *p;
    }
}

const hetero::Kernels table = {
    "generic", MR, NR, /*kc*/ 256, /*mc*/ 64, /*nc*/ 1024,
    ukernel, k_smallm<NR>, k_gemv_panels<NR>, k_gemv_rows, k_gemv_dot, k_unary, k_binary, k_softmax_row, k_layernorm_row,
    k_rmsnorm_row, k_axpby, k_dw_row_accum, k_add_tanh_quantize_row, nullptr,
};

}  // namespace

namespace hetero {
const Kernels* kernels_generic() { return &table; }
#if !(defined(__x86_64__) || defined(_M_X64))
const Kernels* kernels_avx2() { return nullptr; }
const Kernels* kernels_avx512() { return nullptr; }
#endif
#if !defined(__aarch64__)
const Kernels* kernels_neon() { return nullptr; }
#endif
}  // namespace hetero
