// AMX-INT8 block of the int8 GEMM (qlinear.hpp): eight tile registers as 2 x 2 int32 accumulators (16 x 16 each),
// two 16-row slices of A (16 x 64 bytes) and two packed B panels (16 groups of 4 k x 16 columns: the panel layout
// is tdpbusd's B operand as it is). Entered only after amx_available(): the CPU has AMX-TILE / AMX-INT8 and Linux
// granted this process the tile state (arch_prctl ARCH_REQ_XCOMP_PERM).
#include <cstdint>
#include <cstring>

#include "qlinear.hpp"

#if defined(HETERO_QLIN_AMX)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace hetero {
namespace qlin {

#if defined(HETERO_QLIN_AMX)
namespace {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

bool detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1;
  if (!tile || !int8) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

bool amx_available() {
  static const bool ok = detect();
  return ok;
}

// Eight 16 x 64-byte tiles. A global, not a local: GCC does not see ldtilecfg read its operand and would drop the
// stores that fill a local one.
const TileConfig kConfig = [] {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}();

void amx_begin() { _tile_loadconfig(&kConfig); }

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
#else
bool amx_available() { return false; }
void amx_block16(i64, const std::uint8_t*, i64, const std::int8_t*, i64, std::int32_t*) {}
void amx_begin() {}
void amx_end() {}
void amx_block32(i64, const std::uint8_t*, i64, const std::int8_t*, i64, std::int32_t*) {}
#endif

}  // namespace qlin
}  // namespace hetero
