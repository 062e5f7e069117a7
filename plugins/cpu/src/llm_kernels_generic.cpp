// The LLM kernels in portable scalar C++ (any CPU; W = 1).
#include "llm_simd_generic.hpp"
#include "llm_impl.hpp"

namespace {
const LlmKernels table = llm_table<LlmSimd>("generic");
}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_generic() { return &table; }
}  // namespace llm
}  // namespace hetero
