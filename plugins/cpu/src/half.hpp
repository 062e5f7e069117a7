// float16 <-> float32 conversion (Cast, the float16 nodes run on float32 kernels: hetero_cpu/kernels/half.py).
// Bit for bit numpy's astype: round to nearest even, overflow to Inf, subnormals kept, NaN payloads truncated /
// widened with the quiet bit left as it was (the F16C instructions quiet a signalling NaN, so the SIMD paths hand a
// vector holding a NaN to the scalar code).
#pragma once

#include <cstdint>

#include "common.hpp"

namespace hetero {
namespace half {

std::uint16_t to_half(float f);  // the scalar rule every path matches
float to_float(std::uint16_t h);

using ToFloatFn = void (*)(const std::uint16_t* src, float* dst, i64 n);
using ToHalfFn = void (*)(const float* src, std::uint16_t* dst, i64 n);

void to_float_generic(const std::uint16_t* src, float* dst, i64 n);
void to_half_generic(const float* src, std::uint16_t* dst, i64 n);
void to_float_f16c(const std::uint16_t* src, float* dst, i64 n);  // half_avx2.cpp (AVX2 + F16C)
void to_half_f16c(const float* src, std::uint16_t* dst, i64 n);
void to_float_avx512(const std::uint16_t* src, float* dst, i64 n);  // half_avx512.cpp
void to_half_avx512(const float* src, std::uint16_t* dst, i64 n);

}  // namespace half
}  // namespace hetero
