// AVX-512 (F/BW/DQ/VL) traits of the LLM kernels (16 lanes): the float traits of simd_avx512.hpp plus the byte,
// int8-dot and half-precision primitives llm_impl.hpp needs. Included by llm_kernels_avx512.cpp and, through
// llm_simd_avx512vnni.hpp, by llm_kernels_avx512vnni.cpp.
#pragma once
#include <cmath>
#include <cstring>

#include "simd_avx512.hpp"
#include "llm.hpp"

namespace {
struct LlmSimd : SIMD {
  using B = __m512i;
  static constexpr int QGEMM_MR = 8;  // 32 zmm registers
  static constexpr int QGEMM_ROWS = QGEMM_MR;  // x rows per qgemm_group call (the table's max_mr)
  static constexpr int FGEMM_MR = 4;
  static constexpr int QK_NR = 4;
  static constexpr int PV_VECS = 4;
  static constexpr bool DOT_U8 = false;  // as AVX2: dot4 needs weights <= 63
  static constexpr int Q8_SHIFT = 128;

  static __mmask16 tail_mask(hetero::i64 left) {
    return left >= 16 ? static_cast<__mmask16>(0xffff) : (left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1));
  }
  static V load_n(const float* p, hetero::i64 n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void store_n(float* p, V v, int n) { _mm512_mask_storeu_ps(p, tail_mask(n), v); }
  static V load_f16(const void* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p))); }
  static void store_f16(std::uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static V load_bf16(const std::uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V load_u8(const std::uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static V load_i8(const std::int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }

  // d * p[i] (16 u8 scales, one rounding) in two operations instead of three (vpmovzxbd, vcvtdq2ps, vmulps): the
  // bytes shuffled into the low byte of floats 2^23 (bits 0x4B000000: 2^23 + p[i] exactly, the 16 bytes broadcast
  // to each 128-bit lane by the load), then fmsub(2^23 + p[i], d, d23) with d23 = d * 2^23: the fused product is
  // exact, so the one rounding is that of d * p[i] (for finite d; a zero product is +0 either way, see
  // llm_impl.hpp's u8_scaled).
  static constexpr bool U8_SCALED = true;
  static V u8_scaled(const std::uint8_t* p, V d, V d23) {
    const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i idx = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);  // byte 4j: j
    const __m512i f = _mm512_mask_shuffle_epi8(_mm512_set1_epi32(0x4B000000), 0x1111111111111111ull, b, idx);
    return _mm512_fmsub_ps(_mm512_castsi512_ps(f), d, d23);
  }
  static I load_u8_i32(const std::uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I load_i8_i32(const std::uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I imul(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I iclamp(I a, std::int32_t lim) {
    return _mm512_max_epi32(_mm512_min_epi32(a, _mm512_set1_epi32(lim)), _mm512_set1_epi32(-lim));
  }
  static std::int32_t ihsum(I v) { return _mm512_reduce_add_epi32(v); }
  static void store_i8(std::int8_t* p, I v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(v));
  }

  static B load_b(const std::uint8_t* p) { return _mm512_loadu_si512(p); }
  static B bcast4(const std::int8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  // v kept in a register: GCC would otherwise fold its load into each of the two nibble masks (vpandd m512), and
  // a second 64-byte load per step costs more than the register (measured: the load ports bound M = 1).
  static B opaque(B v) {
    asm("" : "+v"(v));
    return v;
  }
  static B bset8(std::uint8_t v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static B band(B a, B b) { return _mm512_and_si512(a, b); }
  static B bor(B a, B b) { return _mm512_or_si512(a, b); }
  static B bandnot(B a, B b) { return _mm512_andnot_si512(a, b); }  // ~a & b
  static B bsll16(B a, int n) { return _mm512_slli_epi16(a, static_cast<unsigned>(n)); }
  static B bsrl16(B a, int n) { return _mm512_srli_epi16(a, static_cast<unsigned>(n)); }
  static B bsrl4(B a) { return _mm512_srli_epi16(a, 4); }

  static I dot4(I acc, B w, B x) {  // w <= 63
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
  }
  static I dot4x2(I acc, B w1, B x1, B w2, B x2) {  // w <= 31
    const __m512i p = _mm512_add_epi16(_mm512_maddubs_epi16(w1, x1), _mm512_maddubs_epi16(w2, x2));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_set1_epi16(1)));
  }
  // int16 accumulation (llm_qgemm_rows.hpp): acc += vpmaddubsw(w, x), wrapping adds the caller keeps in range
  static constexpr bool ACC16 = true;
  static B dot16(B acc, B w, B x) { return _mm512_add_epi16(acc, _mm512_maddubs_epi16(w, x)); }
  static I widen16(B acc) { return _mm512_madd_epi16(acc, _mm512_set1_epi16(1)); }
  // 8-bit weights as in llm_simd_avx2.hpp, with a byte mask for the sign.
  struct Q8 {
    B aw;
    __mmask64 neg;
  };
  static Q8 q8_weights(B w) {
    const __m512i sw = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
    return {_mm512_abs_epi8(sw), _mm512_movepi8_mask(sw)};
  }
  static I dot_q8(I acc, const Q8& w, B x) {
    const __m512i sx = _mm512_mask_sub_epi8(x, w.neg, _mm512_setzero_si512(), x);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w.aw, sx), _mm512_set1_epi16(1)));
  }
  // always inlined: out of line, GCC deletes the calls (no side effects; see llm_impl.hpp, prefetch_record)
  [[gnu::always_inline]] static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  [[gnu::always_inline]] static void prefetch_l2(const void* p) {  // not into L1
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
  }
};
}  // namespace
