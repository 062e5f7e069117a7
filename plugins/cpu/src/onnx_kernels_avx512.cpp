// The ExtraKernels table (onnx_extra.hpp) for the avx512 path: onnx_impl.hpp compiled with this file's flags
// (see CMakeLists.txt); only reached after the run-time CPU check of isa.cpp.
#pragma GCC diagnostic ignored "-Wunused-function"
#include "simd_avx512.hpp"
#define SIMD_NAME "avx512"
#include "kernels_impl.hpp"
#include "onnx_impl.hpp"

namespace hetero {
const ExtraKernels* extra_avx512() { return &extra_table; }
}  // namespace hetero
