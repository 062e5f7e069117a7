// Shared by every kernel family of hetero-metal: prepended to each family's source for Apple's compiler, included
// before it by the emulator's bindings (which compile it as C++ against src/emu/msl_emu.hpp).
//
// Threadgroup memory is declared with TG_ARRAY (in a kernel's body) and passed to helpers as TG_PTR: plain
// `threadgroup` arrays for Apple's compiler, race-checked arrays for the emulator.
#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
#define TG_ARRAY(T, name, count) threadgroup T name[count]
#define TG_PTR(T) threadgroup T*
#else
#define TG_ARRAY(T, name, count) emu::TgPtr<T> name = emu::threadgroup_array<T>(count)
#define TG_PTR(T) emu::TgPtr<T>
#endif

#define SIMD_WIDTH 32u

// A signed byte from its unsigned storage (MSL's char is signed; the C++ one need not be).
static inline int s8(uchar b) { return int(b) - ((int(b) & 0x80) << 1); }

// The f16 at byte offset `at` of a quantised weight row (block headers are 2-byte aligned).
static inline float f16_at(device const uchar* p, uint at) { return float(*(device const half*)(p + at)); }
