// AVX-512 LLM kernels, compiled twice: llm_kernels_avx512.cpp (AVX-512F/BW/DQ/VL: integer dots with
// vpmaddubsw + vpmaddwd) and llm_kernels_avx512vnni.cpp (HETERO_LLM_VNNI=1, adds -mavx512vnni: vpdpbusd).
// Everything lives in an anonymous namespace (the two compilations must never be merged by the linker).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "llm.hpp"

#ifndef HETERO_LLM_VNNI
#define HETERO_LLM_VNNI 0
#endif

namespace {

using hetero::i64;
using namespace hetero::llm;

// ---------------------------------------------------------------------------------------------- activations
void quantize_x(const float* x, i64 M, i64 ldx, i64 k, int bs, bool pair4, std::int8_t* q, float* d,
                std::int32_t* s, float* ds, std::int32_t* sl) {
  const i64 nb = (k + bs - 1) / bs;
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (i64 m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    for (i64 b = 0; b < nb; ++b) {
      const i64 lo = b * bs;
      __m512 vmax = _mm512_setzero_ps();
      for (int i = 0; i < bs; i += 16) {
        const i64 left = k - (lo + i);
        const __mmask16 mk = left >= 16 ? static_cast<__mmask16>(0xffff)
                                        : (left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1));
        const __m512 v = _mm512_maskz_loadu_ps(mk, xr + lo + i);
        vmax = _mm512_max_ps(vmax, _mm512_and_ps(v, absmask));
      }
      const float amax = _mm512_reduce_max_ps(vmax);
      const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      const __m512 vinv = _mm512_set1_ps(inv);
      std::int8_t* qb = q + m * nb * bs + b * bs;
      __m512i vsum = _mm512_setzero_si512(), vhalf = _mm512_setzero_si512();
      for (int i = 0; i < bs; i += 16) {
        const i64 left = k - (lo + i);
        const __mmask16 mk = left >= 16 ? static_cast<__mmask16>(0xffff)
                                        : (left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1));
        const __m512 v = _mm512_maskz_loadu_ps(mk, xr + lo + i);
        __m512i qi = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT |
                                                                                    _MM_FROUND_NO_EXC));
        qi = _mm512_max_epi32(_mm512_min_epi32(qi, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        vsum = _mm512_add_epi32(vsum, qi);
        if (i < bs / 2) vhalf = _mm512_add_epi32(vhalf, qi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + i), _mm512_cvtepi32_epi8(qi));
      }
      const std::int32_t sum = _mm512_reduce_add_epi32(vsum);
      if (pair4) pair_words(qb, bs);
      d[m * nb + b] = dx;
      s[m * nb + b] = sum;
      ds[m * nb + b] = dx * static_cast<float>(sum);
      sl[m * nb + b] = _mm512_reduce_add_epi32(vhalf);
    }
  }
}

// ---------------------------------------------------------------------------------------------- quantized GEMM
// acc (16 x int32) += per-lane dot of 4 unsigned bytes of w with 4 signed bytes of x.
inline __m512i dot_u8s8(__m512i acc, __m512i w, __m512i x) {
#if HETERO_LLM_VNNI
  return _mm512_dpbusd_epi32(acc, w, x);
#else
  // w <= 63 here (4/5/6-bit): the pairwise int16 sums of vpmaddubsw stay below 2 * 63 * 127 < 32767.
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#endif
}

// 8-bit weights. VNNI: the unsigned bytes directly. Otherwise s = w - 128 (signed) with |s| <= 128 against x
// with the sign of s moved onto it, so vpmaddubsw's int16 pair sums stay below 32767; the result is then
// sum((w - 128) x), i.e. the offset moves by 128 (see q8_offset).
inline __m512i dot_q8(__m512i acc, __m512i w, __m512i x) {
#if HETERO_LLM_VNNI
  return _mm512_dpbusd_epi32(acc, w, x);
#else
  const __m512i sw = _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  const __mmask64 neg = _mm512_movepi8_mask(sw);
  const __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
  return _mm512_add_epi32(
      acc, _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(sw), sx), _mm512_set1_epi16(1)));
#endif
}

inline int effective_offset(const QPack& w) {
#if HETERO_LLM_VNNI
  return w.offset();
#else
  return w.bits == 8 ? w.offset() - 128 : w.offset();
#endif
}

inline __m512i bcast4(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline i64 prefetch_distance() {
  static const i64 v = [] { const char* e = std::getenv("HETERO_LLM_PF"); return e ? std::atol(e) : 4096L; }();
  return v;
}

// Bits 4-5 of the 5/6-bit values of nibble vector t (t < 4), from the record's high plane(s) (layout in llm.hpp),
// added to the low (elements 4t+c) and high (B/2+4t+c) nibbles. The 16-bit shifts move bits across byte borders
// only into bits the masks drop.
template <int BITS>
inline void add_high_bits(const std::uint8_t* hp, int t, __m512i& lo, __m512i& hi) {
  if (BITS == 5) {
    const __m512i h = _mm512_loadu_si512(hp), m = _mm512_set1_epi8(0x10);
    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4 - t), m));
    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h, t), m));
  } else if (BITS == 6) {
    const __m512i h = _mm512_loadu_si512(hp + 64 * (t / 2)), m = _mm512_set1_epi8(0x30);
    const int u = 2 * (t % 2);
    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4 - u), m));
    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h, u), m));
  }
}

inline __m512 u8x16_ps(const std::uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 f16x16_ps(const std::uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One 16-row group against MR activation rows. BITS: 4/5/6/8; KQ: scale layout (llm.hpp).
template <int BITS, bool ASYM, int KQ, int MR>
void qgemm_mr(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, float* y, i64 ldy, int nvalid) {
  constexpr bool NIB = BITS < 8;
  const int bs = w.bs;
  const int nt = NIB ? bs / 8 : bs / 4;
  const int off = effective_offset(w);
  const i64 hdr = w.header_bytes(), nib_bytes = w.nibble_bytes();
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const i64 kPrefetch = prefetch_distance();
  __m512 facc[MR];
  const std::int8_t* xrow[MR];
  for (int m = 0; m < MR; ++m) {
    facc[m] = _mm512_setzero_ps();
    xrow[m] = x.q + (m0 + m) * x.ldq;
  }
  for (i64 b0 = 0; b0 < w.nb; b0 += w.sub) {
    const std::uint8_t* sb = group + (b0 / w.sub) * w.super_bytes;
    __m512 sd = _mm512_setzero_ps(), smin = _mm512_setzero_ps();  // k-quants: the super-block's d (and dmin)
    if (KQ) sd = f16x16_ps(sb);
    if (KQ == 1) smin = f16x16_ps(sb + 32);
    const i64 b1 = std::min<i64>(w.nb, b0 + w.sub);
    for (i64 b = b0; b < b1; ++b) {
      const std::uint8_t* rec = sb + w.sb_hdr + (b - b0) * w.rec_bytes;
      const std::uint8_t* qv = rec + hdr;
      if (MR <= 2)  // decode streams the weights from memory: keep more lines in flight than the L2 streamer does
        for (i64 o = 0; o < w.rec_bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetch + o), _MM_HINT_T0);
      __m512i ilo[MR], ihi[MR];  // q6_k keeps the block's two halves apart (one scale each)
      for (int m = 0; m < MR; ++m) ilo[m] = ihi[m] = _mm512_setzero_si512();
      const i64 xo = b * bs;
      for (int t = 0; t < nt; ++t) {
        const __m512i v = _mm512_loadu_si512(qv + 64 * t);
        if (NIB) {
          __m512i lo = _mm512_and_si512(v, nib);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
          add_high_bits<BITS>(qv + nib_bytes, t, lo, hi);
          for (int m = 0; m < MR; ++m) {
            ilo[m] = dot_u8s8(ilo[m], lo, bcast4(xrow[m] + xo + 8 * t));  // pair4 order
            __m512i& acc_hi = KQ == 2 ? ihi[m] : ilo[m];
            acc_hi = dot_u8s8(acc_hi, hi, bcast4(xrow[m] + xo + 8 * t + 4));
          }
        } else {
          for (int m = 0; m < MR; ++m) ilo[m] = dot_q8(ilo[m], v, bcast4(xrow[m] + xo + 4 * t));
        }
      }
      if (KQ == 0) {
        const __m512 dv = f16x16_ps(rec);
        const __m512 mv = ASYM ? f16x16_ps(rec + 32) : _mm512_setzero_ps();
        for (int m = 0; m < MR; ++m) {
          const i64 xi = (m0 + m) * x.nb + b;
          __m512i iv = ilo[m];
          if (off != 0) iv = _mm512_sub_epi32(iv, _mm512_set1_epi32(off * x.s[xi]));
          facc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), _mm512_mul_ps(dv, _mm512_set1_ps(x.d[xi])), facc[m]);
          if (ASYM) facc[m] = _mm512_fmadd_ps(mv, _mm512_set1_ps(x.ds[xi]), facc[m]);
        }
      } else if (KQ == 1) {  // d*sc * dot - dmin*mn * dx*sum(xq)
        const __m512 scv = _mm512_mul_ps(sd, u8x16_ps(rec)), mnv = _mm512_mul_ps(smin, u8x16_ps(rec + 16));
        for (int m = 0; m < MR; ++m) {
          const i64 xi = (m0 + m) * x.nb + b;
          facc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ilo[m]), _mm512_mul_ps(scv, _mm512_set1_ps(x.d[xi])), facc[m]);
          facc[m] = _mm512_fnmadd_ps(mnv, _mm512_set1_ps(x.ds[xi]), facc[m]);
        }
      } else {  // d * (sc_lo * (dot_lo - 32 sum_lo) + sc_hi * (dot_hi - 32 sum_hi)), exact in int32
        const __m512i sclo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
        const __m512i schi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 16)));
        for (int m = 0; m < MR; ++m) {
          const i64 xi = (m0 + m) * x.nb + b;
          const std::int32_t slo = x.sl[xi], shi = x.s[xi] - slo;
          const __m512i lo = _mm512_sub_epi32(ilo[m], _mm512_set1_epi32(32 * slo));
          const __m512i hi = _mm512_sub_epi32(ihi[m], _mm512_set1_epi32(32 * shi));
          const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(lo, sclo), _mm512_mullo_epi32(hi, schi));
          facc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(sd, _mm512_set1_ps(x.d[xi])), facc[m]);
        }
      }
    }
  }
  const __mmask16 keep = nvalid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << nvalid) - 1);
  for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * ldy, keep, facc[m]);
}

template <int BITS, bool ASYM, int KQ>
void qgemm_fmt(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
               int nvalid) {
  switch (mr) {
    case 1: qgemm_mr<BITS, ASYM, KQ, 1>(w, group, x, m0, y, ldy, nvalid); break;
    case 2: qgemm_mr<BITS, ASYM, KQ, 2>(w, group, x, m0, y, ldy, nvalid); break;
    case 3: qgemm_mr<BITS, ASYM, KQ, 3>(w, group, x, m0, y, ldy, nvalid); break;
    case 4: qgemm_mr<BITS, ASYM, KQ, 4>(w, group, x, m0, y, ldy, nvalid); break;
    case 5: qgemm_mr<BITS, ASYM, KQ, 5>(w, group, x, m0, y, ldy, nvalid); break;
    case 6: qgemm_mr<BITS, ASYM, KQ, 6>(w, group, x, m0, y, ldy, nvalid); break;
    case 7: qgemm_mr<BITS, ASYM, KQ, 7>(w, group, x, m0, y, ldy, nvalid); break;
    default: qgemm_mr<BITS, ASYM, KQ, 8>(w, group, x, m0, y, ldy, nvalid); break;
  }
}

void qgemm_group(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                 int nvalid) {
  decltype(&qgemm_fmt<4, false, 0>) f;
  switch (w.kq) {
    case 1: f = w.bits == 4 ? qgemm_fmt<4, true, 1> : qgemm_fmt<5, true, 1>; break;  // q4_k / q5_k
    case 2: f = qgemm_fmt<6, false, 2>; break;                                       // q6_k
    default:
      if (w.bits == 4) f = w.asym ? qgemm_fmt<4, true, 0> : qgemm_fmt<4, false, 0>;
      else if (w.bits == 5) f = w.asym ? qgemm_fmt<5, true, 0> : qgemm_fmt<5, false, 0>;  // q5_1 / q5_0
      else f = w.asym ? qgemm_fmt<8, true, 0> : qgemm_fmt<8, false, 0>;
  }
  f(w, group, x, m0, mr, y, ldy, nvalid);
}

// ---------------------------------------------------------------------------------------------- float GEMM
template <int WT>
inline __m512 loadw(const void* w, i64 i, __mmask16 mk) {
  if (WT == W_F32) return _mm512_maskz_loadu_ps(mk, static_cast<const float*>(w) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(mk, static_cast<const std::uint16_t*>(w) + i);
  if (WT == W_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int WT, int MR>
void fgemm_mr(const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, float* y, i64 ldy) {
  const int NW = 4;
  __m512 acc[MR][NW];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NW; ++j) acc[m][j] = _mm512_setzero_ps();
  i64 wo[NW];
  for (int j = 0; j < NW; ++j) wo[j] = (j < nrows ? j : nrows - 1) * ldw;
  for (i64 i = 0; i < k; i += 16) {
    const __mmask16 mk = k - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 wv[NW];
    for (int j = 0; j < NW; ++j) wv[j] = loadw<WT>(w, wo[j] + i, mk);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mk, x + m * ldx + i);
      for (int j = 0; j < NW; ++j) acc[m][j] = _mm512_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < nrows; ++j) y[m * ldy + j] = _mm512_reduce_add_ps(acc[m][j]);
}

template <int WT>
void fgemm_wt(const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y, i64 ldy) {
  switch (mr) {
    case 1: fgemm_mr<WT, 1>(w, ldw, nrows, k, x, ldx, y, ldy); break;
    case 2: fgemm_mr<WT, 2>(w, ldw, nrows, k, x, ldx, y, ldy); break;
    case 3: fgemm_mr<WT, 3>(w, ldw, nrows, k, x, ldx, y, ldy); break;
    default: fgemm_mr<WT, 4>(w, ldw, nrows, k, x, ldx, y, ldy); break;
  }
}

void fgemm_tile(int wt, const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y,
                i64 ldy) {
  if (wt == W_F16)
    fgemm_wt<W_F16>(w, ldw, nrows, k, x, ldx, mr, y, ldy);
  else if (wt == W_BF16)
    fgemm_wt<W_BF16>(w, ldw, nrows, k, x, ldx, mr, y, ldy);
  else
    fgemm_wt<W_F32>(w, ldw, nrows, k, x, ldx, mr, y, ldy);
}

// ---------------------------------------------------------------------------------------------- conversions
void f16_to_f32(const std::uint16_t* src, float* dst, i64 n) {
  i64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void f32_to_f16(const float* src, std::uint16_t* dst, i64 n) {
  i64 i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// ---------------------------------------------------------------------------------------------- attention
// 16 cached K/V elements as float (q8: the int8 values, before their block scale).
template <int K>
inline __m512 loadkv(const void* p, i64 i) {
  if (K == KV_F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(p) + i)));
  if (K == KV_Q8)
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::int8_t*>(p) + i))));
  return _mm512_loadu_ps(static_cast<const float*>(p) + i);
}

// The same with the lanes outside mk zeroed (the tail of a V row). Only where a row may end: GCC does not move the
// accumulator stores out of a loop that contains masked loads (qk keeps the plain ones: its tiles are full).
template <int K>
inline __m512 loadkv_mask(const void* p, i64 i, __mmask16 mk) {
  if (K == KV_F16)
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, static_cast<const std::uint16_t*>(p) + i));
  if (K == KV_Q8)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mk, static_cast<const std::int8_t*>(p) + i)));
  return _mm512_maskz_loadu_ps(mk, static_cast<const float*>(p) + i);
}

// NR rows x 64 positions: 4*NR accumulators + 4 key vectors. q8 keys are dequantized in registers (int8 -> float
// times the block's scale, a memory operand from L1); memory traffic, not these extra instructions, bounds decode.
template <int K, int NR>
void qk_nr(const float* q, i64 ldq, const void* kt, i64 d, float scale, float* s, i64 lds) {
  const float* ks = reinterpret_cast<const float*>(static_cast<const std::int8_t*>(kt) + d * KT);  // q8 only
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (i64 i = 0; i < d; ++i) {
    __m512 kv[4];
    for (int j = 0; j < 4; ++j) {
      kv[j] = loadkv<K>(kt, i * KT + 16 * j);
      if (K == KV_Q8) kv[j] = _mm512_mul_ps(kv[j], _mm512_loadu_ps(ks + (i / KVB) * KT + 16 * j));
    }
    for (int r = 0; r < NR; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r * ldq + i]);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(qb, kv[j], acc[r][j]);
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(s + r * lds + 16 * j, _mm512_mul_ps(acc[r][j], vs));
}

template <int K>
void qk_t(const float* q, i64 ldq, int nr, const void* kt, i64 d, float scale, float* s, i64 lds) {
  switch (nr) {
    case 1: qk_nr<K, 1>(q, ldq, kt, d, scale, s, lds); break;
    case 2: qk_nr<K, 2>(q, ldq, kt, d, scale, s, lds); break;
    case 3: qk_nr<K, 3>(q, ldq, kt, d, scale, s, lds); break;
    default: qk_nr<K, 4>(q, ldq, kt, d, scale, s, lds); break;
  }
}

void qk_tile(const float* q, i64 ldq, int nr, const void* ktile, int kind, i64 d, float scale, float* s, i64 lds) {
  switch (kind) {
    case KV_F16: qk_t<KV_F16>(q, ldq, nr, ktile, d, scale, s, lds); break;
    case KV_Q8: qk_t<KV_Q8>(q, ldq, nr, ktile, d, scale, s, lds); break;
    default: qk_t<KV_F32>(q, ldq, nr, ktile, d, scale, s, lds); break;
  }
}

// 4 vectors (64 values of d) x NR rows of accumulators: enough independent FMA chains to hide the latency. Vector j
// of a chunk (16 values) lies inside one q8 block of 32, so one broadcast scale dequantizes it.
template <int K, int NR>
void pv_nr(const float* p, i64 ldp, const void* v, const float* vscale, i64 nk, i64 d, const float* corr, float* o) {
  const i64 nb = (d + KVB - 1) / KVB;
  for (i64 c = 0; c < d; c += 64) {
    __mmask16 mk[4];
    for (int j = 0; j < 4; ++j) {
      const i64 left = d - c - 16 * j;
      mk[j] = left >= 16 ? static_cast<__mmask16>(0xffff)
                         : (left <= 0 ? static_cast<__mmask16>(0) : static_cast<__mmask16>((1u << left) - 1));
    }
    const i64 b0 = c / KVB, b1 = b0 + 1 < nb ? b0 + 1 : b0;  // blocks of vectors 0-1 and 2-3 (q8)
    __m512 acc[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < 4; ++j)
        acc[r][j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[j], o + r * d + c + 16 * j), _mm512_set1_ps(corr[r]));
    for (i64 l = 0; l < nk; ++l) {
      __m512 vv[4];
      for (int j = 0; j < 4; ++j) vv[j] = loadkv_mask<K>(v, l * d + c + 16 * j, mk[j]);
      if (K == KV_Q8) {
        const __m512 s0 = _mm512_set1_ps(vscale[l * nb + b0]), s1 = _mm512_set1_ps(vscale[l * nb + b1]);
        vv[0] = _mm512_mul_ps(vv[0], s0);
        vv[1] = _mm512_mul_ps(vv[1], s0);
        vv[2] = _mm512_mul_ps(vv[2], s1);
        vv[3] = _mm512_mul_ps(vv[3], s1);
      }
      for (int r = 0; r < NR; ++r) {
        const __m512 pb = _mm512_set1_ps(p[r * ldp + l]);
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(pb, vv[j], acc[r][j]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < 4; ++j) _mm512_mask_storeu_ps(o + r * d + c + 16 * j, mk[j], acc[r][j]);
  }
}

template <int K>
void pv_t(const float* p, i64 ldp, int nr, const void* v, const float* vscale, i64 nk, i64 d, const float* corr,
          float* o) {
  switch (nr) {
    case 1: pv_nr<K, 1>(p, ldp, v, vscale, nk, d, corr, o); break;
    case 2: pv_nr<K, 2>(p, ldp, v, vscale, nk, d, corr, o); break;
    case 3: pv_nr<K, 3>(p, ldp, v, vscale, nk, d, corr, o); break;
    default: pv_nr<K, 4>(p, ldp, v, vscale, nk, d, corr, o); break;
  }
}

void pv_tile(const float* p, i64 ldp, int nr, const void* v, int kind, const float* vscale, i64 nk, i64 d,
             const float* corr, float* o) {
  switch (kind) {
    case KV_F16: pv_t<KV_F16>(p, ldp, nr, v, vscale, nk, d, corr, o); break;
    case KV_Q8: pv_t<KV_Q8>(p, ldp, nr, v, vscale, nk, d, corr, o); break;
    default: pv_t<KV_F32>(p, ldp, nr, v, vscale, nk, d, corr, o); break;
  }
}

const LlmKernels table = {HETERO_LLM_VNNI ? "avx512vnni" : "avx512", 8, quantize_x, qgemm_group, fgemm_tile,
                          f16_to_f32, f32_to_f16, qk_tile, pv_tile};

}  // namespace
