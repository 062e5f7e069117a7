// The avx512vnni instantiation of the int8 kernels (qlinear_impl.hpp); entered only after the run-time CPU check in
// qlinear.cpp.
#define QLIN_ISA_VNNI 1
#include "qlinear_impl.hpp"

namespace hetero {
namespace qlin {

const QKernels* qkernels_avx512vnni() {
  static const QKernels k{"avx512vnni", 4, 4, tile, quantize8, minmax, finish, rowsums, tile_f32, kF32Rows, kF32Panels,
                          dot_cols, fake_quant8, nullptr};
  return &k;
}

}  // namespace qlin
}  // namespace hetero
