// AVX-512 (F/BW/DQ/VL) LLM kernels without VNNI; see llm_avx512_impl.hpp.
#include "llm_avx512_impl.hpp"

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx512() { return &table; }
}  // namespace llm
}  // namespace hetero
