// The ExtraKernels table (onnx_extra.hpp) for the generic path: onnx_impl.hpp compiled with this file's flags
// (see CMakeLists.txt); only reached after the run-time CPU check of isa.cpp.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "simd_generic.hpp"
#define SIMD_NAME "generic"
#include "kernels_impl.hpp"
#include "onnx_impl.hpp"

#include <string>

namespace hetero {
const ExtraKernels* extra_generic() { return &extra_table; }
}  // namespace hetero

namespace hetero {
#if !(defined(__x86_64__) || defined(_M_X64))
const ExtraKernels* extra_avx2() { return nullptr; }
const ExtraKernels* extra_avx512() { return nullptr; }
#endif
#if !defined(__aarch64__)
const ExtraKernels* extra_neon() { return nullptr; }
#endif

const ExtraKernels& extra_for(const Kernels& kr) {
  for (const ExtraKernels* t : {extra_avx512(), extra_avx2(), extra_neon()})
    if (t && std::string(t->name) == kr.name) return *t;
  return *extra_generic();
}
}  // namespace hetero
