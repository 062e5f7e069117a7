// AMX-BF16 kernels of the fp32 GEMM's bf16x3 path (gemm_bf16x3.hpp): the split of A into hi / lo bf16 rows and the
// 16 x 32 and 32 x 32 tile blocks. Compiled with -mamx-tile -mamx-bf16 and AVX-512 (CMakeLists.txt); entered only after
// bf16x3_available() (gemm.cpp). Tiles all 16 rows x 64 bytes (amx.hpp): 16 x 16 fp32 accumulators, 16 rows x 32 k of
// A, 32 k x 16 columns of B (bf16 pairs).
#include "gemm_bf16x3.hpp"

#include <algorithm>

#if defined(HETERO_GEMM_AMX_BF16)
#include <immintrin.h>

#include "amx.hpp"
#endif

namespace hetero {

#if defined(HETERO_GEMM_AMX_BF16)
namespace {

// Round to nearest even to bf16, as 32-bit lanes holding the bf16 in the high half (bf16x3_split, 16 lanes).
inline __m512i rne16(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
}

}  // namespace

std::uint32_t bf16x3_split_rows(const float* a, i64 rs, i64 cs, i64 rows, i64 K, i64 kp, std::uint16_t* hi,
                                std::uint16_t* lo) {
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  __m512i vmax = _mm512_setzero_si512();
  std::uint32_t smax = 0;
  for (i64 i = 0; i < rows; ++i) {
    const float* src = a + i * rs;
    std::uint16_t* h = hi + i * kp;
    std::uint16_t* l = lo + i * kp;
    if (cs == 1) {
      for (i64 k = 0; k < kp; k += 16) {
        const __mmask16 m = k + 16 <= K ? static_cast<__mmask16>(0xffff)
                                        : (k >= K ? static_cast<__mmask16>(0)
                                                  : static_cast<__mmask16>((1u << (K - k)) - 1));
        const __m512 x = _mm512_maskz_loadu_ps(m, src + k);  // columns past K: +0
        const __m512i u = _mm512_castps_si512(x);
        vmax = _mm512_max_epu32(vmax, _mm512_and_si512(u, absmask));
        const __m512i uh = rne16(u);
        const __m512i ul = rne16(_mm512_castps_si512(_mm512_sub_ps(x, _mm512_castsi512_ps(uh))));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(uh, 16)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(ul, 16)));
      }
    } else {
      for (i64 k = 0; k < kp; ++k) {
        const float x = k < K ? src[k * cs] : 0.f;
        std::uint32_t u;
        std::memcpy(&u, &x, sizeof u);
        if ((u & 0x7fffffffu) > smax) smax = u & 0x7fffffffu;
        bf16x3_split(x, h[k], l[k]);
      }
    }
  }
  alignas(64) std::uint32_t lanes[16];  // (GCC 12 warns inside its own _mm512_reduce_max_epu32)
  _mm512_store_si512(lanes, vmax);
  for (std::uint32_t v : lanes) smax = v > smax ? v : smax;
  return smax;
}

std::uint32_t bf16x3_split_b_block(const float* x, const i64* rows, i64 K, i64 kp, i64 ncols, std::uint16_t* hi,
                                   std::uint16_t* lo) {
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff), himask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  __m512i vmax = _mm512_setzero_si512();
  for (i64 t = 0; t < 2; ++t) {
    const i64 nc = std::min<i64>(16, std::max<i64>(0, ncols - t * 16));
    const __mmask16 m = static_cast<__mmask16>(nc >= 16 ? 0xffffu : (1u << nc) - 1u);
    const float* src = x + t * 16;
    std::uint16_t* h = hi + t * kp * 16;
    std::uint16_t* l = lo + t * kp * 16;
    for (i64 k = 0; k < kp; k += 2, h += 32, l += 32) {
      // rows k and k + 1 (zero past K and past the last column): one 64-byte row of the tile, lane j the pair
      // (k, j) in its low half and (k + 1, j) in its high half
      const __m512 x0 = _mm512_maskz_loadu_ps(k < K ? m : 0, src + (k < K ? rows[k] : 0));
      const __m512 x1 = _mm512_maskz_loadu_ps(k + 1 < K ? m : 0, src + (k + 1 < K ? rows[k + 1] : 0));
      const __m512i u0 = _mm512_castps_si512(x0), u1 = _mm512_castps_si512(x1);
      vmax = _mm512_max_epu32(vmax, _mm512_max_epu32(_mm512_and_si512(u0, absmask), _mm512_and_si512(u1, absmask)));
      const __m512i h0 = rne16(u0), h1 = rne16(u1);
      const __m512i l0 = rne16(_mm512_castps_si512(_mm512_sub_ps(x0, _mm512_castsi512_ps(h0))));
      const __m512i l1 = rne16(_mm512_castps_si512(_mm512_sub_ps(x1, _mm512_castsi512_ps(h1))));
      _mm512_storeu_si512(h, _mm512_or_si512(_mm512_srli_epi32(h0, 16), _mm512_and_si512(h1, himask)));
      _mm512_storeu_si512(l, _mm512_or_si512(_mm512_srli_epi32(l0, 16), _mm512_and_si512(l1, himask)));
    }
  }
  alignas(64) std::uint32_t lanes[16];
  _mm512_store_si512(lanes, vmax);
  std::uint32_t smax = 0;
  for (std::uint32_t v : lanes) smax = v > smax ? v : smax;
  return smax;
}

std::uint32_t bf16x3_split_plain(const float* x, i64 n, std::uint16_t* hi, std::uint16_t* lo) {
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  __m512i vmax = _mm512_setzero_si512();
  for (i64 i = 0; i < n; i += 16) {
    const __mmask16 m = static_cast<__mmask16>(i + 16 <= n ? 0xffffu : (1u << (n - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __m512i u = _mm512_castps_si512(v);
    vmax = _mm512_max_epu32(vmax, _mm512_and_si512(u, absmask));
    const __m512i uh = rne16(u);
    const __m512i ul = rne16(_mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(uh))));
    _mm256_mask_storeu_epi16(hi + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(uh, 16)));
    _mm256_mask_storeu_epi16(lo + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(ul, 16)));
  }
  alignas(64) std::uint32_t lanes[16];
  _mm512_store_si512(lanes, vmax);
  std::uint32_t smax = 0;
  for (std::uint32_t v : lanes) smax = v > smax ? v : smax;
  return smax;
}

void bf16x3_pair_b_block(const std::uint16_t* shi, const std::uint16_t* slo, const i64* rows, i64 K, i64 kp,
                         i64 ncols, std::uint16_t* hi, std::uint16_t* lo) {
  for (i64 t = 0; t < 2; ++t) {
    const i64 nc = std::min<i64>(16, std::max<i64>(0, ncols - t * 16));
    const __mmask16 m = static_cast<__mmask16>(nc >= 16 ? 0xffffu : (1u << nc) - 1u);
    std::uint16_t* h = hi + t * kp * 16;
    std::uint16_t* l = lo + t * kp * 16;
    for (i64 k = 0; k < kp; k += 2, h += 32, l += 32) {
      // (k, j) in the low half of lane j, (k + 1, j) in the high half: one 64-byte row of the tile
      const __mmask16 m0 = k < K ? m : 0, m1 = k + 1 < K ? m : 0;
      const i64 o0 = (k < K ? rows[k] : 0) + t * 16, o1 = (k + 1 < K ? rows[k + 1] : 0) + t * 16;
      const __m512i h0 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m0, shi + o0));
      const __m512i h1 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m1, shi + o1));
      const __m512i l0 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m0, slo + o0));
      const __m512i l1 = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m1, slo + o1));
      _mm512_storeu_si512(h, _mm512_or_si512(h0, _mm512_slli_epi32(h1, 16)));
      _mm512_storeu_si512(l, _mm512_or_si512(l0, _mm512_slli_epi32(l1, 16)));
    }
  }
}

void bf16x3_tiles_begin() { amx_load_tiles16x64(); }
void bf16x3_tiles_end() { _tile_release(); }

// TA: A in tiles (bf16x3_tile_a's layout: a row tile's 16 rows of each k block as one 1 KB tile) instead of rows.
template <bool TA>
void bf16x3_block_t(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                  const std::uint16_t* blo, float* c, i64 ldc) {
  const i64 lda = TA ? 64 : kp * 2, bstride = kp * 16;  // A rows in bytes; B's second 16-column tile, in values
  _tile_zero(0);
  _tile_zero(1);
  for (i64 k0 = 0; k0 < kp; k0 += 32) {
    const i64 ka = TA ? k0 * 16 : k0;
    _tile_loadd(2, ahi + ka, lda);
    _tile_loadd(3, alo + ka, lda);
    _tile_loadd(4, bhi + k0 * 16, 64);  // 16 pairs of k from k0 / 2: 64 bytes each
    _tile_loadd(5, blo + k0 * 16, 64);
    _tile_loadd(6, bhi + bstride + k0 * 16, 64);
    _tile_loadd(7, blo + bstride + k0 * 16, 64);
    // hi x hi, hi x lo, lo x hi per k block (bf16x3_block32's order).
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(1, 2, 6);
    _tile_dpbf16ps(0, 2, 5);
    _tile_dpbf16ps(1, 2, 7);
    _tile_dpbf16ps(0, 3, 4);
    _tile_dpbf16ps(1, 3, 6);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
}

void bf16x3_block(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                  const std::uint16_t* blo, float* c, i64 ldc) {
  bf16x3_block_t<false>(kp, ahi, alo, bhi, blo, c, ldc);
}
void bf16x3_block_ta(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                     const std::uint16_t* blo, float* c, i64 ldc) {
  bf16x3_block_t<true>(kp, ahi, alo, bhi, blo, c, ldc);
}


template <bool TA>
void bf16x3_block32_t(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                    const std::uint16_t* blo, float* c, i64 ldc) {
  const i64 lda = TA ? 64 : kp * 2, bstride = kp * 16, a1 = 16 * kp;  // A rows in bytes; B's right tile; A's rows 16-31
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (i64 k0 = 0; k0 < kp; k0 += 32) {
    const i64 ka = TA ? k0 * 16 : k0;
    // hi x hi, then hi x lo (B's lo in 6-7), then lo x hi (A's lo in 4-5, B's hi again): four independent sums,
    // each element's products in bf16x3_block's order.
    _tile_loadd(4, ahi + ka, lda);
    _tile_loadd(5, ahi + a1 + ka, lda);
    _tile_loadd(6, bhi + k0 * 16, 64);
    _tile_loadd(7, bhi + bstride + k0 * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(6, blo + k0 * 16, 64);
    _tile_loadd(7, blo + bstride + k0 * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(4, alo + ka, lda);
    _tile_loadd(5, alo + a1 + ka, lda);
    _tile_loadd(6, bhi + k0 * 16, 64);
    _tile_loadd(7, bhi + bstride + k0 * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 16 * ldc, ldc * 4);
  _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

void bf16x3_block32(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                    const std::uint16_t* blo, float* c, i64 ldc) {
  bf16x3_block32_t<false>(kp, ahi, alo, bhi, blo, c, ldc);
}
void bf16x3_block32_ta(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                       const std::uint16_t* blo, float* c, i64 ldc) {
  bf16x3_block32_t<true>(kp, ahi, alo, bhi, blo, c, ldc);
}
#else
std::uint32_t bf16x3_split_rows(const float*, i64, i64, i64, i64, i64, std::uint16_t*, std::uint16_t*) {
  return 0xffffffffu;
}
std::uint32_t bf16x3_split_b_block(const float*, const i64*, i64, i64, i64, std::uint16_t*, std::uint16_t*) {
  return 0xffffffffu;
}
std::uint32_t bf16x3_split_plain(const float*, i64, std::uint16_t*, std::uint16_t*) { return 0xffffffffu; }
void bf16x3_pair_b_block(const std::uint16_t*, const std::uint16_t*, const i64*, i64, i64, i64, std::uint16_t*,
                         std::uint16_t*) {}
void bf16x3_block_ta(i64, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                     float*, i64) {}
void bf16x3_block32_ta(i64, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                       float*, i64) {}
void bf16x3_tiles_begin() {}
void bf16x3_tiles_end() {}
void bf16x3_block(i64, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, float*,
                  i64) {}
void bf16x3_block32(i64, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*, const std::uint16_t*,
                    float*, i64) {}
#endif

}  // namespace hetero
