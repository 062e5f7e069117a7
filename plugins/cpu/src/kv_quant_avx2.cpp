// The rotated low-bit KV cache's decoder (kv_quant.hpp) for the avx2 path: 8 codes per vector; a 16-level lookup is
// two vpermps (levels 0-7, 8-15) blended on bit 3 of the code, an 8-level one a single vpermps. Flags per file in
// kv_quant.cmake.
#include <immintrin.h>

#include "kv_quant.hpp"

namespace hetero {
namespace kvq {
namespace {

inline __m256 lookup16(__m256 lo, __m256 hi, __m256i idx) {
  const __m256 sel = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));  // bit 3 -> the sign bit
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx), sel);
}

}  // namespace

void decode_avx2(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period, float* out) {
  const float* cbp = codebook(bits);
  const __m256 lo = _mm256_loadu_ps(cbp), hi = _mm256_loadu_ps(cbp + 8);
  const __m256i low4 = _mm256_set1_epi32(15), low2 = _mm256_set1_epi32(3), four = _mm256_set1_epi32(4);
  const __m256i bitsel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const int bb = block_bytes(bits);
  for (i64 b = 0; b < nblocks; ++b) {
    const std::uint8_t* p = packed + b * bb;
    __m256 v[4];
    if (bits == 4) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m256i x0 = _mm256_cvtepu8_epi32(raw), x1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
      v[0] = lookup16(lo, hi, _mm256_and_si256(x0, low4));
      v[1] = lookup16(lo, hi, _mm256_and_si256(x1, low4));
      v[2] = lookup16(lo, hi, _mm256_srli_epi32(x0, 4));
      v[3] = lookup16(lo, hi, _mm256_srli_epi32(x1, 4));
    } else {
      const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
      for (int k = 0; k < 4; ++k) {
        __m256i idx = _mm256_and_si256(_mm256_srli_epi32(x, 2 * k), low2);
        const __m256i hb = _mm256_and_si256(_mm256_set1_epi32(p[8 + k]), bitsel);
        idx = _mm256_or_si256(idx, _mm256_and_si256(_mm256_cmpeq_epi32(hb, bitsel), four));
        v[k] = _mm256_permutevar8x32_ps(lo, idx);
      }
    }
    for (int k = 0; k < 4; ++k) {
      const __m256 s = period ? _mm256_loadu_ps(scales + (b % period) * kBlock + 8 * k) : _mm256_set1_ps(scales[b]);
      _mm256_storeu_ps(out + b * kBlock + 8 * k, _mm256_mul_ps(v[k], s));
    }
  }
}

}  // namespace kvq
}  // namespace hetero
