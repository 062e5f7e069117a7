// The AMX run-time check (amx.hpp), compiled without AMX flags: it runs before any tile instruction.
#include "amx.hpp"

#if (defined(__x86_64__) || defined(_M_X64)) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define HETERO_AMX_CHECK 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace hetero {

const AmxTileConfig kAmxTiles16x64 = [] {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}();

#if defined(HETERO_AMX_CHECK)
namespace {

unsigned amx_edx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  if (!((d >> 24) & 1)) return 0;  // AMX-TILE
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0 ? d : 0;
}

}  // namespace

bool amx_usable(unsigned feature) {
  static const unsigned edx = amx_edx();
  return (edx & feature) == feature;
}
#else
bool amx_usable(unsigned) { return false; }
#endif

}  // namespace hetero
