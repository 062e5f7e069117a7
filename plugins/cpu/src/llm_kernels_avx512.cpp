// The LLM kernels built for AVX-512 F/BW/DQ/VL without VNNI (int8 dots with vpmaddubsw + vpmaddwd).
#include "llm_simd_avx512.hpp"
#include "llm_impl.hpp"

namespace {
const LlmKernels table = llm_table<LlmSimd>("avx512");
}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx512() { return &table; }
}  // namespace llm
}  // namespace hetero
