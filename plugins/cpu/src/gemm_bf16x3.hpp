// The bf16x3 path of the fp32 GEMM (precision "normal"; gemm.cpp drives it, gemm_amx_bf16.cpp holds the AMX-BF16
// kernels). Each fp32 operand is split x = hi + lo, hi = bf16(x) rounded to nearest even, lo = bf16(x - hi) (x - hi
// is exact in fp32), and C = A_hi B_hi + A_hi B_lo + A_lo B_hi is accumulated in fp32 by TDPBF16PS. Per product
// the dropped terms (A_lo B_lo and the rounding of lo) are below 3 * 2^-16 |a b|; see docs/onnx-models.md for the
// bound of a whole dot product. TDPBF16PS treats bf16 denormals as zero and flushes denormal results, so values
// below 2^-126 in magnitude contribute nothing (an absolute error under 2^-125 per term).
//
// Packed B layout (per part, hi and lo): ceil(N/32) column blocks of 32, each two 16-column tiles; a tile is
// kp/2 rows (pairs of k) of 16 columns x 2 k (TDPBF16PS's B operand): element (k, j) of tile t at
// t * kp * 16 + (k / 2) * 32 + j * 2 + k % 2, kp = K rounded up to 32, padding zero.
#pragma once

#include <cstdint>
#include <cstring>

#include "common.hpp"

namespace hetero {

// hi / lo bf16 bits of a finite x (|x| below 0x7f7f0000's value, so that rounding hi cannot overflow; callers check
// the range). static: one copy per translation unit, whatever its compile flags.
static inline void bf16x3_split(float x, std::uint16_t& hi, std::uint16_t& lo) {
  auto rne = [](std::uint32_t u) { return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; };
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t h = rne(u);
  float hf;
  std::memcpy(&hf, &h, sizeof hf);
  const float r = x - hf;
  std::uint32_t ur;
  std::memcpy(&ur, &r, sizeof ur);
  hi = static_cast<std::uint16_t>(h >> 16);
  lo = static_cast<std::uint16_t>(rne(ur) >> 16);
}

// Largest |x| (as its bits) a split accepts: |x| < 2^128 (1 - 2^-9), below which RNE to bf16 stays finite.
constexpr std::uint32_t kBf16x3MaxBits = 0x7f7f7fffu;

inline i64 bf16x3_kp(i64 K) { return ceil_div(K, 32) * 32; }
// uint16 values of one part (hi or lo) of packed B.
inline i64 bf16x3_b_values(i64 K, i64 N) { return ceil_div(N, 32) * 32 * bf16x3_kp(K); }

// ---- gemm_amx_bf16.cpp (entered only after amx_usable(AMX_BF16) and the AVX-512 check) ----
// Rows [0, rows) of A (element (i, k) at a[i * rs + k * cs]) as hi / lo bf16, row i at hi + i * kp (kp >= K, columns
// K..kp zero). Returns the largest |a| bits seen (>= 0x7f800000: a NaN or inf).
std::uint32_t bf16x3_split_rows(const float* a, i64 rs, i64 cs, i64 rows, i64 K, i64 kp, std::uint16_t* hi,
                                std::uint16_t* lo);
// One 32-column block of B in the packed layout above (tiles at hi and hi + kp * 16, the same for lo) from rows
// [0, K) of x (row k at x + rows[k], columns contiguous): columns past ncols (<= 32) and rows past K zero. For B
// split per call (conv_bf16x3_pw / conv_bf16x3_rows: a conv's input, a row a channel or a tap). Returns the largest
// |x| bits seen, as bf16x3_split_rows.
std::uint32_t bf16x3_split_b_block(const float* x, const i64* rows, i64 K, i64 kp, i64 ncols, std::uint16_t* hi,
                                   std::uint16_t* lo);
// x[0, n) as hi / lo bf16 values in place order; returns the largest |x| bits seen. And one 32-column block of B
// (as bf16x3_split_b_block) from values already split that way: row k at shi / slo + rows[k].
std::uint32_t bf16x3_split_plain(const float* x, i64 n, std::uint16_t* hi, std::uint16_t* lo);
void bf16x3_pair_b_block(const std::uint16_t* shi, const std::uint16_t* slo, const i64* rows, i64 K, i64 kp,
                         i64 ncols, std::uint16_t* hi, std::uint16_t* lo);
// Loads the tile configuration on this thread / releases the tiles.
void bf16x3_tiles_begin();
void bf16x3_tiles_end();
// A 16 x 32 block: c (row stride ldc floats) = the 16 rows of A from ahi / alo (row stride kp) times the 32-column
// block of B at bhi / blo, over kp / 32 k blocks.
void bf16x3_block(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                  const std::uint16_t* blo, float* c, i64 ldc);
// The same for 32 rows (A's rows 16-31 at 16 * kp): four accumulators, each element's products in bf16x3_block's
// order (hi x hi, hi x lo, lo x hi per k block), so the two give the same bits.
void bf16x3_block32(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                    const std::uint16_t* blo, float* c, i64 ldc);
// The two with A in tiles (bf16x3_tile_a): a row tile's k block is 16 rows x 32 values, one 1 KB tile, the k blocks
// of a row tile after each other (A's rows 16-31 still at 16 * kp).
void bf16x3_block_ta(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                     const std::uint16_t* blo, float* c, i64 ldc);
void bf16x3_block32_ta(i64 kp, const std::uint16_t* ahi, const std::uint16_t* alo, const std::uint16_t* bhi,
                       const std::uint16_t* blo, float* c, i64 ldc);

// ---- gemm.cpp ----
struct Bf16x3B {
  const std::uint16_t* hi;
  const std::uint16_t* lo;
  i64 k, n;
  float max_abs;  // the largest |b|
};
// Whether this process can run the path (AMX-BF16 granted, AVX-512 present).
bool bf16x3_available();
// Packs b (K x N) into hi / lo (bf16x3_b_values each); false, nothing usable, when b has a value the split does not
// take (NaN, inf, |b| >= 2^128 (1 - 2^-9)).
bool bf16x3_pack_b(const MatView& b, std::uint16_t* hi, std::uint16_t* lo, float* max_abs);
// Rows of A below which the fp32 kernels run: M <= 4 is the GEMV / small-M path (B streamed once); from M = 5 on
// bf16x3 measured faster at every shape tried (docs/onnx-models.md, "bf16x3").
constexpr i64 kBf16x3MinRows = 5;
// Whether an M x N x K product is worth the path (measured: docs/onnx-models.md).
bool bf16x3_worth(i64 M, i64 N, i64 K);
// C (M x N, row stride ldc) = alpha * A @ B + beta * C, then the epilogue, by bf16x3. Returns false with C untouched
// when A holds a NaN / inf / value too large to split, or when a partial sum could overflow fp32
// (K * max|a| * max|b| near FLT_MAX): the caller then runs the fp32 kernels, so those cases give fp32's results.
bool bf16x3_gemm(const Kernels& kr, const Bf16x3B& b, const MatView& a, float* c, i64 ldc, float alpha, float beta,
                 const Epilogue& ep, int nthreads);

}  // namespace hetero
