// AVX-512 VNNI traits of the LLM kernels: the AVX-512 ones with every int8 dot one vpdpbusd (unsigned weight
// bytes as stored, so 8-bit weights need no shift). Only included by llm_kernels_avx512vnni.cpp (-mavx512vnni).
#pragma once
#include "llm_simd_avx512.hpp"

namespace {
struct LlmSimdVnni : LlmSimd {
  // x rows per qgemm_group call: 9-16 in one wide tile (llm_impl.hpp, qgemm_wide), a verify step's rows at once
  static constexpr int QGEMM_ROWS = 16;
  static constexpr bool DOT_U8 = true;  // vpdpbusd: dot4 takes any unsigned bytes (products summed in int32)
  static constexpr int Q8_SHIFT = 0;
  static constexpr bool ACC16 = false;  // vpdpbusd accumulates int32 directly: qgemm_mr for every tile
  static I dot4(I acc, B w, B x) { return _mm512_dpbusd_epi32(acc, w, x); }
  static I dot4x2(I acc, B w1, B x1, B w2, B x2) { return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, w1, x1), w2, x2); }
  struct Q8 {
    B w;
  };
  static Q8 q8_weights(B w) { return {w}; }
  static I dot_q8(I acc, const Q8& w, B x) { return _mm512_dpbusd_epi32(acc, w.w, x); }
  // dot4 with the 4 activation bytes at p broadcast by the dot's own memory operand (m32{1to16}): GCC keeps
  // _mm512_set1_epi32 a separate vpbroadcastd, which takes a vector ALU slot on Zen 4 -- one per dot, as many as the
  // dots themselves in a one-row tile.
  static constexpr bool DOT_AT = true;
  static I dot4_at(I acc, B w, const std::int8_t* p) {
    asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const std::int8_t(*)[4]>(p)));
    return acc;
  }
  static I dot_q8_at(I acc, const Q8& w, const std::int8_t* p) { return dot4_at(acc, w.w, p); }
  // k-quant activations with one scale per super-block (LlmKernels::k_super): a super-block's scaled int32 dots are
  // summed in integer and converted once (llm_impl.hpp, BlockScales::add_int, super_end) -- per block, the scale
  // conversions, the activation scale's multiply and the float FMAs were ~10 of a q4_k record's ~26 vector
  // operations (~5 now, plus one vpdpwssd for the mins).
  static constexpr bool K_SUPER = true;
  // acc + a * b per int32 lane, a's and b's values in their low int16 halves (|.| < 2^15) and a's high halves zero:
  // vpdpwssd (a's zero high half drops b's). dot_i16_at takes b as the int32 at p, broadcast by the memory operand.
  static I dot_i16(I acc, I a, I b) { return _mm512_dpwssd_epi32(acc, a, b); }
  static I dot_i16_at(I acc, I a, const std::int32_t* p) {
    asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*p));
    return acc;
  }
};
}  // namespace
