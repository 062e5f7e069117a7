// Scalar "vector" traits: the portable path (W = 1). Same interface as simd_avx2/avx512/neon.hpp so that the
// templates in kernels_impl.hpp compile unchanged for every ISA.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {
struct SIMD {
  using V = float;
  using M = bool;
  using I = std::int32_t;
  static constexpr int W = 1;
  static V load(const float* p) { return *p; }
  static I load_s8(const std::int8_t* p) { return *p; }  // W int8 values sign-extended to int32
  static V gather(const float* p, const std::int32_t* idx) { return p[idx[0]]; }
  static void store(float* p, V v) { *p = v; }
  static void store_u8(std::uint8_t* p, V v) { *p = static_cast<std::uint8_t>(v); }  // v an integer in [0, 255]
  static V set1(float x) { return x; }
  static V zero() { return 0.f; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V rcp(V a) { return 1.f / a; }
  static V fma(V a, V b, V c) { return a * b + c; }   // a*b + c
  static V fnma(V a, V b, V c) { return c - a * b; }  // c - a*b
  // max/min follow the x86 convention: the second operand is returned when either is NaN.
  static V max(V a, V b) { return a > b ? a : b; }
  static V min(V a, V b) { return a < b ? a : b; }
  static V abs(V a) { return std::fabs(a); }
  static V neg(V a) { return -a; }
  static V sqrt(V a) { return std::sqrt(a); }
  static V floor(V a) { return std::floor(a); }
  static V ceil(V a) { return std::ceil(a); }
  static V round(V a) { return std::nearbyint(a); }  // default rounding mode: half to even
  static M lt(V a, V b) { return a < b; }
  static M le(V a, V b) { return a <= b; }
  static M gt(V a, V b) { return a > b; }
  static M ge(V a, V b) { return a >= b; }
  static M eq(V a, V b) { return a == b; }
  static M isnan(V a) { return a != a; }
  static bool any(M m) { return m; }
  static M mand(M a, M b) { return a && b; }
  static M mor(M a, M b) { return a || b; }
  static V select(M m, V a, V b) { return m ? a : b; }
  static I cvt_i(V a) { return static_cast<I>(std::nearbyint(a)); }
  static V cvt_f(I a) { return static_cast<float>(a); }
  static I as_int(V a) {
    I r;
    std::memcpy(&r, &a, 4);
    return r;
  }
  static V as_float(I a) {
    V r;
    std::memcpy(&r, &a, 4);
    return r;
  }
  static I iadd(I a, I b) { return a + b; }
  static I isub(I a, I b) { return a - b; }
  static I iand(I a, I b) { return a & b; }
  static I ior(I a, I b) { return a | b; }
  static I iset1(std::int32_t x) { return x; }
  template <int N> static I slli(I a) { return static_cast<I>(static_cast<std::uint32_t>(a) << N); }
  template <int N> static I srai(I a) { return a >> N; }
  static float hsum(V a) { return a; }
  static float hmax(V a) { return a; }
};
}  // namespace
