// AVX2 + FMA + F16C traits of the LLM kernels (8 lanes): the float traits of simd_avx2.hpp plus the byte, int8-dot
// and half-precision primitives llm_impl.hpp needs. Only included by llm_kernels_avx2.cpp (-mavx2 -mfma -mf16c).
#pragma once
#include <cmath>
#include <cstring>

#include "simd_avx2.hpp"
#include "llm.hpp"

namespace {
struct LlmSimd : SIMD {
  using B = __m256i;                // W lanes of 4 bytes (one weight row's 4 quants per lane)
  static constexpr int QGEMM_MR = 8;  // x rows per qgemm call: 5-8 rows spill some of 16 ymm registers, still
                                      // cheaper than decoding each weight block twice (verify steps of 5-8 tokens)
  static constexpr int QGEMM_ROWS = QGEMM_MR;  // x rows per qgemm_group call (the table's max_mr)
  static constexpr int FGEMM_MR = 3;  // 3 x rows x 4 weight rows: 12 accumulators + 4 weights
  static constexpr int QK_NR = 2;     // attention rows per pass of 4 key vectors: 8 accumulators + 4 keys
  static constexpr int PV_VECS = 2;   // value vectors per row and pass: 4 rows -> 8 accumulators + 2 loads
  static constexpr bool DOT_U8 = false;  // vpmaddubsw sums byte pairs in int16: dot4 needs weights <= 63
  static constexpr int Q8_SHIFT = 128;  // dot_q8 returns sum((w - 128) x)

  // ---- float loads / stores
  static __m256i tail_mask(hetero::i64 left) {  // lanes < left set (left clamped to [0, 8])
    const int n = left <= 0 ? 0 : (left >= 8 ? 8 : static_cast<int>(left));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_n(const float* p, hetero::i64 n) { return _mm256_maskload_ps(p, tail_mask(n)); }
  static void store_n(float* p, V v, int n) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else if (n > 0) _mm256_maskstore_ps(p, tail_mask(n), v);
  }
  static V load_f16(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p))); }
  static void store_f16(std::uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static V load_bf16(const std::uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V load_u8(const std::uint8_t* p) {  // W unsigned bytes as floats
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static V load_i8(const std::int8_t* p) {  // W signed bytes as floats
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  // ---- int32 lanes
  static I load_i8_i32(const std::uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I imul(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I iclamp(I a, std::int32_t lim) {  // to [-lim, lim]
    return _mm256_max_epi32(_mm256_min_epi32(a, _mm256_set1_epi32(lim)), _mm256_set1_epi32(-lim));
  }
  static std::int32_t ihsum(I v) {
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
  }
  static void store_i8(std::int8_t* p, I v) {  // W values already in [-127, 127]
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(p16, p16));
  }

  // ---- byte lanes (quantized weights)
  static B load_b(const std::uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static B bcast4(const std::int8_t* p) {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  // v kept in a register: GCC would otherwise fold its load into each of the two nibble masks (vpandd m512), and
  // a second 64-byte load per step costs more than the register (measured: the load ports bound M = 1).
  static B opaque(B v) {
    asm("" : "+v"(v));
    return v;
  }
  static B bset8(std::uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static B band(B a, B b) { return _mm256_and_si256(a, b); }
  static B bor(B a, B b) { return _mm256_or_si256(a, b); }
  static B bandnot(B a, B b) { return _mm256_andnot_si256(a, b); }  // ~a & b
  // 16-bit lane shifts: the callers mask the bits that cross a byte border.
  static B bsll16(B a, int n) { return _mm256_sll_epi16(a, _mm_cvtsi32_si128(n)); }
  static B bsrl16(B a, int n) { return _mm256_srl_epi16(a, _mm_cvtsi32_si128(n)); }
  static B bsrl4(B a) { return _mm256_srli_epi16(a, 4); }

  // ---- int8 dots: acc (int32 lanes) += the dot of each lane's 4 unsigned weight bytes with 4 signed x bytes
  static I dot4(I acc, B w, B x) {  // w <= 63: vpmaddubsw's int16 pair sums stay below 2 * 63 * 127
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
  static I dot4x2(I acc, B w1, B x1, B w2, B x2) {  // w <= 31: four products of a lane fit in int16
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w1, x1), _mm256_maddubs_epi16(w2, x2));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
  // int16 accumulation (llm_qgemm_rows.hpp): acc += vpmaddubsw(w, x), wrapping adds the caller keeps in range
  static constexpr bool ACC16 = true;
  static B dot16(B acc, B w, B x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)); }
  static I widen16(B acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
  // 8-bit weights: s = w - 128 (|s| <= 128) against x with the sign of s moved onto it, so no int16 pair sum
  // saturates; the dot is sum((w - 128) x) (Q8_SHIFT). The weight half is prepared once for all x rows.
  struct Q8 {
    B sw, aw;
  };
  static Q8 q8_weights(B w) {
    const B sw = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    return {sw, _mm256_sign_epi8(sw, sw)};
  }
  static I dot_q8(I acc, const Q8& w, B x) {
    const __m256i sx = _mm256_sign_epi8(x, w.sw);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w.aw, sx), _mm256_set1_epi16(1)));
  }
  // always inlined: out of line, GCC deletes the calls (no side effects; see llm_impl.hpp, prefetch_record)
  [[gnu::always_inline]] static void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  [[gnu::always_inline]] static void prefetch_l2(const void* p) {  // not into L1
    _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
  }
};
}  // namespace
