// The LLM kernels built for AVX-512 with VNNI (int8 dots with vpdpbusd); compiled with -mavx512vnni on top of the
// AVX-512 flags and entered only when the CPU reports avx512vnni.
#include "llm_simd_avx512vnni.hpp"
#include "llm_impl.hpp"

namespace {
const LlmKernels table = llm_table<LlmSimdVnni>("avx512vnni");
}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx512vnni() { return &table; }
}  // namespace llm
}  // namespace hetero
