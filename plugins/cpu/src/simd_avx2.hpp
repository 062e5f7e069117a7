// AVX2 + FMA traits (8 floats). Only included by kernels_avx2.cpp, which is compiled with -mavx2 -mfma.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace {
struct SIMD {
  using V = __m256;
  using M = __m256;
  using I = __m256i;
  static constexpr int W = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  // W int8 values sign-extended to int32
  static I load_s8(const std::int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  // p[idx[l]] for each lane l (idx: W int32 offsets)
  static V gather(const float* p, const std::int32_t* idx) {
    return _mm256_i32gather_ps(p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)), 4);
  }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // W floats holding integers in [0, 255] stored as W bytes
  static void store_u8(std::uint8_t* p, V v) {
    const __m256i i = _mm256_cvttps_epi32(v);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  // r[i][j] -> r[j][i] for a W x W block in registers (the channel-blocked depthwise kernel's way in and out of planes)
  static void transpose(V* r) {
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // u[4i + e], 128-bit lane k: rows 4i..4i+3 at column 4k + e
      u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int e = 0; e < 4; ++e) {
      r[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
      r[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
  }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V rcp(V a) { return _mm256_rcp_ps(a); }  // 1/a within 1.5 * 2^-12
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V fnma(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V abs(V a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static V neg(V a) { return _mm256_xor_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V floor(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static V ceil(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
  static V round(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static M lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M le(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
  static M gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M ge(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M eq(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M isnan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static bool any(M m) { return _mm256_movemask_ps(m) != 0; }
  static M mand(M a, M b) { return _mm256_and_ps(a, b); }
  static M mor(M a, M b) { return _mm256_or_ps(a, b); }
  static V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }
  static I cvt_i(V a) { return _mm256_cvtps_epi32(a); }
  static V cvt_f(I a) { return _mm256_cvtepi32_ps(a); }
  static I as_int(V a) { return _mm256_castps_si256(a); }
  static V as_float(I a) { return _mm256_castsi256_ps(a); }
  static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I iand(I a, I b) { return _mm256_and_si256(a, b); }
  static I ior(I a, I b) { return _mm256_or_si256(a, b); }
  static I iset1(std::int32_t x) { return _mm256_set1_epi32(x); }
  template <int N> static I slli(I a) { return _mm256_slli_epi32(a, N); }
  template <int N> static I srai(I a) { return _mm256_srai_epi32(a, N); }
  static float hsum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static float hmax(V a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};
}  // namespace
