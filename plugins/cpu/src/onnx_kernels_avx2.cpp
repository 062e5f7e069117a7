// The ExtraKernels table (onnx_extra.hpp) for the avx2 path: onnx_impl.hpp compiled with this file's flags
// (see CMakeLists.txt); only reached after the run-time CPU check of isa.cpp.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "simd_avx2.hpp"
#define SIMD_NAME "avx2"
#include "kernels_impl.hpp"
#include "onnx_impl.hpp"

namespace hetero {
const ExtraKernels* extra_avx2() { return &extra_table; }
}  // namespace hetero
