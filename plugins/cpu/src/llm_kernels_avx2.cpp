// The LLM kernels built for AVX2 + FMA + F16C (-mavx2 -mfma -mf16c; entered only after the run-time CPU check).
#include "llm_simd_avx2.hpp"
#include "llm_impl.hpp"

namespace {
const LlmKernels table = llm_table<LlmSimd>("avx2");
}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx2() { return &table; }
}  // namespace llm
}  // namespace hetero
