// The rotated low-bit KV cache's decoder (kv_quant.hpp) for the avx512 path: 16 codes per vector, the level looked
// up with one vpermps from the codebook in a register, times the scale(s). Flags per file in kv_quant.cmake.
#include <immintrin.h>

#include <cstring>

#include "kv_quant.hpp"

namespace hetero {
namespace kvq {

void decode_avx512(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period, float* out) {
  const __m512 cb = _mm512_loadu_ps(codebook(bits));
  const __m512i low4 = _mm512_set1_epi32(15), low2 = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4);
  const __m512i sh01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i sh23 = _mm512_add_epi32(sh01, four);
  const int bb = block_bytes(bits);
  for (i64 b = 0; b < nblocks; ++b) {
    const std::uint8_t* p = packed + b * bb;
    __m512i i0, i1;
    if (bits == 4) {
      const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      i0 = _mm512_and_si512(x, low4);
      i1 = _mm512_srli_epi32(x, 4);
    } else {
      __m128i t = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));  // the 2-bit plane, twice
      t = _mm_unpacklo_epi64(t, t);
      const __m512i x = _mm512_cvtepu8_epi32(t);
      std::uint32_t hb;
      std::memcpy(&hb, p + 8, 4);
      i0 = _mm512_and_si512(_mm512_srlv_epi32(x, sh01), low2);
      i1 = _mm512_and_si512(_mm512_srlv_epi32(x, sh23), low2);
      i0 = _mm512_mask_or_epi32(i0, static_cast<__mmask16>(hb & 0xffffu), i0, four);
      i1 = _mm512_mask_or_epi32(i1, static_cast<__mmask16>(hb >> 16), i1, four);
    }
    __m512 v0 = _mm512_permutexvar_ps(i0, cb), v1 = _mm512_permutexvar_ps(i1, cb);
    if (period) {
      const float* s = scales + (b % period) * kBlock;
      v0 = _mm512_mul_ps(v0, _mm512_loadu_ps(s));
      v1 = _mm512_mul_ps(v1, _mm512_loadu_ps(s + 16));
    } else {
      const __m512 s = _mm512_set1_ps(scales[b]);
      v0 = _mm512_mul_ps(v0, s);
      v1 = _mm512_mul_ps(v1, s);
    }
    _mm512_storeu_ps(out + b * kBlock, v0);
    _mm512_storeu_ps(out + b * kBlock + 16, v1);
  }
}

}  // namespace kvq
}  // namespace hetero
