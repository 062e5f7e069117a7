// The generic instantiation of the int8 kernels (qlinear_impl.hpp); entered only after the run-time CPU check in
// qlinear.cpp.

#include "qlinear_impl.hpp"

namespace hetero {
namespace qlin {

const QKernels* qkernels_generic() {
  static const QKernels k{"generic", 4, 4, tile, quantize8, minmax, finish, rowsums, nullptr, 0, 0, dot_cols, fake_quant8, nullptr};
  return &k;
}

}  // namespace qlin
}  // namespace hetero
