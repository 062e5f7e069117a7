// AVX2 + FMA + F16C LLM kernels (compiled with -mavx2 -mfma -mf16c; entered only after the run-time CPU check).
// Integer dots with vpmaddubsw + vpmaddwd; a 16-row weight group is processed as two 8-row halves.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "llm.hpp"

namespace {

using hetero::i64;
using namespace hetero::llm;

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline std::int32_t hsum8i(__m256i v) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  return _mm_cvtsi128_si32(s4);
}

inline __m256i tail_mask(i64 left) {  // lanes < left set (left clamped to [0, 8])
  const int n = left <= 0 ? 0 : (left >= 8 ? 8 : static_cast<int>(left));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

void quantize_x(const float* x, i64 M, i64 ldx, i64 k, int bs, bool pair4, std::int8_t* q, float* d,
                std::int32_t* s, float* ds, std::int32_t* sl) {
  const i64 nb = (k + bs - 1) / bs;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (i64 m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    for (i64 b = 0; b < nb; ++b) {
      const i64 lo = b * bs;
      __m256 vmax = _mm256_setzero_ps();
      for (int i = 0; i < bs; i += 8) {
        const __m256 v = _mm256_maskload_ps(xr + lo + i, tail_mask(k - (lo + i)));
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, absmask));
      }
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      const __m256 vinv = _mm256_set1_ps(inv);
      std::int8_t* qb = q + m * nb * bs + b * bs;
      __m256i vsum = _mm256_setzero_si256(), vhalf = _mm256_setzero_si256();
      for (int i = 0; i < bs; i += 8) {
        const __m256 v = _mm256_maskload_ps(xr + lo + i, tail_mask(k - (lo + i)));
        __m256i qi = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT |
                                                                                  _MM_FROUND_NO_EXC));
        qi = _mm256_max_epi32(_mm256_min_epi32(qi, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
        vsum = _mm256_add_epi32(vsum, qi);
        if (i < bs / 2) vhalf = _mm256_add_epi32(vhalf, qi);
        const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        const __m128i p8 = _mm_packs_epi16(p16, p16);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qb + i), p8);
      }
      const std::int32_t sum = hsum8i(vsum);
      if (pair4) pair_words(qb, bs);
      d[m * nb + b] = dx;
      s[m * nb + b] = sum;
      ds[m * nb + b] = dx * static_cast<float>(sum);
      sl[m * nb + b] = hsum8i(vhalf);
    }
  }
}

inline __m256i bcast4(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Bits 4-5 of the 5/6-bit values of nibble vector t, half h (rows 8h..8h+7), from the record's high plane(s)
// (layout in llm.hpp). The 16-bit shifts move bits across byte borders only into bits the masks drop.
template <int BITS>
inline void add_high_bits(const std::uint8_t* hp, int t, int h, __m256i& lo, __m256i& hi) {
  if (BITS == 5) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hp + 32 * h));
    const __m256i m = _mm256_set1_epi8(0x10);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - t)), m));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(t)), m));
  } else if (BITS == 6) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hp + 64 * (t / 2) + 32 * h));
    const __m256i m = _mm256_set1_epi8(0x30);
    const int u = 2 * (t % 2);
    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - u)), m));
    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(u)), m));
  }
}

inline __m256 u8x8_ps(const std::uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 f16x8_ps(const std::uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// One 16-row group (as two 8-row halves) against MR activation rows. BITS: 4/5/6/8; KQ: scale layout (llm.hpp).
template <int BITS, bool ASYM, int KQ, int MR>
void qgemm_mr(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, float* y, i64 ldy, int nvalid) {
  constexpr bool NIB = BITS < 8;
  const int bs = w.bs;
  const int nt = NIB ? bs / 8 : bs / 4;
  // 8-bit: dots of (w - 128) (see below), so the offset moves by 128.
  const int off = BITS == 8 ? w.offset() - 128 : w.offset();
  const i64 hdr = w.header_bytes(), nib_bytes = w.nibble_bytes();
  const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const std::int8_t* xrow[MR];
  for (int m = 0; m < MR; ++m) xrow[m] = x.q + (m0 + m) * x.ldq;
  for (int h = 0; h < 2; ++h) {
    __m256 facc[MR];
    for (int m = 0; m < MR; ++m) facc[m] = _mm256_setzero_ps();
    for (i64 b0 = 0; b0 < w.nb; b0 += w.sub) {
      const std::uint8_t* sb = group + (b0 / w.sub) * w.super_bytes;
      __m256 sd = _mm256_setzero_ps(), smin = _mm256_setzero_ps();  // k-quants: the super-block's d (and dmin)
      if (KQ) sd = f16x8_ps(sb + 16 * h);
      if (KQ == 1) smin = f16x8_ps(sb + 32 + 16 * h);
      const i64 b1 = std::min<i64>(w.nb, b0 + w.sub);
      for (i64 b = b0; b < b1; ++b) {
        const std::uint8_t* rec = sb + w.sb_hdr + (b - b0) * w.rec_bytes;
        const std::uint8_t* qv = rec + hdr;
        if (MR <= 2 && h == 0)  // decode streams the weights from memory: prefetch ahead of the L2 streamer
          for (i64 o = 0; o < w.rec_bytes; o += 64)
            _mm_prefetch(reinterpret_cast<const char*>(rec + 4096 + o), _MM_HINT_T0);
        __m256i ilo[MR], ihi[MR];  // q6_k keeps the block's two halves apart (one scale each)
        for (int m = 0; m < MR; ++m) ilo[m] = ihi[m] = _mm256_setzero_si256();
        const i64 xo = b * bs;
        for (int t = 0; t < nt; ++t) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qv + 64 * t + 32 * h));
          if (NIB) {
            __m256i lo = _mm256_and_si256(v, nib);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            add_high_bits<BITS>(qv + nib_bytes, t, h, lo, hi);
            for (int m = 0; m < MR; ++m) {
              const __m256i plo = _mm256_maddubs_epi16(lo, bcast4(xrow[m] + xo + 8 * t));  // pair4 order
              const __m256i phi = _mm256_maddubs_epi16(hi, bcast4(xrow[m] + xo + 8 * t + 4));
              if (KQ == 2) {
                ilo[m] = _mm256_add_epi32(ilo[m], _mm256_madd_epi16(plo, ones));
                ihi[m] = _mm256_add_epi32(ihi[m], _mm256_madd_epi16(phi, ones));
              } else {
                // weights <= 31: four products of one lane fit in int16 before widening.
                ilo[m] = _mm256_add_epi32(ilo[m], _mm256_madd_epi16(_mm256_add_epi16(plo, phi), ones));
              }
            }
          } else {
            // |w - 128| <= 128 against x (|x| <= 127) with the sign moved onto x: no int16 saturation.
            const __m256i sw = _mm256_xor_si256(v, flip);
            const __m256i aw = _mm256_sign_epi8(sw, sw);
            for (int m = 0; m < MR; ++m) {
              const __m256i sx = _mm256_sign_epi8(bcast4(xrow[m] + xo + 4 * t), sw);
              ilo[m] = _mm256_add_epi32(ilo[m], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
            }
          }
        }
        if (KQ == 0) {
          const __m256 dv = f16x8_ps(rec + 16 * h);
          const __m256 mv = ASYM ? f16x8_ps(rec + 32 + 16 * h) : _mm256_setzero_ps();
          for (int m = 0; m < MR; ++m) {
            const i64 xi = (m0 + m) * x.nb + b;
            __m256i iv = ilo[m];
            if (off != 0) iv = _mm256_sub_epi32(iv, _mm256_set1_epi32(off * x.s[xi]));
            facc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv), _mm256_mul_ps(dv, _mm256_set1_ps(x.d[xi])), facc[m]);
            if (ASYM) facc[m] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x.ds[xi]), facc[m]);
          }
        } else if (KQ == 1) {  // d*sc * dot - dmin*mn * dx*sum(xq)
          const __m256 scv = _mm256_mul_ps(sd, u8x8_ps(rec + 8 * h));
          const __m256 mnv = _mm256_mul_ps(smin, u8x8_ps(rec + 16 + 8 * h));
          for (int m = 0; m < MR; ++m) {
            const i64 xi = (m0 + m) * x.nb + b;
            facc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ilo[m]), _mm256_mul_ps(scv, _mm256_set1_ps(x.d[xi])),
                                      facc[m]);
            facc[m] = _mm256_fnmadd_ps(mnv, _mm256_set1_ps(x.ds[xi]), facc[m]);
          }
        } else {  // d * (sc_lo * (dot_lo - 32 sum_lo) + sc_hi * (dot_hi - 32 sum_hi)), exact in int32
          const __m256i sclo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 8 * h)));
          const __m256i schi =
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rec + 16 + 8 * h)));
          for (int m = 0; m < MR; ++m) {
            const i64 xi = (m0 + m) * x.nb + b;
            const std::int32_t slo = x.sl[xi], shi = x.s[xi] - slo;
            const __m256i lo = _mm256_sub_epi32(ilo[m], _mm256_set1_epi32(32 * slo));
            const __m256i hi = _mm256_sub_epi32(ihi[m], _mm256_set1_epi32(32 * shi));
            const __m256i isum = _mm256_add_epi32(_mm256_mullo_epi32(lo, sclo), _mm256_mullo_epi32(hi, schi));
            facc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(sd, _mm256_set1_ps(x.d[xi])), facc[m]);
          }
        }
      }
    }
    const int nv = nvalid - 8 * h;
    for (int m = 0; m < MR; ++m) {
      if (nv >= 8) {
        _mm256_storeu_ps(y + m * ldy + 8 * h, facc[m]);
      } else if (nv > 0) {
        _mm256_maskstore_ps(y + m * ldy + 8 * h, tail_mask(nv), facc[m]);
      }
    }
  }
}

template <int BITS, bool ASYM, int KQ>
void qgemm_fmt(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
               int nvalid) {
  switch (mr) {
    case 1: qgemm_mr<BITS, ASYM, KQ, 1>(w, group, x, m0, y, ldy, nvalid); break;
    case 2: qgemm_mr<BITS, ASYM, KQ, 2>(w, group, x, m0, y, ldy, nvalid); break;
    case 3: qgemm_mr<BITS, ASYM, KQ, 3>(w, group, x, m0, y, ldy, nvalid); break;
    default: qgemm_mr<BITS, ASYM, KQ, 4>(w, group, x, m0, y, ldy, nvalid); break;
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

template <int WT>
inline __m256 loadw8(const void* w, i64 i) {
  if (WT == W_F32) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(w) + i));
  if (WT == W_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int WT>
inline float loadw1(const void* w, i64 i) {
  if (WT == W_F32) return static_cast<const float*>(w)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(w)[i];
  return WT == W_F16 ? half_to_float(h) : bf16_to_float(h);
}

template <int WT, int MR>
void fgemm_mr(const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, float* y, i64 ldy) {
  const int NW = 4;
  __m256 acc[MR][NW];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NW; ++j) acc[m][j] = _mm256_setzero_ps();
  i64 wo[NW];
  for (int j = 0; j < NW; ++j) wo[j] = (j < nrows ? j : nrows - 1) * ldw;
  i64 i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[NW];
    for (int j = 0; j < NW; ++j) wv[j] = loadw8<WT>(w, wo[j] + i);
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * ldx + i);
      for (int j = 0; j < NW; ++j) acc[m][j] = _mm256_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < nrows; ++j) {
      float r = hsum8(acc[m][j]);
      for (i64 t = i; t < k; ++t) r += x[m * ldx + t] * loadw1<WT>(w, wo[j] + t);
      y[m * ldy + j] = r;
    }
}

template <int WT>
void fgemm_wt(const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y, i64 ldy) {
  switch (mr) {
    case 1: fgemm_mr<WT, 1>(w, ldw, nrows, k, x, ldx, y, ldy); break;
    case 2: fgemm_mr<WT, 2>(w, ldw, nrows, k, x, ldx, y, ldy); break;
    default: fgemm_mr<WT, 3>(w, ldw, nrows, k, x, ldx, y, ldy); break;
  }
}

void fgemm_tile(int wt, const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y,
                i64 ldy) {
  // 3 x rows x 4 weight rows keep 12 accumulators + 4 weights in the 16 ymm registers.
  for (int m0 = 0; m0 < mr; m0 += 3) {
    const int r = mr - m0 < 3 ? mr - m0 : 3;
    if (wt == W_F16)
      fgemm_wt<W_F16>(w, ldw, nrows, k, x + m0 * ldx, ldx, r, y + m0 * ldy, ldy);
    else if (wt == W_BF16)
      fgemm_wt<W_BF16>(w, ldw, nrows, k, x + m0 * ldx, ldx, r, y + m0 * ldy, ldy);
    else
      fgemm_wt<W_F32>(w, ldw, nrows, k, x + m0 * ldx, ldx, r, y + m0 * ldy, ldy);
  }
}

void f16_to_f32(const std::uint16_t* src, float* dst, i64 n) {
  i64 i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void f32_to_f16(const float* src, std::uint16_t* dst, i64 n) {
  i64 i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// 8 cached K/V elements as float (q8: the int8 values, before their block scale).
template <int K>
inline __m256 loadkv(const void* p, i64 i) {
  if (K == KV_F16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(p) + i)));
  if (K == KV_Q8)
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const std::int8_t*>(p) + i))));
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

template <int K>
inline float loadkv1(const void* p, i64 i) {
  if (K == KV_F16) return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
  if (K == KV_Q8) return static_cast<float>(static_cast<const std::int8_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Rows in pairs and keys in halves of 32: 8 accumulators + 4 key vectors fit the 16 ymm registers. q8 keys are
// dequantized in registers (int8 -> float times the block's scale, read from L1 as a memory operand).
template <int K, int NR>
void qk_nr(const float* q, i64 ldq, const void* kt, i64 d, float scale, float* s, i64 lds) {
  const float* ks = reinterpret_cast<const float*>(static_cast<const std::int8_t*>(kt) + d * KT);  // q8 only
  for (int half = 0; half < 2; ++half) {
    __m256 acc[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_setzero_ps();
    for (i64 i = 0; i < d; ++i) {
      __m256 kv[4];
      for (int j = 0; j < 4; ++j) {
        kv[j] = loadkv<K>(kt, i * KT + 32 * half + 8 * j);
        if (K == KV_Q8) kv[j] = _mm256_mul_ps(kv[j], _mm256_loadu_ps(ks + (i / KVB) * KT + 32 * half + 8 * j));
      }
      for (int r = 0; r < NR; ++r) {
        const __m256 qb = _mm256_set1_ps(q[r * ldq + i]);
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm256_fmadd_ps(qb, kv[j], acc[r][j]);
      }
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(s + r * lds + 32 * half + 8 * j, _mm256_mul_ps(acc[r][j], vs));
  }
}

template <int K>
void qk_t(const float* q, i64 ldq, int nr, const void* ktile, i64 d, float scale, float* s, i64 lds) {
  for (int r0 = 0; r0 < nr; r0 += 2)
    (nr - r0 >= 2 ? qk_nr<K, 2> : qk_nr<K, 1>)(q + r0 * ldq, ldq, ktile, d, scale, s + r0 * lds, lds);
}

void qk_tile(const float* q, i64 ldq, int nr, const void* ktile, int kind, i64 d, float scale, float* s, i64 lds) {
  switch (kind) {
    case KV_F16: qk_t<KV_F16>(q, ldq, nr, ktile, d, scale, s, lds); break;
    case KV_Q8: qk_t<KV_Q8>(q, ldq, nr, ktile, d, scale, s, lds); break;
    default: qk_t<KV_F32>(q, ldq, nr, ktile, d, scale, s, lds); break;
  }
}

// 2 vectors (16 values of d) x NR rows of accumulators (NR <= 4 -> 8 chains + 2 loads within 16 registers). A chunk
// of 16 (or 8) values never straddles a q8 block of 32, so one scale dequantizes the chunk of a row.
template <int K, int NR>
void pv_nr(const float* p, i64 ldp, const void* v, const float* vscale, i64 nk, i64 d, const float* corr, float* o) {
  const i64 nb = (d + KVB - 1) / KVB;
  i64 c = 0;
  for (; c + 16 <= d; c += 16) {
    __m256 acc[NR][2];
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < 2; ++j)
        acc[r][j] = _mm256_mul_ps(_mm256_loadu_ps(o + r * d + c + 8 * j), _mm256_set1_ps(corr[r]));
    for (i64 l = 0; l < nk; ++l) {
      __m256 v0 = loadkv<K>(v, l * d + c), v1 = loadkv<K>(v, l * d + c + 8);
      if (K == KV_Q8) {
        const __m256 sc = _mm256_set1_ps(vscale[l * nb + c / KVB]);
        v0 = _mm256_mul_ps(v0, sc);
        v1 = _mm256_mul_ps(v1, sc);
      }
      for (int r = 0; r < NR; ++r) {
        const __m256 pb = _mm256_set1_ps(p[r * ldp + l]);
        acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int j = 0; j < 2; ++j) _mm256_storeu_ps(o + r * d + c + 8 * j, acc[r][j]);
  }
  for (; c + 8 <= d; c += 8) {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_mul_ps(_mm256_loadu_ps(o + r * d + c), _mm256_set1_ps(corr[r]));
    for (i64 l = 0; l < nk; ++l) {
      __m256 vv = loadkv<K>(v, l * d + c);
      if (K == KV_Q8) vv = _mm256_mul_ps(vv, _mm256_set1_ps(vscale[l * nb + c / KVB]));
      for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[r * ldp + l]), vv, acc[r]);
    }
    for (int r = 0; r < NR; ++r) _mm256_storeu_ps(o + r * d + c, acc[r]);
  }
  for (; c < d; ++c)
    for (int r = 0; r < NR; ++r) {
      float a = o[r * d + c] * corr[r];
      for (i64 l = 0; l < nk; ++l) {
        float vv = loadkv1<K>(v, l * d + c);
        if (K == KV_Q8) vv *= vscale[l * nb + c / KVB];
        a += p[r * ldp + l] * vv;
      }
      o[r * d + c] = a;
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

const LlmKernels table = {"avx2", 4, quantize_x, qgemm_group, fgemm_tile, f16_to_f32, f32_to_f16, qk_tile, pv_tile};

}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx2() { return &table; }
}  // namespace llm
}  // namespace hetero
