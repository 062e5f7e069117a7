// The rotated low-bit KV cache formats (see kv_quant.hpp): codebooks, rotation, the quantizer of the write path
// (scalar: one row per appended position and head) and the portable decoder, plus the per-ISA dispatch.
#include "kv_quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "llm.hpp"

namespace hetero {
namespace kvq {
namespace {

// Lloyd-Max levels of N(0, 1) (Lloyd 1957 / Max 1960: thresholds at the midpoints of neighbouring levels, each level
// the centroid of its cell, iterated to the fixed point; computed by scripts/kv_codebook.py; the same decimals as
// hetero.contract.kv_rotated.CODEBOOKS).
alignas(64) const float kCodebook4[16] = {-2.7325896f, -2.0690172f, -1.6180464f, -1.2562312f, -0.9423405f, -0.6567591f,
                                          -0.3880483f, -0.1283950f, 0.1283950f,  0.3880483f,  0.6567591f,  0.9423405f,
                                          1.2562312f,  1.6180464f,  2.0690172f,  2.7325896f};
alignas(64) const float kCodebook3[16] = {-2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f, 0.2450942f, 0.7560053f,
                                          1.3439093f,  2.1519457f,  -2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f,
                                          0.2450942f,  0.7560053f,  1.3439093f,  2.1519457f};
// Rotation signs: bit i set = value i of a group negated (hetero.contract.kv_rotated.SIGN_BITS).
constexpr std::uint64_t kSignBits[2] = {0x9E3779B97F4A7C15ull, 0xD1B54A32D192ED03ull};
constexpr i64 kMaxGroup = 128;

bool negated(i64 i) { return (kSignBits[i / 64] >> (i % 64)) & 1u; }

// Unnormalized fast Walsh-Hadamard transform of g values in place (stride 1, 2, 4, ...: (a, b) -> (a + b, a - b)).
void hadamard(float* x, i64 g) {
  for (i64 h = 1; h < g; h *= 2)
    for (i64 i = 0; i < g; i += 2 * h)
      for (i64 j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

float norm(i64 g) { return 1.f / std::sqrt(static_cast<float>(g)); }

}  // namespace

const float* codebook(int bits) { return bits == 4 ? kCodebook4 : kCodebook3; }

i64 rotation_group(i64 d) { return std::min<i64>(d & -d, kMaxGroup); }

void rotate(float* x, i64 d) {
  const i64 g = rotation_group(d);
  const float nm = norm(g);
  for (i64 o = 0; o < d; o += g) {
    float* y = x + o;
    for (i64 i = 0; i < g; ++i)
      if (negated(i)) y[i] = -y[i];
    hadamard(y, g);
    for (i64 i = 0; i < g; ++i) y[i] *= nm;
  }
}

void unrotate(float* x, i64 d) {
  const i64 g = rotation_group(d);
  const float nm = norm(g);
  for (i64 o = 0; o < d; o += g) {
    float* y = x + o;
    hadamard(y, g);
    for (i64 i = 0; i < g; ++i) {
      y[i] *= nm;
      if (negated(i)) y[i] = -y[i];
    }
  }
}

void quantize_row(const float* x, i64 d, int bits, float* tmp, std::uint8_t* codes, std::uint16_t* scales) {
  std::memcpy(tmp, x, static_cast<std::size_t>(d) * 4);
  rotate(tmp, d);
  const float* cb = codebook(bits);
  const int levels = 1 << bits;
  float thr[15];
  for (int j = 0; j + 1 < levels; ++j) thr[j] = (cb[j] + cb[j + 1]) * 0.5f;
  for (i64 b = 0; b * kBlock < d; ++b) {
    const float* y = tmp + b * kBlock;
    double ss = 0.0;
    for (int i = 0; i < kBlock; ++i) ss += static_cast<double>(y[i]) * static_cast<double>(y[i]);
    const float rms = static_cast<float>(std::sqrt(ss / kBlock));
    const std::uint16_t h = llm::float_to_half(std::min(rms, 65504.f));
    scales[b] = h;
    const float s = llm::half_to_float(h);
    for (int i = 0; i < kBlock; ++i) {
      const float u = s > 0.f ? y[i] / s : 0.f;
      int c = 0;
      for (int j = 0; j + 1 < levels; ++j) c += u > thr[j];
      codes[b * kBlock + i] = static_cast<std::uint8_t>(c);
    }
  }
}

void set_code(std::uint8_t* packed, int bits, i64 i, int code) {
  std::uint8_t* p = packed + (i / kBlock) * block_bytes(bits);
  const int j = static_cast<int>(i % kBlock);
  if (bits == 4) {
    const int sh = j < 16 ? 0 : 4;
    p[j % 16] = static_cast<std::uint8_t>((p[j % 16] & ~(15 << sh)) | ((code & 15) << sh));
  } else {
    const int sh = 2 * (j / 8);
    p[j % 8] = static_cast<std::uint8_t>((p[j % 8] & ~(3 << sh)) | ((code & 3) << sh));
    std::uint8_t& hb = p[8 + j / 8];
    hb = static_cast<std::uint8_t>((hb & ~(1 << (j % 8))) | (((code >> 2) & 1) << (j % 8)));
  }
}

void decode_generic(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period, float* out) {
  const float* cb = codebook(bits);
  for (i64 b = 0; b < nblocks; ++b) {
    const std::uint8_t* p = packed + b * block_bytes(bits);
    float* o = out + b * kBlock;
    for (int j = 0; j < kBlock; ++j) {
      int c;
      if (bits == 4) c = (p[j % 16] >> (j < 16 ? 0 : 4)) & 15;
      else c = ((p[j % 8] >> (2 * (j / 8))) & 3) | (((p[8 + j / 8] >> (j % 8)) & 1) << 2);
      o[j] = cb[c] * (period ? scales[(b % period) * kBlock + j] : scales[b]);
    }
  }
}

#ifndef HETERO_KVQ_X86
void decode_avx2(int bits, const std::uint8_t* p, i64 n, const float* s, int pe, float* o) {
  decode_generic(bits, p, n, s, pe, o);
}
void decode_avx512(int bits, const std::uint8_t* p, i64 n, const float* s, int pe, float* o) {
  decode_generic(bits, p, n, s, pe, o);
}
#endif

DecodeFn decoder() {
  const char* isa = active().name;
  if (std::strcmp(isa, "avx512") == 0) return decode_avx512;
  if (std::strcmp(isa, "avx2") == 0) return decode_avx2;
  return decode_generic;
}

}  // namespace kvq
}  // namespace hetero
