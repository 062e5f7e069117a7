// AArch64 NEON traits (4 floats). NEON is baseline on aarch64, so no extra compiler flags are needed.
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

namespace {
struct SIMD {
  using V = float32x4_t;
  using M = uint32x4_t;
  using I = int32x4_t;
  static constexpr int W = 4;
  static V load(const float* p) { return vld1q_f32(p); }
  static I load_s8(const std::int8_t* p) {  // W int8 values sign-extended to int32
    const std::int32_t t[4] = {p[0], p[1], p[2], p[3]};
    return vld1q_s32(t);
  }
  static V gather(const float* p, const std::int32_t* idx) {
    const float t[4] = {p[idx[0]], p[idx[1]], p[idx[2]], p[idx[3]]};
    return vld1q_f32(t);
  }
  static void store(float* p, V v) { vst1q_f32(p, v); }
  // W floats holding integers in [0, 255] stored as W bytes
  static void store_u8(std::uint8_t* p, V v) {
    const uint16x4_t h = vmovn_u32(vcvtq_u32_f32(v));
    const uint8x8_t b = vmovn_u16(vcombine_u16(h, h));
    std::uint8_t t[8];
    vst1_u8(t, b);
    std::memcpy(p, t, 4);
  }
  static V set1(float x) { return vdupq_n_f32(x); }
  static V zero() { return vdupq_n_f32(0.f); }
  static V add(V a, V b) { return vaddq_f32(a, b); }
  static V sub(V a, V b) { return vsubq_f32(a, b); }
  static V mul(V a, V b) { return vmulq_f32(a, b); }
  static V div(V a, V b) { return vdivq_f32(a, b); }
  // 1/a within ~2^-16: the 8-bit estimate and one Newton step
  static V rcp(V a) {
    const V e = vrecpeq_f32(a);
    return vmulq_f32(e, vrecpsq_f32(a, e));
  }
  static V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static V fnma(V a, V b, V c) { return vfmsq_f32(c, a, b); }
  // Keep the x86 semantics (second operand on NaN) so the shared code's NaN fix-ups stay valid.
  static V max(V a, V b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
  static V min(V a, V b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
  static V abs(V a) { return vabsq_f32(a); }
  static V neg(V a) { return vnegq_f32(a); }
  static V sqrt(V a) { return vsqrtq_f32(a); }
  static V floor(V a) { return vrndmq_f32(a); }
  static V ceil(V a) { return vrndpq_f32(a); }
  static V round(V a) { return vrndnq_f32(a); }
  static M lt(V a, V b) { return vcltq_f32(a, b); }
  static M le(V a, V b) { return vcleq_f32(a, b); }
  static M gt(V a, V b) { return vcgtq_f32(a, b); }
  static M ge(V a, V b) { return vcgeq_f32(a, b); }
  static M eq(V a, V b) { return vceqq_f32(a, b); }
  static M isnan(V a) { return vmvnq_u32(vceqq_f32(a, a)); }
  static bool any(M m) { return vmaxvq_u32(m) != 0; }
  static M mand(M a, M b) { return vandq_u32(a, b); }
  static M mor(M a, M b) { return vorrq_u32(a, b); }
  static V select(M m, V a, V b) { return vbslq_f32(m, a, b); }
  static I cvt_i(V a) { return vcvtnq_s32_f32(a); }
  static V cvt_f(I a) { return vcvtq_f32_s32(a); }
  static I as_int(V a) { return vreinterpretq_s32_f32(a); }
  static V as_float(I a) { return vreinterpretq_f32_s32(a); }
  static I iadd(I a, I b) { return vaddq_s32(a, b); }
  static I isub(I a, I b) { return vsubq_s32(a, b); }
  static I iand(I a, I b) { return vandq_s32(a, b); }
  static I ior(I a, I b) { return vorrq_s32(a, b); }
  static I iset1(std::int32_t x) { return vdupq_n_s32(x); }
  template <int N> static I slli(I a) { return vshlq_n_s32(a, N); }
  template <int N> static I srai(I a) { return vshrq_n_s32(a, N); }
  static float hsum(V a) { return vaddvq_f32(a); }
  static float hmax(V a) { return vmaxvq_f32(a); }
};
}  // namespace
