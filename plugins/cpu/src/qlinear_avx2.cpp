// The avx2 instantiation of the int8 kernels (qlinear_impl.hpp); entered only after the run-time CPU check in
// qlinear.cpp.
#define QLIN_ISA_AVX2 1
#include "qlinear_impl.hpp"

namespace hetero {
namespace qlin {

const QKernels* qkernels_avx2() {
  static const QKernels k{"avx2",  2,        1,           tile,        quantize8, minmax, finish,
                          rowsums, nullptr, 0, 0, dot_cols, fake_quant8, tile_pairs};
  return &k;
}

}  // namespace qlin
}  // namespace hetero
