// Scalar traits of the LLM kernels (W = 1: one weight row per "vector", its 4 quants of a step in one uint32):
// the float traits of simd_generic.hpp plus the byte, int8-dot and half-precision primitives of llm_impl.hpp.
// The portable path of every CPU. Only included by llm_kernels_generic.cpp.
#pragma once
#include "simd_generic.hpp"
#include "llm.hpp"

namespace {
struct LlmSimd : SIMD {
  using B = std::uint32_t;
  static constexpr int QGEMM_MR = 4;
  static constexpr int QGEMM_ROWS = QGEMM_MR;  // x rows per qgemm_group call (the table's max_mr)
  static constexpr int FGEMM_MR = 4;
  static constexpr int QK_NR = 4;
  static constexpr int PV_VECS = 4;
  static constexpr bool DOT_U8 = true;  // dot4 takes any unsigned bytes (exact int products)
  static constexpr int Q8_SHIFT = 0;  // dot_q8 multiplies the unsigned bytes as stored

  static V load_n(const float* p, hetero::i64 n) { return n > 0 ? *p : 0.f; }
  static void store_n(float* p, V v, int n) {
    if (n > 0) *p = v;
  }
  static V load_f16(const void* p) {
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return hetero::llm::half_to_float(h);
  }
  static void store_f16(std::uint16_t* p, V v) { *p = hetero::llm::float_to_half(v); }
  static V load_bf16(const std::uint16_t* p) { return hetero::llm::bf16_to_float(*p); }
  static V load_u8(const std::uint8_t* p) { return static_cast<float>(*p); }
  static V load_i8(const std::int8_t* p) { return static_cast<float>(*p); }

  static I load_i8_i32(const std::uint8_t* p) { return static_cast<std::int8_t>(*p); }
  static I imul(I a, I b) { return a * b; }
  static I iclamp(I a, std::int32_t lim) { return a > lim ? lim : (a < -lim ? -lim : a); }
  static std::int32_t ihsum(I v) { return v; }
  static void store_i8(std::int8_t* p, I v) { *p = static_cast<std::int8_t>(v); }

  static B load_b(const std::uint8_t* p) {
    B v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static B bcast4(const std::int8_t* p) {
    B v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static B opaque(B v) { return v; }  // (the SIMD paths keep a loaded vector from being loaded twice)
  static B bset8(std::uint8_t v) { return 0x01010101u * v; }
  static B band(B a, B b) { return a & b; }
  static B bor(B a, B b) { return a | b; }
  static B bandnot(B a, B b) { return ~a & b; }
  // 32-bit shifts stand in for the SIMD paths' 16-bit ones: the callers mask every bit that crosses a byte.
  static B bsll16(B a, int n) { return a << n; }
  static B bsrl16(B a, int n) { return a >> n; }
  static B bsrl4(B a) { return a >> 4; }

  static I dot4(I acc, B w, B x) {
    for (int c = 0; c < 4; ++c)
      acc += static_cast<I>((w >> (8 * c)) & 0xffu) * static_cast<std::int8_t>((x >> (8 * c)) & 0xffu);
    return acc;
  }
  static I dot4x2(I acc, B w1, B x1, B w2, B x2) { return dot4(dot4(acc, w1, x1), w2, x2); }
  struct Q8 {
    B w;
  };
  static Q8 q8_weights(B w) { return {w}; }
  static I dot_q8(I acc, const Q8& w, B x) { return dot4(acc, w.w, x); }
  static void prefetch(const void*) {}
  static void prefetch_l2(const void*) {}
};
}  // namespace
