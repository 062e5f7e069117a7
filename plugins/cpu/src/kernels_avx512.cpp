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

// Kernels::lstm_q_pair (common.hpp's LstmQPair). A batch-1 step tile of an int8 LSTM reads R (4H x H bytes) from L2
// at Zen 4's ~32 B a cycle with vpdpbusd half idle; the other direction's cell work placed between the tile's items
// runs in those idle cycles (issued as separate kernel calls it did not overlap: the out-of-order window holds one
// item's loads, not a call's). The tile is the qlinear avx512vnni 1 x 4 tile; the cells repeat, value for value,
// finish_f32_row's float32(corrected sum) * col, the binary add of the input side, k_unary's vsigmoid / vtanh and
// rnn.cpp's cell update and h = o * tanh(c) (each product and sum rounded alone: the barriers keep GCC from fusing
// them into FMAs, which the unfused path does not use).
inline V keep(V v) {
  __asm__("" : "+v"(v));
  return v;
}

__attribute__((target("avx512vnni"))) void k_lstm_q_pair(const hetero::LstmQPair& a) {
  const i64 H = a.H, blocks = a.raw_in ? (a.units ? a.units : H) / 16 : 0, items = a.hq ? a.panels / 4 : 0;
  const __m512i za = _mm512_set1_epi32(a.za);
  const __m512i rr = _mm512_set1_epi32(static_cast<std::int32_t>(static_cast<std::uint32_t>(a.rowsum) -
                                                                 static_cast<std::uint32_t>(a.K) *
                                                                     static_cast<std::uint32_t>(a.za)));
  // gate q's pre-activation for units j..j+15: float32(raw - za colsum - zb rr) * col + xw
  auto gate = [&](i64 q, i64 j) {
    const i64 n = q * H + j;
    __m512i v = _mm512_loadu_si512(a.raw_in + n);
    v = _mm512_sub_epi32(v, _mm512_mullo_epi32(za, _mm512_loadu_si512(a.colsum + n)));
    v = _mm512_sub_epi32(v, _mm512_mullo_epi32(_mm512_loadu_si512(a.zb + n), rr));
    const V f = keep(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_loadu_ps(a.col + n)));
    return keep(_mm512_add_ps(f, _mm512_loadu_ps(a.xw + n)));
  };
  auto cell = [&](i64 blk) {
    const i64 j = blk * 16;
    const V gi = keep(vsigmoid(gate(0, j)));
    const V gf = keep(vsigmoid(gate(2, j)));
    const V gc = keep(vtanh(gate(3, j)));
    const V t1 = keep(_mm512_mul_ps(gf, _mm512_loadu_ps(a.c + j)));
    const V t2 = keep(_mm512_mul_ps(gi, gc));
    const V c = keep(_mm512_add_ps(t1, t2));
    _mm512_storeu_ps(a.c + j, c);
    const V go = keep(vsigmoid(gate(1, j)));
    const V th = keep(vtanh(c));
    const V h = _mm512_mul_ps(go, th);
    _mm512_storeu_ps(a.h + j, h);
    if (a.y) _mm512_storeu_ps(a.y + j, h);
  };
  const i64 n = std::max(items, blocks);
  for (i64 e = 0; e < n; ++e) {
    if (e < blocks) cell(e);  // before the item's loads (measured: no better in the middle of its k loop)
    if (e >= items) continue;
    const std::int8_t* b = a.b + 4 * e * a.pstride;
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
    for (i64 g = 0; g < a.k4; ++g) {
      const std::int8_t* bg = b + g * 64;
      std::int32_t a4;
      std::memcpy(&a4, a.hq + 4 * g, 4);
      const __m512i av = _mm512_set1_epi32(a4);
      c0 = _mm512_dpbusd_epi32(c0, av, _mm512_load_si512(bg));
      c1 = _mm512_dpbusd_epi32(c1, av, _mm512_load_si512(bg + a.pstride));
      c2 = _mm512_dpbusd_epi32(c2, av, _mm512_load_si512(bg + 2 * a.pstride));
      c3 = _mm512_dpbusd_epi32(c3, av, _mm512_load_si512(bg + 3 * a.pstride));
    }
    std::int32_t* o = a.raw_out + e * 64;
    _mm512_storeu_si512(o, c0);
    _mm512_storeu_si512(o + 16, c1);
    _mm512_storeu_si512(o + 32, c2);
    _mm512_storeu_si512(o + 48, c3);
  }
}

const hetero::Kernels table = {
    "avx512", MR, NR, /*kc*/ 256, /*mc*/ 144, /*nc*/ 1024,
    ukernel, k_smallm<NRV>, k_gemv_panels<NRV>, k_gemv_rows, k_gemv_dot, k_unary, k_binary, k_softmax_row, k_layernorm_row,
    k_rmsnorm_row, k_axpby, k_dw_row_accum, k_add_tanh_quantize_row, k_lstm_q_pair,
};

}  // namespace

namespace hetero {
const Kernels* kernels_avx512() { return &table; }
}  // namespace hetero
