// AVX-512F traits (16 floats). Only included by kernels_avx512.cpp (compiled with -mavx512f ... -mfma).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace {
struct SIMD {
  using V = __m512;
  using M = __mmask16;
  using I = __m512i;
  static constexpr int W = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  // W int8 values sign-extended to int32
  static I load_s8(const std::int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  // p[idx[l]] for each lane l (idx: W int32 offsets)
  static V gather(const float* p, const std::int32_t* idx) {
    return _mm512_i32gather_ps(_mm512_loadu_si512(idx), p, 4);
  }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  // W floats holding integers in [0, 255] stored as W bytes
  static void store_u8(std::uint8_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v)));
  }
  // The first n (0 < n < W) values of p, `fill` in the other lanes, and their store: masked, so nothing past them is
  // read or written (a row's ragged tail without the scalar copy through a stack buffer).
  static V load_part(const float* p, int n, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), static_cast<M>((1u << n) - 1), p);
  }
  static void store_part(float* p, int n, V v) { _mm512_mask_storeu_ps(p, static_cast<M>((1u << n) - 1), v); }
  // r[i][j] -> r[j][i] for a W x W block in registers (the channel-blocked depthwise kernel's way in and out of planes)
  static void transpose(V* r) {
    V t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + e], 128-bit lane k: rows 4i..4i+3 at column 4k + e
    for (int i = 0; i < 4; ++i) {
      u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int e = 0; e < 4; ++e) {
      const V v0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88), v1 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88);
      const V w0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xDD), w1 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xDD);
      r[e] = _mm512_shuffle_f32x4(v0, v1, 0x88);
      r[8 + e] = _mm512_shuffle_f32x4(v0, v1, 0xDD);
      r[4 + e] = _mm512_shuffle_f32x4(w0, w1, 0x88);
      r[12 + e] = _mm512_shuffle_f32x4(w0, w1, 0xDD);
    }
  }
  // src[0, 2, ..., 2W - 2] -> even, src[1, 3, ..., 2W - 1] -> odd (a stride-2 conv's column phases)
  static void unzip(const float* src, float* even, float* odd) {
    const V a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
    _mm512_storeu_ps(even, _mm512_permutex2var_ps(a, unzip_index(0), b));
    _mm512_storeu_ps(odd, _mm512_permutex2var_ps(a, unzip_index(1), b));
  }
  // unzip of the first n < 2W values alone (masked: nothing read or written past them): ceil(n / 2) even values
  static void unzip_part(const float* src, int n, float* even, float* odd) {
    const auto mask = [](int k) { return static_cast<__mmask16>(k >= 16 ? 0xFFFF : (1u << (k < 0 ? 0 : k)) - 1); };
    const V a = _mm512_maskz_loadu_ps(mask(n), src), b = _mm512_maskz_loadu_ps(mask(n - 16), src + 16);
    _mm512_mask_storeu_ps(even, mask((n + 1) / 2), _mm512_permutex2var_ps(a, unzip_index(0), b));
    _mm512_mask_storeu_ps(odd, mask(n / 2), _mm512_permutex2var_ps(a, unzip_index(1), b));
  }
  // The 2W values at src (the first n of them where n < 2W, zeros past them: masked, nothing past them read) split in
  // registers into their even and odd ones (a stride-2 conv's column phases without a copy).
  static void unzip_regs(const float* src, long n, V& even, V& odd) {
    V a, b;
    if (n >= 32) {
      a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
    } else {
      const auto mask = [](long k) { return static_cast<__mmask16>(k >= 16 ? 0xFFFF : (1u << (k < 0 ? 0 : k)) - 1); };
      a = _mm512_maskz_loadu_ps(mask(n), src), b = _mm512_maskz_loadu_ps(mask(n - 16), src + 16);
    }
    even = _mm512_permutex2var_ps(a, unzip_index(0), b);
    odd = _mm512_permutex2var_ps(a, unzip_index(1), b);
  }
  // a, b (2W consecutive values) split into their even and odd ones
  static void unzip_v(V a, V b, V& even, V& odd) {
    even = _mm512_permutex2var_ps(a, unzip_index(0), b);
    odd = _mm512_permutex2var_ps(a, unzip_index(1), b);
  }
  // [prev[W - 1], v[0], ..., v[W - 2]]: v shifted up one lane, prev's last lane in front
  static V shift_in(V v, V prev) {
    return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v), _mm512_castps_si512(prev), 15));
  }
  static I unzip_index(int phase) {
    return _mm512_add_epi32(_mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0),
                            _mm512_set1_epi32(phase));
  }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V rcp(V a) { return _mm512_rcp14_ps(a); }  // 1/a within 2^-14
  static V scalef(V a, V n) { return _mm512_scalef_ps(a, n); }  // a 2^floor(n), one rounding
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V fnma(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V abs(V a) { return _mm512_castsi512_ps(_mm512_and_epi32(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff))); }
  static V neg(V a) { return _mm512_castsi512_ps(_mm512_xor_epi32(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN))); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V floor(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static V ceil(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
  static V round(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static M lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M le(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
  static M gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M ge(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M eq(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M isnan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static bool any(M m) { return m != 0; }
  static M mand(M a, M b) { return static_cast<M>(a & b); }
  static M mor(M a, M b) { return static_cast<M>(a | b); }
  static V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  static I cvt_i(V a) { return _mm512_cvtps_epi32(a); }
  static V cvt_f(I a) { return _mm512_cvtepi32_ps(a); }
  static I as_int(V a) { return _mm512_castps_si512(a); }
  static V as_float(I a) { return _mm512_castsi512_ps(a); }
  static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I iand(I a, I b) { return _mm512_and_epi32(a, b); }
  static I ior(I a, I b) { return _mm512_or_epi32(a, b); }
  static I iset1(std::int32_t x) { return _mm512_set1_epi32(x); }
  template <int N> static I slli(I a) { return _mm512_slli_epi32(a, N); }
  template <int N> static I srai(I a) { return _mm512_srai_epi32(a, N); }
  static float hsum(V a) { return _mm512_reduce_add_ps(a); }
  static float hmax(V a) { return _mm512_reduce_max_ps(a); }
};
}  // namespace
