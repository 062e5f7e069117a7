// The LLM kernels built for AVX-512 with VNNI, VBMI and GFNI (the VNNI kernels; q6_k's one-row tile unpacks its 6-bit
// values with gf2p8affineqb); compiled with -mavx512vbmi -mgfni on top of the VNNI flags and entered only when the CPU
// reports all three.
#include "llm_simd_avx512vbmi.hpp"
#include "llm_impl.hpp"

namespace {
const LlmKernels table = llm_table<LlmSimdVbmi>("avx512vbmi");
}  // namespace

namespace hetero {
namespace llm {
const LlmKernels* llm_kernels_avx512vbmi() { return &table; }
}  // namespace llm
}  // namespace hetero
