// float16 <-> float32, 8 values a step with F16C (compiled with -mavx2 -mf16c; entered only after the run-time check
// in half.cpp). A step whose values hold a NaN goes to the scalar rule (numpy keeps a signalling NaN signalling).
#include <immintrin.h>

#include "half.hpp"

namespace hetero {
namespace half {

void to_float_f16c(const std::uint16_t* src, float* dst, i64 n) {
  i64 i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
      to_float_generic(src + i, dst + i, 8);
      continue;
    }
    _mm256_storeu_ps(dst + i, v);
  }
  to_float_generic(src + i, dst + i, n - i);
}

void to_half_f16c(const float* src, std::uint16_t* dst, i64 n) {
  i64 i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
      to_half_generic(src + i, dst + i, 8);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  to_half_generic(src + i, dst + i, n - i);
}

}  // namespace half
}  // namespace hetero
