// The per-ISA kernels of qlinear.hpp: included once by each qlinear_<isa>.cpp, which defines QLIN_ISA_VNNI /
// QLIN_ISA_AVX2 (or neither: generic C++) before including it, and compiles with that ISA's flags.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>

#include "qlinear.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(QLIN_ISA_VNNI) || defined(QLIN_ISA_AVX2)
#include <immintrin.h>
#endif

namespace hetero {
namespace qlin {
namespace {

inline std::int32_t load4(const std::uint8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if defined(QLIN_ISA_VNNI)
// An aligned load kept a load (the empty asm): GCC would fold a B load into every row's vpdpbusd, M loads of a
// line where one does (Zen 4 loads one zmm a cycle, the rate vpdpbusd issues at).
inline __m512i load_in_register(const std::int8_t* p) {
  __m512i v = _mm512_load_si512(p);
  __asm__("" : "+v"(v));
  return v;
}

// One row's accumulators (the first NP of c0..c3) += its 4 bytes of a times the panels' k group.
template <int NP>
inline void dot_row(__m512i& c0, __m512i& c1, __m512i& c2, __m512i& c3, const std::uint8_t* a4, __m512i b0,
                    __m512i b1, __m512i b2, __m512i b3) {
  const __m512i av = _mm512_set1_epi32(load4(a4));
  c0 = _mm512_dpbusd_epi32(c0, av, b0);
  if constexpr (NP > 1) c1 = _mm512_dpbusd_epi32(c1, av, b1);
  if constexpr (NP > 2) c2 = _mm512_dpbusd_epi32(c2, av, b2);
  if constexpr (NP > 3) c3 = _mm512_dpbusd_epi32(c3, av, b3);
}

#define QLIN_ROW_VARS(r) __m512i c##r##0 = z, c##r##1 = z, c##r##2 = z, c##r##3 = z;
#define QLIN_ROW_DOT(r) \
  if constexpr (M > r) dot_row<NP>(c##r##0, c##r##1, c##r##2, c##r##3, ag + r * lda, b0, b1, b2, b3);
#define QLIN_ROW_OUT(r)                                                 \
  if constexpr (M > r) {                                                \
    acc[r][0] = c##r##0;                                                \
    if constexpr (NP > 1) acc[r][1] = c##r##1;                          \
    if constexpr (NP > 2) acc[r][2] = c##r##2;                          \
    if constexpr (NP > 3) acc[r][3] = c##r##3;                          \
  }

// acc[r][p] = the tile's raw sums over k4 groups of 4, for every tile shape the kernels use (M <= 8 rows, NP <= 4
// panels, 16 accumulators at most). Named accumulators (the rows and panels past M and NP compile away): GCC 12
// keeps an array of them in registers only by copying each one twice per k group and folding the B loads into
// every row's vpdpbusd (4 x 4: 35 moves and a spill, 70 x 512 x 1024 ~2 % slower on Zen 4; 3 x 4, an int8 LSTM's
// 3-row step: 24 moves and 12 loads a group where 4 do, the layer 4.6 -> 3.75 ms).
template <int M, int NP>
inline void accumulate(__m512i (&acc)[M][NP], i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b,
                       i64 pstride) {
  static_assert(M >= 1 && M <= 8 && NP >= 1 && NP <= 4 && M * NP <= 16, "a tile of at most 16 accumulators");
  const __m512i z = _mm512_setzero_si512();
  QLIN_ROW_VARS(0) QLIN_ROW_VARS(1) QLIN_ROW_VARS(2) QLIN_ROW_VARS(3)
  QLIN_ROW_VARS(4) QLIN_ROW_VARS(5) QLIN_ROW_VARS(6) QLIN_ROW_VARS(7)
  for (i64 g = 0; g < k4; ++g) {
    const std::int8_t* bg = b + g * 64;
    __m512i b0 = load_in_register(bg), b1 = z, b2 = z, b3 = z;
    if constexpr (NP > 1) b1 = load_in_register(bg + pstride);
    if constexpr (NP > 2) b2 = load_in_register(bg + 2 * pstride);
    if constexpr (NP > 3) b3 = load_in_register(bg + 3 * pstride);
    const std::uint8_t* ag = a + 4 * g;
    QLIN_ROW_DOT(0) QLIN_ROW_DOT(1) QLIN_ROW_DOT(2) QLIN_ROW_DOT(3)
    QLIN_ROW_DOT(4) QLIN_ROW_DOT(5) QLIN_ROW_DOT(6) QLIN_ROW_DOT(7)
  }
  QLIN_ROW_OUT(0) QLIN_ROW_OUT(1) QLIN_ROW_OUT(2) QLIN_ROW_OUT(3)
  QLIN_ROW_OUT(4) QLIN_ROW_OUT(5) QLIN_ROW_OUT(6) QLIN_ROW_OUT(7)
}
#undef QLIN_ROW_VARS
#undef QLIN_ROW_DOT
#undef QLIN_ROW_OUT

template <int M, int NP>
void tile_fixed(i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* c,
                i64 ldc) {
  __m512i acc[M][NP];
  accumulate<M, NP>(acc, k4, a, lda, b, pstride);
  for (int r = 0; r < M; ++r)
    for (int p = 0; p < NP; ++p) _mm512_storeu_si512(reinterpret_cast<void*>(c + r * ldc + p * 16), acc[r][p]);
}

// The tile with the F32 stage of contiguous rows applied in registers (the finish pass over a stored raw tile was
// ~10 % of a T5 GEMM on Zen 4): the same wrapping int32 correction and float multiply, then add, as finish_f32_row.
// The correction's products are taken once a panel where they do not depend on the row: za x colsum for one za (a
// dynamically quantized A), and zb x rr not at all when the panel's zb are 0 (symmetric weights); wrapping int32
// arithmetic, so the same bits as per row. The loops over rows and panels are unrolled (compile-time bounds): with a
// run-time loop GCC spilled the 16 accumulators to the stack and read them back, and at K = 128 (an int8 LSTM's
// 80 x 128 x 2048 input projection) the epilogue was ~30 % of the tile's samples.
template <int M, int NP>
void tile_fixed_f32(i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, const Corrections& cr,
                    const OutStage& st, i64 m0, i64 n0, int ncols) {
  __m512i acc[M][NP];
  accumulate<M, NP>(acc, k4, a, lda, b, pstride);
  // the struct fields in locals: a float store may alias them, and GCC reloaded them after every row's store
  const bool one_za = cr.za_count == 1;
  const std::int32_t *za_p = cr.za, *rowsum = cr.rowsum;
  const std::uint32_t kk = static_cast<std::uint32_t>(cr.k);
  float* const out = static_cast<float*>(st.out);
  const float *const scale = st.scale, *const fbias = st.fbias, *const addend = st.addend;
  const i64 rs = st.rs, add_rs = st.add_rs;
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
    const int lanes = ncols - 16 * p;
    if (lanes <= 0) break;
    const __mmask16 mask = lanes >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << lanes) - 1);
    const i64 n = n0 + 16 * p;
    const __m512i cs = _mm512_maskz_loadu_epi32(mask, cr.colsum + n), zb = _mm512_maskz_loadu_epi32(mask, cr.zb + n);
    const bool any_zb = _mm512_test_epi32_mask(zb, zb) != 0;
    const __m512 sc = _mm512_maskz_loadu_ps(mask, scale + n);
    const __m512 bias = fbias ? _mm512_maskz_loadu_ps(mask, fbias + n) : _mm512_setzero_ps();
    const __m512i za_cs = _mm512_mullo_epi32(_mm512_set1_epi32(za_p[0]), cs);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) {
      const i64 m = m0 + r;
      const std::uint32_t za = static_cast<std::uint32_t>(za_p[one_za ? 0 : m]);
      __m512i v = _mm512_sub_epi32(
          acc[r][p], one_za ? za_cs : _mm512_mullo_epi32(_mm512_set1_epi32(static_cast<int>(za)), cs));
      if (any_zb) {
        const std::uint32_t rr = static_cast<std::uint32_t>(rowsum[m]) - kk * za;
        v = _mm512_sub_epi32(v, _mm512_mullo_epi32(zb, _mm512_set1_epi32(static_cast<int>(rr))));
      }
      __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), sc);
      if (fbias) f = _mm512_add_ps(f, bias);
      if (addend) f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(mask, addend + m * add_rs + n));
      _mm512_mask_storeu_ps(out + m * rs + n, mask, f);
    }
  }
}

// The F32 tile's shape: 8 rows x 2 panels (16 accumulators, as 4 x 4) keeps a task's block of B at 2 panels,
// 16 KiB for K = 512, in L1 with the A rows, where 4 panels stream from L2 at every row tile (70 x 512 x 1024:
// 178.8 -> 176.3 us on Zen 4).
constexpr int kF32Rows = 8, kF32Panels = 2;

template <int M, int NP>
void tile_f32_np(int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps, const Corrections& cr,
                 const OutStage& st, i64 m0, i64 n0, int ncols) {
  if constexpr (NP > 1) {
    if (np < NP) return tile_f32_np<M, NP - 1>(np, k4, a, lda, b, ps, cr, st, m0, n0, ncols);
  }
  tile_fixed_f32<M, NP>(k4, a, lda, b, ps, cr, st, m0, n0, ncols);
}

template <int M>
void tile_f32_rows(int m, int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps,
                   const Corrections& cr, const OutStage& st, i64 m0, i64 n0, int ncols) {
  if constexpr (M > 1) {
    if (m < M) return tile_f32_rows<M - 1>(m, np, k4, a, lda, b, ps, cr, st, m0, n0, ncols);
  }
  tile_f32_np<M, kF32Panels>(np, k4, a, lda, b, ps, cr, st, m0, n0, ncols);
}

void tile_f32(int m, int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps,
              const Corrections& cr, const OutStage& st, i64 m0, i64 n0, int ncols) {
  tile_f32_rows<kF32Rows>(m, np, k4, a, lda, b, ps, cr, st, m0, n0, ncols);
}
#elif defined(QLIN_ISA_AVX2)
// A 16-byte quarter of a 64-byte group (4 columns x 4 k) widened to int16 meets the row's 4 bytes of a, widened and
// repeated; vpmaddwd leaves two partial sums per column (k 0+1, k 2+3), added once at the end of the tile.
template <int M, int NP>
void tile_fixed(i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* c,
                i64 ldc) {
  constexpr int Q = NP * 4;  // quarters of 4 columns
  __m256i acc[M][Q];
  for (int r = 0; r < M; ++r)
    for (int q = 0; q < Q; ++q) acc[r][q] = _mm256_setzero_si256();
  for (i64 g = 0; g < k4; ++g) {
    __m256i av[M];
    for (int r = 0; r < M; ++r) {
      const __m128i a4 = _mm_cvtsi32_si128(load4(a + r * lda + 4 * g));
      av[r] = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(a4));
    }
    for (int q = 0; q < Q; ++q) {
      const std::int8_t* src = b + (q / 4) * pstride + g * 64 + (q % 4) * 16;
      const __m256i bw = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(src)));
      for (int r = 0; r < M; ++r) acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(av[r], bw));
    }
  }
  for (int r = 0; r < M; ++r)
    for (int q = 0; q < Q; ++q) {
      alignas(32) std::int32_t t[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(t), acc[r][q]);
      for (int j = 0; j < 4; ++j) c[r * ldc + q * 4 + j] = t[2 * j] + t[2 * j + 1];
    }
}

// The tile over PairSafe's copy of B (no pair sum past int16, so vpmaddubsw is exact): a ymm holds 8 columns x
// 4 k of a 64-byte group; vpmaddubsw + vpmaddwd by ones gives each column's 4-k sum in its int32 lane, 32
// multiply-adds in 3 instructions where the 16-bit widening above takes 4 and two widenings. One panel at a time
// (2 x M accumulators, M <= 4).
template <int M>
void tile_pairs_panel(i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, std::int32_t* c, i64 ldc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo[M], hi[M];
  for (int r = 0; r < M; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
  for (i64 g = 0; g < k4; ++g) {
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + g * 64));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + g * 64 + 32));
    for (int r = 0; r < M; ++r) {
      const __m256i av = _mm256_set1_epi32(load4(a + r * lda + 4 * g));
      lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(_mm256_maddubs_epi16(av, b0), ones));
      hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(_mm256_maddubs_epi16(av, b1), ones));
    }
  }
  for (int r = 0; r < M; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), lo[r]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), hi[r]);
  }
}

template <int M>
void tile_pairs_m(int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps, std::int32_t* c,
                  i64 ldc) {
  for (int p = 0; p < np; ++p) tile_pairs_panel<M>(k4, a, lda, b + p * ps, c + p * kPanel, ldc);
}

void tile_pairs(int m, int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps,
                std::int32_t* c, i64 ldc) {
  switch (m) {
    case 1: return tile_pairs_m<1>(np, k4, a, lda, b, ps, c, ldc);
    case 2: return tile_pairs_m<2>(np, k4, a, lda, b, ps, c, ldc);
    case 3: return tile_pairs_m<3>(np, k4, a, lda, b, ps, c, ldc);
    default: return tile_pairs_m<4>(np, k4, a, lda, b, ps, c, ldc);
  }
}
#else
template <int M, int NP>
void tile_fixed(i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* c,
                i64 ldc) {
  for (int r = 0; r < M; ++r)
    for (int p = 0; p < NP; ++p) {
      std::int32_t acc[16] = {};
      const std::int8_t* panel = b + p * pstride;
      const std::uint8_t* row = a + r * lda;
      for (i64 g = 0; g < k4; ++g)
        for (int j = 0; j < 16; ++j)
          for (int t = 0; t < 4; ++t)
            acc[j] += static_cast<std::int32_t>(row[4 * g + t]) * static_cast<std::int32_t>(panel[g * 64 + j * 4 + t]);
      for (int j = 0; j < 16; ++j) c[r * ldc + p * 16 + j] = acc[j];
    }
}
#endif

template <int M>
void tile_m(int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps, std::int32_t* c, i64 ldc) {
  switch (np) {
    case 1: return tile_fixed<M, 1>(k4, a, lda, b, ps, c, ldc);
    case 2: return tile_fixed<M, 2>(k4, a, lda, b, ps, c, ldc);
    case 3: return tile_fixed<M, 3>(k4, a, lda, b, ps, c, ldc);
    default: return tile_fixed<M, 4>(k4, a, lda, b, ps, c, ldc);
  }
}

void tile(int m, int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 ps, std::int32_t* c,
          i64 ldc) {
  switch (m) {
    case 1: return tile_m<1>(np, k4, a, lda, b, ps, c, ldc);
    case 2: return tile_m<2>(np, k4, a, lda, b, ps, c, ldc);
    case 3: return tile_m<3>(np, k4, a, lda, b, ps, c, ldc);
    default: return tile_m<4>(np, k4, a, lda, b, ps, c, ldc);
  }
}

#if defined(QLIN_ISA_VNNI)
// Four rows at a time (a row past the last one reads the last one again and is not stored), 64 bytes of k a step:
// 4 x NC accumulators, each column's 64 bytes loaded once for the four rows, the tail of kp through a byte mask.
template <int NC>
void dot_cols_fixed(const std::uint8_t* a, i64 rows, i64 lda, const std::int8_t* cols, i64 kp, std::int32_t* raw,
                    i64 ldraw) {
  constexpr int R = 4;
  for (i64 r0 = 0; r0 < rows; r0 += R) {
    const std::uint8_t* ar[R];
    for (int i = 0; i < R; ++i) ar[i] = a + std::min(r0 + i, rows - 1) * lda;
    __m512i acc[R][NC];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < NC; ++j) acc[i][j] = _mm512_setzero_si512();
    for (i64 k = 0; k < kp; k += 64) {
      const __mmask64 mask = kp - k >= 64 ? ~__mmask64{0} : (__mmask64{1} << (kp - k)) - 1;
      __m512i w[NC];
      for (int j = 0; j < NC; ++j) w[j] = _mm512_maskz_loadu_epi8(mask, cols + j * kp + k);
      for (int i = 0; i < R; ++i) {
        const __m512i av = _mm512_maskz_loadu_epi8(mask, ar[i] + k);
        for (int j = 0; j < NC; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, w[j]);
      }
    }
    for (int i = 0; i < R && r0 + i < rows; ++i)
      for (int j = 0; j < NC; ++j) raw[(r0 + i) * ldraw + j] = _mm512_reduce_add_epi32(acc[i][j]);
  }
}

void dot_cols(const std::uint8_t* a, i64 rows, i64 lda, const std::int8_t* cols, int ncols, i64 kp,
              std::int32_t* raw, i64 ldraw) {
  switch (ncols) {
    case 1: return dot_cols_fixed<1>(a, rows, lda, cols, kp, raw, ldraw);
    case 2: return dot_cols_fixed<2>(a, rows, lda, cols, kp, raw, ldraw);
    case 3: return dot_cols_fixed<3>(a, rows, lda, cols, kp, raw, ldraw);
    default: return dot_cols_fixed<4>(a, rows, lda, cols, kp, raw, ldraw);
  }
}
#elif defined(QLIN_ISA_AVX2)
// 16 bytes of k a step widened to 16 bits on both sides (vpmaddwd: exact), a scalar tail (kp % 16: whole groups of 4).
void dot_cols(const std::uint8_t* a, i64 rows, i64 lda, const std::int8_t* cols, int ncols, i64 kp,
              std::int32_t* raw, i64 ldraw) {
  for (i64 r = 0; r < rows; ++r) {
    const std::uint8_t* row = a + r * lda;
    for (int j = 0; j < ncols; ++j) {
      const std::int8_t* col = cols + j * kp;
      __m256i acc = _mm256_setzero_si256();
      i64 k = 0;
      for (; k + 16 <= kp; k += 16) {
        const __m256i av = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
        const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + k)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(av, wv));
      }
      alignas(32) std::int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
      std::uint32_t s = 0;  // wrapping, as the accumulators
      for (int i = 0; i < 8; ++i) s += static_cast<std::uint32_t>(lanes[i]);
      for (; k < kp; ++k) s += static_cast<std::uint32_t>(static_cast<std::int32_t>(row[k]) * col[k]);
      raw[r * ldraw + j] = static_cast<std::int32_t>(s);
    }
  }
}
#else
void dot_cols(const std::uint8_t* a, i64 rows, i64 lda, const std::int8_t* cols, int ncols, i64 kp,
              std::int32_t* raw, i64 ldraw) {
  for (i64 r = 0; r < rows; ++r)
    for (int j = 0; j < ncols; ++j) {
      std::uint32_t s = 0;  // wrapping, as the vector accumulators
      for (i64 k = 0; k < kp; ++k)
        s += static_cast<std::uint32_t>(static_cast<std::int32_t>(a[r * lda + k]) * cols[j * kp + k]);
      raw[r * ldraw + j] = static_cast<std::int32_t>(s);
    }
}
#endif

#if defined(QLIN_ISA_VNNI)
// round(x / scale) clamped to [lo, hi] (the zero point not added yet) for 16 lanes.
// x * (1 / scale) in place of x / scale (a division per 16 values bounds the loop): the product is within 3 ulps
// of the quotient (1 / scale and the product round once each). Clamped to [lo, hi] (integers, |.| <= 383, where
// 3 ulps < 2^-12) it rounds (cvtps2dq: to nearest even) to the quotient's integer unless it lies within 2^-10 of
// a half step; those lanes (~0.2 %) are divided as before, so the bytes are the division's, bit for bit. Clamping
// before rounding is the same as after (the bounds are integers); a product clamped from beyond a bound has the
// quotient beyond it less 3 ulps, which rounds to the bound too. maxps returns its second operand for NaN: NaN ->
// lo. Taken where scale and 1 / scale are normal floats (else every lane divides).
struct Round512 {
  __m512 vs, vlo, vhi, vr, edge;
  bool by_mul;
  Round512(float scale, float lo, float hi)
      : vs(_mm512_set1_ps(scale)), vlo(_mm512_set1_ps(lo)), vhi(_mm512_set1_ps(hi)), vr(_mm512_set1_ps(1.f / scale)),
        edge(_mm512_set1_ps(0.5f - 1.f / 1024.f)), by_mul(std::isnormal(scale) && std::isnormal(1.f / scale)) {}
  __m512i divided(__m512 xv) const {
    constexpr int kNear = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512 q = _mm512_roundscale_ps(_mm512_div_ps(xv, vs), kNear);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(q, vlo), vhi));
  }
  __m512i operator()(__m512 xv) const {
    if (!by_mul) return divided(xv);
    const __m512 y = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(xv, vr), vlo), vhi);
    __m512i v = _mm512_cvtps_epi32(y);
    const __m512 off = _mm512_abs_ps(_mm512_sub_ps(y, _mm512_cvtepi32_ps(v)));
    const __mmask16 near = _mm512_cmp_ps_mask(off, edge, _CMP_GE_OQ);
    if (near) v = _mm512_mask_mov_epi32(v, near, divided(xv));
    return v;
  }
};
#endif

void quantize8(const float* x, i64 n, float scale, int zp, int qmin, int qmax, std::uint8_t* y) {
  const float lo = static_cast<float>(qmin - zp), hi = static_cast<float>(qmax - zp);
  i64 i = 0;
#if defined(QLIN_ISA_VNNI)
  const Round512 round(scale, lo, hi);
  const __m512i vzp = _mm512_set1_epi32(zp);
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_add_epi32(round(_mm512_loadu_ps(x + i)), vzp);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(v));
  }
#elif defined(QLIN_ISA_AVX2)
  const __m256 vs = _mm256_set1_ps(scale), vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  const __m256i vzp = _mm256_set1_epi32(zp);
  for (; i + 8 <= n; i += 8) {
    __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, vlo), vhi);
    alignas(32) std::int32_t t[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_add_epi32(_mm256_cvtps_epi32(q), vzp));
    for (int j = 0; j < 8; ++j) y[i + j] = static_cast<std::uint8_t>(t[j]);
  }
#endif
  for (; i < n; ++i) {
    float q = std::nearbyint(x[i] / scale);  // the FP environment's rounding: to nearest, ties to even
    q = q >= lo ? q : lo;                      // NaN -> lo, i.e. 0 after the zero point (the reference's cast)
    q = q <= hi ? q : hi;
    y[i] = static_cast<std::uint8_t>(static_cast<int>(q) + zp);
  }
}

// x[i] = float32(saturate(round_half_even(x[i] / scale) + zp) - zp) * scale (+ bias[i]) in place: quantize8's
// bytes, then DequantizeLinear's product (q - zp is an exact integer: one rounding), then the float Add, in one pass
// over x (a QDQ model's Q -> DQ -> Add(bias) after its int8 GEMM).
void fake_quant8(float* x, i64 n, float scale, int zp, int qmin, int qmax, const float* bias) {
  i64 i = 0;
#if defined(QLIN_ISA_VNNI)
  const Round512 round(scale, static_cast<float>(qmin - zp), static_cast<float>(qmax - zp));
  for (; i + 16 <= n; i += 16) {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(round(_mm512_loadu_ps(x + i))), round.vs);
    if (bias) f = _mm512_add_ps(f, _mm512_loadu_ps(bias + i));
    _mm512_storeu_ps(x + i, f);
  }
#endif
  alignas(64) std::uint8_t q[256];
  while (i < n) {
    const i64 nc = n - i < 256 ? n - i : 256;
    quantize8(x + i, nc, scale, zp, qmin, qmax, q);
    for (i64 j = 0; j < nc; ++j) {
      const int v = qmin < 0 ? static_cast<int>(static_cast<std::int8_t>(q[j])) : static_cast<int>(q[j]);
      const float f = static_cast<float>(v - zp) * scale;
      x[i + j] = bias ? f + bias[i + j] : f;
    }
    i += nc;
  }
}

void minmax(const float* x, i64 n, float* lo_out, float* hi_out) {
  float lo = x[0], hi = x[0];
  i64 i = 0;
#if defined(QLIN_ISA_VNNI)
  if (n >= 16) {  // minps(x, acc) keeps acc where x is NaN, as the scalar loop does
    // four accumulators each (one min / max chain is bound by the instruction's latency, 4 cycles per 16 values)
    __m512 vlo[4], vhi[4];
    for (int u = 0; u < 4; ++u) vlo[u] = vhi[u] = _mm512_set1_ps(lo);
    for (; i + 64 <= n; i += 64)
      for (int u = 0; u < 4; ++u) {
        const __m512 v = _mm512_loadu_ps(x + i + 16 * u);
        vlo[u] = _mm512_min_ps(v, vlo[u]);
        vhi[u] = _mm512_max_ps(v, vhi[u]);
      }
    for (; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      vlo[0] = _mm512_min_ps(v, vlo[0]);
      vhi[0] = _mm512_max_ps(v, vhi[0]);
    }
    // NaN reaches an accumulator only from x[0] (all four then NaN): combining them keeps it
    lo = _mm512_reduce_min_ps(_mm512_min_ps(_mm512_min_ps(vlo[0], vlo[1]), _mm512_min_ps(vlo[2], vlo[3])));
    hi = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(vhi[0], vhi[1]), _mm512_max_ps(vhi[2], vhi[3])));
  }
#elif defined(QLIN_ISA_AVX2)
  if (n >= 8) {
    __m256 vlo = _mm256_set1_ps(lo), vhi = vlo;
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      vlo = _mm256_min_ps(v, vlo);
      vhi = _mm256_max_ps(v, vhi);
    }
    alignas(32) float a[8], b[8];
    _mm256_store_ps(a, vlo);
    _mm256_store_ps(b, vhi);
    for (int j = 0; j < 8; ++j) {
      lo = a[j] < lo ? a[j] : lo;
      hi = b[j] > hi ? b[j] : hi;
    }
  }
#endif
  for (; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  *lo_out = lo;
  *hi_out = hi;
}

void rowsums(const std::uint8_t* a, i64 rows, i64 k, i64 lda, std::int32_t* out) {
  for (i64 r = 0; r < rows; ++r) {
    const std::uint8_t* row = a + r * lda;
    std::uint64_t s = 0;  // the low 32 bits: the wrapping uint32 sum
    i64 i = 0;
#if defined(QLIN_ISA_VNNI)
    // vpsadbw against zero: the sums of each 8 bytes in 64-bit lanes (the scalar loop below was 7 % of a T5 GEMM)
    // (a short row or the tail in one masked load: a conv's rows are often K = 9-72 bytes)
    __m512i acc = _mm512_setzero_si512();
    for (; i + 64 <= k; i += 64)
      acc = _mm512_add_epi64(acc, _mm512_sad_epu8(_mm512_loadu_si512(row + i), _mm512_setzero_si512()));
    if (i < k) {
      const __mmask64 tail = ~std::uint64_t{0} >> (64 - (k - i));
      acc = _mm512_add_epi64(acc, _mm512_sad_epu8(_mm512_maskz_loadu_epi8(tail, row + i), _mm512_setzero_si512()));
      i = k;
    }
    s = static_cast<std::uint64_t>(_mm512_reduce_add_epi64(acc));
#endif
    for (; i < k; ++i) s += row[i];
    out[r] = static_cast<std::int32_t>(static_cast<std::uint32_t>(s));
  }
}

// One row: v[j] = raw[j] - za colsum[n0 + j] - zb[n0 + j] (rowsum - K za), in wrapping int32 (unsigned) arithmetic.
inline void corrected(const Corrections& cr, i64 m, i64 n0, int ncols, const std::int32_t* raw, std::int32_t* v) {
  const std::uint32_t za = static_cast<std::uint32_t>(cr.za[cr.za_count == 1 ? 0 : m]);
  const std::uint32_t rr = static_cast<std::uint32_t>(cr.rowsum[m]) - static_cast<std::uint32_t>(cr.k) * za;
  const std::int32_t* cs = cr.colsum + n0;
  const std::int32_t* zb = cr.zb + n0;
  for (int j = 0; j < ncols; ++j)
    v[j] = static_cast<std::int32_t>(static_cast<std::uint32_t>(raw[j]) - za * static_cast<std::uint32_t>(cs[j]) -
                                     static_cast<std::uint32_t>(zb[j]) * rr);
}

// The float stage of one contiguous row, in one pass: out[j] = float32(corrected sum) * scale[j] (+ bias[j])
// (+ add[j]), in that order.
template <bool Bias>
void finish_f32_row(const Corrections& cr, i64 m, i64 n, int nc, const std::int32_t* raw, const float* sc,
                    const float* bias, const float* add, float* o) {
  const std::uint32_t za = static_cast<std::uint32_t>(cr.za[cr.za_count == 1 ? 0 : m]);
  const std::uint32_t rr = static_cast<std::uint32_t>(cr.rowsum[m]) - static_cast<std::uint32_t>(cr.k) * za;
  const std::int32_t* cs = cr.colsum + n;
  const std::int32_t* zb = cr.zb + n;
  for (int j = 0; j < nc; ++j) {
    const std::int32_t v = static_cast<std::int32_t>(static_cast<std::uint32_t>(raw[j]) -
                                                     za * static_cast<std::uint32_t>(cs[j]) -
                                                     static_cast<std::uint32_t>(zb[j]) * rr);
    float f = static_cast<float>(v) * sc[j];
    if (Bias) f = f + bias[j];
    o[j] = add ? f + add[j] : f;
  }
}

#if defined(QLIN_ISA_VNNI)
// The Q8 stage of 4 rows into an output whose rows are adjacent bytes (rs == 1: QLinearConv's NCHW output, a column
// per channel): 16 columns at a time requantized as finish's scalar loop does (cvtps2dq rounds half to even, as
// nearbyint; maxps returns lo for NaN), then each column's 4 bytes stored as one word. The scalar loop and its
// byte-strided stores cost ~10 % of magika's QLinearConv on Zen 4.
void requant_4rows_to_columns(const OutStage& st, const Corrections& cr, i64 m0, i64 n0, int ncols,
                              const std::int32_t* raw, i64 ldraw) {
  const __m512 lo = _mm512_set1_ps(static_cast<float>(st.qmin - st.y_zp));
  const __m512 hi = _mm512_set1_ps(static_cast<float>(st.qmax - st.y_zp));
  const __m512i yzp = _mm512_set1_epi32(st.y_zp);
  auto* out = static_cast<std::uint8_t*>(st.out);  // int8 or uint8: the same low byte
  for (int c0 = 0; c0 < ncols; c0 += 16) {
    const int lanes = std::min(16, ncols - c0);
    const __mmask16 mask = lanes == 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << lanes) - 1);
    const i64 n = n0 + c0;
    const __m512i cs = _mm512_maskz_loadu_epi32(mask, cr.colsum + n), zb = _mm512_maskz_loadu_epi32(mask, cr.zb + n);
    const __m512i ib = st.ibias ? _mm512_maskz_loadu_epi32(mask, st.ibias + n) : _mm512_setzero_si512();
    const __m512 sc = _mm512_maskz_loadu_ps(mask, st.scale + n);
    __m128i q[4];
    for (int r = 0; r < 4; ++r) {
      const i64 m = m0 + r;
      const std::uint32_t za = static_cast<std::uint32_t>(cr.za[cr.za_count == 1 ? 0 : m]);
      const std::uint32_t rr = static_cast<std::uint32_t>(cr.rowsum[m]) - static_cast<std::uint32_t>(cr.k) * za;
      __m512i v = _mm512_maskz_loadu_epi32(mask, raw + r * ldraw + c0);
      v = _mm512_sub_epi32(v, _mm512_mullo_epi32(_mm512_set1_epi32(static_cast<int>(za)), cs));
      v = _mm512_sub_epi32(v, _mm512_mullo_epi32(zb, _mm512_set1_epi32(static_cast<int>(rr))));
      v = _mm512_add_epi32(v, ib);
      const __m512 f = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), sc), lo), hi);
      q[r] = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), yzp));
    }
    // 4 rows x 16 bytes -> 16 words (column j: rows 0-3)
    const __m128i t01l = _mm_unpacklo_epi8(q[0], q[1]), t01h = _mm_unpackhi_epi8(q[0], q[1]);
    const __m128i t23l = _mm_unpacklo_epi8(q[2], q[3]), t23h = _mm_unpackhi_epi8(q[2], q[3]);
    alignas(16) std::uint32_t words[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(words), _mm_unpacklo_epi16(t01l, t23l));
    _mm_store_si128(reinterpret_cast<__m128i*>(words + 4), _mm_unpackhi_epi16(t01l, t23l));
    _mm_store_si128(reinterpret_cast<__m128i*>(words + 8), _mm_unpacklo_epi16(t01h, t23h));
    _mm_store_si128(reinterpret_cast<__m128i*>(words + 12), _mm_unpackhi_epi16(t01h, t23h));
    for (int j = 0; j < lanes; ++j) std::memcpy(out + (n + j) * st.cs + m0, words + j, 4);
  }
}
#endif

// The I32 / F32 stage into an output whose rows are adjacent (rs == 1: NCHW, rows = positions, columns = channels
// cs apart): the tile's values corrected row by row, then written column by column, each column's rows in one run
// (a 4-row tile's 4 x 4 blocks transposed in registers: one 16-byte store a column).
void finish_columns(const OutStage& st, const Corrections& cr, i64 m0, int rows, i64 n0, int ncols,
                    const std::int32_t* raw, i64 ldraw) {
  constexpr int kValues = 1024;
  alignas(64) std::int32_t v[kValues];
  const int chunk = rows >= kValues ? 1 : kValues / rows;  // columns per pass
  for (int c0 = 0; c0 < ncols; c0 += chunk) {
    const int nc = ncols - c0 < chunk ? ncols - c0 : chunk;
    const i64 n = n0 + c0;
    for (int r = 0; r < rows; ++r) corrected(cr, m0 + r, n, nc, raw + r * ldraw + c0, v + r * nc);
    if (st.ibias)  // wrapping, as int32 tensors add
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < nc; ++j)
          v[r * nc + j] = static_cast<std::int32_t>(static_cast<std::uint32_t>(v[r * nc + j]) +
                                                    static_cast<std::uint32_t>(st.ibias[n + j]));
    int j = 0;
#if defined(__SSE2__)
    if (rows == 4)
      for (; j + 4 <= nc; j += 4) {
        __m128i c[4];
        for (int r = 0; r < 4; ++r) c[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + r * nc + j));
        const __m128i t0 = _mm_unpacklo_epi32(c[0], c[1]), t1 = _mm_unpackhi_epi32(c[0], c[1]);
        const __m128i t2 = _mm_unpacklo_epi32(c[2], c[3]), t3 = _mm_unpackhi_epi32(c[2], c[3]);
        const __m128i col[4] = {_mm_unpacklo_epi64(t0, t2), _mm_unpackhi_epi64(t0, t2), _mm_unpacklo_epi64(t1, t3),
                                _mm_unpackhi_epi64(t1, t3)};  // column j + q, rows 0-3
        for (int q = 0; q < 4; ++q) {
          const i64 at = (n + j + q) * st.cs + m0;
          if (st.kind == OutStage::I32) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<std::int32_t*>(st.out) + at), col[q]);
            continue;
          }
          __m128 f = _mm_mul_ps(_mm_cvtepi32_ps(col[q]), _mm_set1_ps(st.scale[n + j + q]));
          if (st.fbias) f = _mm_add_ps(f, _mm_set1_ps(st.fbias[n + j + q]));
          _mm_storeu_ps(static_cast<float*>(st.out) + at, f);
        }
      }
#endif
    for (; j < nc; ++j) {
      const i64 at = (n + j) * st.cs + m0;
      if (st.kind == OutStage::I32) {
        std::int32_t* o = static_cast<std::int32_t*>(st.out) + at;
        for (int r = 0; r < rows; ++r) o[r] = v[r * nc + j];
        continue;
      }
      const float sc = st.scale[n + j], fb = st.fbias ? st.fbias[n + j] : 0.0f;
      float* o = static_cast<float*>(st.out) + at;
      for (int r = 0; r < rows; ++r) {
        const float x = static_cast<float>(v[r * nc + j]) * sc;
        o[r] = st.fbias ? x + fb : x;
      }
    }
  }
}

void finish(const OutStage& st, const Corrections& cr, i64 m0, int rows, i64 n0, int ncols, const std::int32_t* raw,
            i64 ldraw) {
#if defined(QLIN_ISA_VNNI)
  if (st.kind == OutStage::Q8 && rows == 4 && st.rs == 1)
    return requant_4rows_to_columns(st, cr, m0, n0, ncols, raw, ldraw);
#endif
  // contiguous rows: straight into the output (an F32 stage with an int32 bias adds it first, below)
  if (st.cs == 1 && (st.kind == OutStage::I32 || (st.kind == OutStage::F32 && !st.ibias))) {
    for (int r = 0; r < rows; ++r) {
      const i64 m = m0 + r;
      const std::int32_t* rw = raw + r * ldraw;
      if (st.kind == OutStage::I32) {
        corrected(cr, m, n0, ncols, rw, static_cast<std::int32_t*>(st.out) + m * st.rs + n0);
      } else {
        float* o = static_cast<float*>(st.out) + m * st.rs + n0;
        const float* add = st.addend ? st.addend + m * st.add_rs + n0 : nullptr;
        if (st.fbias)
          finish_f32_row<true>(cr, m, n0, ncols, rw, st.scale + n0, st.fbias + n0, add, o);
        else
          finish_f32_row<false>(cr, m, n0, ncols, rw, st.scale + n0, nullptr, add, o);
      }
    }
    return;
  }
  if (st.rs == 1 && st.kind != OutStage::Q8 && !st.addend)  // rows adjacent in memory: a conv's NCHW output
    return finish_columns(st, cr, m0, rows, n0, ncols, raw, ldraw);
  alignas(64) std::int32_t v[256];
  alignas(64) float f[256];
  for (int r = 0; r < rows; ++r) {
    const i64 m = m0 + r;
    for (int c0 = 0; c0 < ncols; c0 += 256) {
      const int nc = ncols - c0 < 256 ? ncols - c0 : 256;
      const i64 n = n0 + c0;
      corrected(cr, m, n, nc, raw + r * ldraw + c0, v);
      if (st.kind == OutStage::I32) {
        std::int32_t* o = static_cast<std::int32_t*>(st.out) + m * st.rs + n * st.cs;
        if (st.cs == 1) std::memcpy(o, v, static_cast<std::size_t>(nc) * 4);
        else for (int j = 0; j < nc; ++j) o[j * st.cs] = v[j];
        continue;
      }
      if (st.ibias) {  // wrapping, as int32 tensors add
        const std::int32_t* b = st.ibias + n;
        for (int j = 0; j < nc; ++j)
          v[j] = static_cast<std::int32_t>(static_cast<std::uint32_t>(v[j]) + static_cast<std::uint32_t>(b[j]));
      }
      if (st.kind == OutStage::F32) {
        const float* sc = st.scale + n;
        for (int j = 0; j < nc; ++j) f[j] = static_cast<float>(v[j]) * sc[j];
        if (st.fbias) {
          const float* b = st.fbias + n;
          for (int j = 0; j < nc; ++j) f[j] = f[j] + b[j];
        }
        if (st.addend) {
          const float* add = st.addend + m * st.add_rs + n;
          for (int j = 0; j < nc; ++j) f[j] = f[j] + add[j];
        }
        float* o = static_cast<float*>(st.out) + m * st.rs + n * st.cs;
        if (st.cs == 1) std::memcpy(o, f, static_cast<std::size_t>(nc) * 4);
        else for (int j = 0; j < nc; ++j) o[j * st.cs] = f[j];
        continue;
      }
      const float lo = static_cast<float>(st.qmin - st.y_zp), hi = static_cast<float>(st.qmax - st.y_zp);
      const float* sc = st.scale + n;
      for (int j = 0; j < nc; ++j) {
        float x = static_cast<float>(v[j]) * sc[j];
        x = x >= lo ? x : lo;
        x = x <= hi ? x : hi;
        v[j] = static_cast<std::int32_t>(std::nearbyint(x)) + st.y_zp;
      }
      if (st.y_unsigned) {
        std::uint8_t* o = static_cast<std::uint8_t*>(st.out) + m * st.rs + n * st.cs;
        for (int j = 0; j < nc; ++j) o[j * st.cs] = static_cast<std::uint8_t>(v[j]);
      } else {
        std::int8_t* o = static_cast<std::int8_t*>(st.out) + m * st.rs + n * st.cs;
        for (int j = 0; j < nc; ++j) o[j * st.cs] = static_cast<std::int8_t>(v[j]);
      }
    }
  }
}

}  // namespace
}  // namespace qlin
}  // namespace hetero
