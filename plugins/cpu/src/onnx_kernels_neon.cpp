// The ExtraKernels table (onnx_extra.hpp) for the neon path: onnx_impl.hpp compiled with this file's flags
// (see CMakeLists.txt); only reached after the run-time CPU check of isa.cpp.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "simd_neon.hpp"
#define SIMD_NAME "neon"
#include "kernels_impl.hpp"
#include "onnx_impl.hpp"

namespace hetero {
const ExtraKernels* extra_neon() { return &extra_table; }
}  // namespace hetero
