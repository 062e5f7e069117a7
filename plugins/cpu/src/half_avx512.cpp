// float16 <-> float32, 16 values a step (AVX-512F's vcvtph2ps / vcvtps2ph; compiled with the AVX-512 flags, entered
// only after the run-time check in half.cpp). Tails by masked loads and stores. A step whose values hold a NaN goes
// to the scalar rule (numpy keeps a signalling NaN signalling; the instructions quiet it).
#include <immintrin.h>

#include "half.hpp"

namespace hetero {
namespace half {

namespace {
inline void to_float16(const std::uint16_t* src, float* dst, __mmask16 m) {
  const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src));
  if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
    to_float_generic(src, dst, __builtin_popcount(m));
    return;
  }
  _mm512_mask_storeu_ps(dst, m, v);
}

inline void to_half16(const float* src, std::uint16_t* dst, __mmask16 m) {
  const __m512 v = _mm512_maskz_loadu_ps(m, src);
  if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
    to_half_generic(src, dst, __builtin_popcount(m));
    return;
  }
  _mm256_mask_storeu_epi16(dst, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
}  // namespace

void to_float_avx512(const std::uint16_t* src, float* dst, i64 n) {
  i64 i = 0;
  for (; i + 16 <= n; i += 16) to_float16(src + i, dst + i, 0xffff);
  if (i < n) to_float16(src + i, dst + i, static_cast<__mmask16>((1u << (n - i)) - 1));
}

void to_half_avx512(const float* src, std::uint16_t* dst, i64 n) {
  i64 i = 0;
  for (; i + 16 <= n; i += 16) to_half16(src + i, dst + i, 0xffff);
  if (i < n) to_half16(src + i, dst + i, static_cast<__mmask16>((1u << (n - i)) - 1));
}

}  // namespace half
}  // namespace hetero
