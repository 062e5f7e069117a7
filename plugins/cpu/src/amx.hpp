// AMX helpers shared by the AMX kernel families (qlinear_amx.cpp: int8, gemm_amx_bf16.cpp: the fp32 GEMM's
// bf16x3 path): the run-time check and the one tile configuration both use.
#pragma once

#include <cstdint>

namespace hetero {

// CPUID.(EAX=7, ECX=0):EDX bits of the AMX features (AMX-TILE is bit 24, checked by amx_usable).
enum AmxFeature : unsigned { AMX_BF16 = 1u << 22, AMX_INT8 = 1u << 25 };

// Whether this CPU has AMX-TILE and `feature`, and Linux granted this process the tile state (arch_prctl
// ARCH_REQ_XCOMP_PERM, asked once per process). False on other systems and compilers.
bool amx_usable(unsigned feature);

// ldtilecfg's 64-byte operand.
struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// Eight 16 x 64-byte tiles. A global, not a local: GCC does not see ldtilecfg read its operand and would drop the
// stores that fill a local one.
extern const AmxTileConfig kAmxTiles16x64;

}  // namespace hetero

#if defined(__AMX_TILE__)
#include <immintrin.h>
namespace hetero {
inline void amx_load_tiles16x64() { _tile_loadconfig(&kAmxTiles16x64); }
}  // namespace hetero
#endif
