// Portable scalar LLM kernels (any CPU; the reference the SIMD paths are tested against through the Python tests).
#include <cmath>
#include <cstdint>

#include "llm.hpp"

namespace {

using hetero::i64;
using namespace hetero::llm;

void quantize_x(const float* x, i64 M, i64 ldx, i64 k, int bs, bool pair4, std::int8_t* q, float* d,
                std::int32_t* s, float* ds, std::int32_t* sl) {
  const i64 nb = (k + bs - 1) / bs;
  for (i64 m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    for (i64 b = 0; b < nb; ++b) {
      const i64 lo = b * bs, hi = lo + bs < k ? lo + bs : k;
      float amax = 0.f;
      for (i64 i = lo; i < hi; ++i) amax = std::fmax(amax, std::fabs(xr[i]));
      const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      std::int8_t* qb = q + m * nb * bs + b * bs;
      std::int32_t sum = 0, half = 0;
      for (i64 i = 0; i < bs; ++i) {
        int v = 0;
        if (lo + i < hi) {
          v = static_cast<int>(std::nearbyint(xr[lo + i] * inv));
          v = v > 127 ? 127 : (v < -127 ? -127 : v);
        }
        qb[i] = static_cast<std::int8_t>(v);
        sum += v;
        if (i < bs / 2) half += v;
      }
      if (pair4) pair_words(qb, bs);
      d[m * nb + b] = dx;
      s[m * nb + b] = sum;
      ds[m * nb + b] = dx * static_cast<float>(sum);
      sl[m * nb + b] = half;
    }
  }
}

// Row j's value q (before the offset/scales) of element e (< bs) of a record's quants.
inline int quant_value(const QPack& w, const std::uint8_t* qv, int j, int e) {
  if (w.bits == 8) return qv[(e / 4) * 64 + j * 4 + e % 4];
  const int half = w.bs / 2, hi = e >= half, p = hi ? e - half : e, t = p / 4, c = p % 4;
  int v = (qv[t * 64 + j * 4 + c] >> (4 * hi)) & 15;
  const std::uint8_t* hp = qv + w.nibble_bytes();
  if (w.bits == 5) v |= ((hp[j * 4 + c] >> (t + 4 * hi)) & 1) << 4;
  if (w.bits == 6) v |= ((hp[(t / 2) * 64 + j * 4 + c] >> (2 * (t % 2) + 4 * hi)) & 3) << 4;
  return v;
}

void qgemm_group(const QPack& w, const std::uint8_t* group, const XQ& x, i64 m0, int mr, float* y, i64 ldy,
                 int nvalid) {
  const int bs = w.bs, off = w.offset();
  for (int m = 0; m < mr; ++m) {
    float acc[QR] = {};
    const std::int8_t* xq = x.q + (m0 + m) * x.ldq;
    for (i64 b = 0; b < w.nb; ++b) {
      const std::uint8_t* rec = w.record(group, b);
      const std::uint16_t* dh = reinterpret_cast<const std::uint16_t*>(rec);
      const std::uint16_t* sbh = reinterpret_cast<const std::uint16_t*>(rec - (b % w.sub) * w.rec_bytes - w.sb_hdr);
      const std::uint8_t* qv = rec + w.header_bytes();
      const std::int8_t* xb = xq + b * bs;
      const i64 xi = (m0 + m) * x.nb + b;
      const float dx = x.d[xi], dsx = x.ds[xi];
      for (int j = 0; j < QR; ++j) {
        std::int32_t lo = 0, hi = 0;  // dots over the block's two halves (in the activations' pair4 order)
        for (int e = 0; e < bs; ++e) {
          const int xe = w.nibbles() ? (e < bs / 2 ? 8 * (e / 4) + e % 4 : 8 * ((e - bs / 2) / 4) + 4 + e % 4) : e;
          (e < bs / 2 ? lo : hi) += quant_value(w, qv, j, e) * xb[xe];
        }
        if (w.kq == 1) {  // d*sc * q - dmin*mn
          acc[j] += half_to_float(sbh[j]) * static_cast<float>(rec[j]) * dx * static_cast<float>(lo + hi);
          acc[j] -= half_to_float(sbh[QR + j]) * static_cast<float>(rec[16 + j]) * dsx;
        } else if (w.kq == 2) {  // d * (sc_lo * (lo - 32 sum_lo) + sc_hi * (hi - 32 sum_hi))
          const std::int32_t sx_lo = x.sl[xi], sx_hi = x.s[xi] - sx_lo;
          const std::int32_t isum = static_cast<std::int8_t>(rec[j]) * (lo - off * sx_lo) +
                                    static_cast<std::int8_t>(rec[16 + j]) * (hi - off * sx_hi);
          acc[j] += half_to_float(sbh[j]) * dx * static_cast<float>(isum);
        } else {
          acc[j] += half_to_float(dh[j]) * dx * static_cast<float>(lo + hi - off * x.s[xi]);
          if (w.asym) acc[j] += half_to_float(dh[QR + j]) * dsx;
        }
      }
    }
    for (int j = 0; j < nvalid; ++j) y[m * ldy + j] = acc[j];
  }
}

inline float load_w(int wt, const void* w, i64 i) {
  switch (wt) {
    case W_F16: return half_to_float(static_cast<const std::uint16_t*>(w)[i]);
    case W_BF16: return bf16_to_float(static_cast<const std::uint16_t*>(w)[i]);
    default: return static_cast<const float*>(w)[i];
  }
}

void fgemm_tile(int wt, const void* w, i64 ldw, int nrows, i64 k, const float* x, i64 ldx, int mr, float* y,
                i64 ldy) {
  for (int m = 0; m < mr; ++m)
    for (int j = 0; j < nrows; ++j) {
      double acc = 0.0;
      for (i64 i = 0; i < k; ++i) acc += static_cast<double>(load_w(wt, w, j * ldw + i)) * x[m * ldx + i];
      y[m * ldy + j] = static_cast<float>(acc);
    }
}

void f16_to_f32(const std::uint16_t* src, float* dst, i64 n) {
  for (i64 i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
}

void f32_to_f16(const float* src, std::uint16_t* dst, i64 n) {
  for (i64 i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// One cached K/V element as stored (q8: the int8 value; the caller applies its block scale).
inline float load_kv(int kind, const void* p, i64 i) {
  switch (kind) {
    case KV_F16: return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case KV_Q8: return static_cast<float>(static_cast<const std::int8_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void qk_tile(const float* q, i64 ldq, int nr, const void* ktile, int kind, i64 d, float scale, float* s, i64 lds) {
  const float* ks = kind == KV_Q8 ? reinterpret_cast<const float*>(static_cast<const std::int8_t*>(ktile) + d * KT)
                                  : nullptr;
  for (int r = 0; r < nr; ++r) {
    float acc[KT] = {};
    for (i64 i0 = 0; i0 < d; i0 += KVB) {  // q8: one scale per block of KVB values (other kinds: any split works)
      float part[KT] = {};
      for (i64 i = i0; i < d && i < i0 + KVB; ++i) {
        const float qi = q[r * ldq + i];
        for (int l = 0; l < KT; ++l) part[l] += qi * load_kv(kind, ktile, i * KT + l);
      }
      for (int l = 0; l < KT; ++l) acc[l] += ks ? part[l] * ks[(i0 / KVB) * KT + l] : part[l];
    }
    for (int l = 0; l < KT; ++l) s[r * lds + l] = acc[l] * scale;
  }
}

void pv_tile(const float* p, i64 ldp, int nr, const void* v, int kind, const float* vscale, i64 nk, i64 d,
             const float* corr, float* o) {
  const i64 nb = (d + KVB - 1) / KVB;
  for (int r = 0; r < nr; ++r) {
    float* orow = o + r * d;
    for (i64 i = 0; i < d; ++i) orow[i] *= corr[r];
    for (i64 l = 0; l < nk; ++l) {
      const float pl = p[r * ldp + l];
      for (i64 i = 0; i < d; ++i) {
        const float vv = load_kv(kind, v, l * d + i);
        orow[i] += kind == KV_Q8 ? pl * (vv * vscale[l * nb + i / KVB]) : pl * vv;
      }
    }
  }
}

const LlmKernels table = {"generic", 4, quantize_x, qgemm_group, fgemm_tile, f16_to_f32, f32_to_f16, qk_tile, pv_tile};

}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_generic() { return &table; }
}  // namespace llm
}  // namespace hetero
