// The AVX-512 walk of trees.hpp: eight lanes per vector (rows of one tree, or trees of one row), up to four vectors
// advanced in turn so that their gathers overlap. A step gathers each active lane's node (threshold; feature, flags
// and true child in one 64-bit gather), then its feature value, compares in double and moves to the true child or
// the next node; a lane stops at its leaf, a vector when all its lanes have.
#include <immintrin.h>

#include "trees.hpp"

namespace hetero {
namespace {

template <bool LT, int G, class X>
void walk(const TreeNode16* nodes, const X* x, const std::int32_t* start, const std::int32_t* offset, int n,
          std::int32_t* leaf) {
  const char* base = reinterpret_cast<const char*>(nodes);
  const __m256i leaf_bit = _mm256_set1_epi32(static_cast<int>(kTreeLeaf));
  const __m256i missing_bit = _mm256_set1_epi32(static_cast<int>(kTreeMissingYes));
  const __m256i index_mask = _mm256_set1_epi32(static_cast<int>(kTreeIndexMask));
  const __m256i one = _mm256_set1_epi32(1);
  __m256i idx[G], off[G];
  __mmask8 act[G];
  for (int g = 0; g < G; ++g) {
    const int m = n - 8 * g;
    act[g] = static_cast<__mmask8>(m >= 8 ? 0xff : m <= 0 ? 0 : (1u << m) - 1);
    idx[g] = _mm256_maskz_loadu_epi32(act[g], start + 8 * g);
    off[g] = _mm256_maskz_loadu_epi32(act[g], offset + 8 * g);
  }
  for (;;) {
    bool any = false;
    for (int g = 0; g < G; ++g) {
      __mmask8 a = act[g];
      if (!a) continue;
      any = true;
      const __m256i at = _mm256_slli_epi32(idx[g], 4);
      const __m512i meta_yes = _mm512_mask_i32gather_epi64(_mm512_setzero_si512(), a, at, base + 8, 1);
      const __m512d th = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), a, at, base, 1);
      const __m256i meta = _mm512_cvtepi64_epi32(meta_yes);
      a &= static_cast<__mmask8>(~_mm256_test_epi32_mask(meta, leaf_bit));
      act[g] = a;
      const __m256i xo = _mm256_add_epi32(off[g], _mm256_and_si256(meta, index_mask));
      __m512d v;
      if constexpr (sizeof(X) == 8)
        v = _mm512_mask_i32gather_pd(_mm512_setzero_pd(), a, xo, x, 8);
      else  // float features widened: exact, so the double compare orders them as float would
        v = _mm512_cvtps_pd(_mm256_mmask_i32gather_ps(_mm256_setzero_ps(), a, xo, x, 4));
      __mmask8 c = _mm512_mask_cmp_pd_mask(a, v, th, LT ? _CMP_LT_OQ : _CMP_LE_OQ);
      c |= _mm512_mask_cmp_pd_mask(_mm256_mask_test_epi32_mask(a, meta, missing_bit), v, v, _CMP_UNORD_Q);
      const __m256i yes = _mm512_cvtepi64_epi32(_mm512_srli_epi64(meta_yes, 32));
      const __m256i next = _mm256_mask_mov_epi32(_mm256_add_epi32(idx[g], one), c, yes);
      idx[g] = _mm256_mask_mov_epi32(idx[g], a, next);
    }
    if (!any) break;
  }
  alignas(32) std::int32_t tmp[8 * G];
  for (int g = 0; g < G; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(tmp + 8 * g), idx[g]);
  for (int k = 0; k < n; ++k) leaf[k] = tmp[k];
}

template <bool LT, class X>
void walk_n(const TreeNode16* nodes, const X* x, const std::int32_t* start, const std::int32_t* offset, int n,
            std::int32_t* leaf) {
  if (n <= 8) return walk<LT, 1, X>(nodes, x, start, offset, n, leaf);
  if (n <= 16) return walk<LT, 2, X>(nodes, x, start, offset, n, leaf);
  if (n <= 24) return walk<LT, 3, X>(nodes, x, start, offset, n, leaf);
  walk<LT, 4, X>(nodes, x, start, offset, n, leaf);
}

}  // namespace

void tree_walk_avx512(const TreeNode16* nodes, const double* x, const std::int32_t* start,
                      const std::int32_t* offset, int n, bool lt, std::int32_t* leaf) {
  if (lt)
    walk_n<true>(nodes, x, start, offset, n, leaf);
  else
    walk_n<false>(nodes, x, start, offset, n, leaf);
}

void tree_walk_avx512(const TreeNode16* nodes, const float* x, const std::int32_t* start,
                      const std::int32_t* offset, int n, bool lt, std::int32_t* leaf) {
  if (lt)
    walk_n<true>(nodes, x, start, offset, n, leaf);
  else
    walk_n<false>(nodes, x, start, offset, n, leaf);
}

}  // namespace hetero
