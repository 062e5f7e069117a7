// GGUF (ggml) block formats for the LLM kernels: q5_0, q5_1, q4_k, q5_k and q6_k rows, as stored in the file, are
// decoded block by block (32 elements: values 0..63 plus the block's scale material) and written into the RB16
// planes layout of llm.hpp, which keeps each format's own scales (no re-quantisation, no float rounding: the kernels
// compute d * sc exactly in float32) and about its size in bytes. Block layouts as in hetero.contract.quant's reference.
#include <algorithm>
#include <cstring>
#include <string>

#include "llm.hpp"

namespace hetero {
namespace llm {
namespace {

enum GgmlType : int { G_Q5_0 = 1, G_Q5_1, G_Q4_K, G_Q5_K, G_Q6_K };

// Source bytes per block: 32 elements (q5_x) or a 256-element super-block (k-quants).
i64 src_block_bytes(int type) {
  switch (type) {
    case G_Q5_0: return 22;
    case G_Q5_1: return 24;
    case G_Q4_K: return 144;
    case G_Q5_K: return 176;
    default: return 210;  // q6_k
  }
}

std::uint16_t u16(const std::uint8_t* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One block of 32 elements of one row: values and scale material in the repacked record's terms.
struct Block {
  std::uint8_t q[32];
  std::uint16_t d = 0, m = 0;        // kq 0: f16 d (and m); k-quants: the super-block's f16 d (and dmin)
  std::uint8_t sc = 0, mn = 0;       // kq 1: 6-bit scale and min
  std::int8_t sc_lo = 0, sc_hi = 0;  // kq 2: scales of elements 0..15 and 16..31
};

// q4_k / q5_k: the 6-bit scale and min of sub-block j from the 12 packed bytes.
void k_scale_min(const std::uint8_t* s, int j, std::uint8_t& sc, std::uint8_t& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = static_cast<std::uint8_t>((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    mn = static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Block b (of 32 elements) of a source row.
void decode(int type, const std::uint8_t* row, i64 b, Block& out) {
  if (type == G_Q5_0 || type == G_Q5_1) {
    const std::uint8_t* p = row + b * src_block_bytes(type);
    out.d = u16(p);
    const i64 at = type == G_Q5_0 ? 2 : 4;
    if (type == G_Q5_1) out.m = u16(p + 2);
    std::uint32_t qh;
    std::memcpy(&qh, p + at, 4);
    const std::uint8_t* qs = p + at + 4;
    for (int j = 0; j < 16; ++j) {
      out.q[j] = static_cast<std::uint8_t>((qs[j] & 15) | (((qh >> j) & 1) << 4));
      out.q[j + 16] = static_cast<std::uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    return;
  }
  const std::uint8_t* p = row + (b / 8) * src_block_bytes(type);
  const int j = static_cast<int>(b % 8);  // sub-block within the super-block
  if (type == G_Q4_K || type == G_Q5_K) {
    out.d = u16(p);
    out.m = u16(p + 2);
    k_scale_min(p + 4, j, out.sc, out.mn);
    // qs: 4 chunks of 32 bytes; chunk c holds sub-block 2c in its low nibbles and 2c+1 in its high nibbles.
    const std::uint8_t* qs = p + (type == G_Q4_K ? 16 : 48) + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) out.q[l] = static_cast<std::uint8_t>((qs[l] >> shift) & 15);
    if (type == G_Q5_K) {
      const std::uint8_t* qh = p + 16;  // bit j of byte l: bit 4 of sub-block j's element l
      for (int l = 0; l < 32; ++l) out.q[l] = static_cast<std::uint8_t>(out.q[l] | (((qh[l] >> j) & 1) << 4));
    }
    return;
  }
  // q6_k: ql[128] | qh[64] | scales[16] (i8, one per 16 elements) | d. Each half (128 elements) n: element
  // 32*r + l (r < 4, l < 32) has low bits from ql[64n + l + 32*(r&1)] (nibble r/2) and high bits from
  // qh[32n + l] (bits 2r, 2r+1).
  out.d = u16(p + 208);
  const int e0 = 32 * j, n = e0 / 128, r = (e0 % 128) / 32;
  const std::uint8_t* ql = p + 64 * n + 32 * (r & 1);
  const std::uint8_t* qh = p + 128 + 32 * n;
  for (int l = 0; l < 32; ++l) {
    const int lo = (ql[l] >> (4 * (r / 2))) & 15, hi = (qh[l] >> (2 * r)) & 3;
    out.q[l] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
  const auto* sc = reinterpret_cast<const std::int8_t*>(p + 192);
  out.sc_lo = sc[2 * j];
  out.sc_hi = sc[2 * j + 1];
}

// Row j's quants of one block into a record's planes (see llm.hpp).
void write_quants(const QPack& pk, const Block& blk, int j, std::uint8_t* qv) {
  const std::uint8_t* q = blk.q;
  std::uint8_t* hp = qv + pk.nibble_bytes();
  for (int t = 0; t < 4; ++t)
    for (int c = 0; c < 4; ++c) {
      const int a = q[4 * t + c], b = q[16 + 4 * t + c];
      if (pk.bits == 5) {  // a's 5 bits, b's bits 2-4 above them; b's bits 0-1 in the high plane
        qv[t * 64 + j * 4 + c] = static_cast<std::uint8_t>((a & 31) | ((b >> 2) << 5));
        hp[j * 4 + c] = static_cast<std::uint8_t>(hp[j * 4 + c] | ((b & 3) << (2 * t)));
        continue;
      }
      qv[t * 64 + j * 4 + c] = static_cast<std::uint8_t>((a & 15) | ((b & 15) << 4));
      if (pk.bits == 6) {
        const int v = t / 2, u = t % 2;
        std::uint8_t& h = hp[v * 64 + j * 4 + c];
        h = static_cast<std::uint8_t>(h | (((a >> 4) & 3) << (2 * u)) | (((b >> 4) & 3) << (4 + 2 * u)));
      }
    }
}

}  // namespace

bool ggml_pack(const std::string& wtype, QPack& pk) {
  int type = 0;
  if (wtype == "q5_0") type = G_Q5_0;
  else if (wtype == "q5_1") type = G_Q5_1;
  else if (wtype == "q4_k") type = G_Q4_K;
  else if (wtype == "q5_k") type = G_Q5_K;
  else if (wtype == "q6_k") type = G_Q6_K;
  else return false;
  pk.ggml = type;
  pk.bs = 32;
  pk.bits = type == G_Q4_K ? 4 : (type == G_Q6_K ? 6 : 5);
  pk.asym = type == G_Q5_1 || type == G_Q4_K || type == G_Q5_K;
  pk.kq = type == G_Q4_K || type == G_Q5_K ? 1 : (type == G_Q6_K ? 2 : 0);
  pk.sub = 8;  // k-quants: super-blocks; q5_0 / q5_1: runs of 8 records without a header (llm.hpp)
  pk.layout();
  return true;
}

i64 ggml_row_bytes(const QPack& pk) {
  const i64 per = pk.kq ? 256 : 32;
  return (pk.k / per) * src_block_bytes(pk.ggml);
}

void ggml_repack(const QPack& pk, const std::uint8_t* src, std::uint8_t* dst, i64 g0, i64 g1) {
  const i64 row_bytes = ggml_row_bytes(pk);
  std::memset(dst + g0 * pk.group_bytes, 0, static_cast<std::size_t>((g1 - g0) * pk.group_bytes));
  Block blk;
  for (i64 g = g0; g < g1; ++g) {
    std::uint8_t* grp = dst + g * pk.group_bytes;
    const int rows = static_cast<int>(std::min<i64>(QR, pk.n - g * QR));  // padding rows keep zero scales
    for (i64 b = 0; b < pk.nb; ++b) {
      std::uint8_t* rec = const_cast<std::uint8_t*>(pk.record(grp, b));
      std::uint8_t* sb = rec - (b % pk.sub) * pk.rec_bytes - pk.sb_hdr;
      for (int j = 0; j < rows; ++j) {
        decode(pk.ggml, src + (g * QR + j) * row_bytes, b, blk);
        if (pk.kq == 0) {
          std::memcpy(rec + 2 * j, &blk.d, 2);
          if (pk.asym) std::memcpy(rec + 32 + 2 * j, &blk.m, 2);
        } else {
          if (b % pk.sub == 0) {
            std::memcpy(sb + 2 * j, &blk.d, 2);
            if (pk.kq == 1) std::memcpy(sb + 32 + 2 * j, &blk.m, 2);
          }
          if (pk.kq == 1) {
            rec[j] = blk.sc;
            rec[16 + j] = blk.mn;
          } else {
            rec[j] = static_cast<std::uint8_t>(blk.sc_lo);
            rec[16 + j] = static_cast<std::uint8_t>(blk.sc_hi);
          }
        }
        write_quants(pk, blk, j, rec + pk.header_bytes());
      }
    }
  }
}

void ggml_dequant_row(const QPack& pk, const std::uint8_t* row, float* out) {
  Block blk;
  for (i64 b = 0; b < pk.nb; ++b) {
    decode(pk.ggml, row, b, blk);
    float* o = out + b * 32;
    const float d = half_to_float(blk.d);
    // The same float operations, in the same order, as hetero.contract.quant.dequantize_ggml (bit-identical results).
    if (pk.kq == 1) {
      const float scale = d * static_cast<float>(blk.sc), off = half_to_float(blk.m) * static_cast<float>(blk.mn);
      for (int l = 0; l < 32; ++l) o[l] = static_cast<float>(blk.q[l]) * scale - off;
    } else if (pk.kq == 2) {
      const float s0 = d * static_cast<float>(blk.sc_lo), s1 = d * static_cast<float>(blk.sc_hi);
      for (int l = 0; l < 32; ++l) o[l] = (static_cast<float>(blk.q[l]) - 32.f) * (l < 16 ? s0 : s1);
    } else if (pk.asym) {
      const float m = half_to_float(blk.m);
      for (int l = 0; l < 32; ++l) o[l] = static_cast<float>(blk.q[l]) * d + m;
    } else {
      for (int l = 0; l < 32; ++l) o[l] = (static_cast<float>(blk.q[l]) - 16.f) * d;
    }
  }
}

}  // namespace llm
}  // namespace hetero
