// The rotated low-bit KV cache formats "q4r" / "q3r" (defined in numpy by core/hetero/contract/kv_rotated.py,
// which this code matches bit for bit): a (position, head) row of d values (d a multiple of 32) is rotated per group
// of G = min(largest power of two dividing d, 128) values by fixed random signs and the normalized Walsh-Hadamard
// transform, then each block of 32 rotated values is stored as a float16 scale (the block's RMS) and 4- or 3-bit
// indices into a Lloyd-Max codebook of the unit Gaussian.
//
// Packed codes, per block of 32 (kBlockBytes = 4 * bits bytes): 4 bits: byte j = code j | code (j + 16) << 4;
// 3 bits: byte j < 8 = the low two bits of codes j, j + 8, j + 16, j + 24 at bits 0-1, 2-3, 4-5, 6-7, then bytes
// 8..11 hold bit 2 of code i at bit i % 8 of byte 8 + i / 8. V rows pack their d values this way; a K tile row (one
// dimension over 64 positions) packs its 64 positions as two such blocks.
//
// The attention kernels rotate the query (q . k is unchanged by an orthogonal map), decode codes * scale into an
// L1-resident float tile (`decode`, per ISA: kv_quant_<isa>.cpp) and un-rotate the output row once.
#pragma once

#include <cstdint>

#include "common.hpp"

namespace hetero {
namespace kvq {

constexpr int kBlock = 32;                              // values per scale and per packed block
constexpr int kMeanPositions = 64;                      // keys averaged into the keys' centre (kv_rotated.key_mean)
inline int block_bytes(int bits) { return 4 * bits; }  // 16 (4 bits) or 12 (3 bits)

// The 16 / 8 Lloyd-Max levels (a 3-bit table is padded to 16 by repeating it, for 16-lane permutes).
const float* codebook(int bits);

// Walsh-Hadamard group size of a head of d values.
i64 rotation_group(i64 d);
// x[0:d] -> H (s * x) / sqrt(G) per group, in place; and its inverse.
void rotate(float* x, i64 d);
void unrotate(float* x, i64 d);

// Rotate a copy of x[0:d] (tmp: d floats) and quantize it: codes[0:d] (one per byte, unpacked) and scales[0:d/32].
void quantize_row(const float* x, i64 d, int bits, float* tmp, std::uint8_t* codes, std::uint16_t* scales);
// Code `code` of value i of packed blocks (other codes untouched).
void set_code(std::uint8_t* packed, int bits, i64 i, int code);

// out[b * 32 + j] = level(code j of block b) * scale, for the nblocks packed blocks; scale = scales[b] when
// period == 0 (V rows: one scale per block), else scales[(b % period) * 32 + j] (K tile rows: one scale per position,
// the same 64 for each row of a 32-row block: period 2).
using DecodeFn = void (*)(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period,
                          float* out);
DecodeFn decoder();  // the active ISA's (avx512 / avx2 / generic)
void decode_generic(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period, float* out);
void decode_avx2(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period, float* out);
void decode_avx512(int bits, const std::uint8_t* packed, i64 nblocks, const float* scales, int period, float* out);

}  // namespace kvq
}  // namespace hetero
