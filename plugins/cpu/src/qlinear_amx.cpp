// AMX-INT8 block of the int8 GEMM (qlinear.hpp): eight tile registers as 2 x 2 int32 accumulators (16 x 16 each),
// two 16-row slices of A (16 x 64 bytes) and two packed B panels (16 groups of 4 k x 16 columns: the panel layout
// is tdpbusd's B operand as it is). Entered only after amx_available(): the CPU has AMX-TILE / AMX-INT8 and Linux
// granted this process the tile state (amx.hpp).
#include <cstdint>
#include <cstring>

#include "amx.hpp"
#include "qlinear.hpp"

namespace hetero {
namespace qlin {

#if defined(HETERO_QLIN_AMX)
bool amx_available() { return amx_usable(AMX_INT8); }

void amx_begin() { amx_load_tiles16x64(); }

void amx_end() { _tile_release(); }

void amx_block32(i64 k, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* raw) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const std::int8_t* b1 = b + pstride;
  for (i64 k0 = 0; k0 < k; k0 += 64) {
    _tile_loadd(4, a + k0, lda);
    _tile_loadd(5, a + 16 * lda + k0, lda);
    _tile_loadd(6, b + k0 * 16, 64);  // 16 groups of 4 k from group k0 / 4: 64 bytes each
    _tile_loadd(7, b1 + k0 * 16, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, raw, 32 * 4);
  _tile_stored(1, raw + 16, 32 * 4);
  _tile_stored(2, raw + 16 * 32, 32 * 4);
  _tile_stored(3, raw + 16 * 32 + 16, 32 * 4);
}
void amx_block16(i64 k, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* raw) {
  _tile_zero(0);
  _tile_zero(1);
  const std::int8_t* b1 = b + pstride;
  for (i64 k0 = 0; k0 < k; k0 += 64) {
    _tile_loadd(4, a + k0, lda);
    _tile_loadd(6, b + k0 * 16, 64);
    _tile_loadd(7, b1 + k0 * 16, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
  }
  _tile_stored(0, raw, 32 * 4);
  _tile_stored(1, raw + 16, 32 * 4);
}

// The recurrent product of a quantized LSTM step (a few rows of A, each B panel read once): panels two at a time
// over two k blocks an iteration, every load of an iteration in its own register (A in 2 / 3, B in 4-7), so the next
// iteration's loads need not wait for this one's products (1 thread, a 768-wide layer of 3 rows: 7 % faster than four
// accumulators sharing one A register and three B registers).
template <int NP>
void panels16(i64 k, const std::uint8_t* a, i64 lda, const std::int8_t* b0, const std::int8_t* b1, std::int32_t* raw,
              i64 ldraw) {
  _tile_zero(0);
  if constexpr (NP > 1) _tile_zero(1);
  i64 k0 = 0;
  for (; k0 + 128 <= k; k0 += 128) {
    _tile_loadd(2, a + k0, lda);
    _tile_loadd(4, b0 + k0 * 16, 64);
    if constexpr (NP > 1) _tile_loadd(5, b1 + k0 * 16, 64);
    _tile_loadd(3, a + k0 + 64, lda);
    _tile_loadd(6, b0 + (k0 + 64) * 16, 64);
    if constexpr (NP > 1) _tile_loadd(7, b1 + (k0 + 64) * 16, 64);
    _tile_dpbusd(0, 2, 4);
    if constexpr (NP > 1) _tile_dpbusd(1, 2, 5);
    _tile_dpbusd(0, 3, 6);
    if constexpr (NP > 1) _tile_dpbusd(1, 3, 7);
  }
  if (k0 < k) {
    _tile_loadd(2, a + k0, lda);
    _tile_loadd(4, b0 + k0 * 16, 64);
    if constexpr (NP > 1) _tile_loadd(5, b1 + k0 * 16, 64);
    _tile_dpbusd(0, 2, 4);
    if constexpr (NP > 1) _tile_dpbusd(1, 2, 5);
  }
  _tile_stored(0, raw, ldraw * 4);
  if constexpr (NP > 1) _tile_stored(1, raw + 16, ldraw * 4);
}

void amx_panels16(i64 k, int np, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride,
                  std::int32_t* raw, i64 ldraw) {
  int p = 0;
  for (; p + 2 <= np; p += 2) panels16<2>(k, a, lda, b + p * pstride, b + (p + 1) * pstride, raw + 16 * p, ldraw);
  if (p < np) panels16<1>(k, a, lda, b + p * pstride, nullptr, raw + 16 * p, ldraw);
}
#else
bool amx_available() { return false; }
void amx_panels16(i64, int, const std::uint8_t*, i64, const std::int8_t*, i64, std::int32_t*, i64) {}
void amx_block16(i64, const std::uint8_t*, i64, const std::int8_t*, i64, std::int32_t*) {}
void amx_begin() {}
void amx_end() {}
void amx_block32(i64, const std::uint8_t*, i64, const std::int8_t*, i64, std::int32_t*) {}
#endif

}  // namespace qlin
}  // namespace hetero
