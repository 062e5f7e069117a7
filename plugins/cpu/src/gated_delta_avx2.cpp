// The gated delta rule's per-head kernel built for the avx2 path (flags per file in gated_delta.cmake).
#include "gated_delta_impl.hpp"

namespace hetero {
namespace gd {
void head_avx2(const HeadArgs& h) { head_impl(h); }
}  // namespace gd
}  // namespace hetero
