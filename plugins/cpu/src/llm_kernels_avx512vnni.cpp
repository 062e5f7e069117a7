// AVX-512 LLM kernels with VNNI (vpdpbusd); compiled with -mavx512vnni on top of the AVX-512 flags and entered
// only when the CPU reports avx512vnni. See llm_avx512_impl.hpp.
#define HETERO_LLM_VNNI 1
#include "llm_avx512_impl.hpp"

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx512vnni() { return &table; }
}  // namespace llm
}  // namespace hetero
