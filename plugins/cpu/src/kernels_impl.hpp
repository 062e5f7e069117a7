// ISA-independent kernel bodies written against the `SIMD` traits of the including translation unit
// (simd_generic/avx2/avx512/neon.hpp). Each kernels_<isa>.cpp includes one traits header and then this file, so
// everything here is compiled once per ISA with that file's flags. Everything lives in an anonymous namespace:
// identical inline functions compiled with different -m flags must never be merged by the linker.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common.hpp"

namespace {

using hetero::i64;
using V = SIMD::V;
using M = SIMD::M;
constexpr int W = SIMD::W;

inline i64 imin(i64 a, i64 b) { return a < b ? a : b; }

// ------------------------------------------------------------------------------------------------------------
// Vector math. Accuracy targets (checked against float64 numpy in the tests): relative error <= 2e-6.
// ------------------------------------------------------------------------------------------------------------

inline V vnan_pass(V x, V r) { return SIMD::select(SIMD::isnan(x), x, r); }

// p 2^n (n integer-valued, ni the same as integers): one instruction where the ISA scales (AVX-512's vscalefps: a
// third of exp's instructions), else two exact power-of-two factors (below) whose product rounds once, the same.
template <class S>
inline auto vscale(V p, V n, SIMD::I, int) -> decltype(S::scalef(p, n)) {
  return S::scalef(p, n);
}
template <class S>
inline V vscale(V p, V, SIMD::I ni, long) {
  SIMD::I n1 = SIMD::srai<1>(ni);
  SIMD::I n2 = SIMD::isub(ni, n1);
  V s1 = SIMD::as_float(SIMD::slli<23>(SIMD::iadd(n1, SIMD::iset1(127))));
  V s2 = SIMD::as_float(SIMD::slli<23>(SIMD::iadd(n2, SIMD::iset1(127))));
  return SIMD::mul(SIMD::mul(p, s1), s2);
}

// t 2^n rounded once (t normal, n integer-valued in [-150, 128]), without subnormal arithmetic: where the result is
// below 2^-126, |t| 2^(n + 149) (normal: a power-of-two scaling, exact) rounded to an integer is the result's bit
// pattern (the float with those bits is that integer times 2^-149, and an integer below 2^24 encodes it whether it
// lands subnormal or, rounded up, on 2^-126); elsewhere the plain scaling, its n lifted out of the subnormal range in
// the lanes it does not serve. On x86 a product that reads or writes a subnormal takes a microcode assist: sigmoid
// of activations of +-400 (a diffusion U-Net's first blocks) ran 20x slower than of +-5. Vectors with no n below
// -125 (|t| >= 0.5 then gives a normal result) take the plain scaling alone.
inline V vscale_tiny(V t, V n) {
  if (!SIMD::any(SIMD::lt(n, SIMD::set1(-125.f)))) return vscale<SIMD>(t, n, SIMD::cvt_i(n), 0);
  V nq = SIMD::min(SIMD::add(n, SIMD::set1(149.f)), SIMD::set1(200.f));
  V q = vscale<SIMD>(SIMD::abs(t), nq, SIMD::cvt_i(nq), 0);
  M tiny = SIMD::lt(q, SIMD::set1(8388608.f));
  V sub = SIMD::as_float(SIMD::ior(SIMD::cvt_i(q), SIMD::iand(SIMD::as_int(t), SIMD::iset1(INT32_MIN))));
  V nn = SIMD::select(tiny, SIMD::zero(), n);
  return SIMD::select(tiny, sub, vscale<SIMD>(t, nn, SIMD::cvt_i(nn), 0));
}

// exp(x) = p 2^n: p (in [0.7, 1.42]) and the integer-valued n, for x clamped to [-104, 89].
inline V vexp_parts(V x, V& n) {
  // x already clamped to [-104, 89].
  const V log2e = SIMD::set1(1.44269504088896341f);
  // Adding 1.5 * 2^23 rounds x log2(e) (|.| < 2^22) to an integer, half to even like round(), and leaves that integer
  // in the low mantissa bits: one FMA instead of a multiply, a round and a conversion.
  const V magic = SIMD::set1(12582912.f);
  const V k = SIMD::fma(x, log2e, magic);
  n = SIMD::sub(k, magic);
  // Cody-Waite: ln2 = hi + lo, hi has few mantissa bits so n*hi is exact.
  V r = SIMD::fnma(n, SIMD::set1(0.693359375f), x);
  r = SIMD::fnma(n, SIMD::set1(-2.12194440e-4f), r);
  // Taylor to degree 7 on |r| <= ln2/2: truncation < 1.2e-8 relative.
  V p = SIMD::set1(1.f / 5040.f);
  p = SIMD::fma(p, r, SIMD::set1(1.f / 720.f));
  p = SIMD::fma(p, r, SIMD::set1(1.f / 120.f));
  p = SIMD::fma(p, r, SIMD::set1(1.f / 24.f));
  p = SIMD::fma(p, r, SIMD::set1(1.f / 6.f));
  p = SIMD::fma(p, r, SIMD::set1(0.5f));
  p = SIMD::fma(p, r, SIMD::set1(1.f));
  p = SIMD::fma(p, r, SIMD::set1(1.f));
  return p;
}

// 2^n scaled without flushing: exp(x) rounds to inf / subnormal / 0 exactly like a correctly scaled result.
inline V vexp_core(V x) {
  V n;
  V p = vexp_parts(x, n);
  return vscale_tiny(p, n);
}

inline V vexp(V x) {
  V xc = SIMD::min(SIMD::max(x, SIMD::set1(-104.f)), SIMD::set1(89.f));
  return vnan_pass(x, vexp_core(xc));
}

// exp(x) - 1 with full relative accuracy near 0 (series for |x| < 0.7, exp otherwise: cancellation there
// costs at most a factor 2).
inline V vexpm1(V x) {
  V ax = SIMD::abs(x);
  V p = SIMD::set1(1.f / 3628800.f);
  p = SIMD::fma(p, x, SIMD::set1(1.f / 362880.f));
  p = SIMD::fma(p, x, SIMD::set1(1.f / 40320.f));
  p = SIMD::fma(p, x, SIMD::set1(1.f / 5040.f));
  p = SIMD::fma(p, x, SIMD::set1(1.f / 720.f));
  p = SIMD::fma(p, x, SIMD::set1(1.f / 120.f));
  p = SIMD::fma(p, x, SIMD::set1(1.f / 24.f));
  p = SIMD::fma(p, x, SIMD::set1(1.f / 6.f));
  p = SIMD::fma(p, x, SIMD::set1(0.5f));
  p = SIMD::fma(p, x, SIMD::set1(1.f));
  V small = SIMD::mul(p, x);
  V big = SIMD::sub(vexp(x), SIMD::set1(1.f));
  return SIMD::select(SIMD::lt(ax, SIMD::set1(0.7f)), small, big);
}

inline V vlog(V x) {
  // Subnormals: scale into the normal range first.
  M den = SIMD::lt(x, SIMD::set1(1.17549435e-38f));
  V xs = SIMD::select(den, SIMD::mul(x, SIMD::set1(8388608.f)), x);
  SIMD::I xi = SIMD::as_int(xs);
  V e = SIMD::cvt_f(SIMD::isub(SIMD::srai<23>(xi), SIMD::iset1(127)));
  e = SIMD::select(den, SIMD::sub(e, SIMD::set1(23.f)), e);
  V m = SIMD::as_float(SIMD::ior(SIMD::iand(xi, SIMD::iset1(0x007fffff)), SIMD::iset1(0x3f800000)));
  // Centre the mantissa on 1: m in [sqrt(1/2), sqrt(2)).
  M big = SIMD::gt(m, SIMD::set1(1.41421356f));
  m = SIMD::select(big, SIMD::mul(m, SIMD::set1(0.5f)), m);
  e = SIMD::select(big, SIMD::add(e, SIMD::set1(1.f)), e);
  // log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716: odd series to s^9 (error < 1e-9).
  V f = SIMD::sub(m, SIMD::set1(1.f));
  V s = SIMD::div(f, SIMD::add(f, SIMD::set1(2.f)));
  V s2 = SIMD::mul(s, s);
  V p = SIMD::set1(2.f / 9.f);
  p = SIMD::fma(p, s2, SIMD::set1(2.f / 7.f));
  p = SIMD::fma(p, s2, SIMD::set1(2.f / 5.f));
  p = SIMD::fma(p, s2, SIMD::set1(2.f / 3.f));
  p = SIMD::fma(p, s2, SIMD::set1(2.f));
  V lm = SIMD::mul(p, s);
  V r = SIMD::fma(e, SIMD::set1(0.693359375f), SIMD::fma(e, SIMD::set1(-2.12194440e-4f), lm));
  const float inf = std::numeric_limits<float>::infinity();
  r = SIMD::select(SIMD::eq(x, SIMD::zero()), SIMD::set1(-inf), r);
  r = SIMD::select(SIMD::eq(x, SIMD::set1(inf)), x, r);
  r = SIMD::select(SIMD::lt(x, SIMD::zero()), SIMD::set1(std::numeric_limits<float>::quiet_NaN()), r);
  return vnan_pass(x, r);
}

// log(1 + e) for e >= 0, accurate for tiny e (the classic u-1 correction).
inline V vlog1p_pos(V e) {
  V u = SIMD::add(SIMD::set1(1.f), e);
  V d = SIMD::sub(u, SIMD::set1(1.f));
  V r = SIMD::div(SIMD::mul(vlog(u), e), SIMD::select(SIMD::eq(d, SIMD::zero()), SIMD::set1(1.f), d));
  return SIMD::select(SIMD::eq(d, SIMD::zero()), e, r);
}

inline V copysign_of(V mag, V sgn) {
  SIMD::I sb = SIMD::iand(SIMD::as_int(sgn), SIMD::iset1(INT32_MIN));
  return SIMD::as_float(SIMD::ior(SIMD::as_int(SIMD::abs(mag)), sb));
}

// 1 / d for d in [1, 2^125) (a normal estimate on every ISA: see SIGMOID_FLUSH): the ISA's reciprocal estimate and a
// Newton step (a relative error of about 2^-23 from the 12-bit AVX2 estimate, less from the others), where a
// division's throughput was half of SiLU's time.
inline V vrecip(V d) {
  const V r = SIMD::rcp(d);
  return SIMD::fma(r, SIMD::fnma(d, r, SIMD::set1(1.f)), r);
}

// tanh x = x P(x^2) / Q(x^2) on |x| < 9, P and Q of degree 4 (fitted for this file by iterated least squares on the
// relative error of tanh(x) / x over [0, 9]: under 4e-7 relative in float, against the 2e-6 target), the quotient by
// a reciprocal estimate, a Newton step and a residual step; +-1 from |x| = 9 (tanh rounds to 1 in float from 9.01). The expm1 form
// (a series, an exponential and a division: about 40 vector operations) was half the time of text2tashkeel's
// attention (tanh over 80 x 80 x 512 values) and a third of an int8 LSTM step's gate math.
inline V vtanh(V x) {
  const V ax = SIMD::abs(x);
  const V xc = SIMD::min(ax, SIMD::set1(9.f));  // |x|: the sign goes on last (the residual step makes -0 +0)
  const V t = SIMD::mul(xc, xc);
  V p = SIMD::set1(1.3752469905e-08f);
  p = SIMD::fma(p, t, SIMD::set1(2.0901740974e-05f));
  p = SIMD::fma(p, t, SIMD::set1(3.5136273247e-03f));
  p = SIMD::fma(p, t, SIMD::set1(1.3396304421e-01f));
  p = SIMD::fma(p, t, SIMD::set1(9.9999999063e-01f));
  V q = SIMD::set1(7.9409980118e-07f);
  q = SIMD::fma(q, t, SIMD::set1(3.3149539914e-04f));
  q = SIMD::fma(q, t, SIMD::set1(2.5945885640e-02f));
  q = SIMD::fma(q, t, SIMD::set1(4.6729628065e-01f));
  q = SIMD::fma(q, t, SIMD::set1(1.f));
  V r = SIMD::rcp(q);
  r = SIMD::fma(r, SIMD::fnma(q, r, SIMD::set1(1.f)), r);
  const V num = SIMD::mul(xc, p);
  V y = SIMD::mul(num, r);
  y = SIMD::fma(SIMD::fnma(y, q, num), r, y);  // the quotient's residual: ~0.6 ulp on average, not ~0.9
  y = SIMD::min(y, SIMD::set1(1.f));  // never past 1 (a few ulp of error below 9)
  return vnan_pass(x, copysign_of(SIMD::select(SIMD::ge(ax, SIMD::set1(9.f)), SIMD::set1(1.f), y), x));
}

// Below EXP_FLUSH exp(x) is under 2^-126: vexp_flush gives 0 (onnxruntime's sigmoid flushes below about -18), an
// absolute error under 1.2e-38. A subnormal result would slow every later product that reads it (an x86 microcode
// assist per operation): a diffusion U-Net's SiLUs of activations near -90 fed 45K of them into its convolutions.
constexpr float EXP_FLUSH = -87.33f;  // exp(-87.33) = 1.183e-38, normal

// sigmoid(x) is 0 below SIGMOID_FLUSH (an absolute error under 2.7e-38): 1 + exp(-x) stays under 2^125 there, where
// every ISA's reciprocal estimate is a normal number (SSE/AVX's rcpps flushes its results below 2^-126 to 0 from
// inputs near 2^126). From SIGMOID_ONE on 1 + exp(-x) rounds to 1 (it does from 17.33).
constexpr float SIGMOID_FLUSH = -86.5f;
constexpr float SIGMOID_ONE = 20.f;

// 1 + p 2^n for an integer-valued n with p 2^n normal (n in [-125, 126], p in [0.7, 1.42]), k = n + 1.5 * 2^23 (n in
// its low mantissa bits): AVX-512's vscalefps and an add, else one FMA by 2^n, whose exponent bits are n + 127 from
// k's bits (an integer add and a shift, no conversion). A NaN p passes through either.
template <class S>
inline auto vone_plus_scaled(V p, V n, V, int) -> decltype(S::scalef(p, n)) {
  return S::add(S::set1(1.f), S::scalef(p, n));
}
template <class S>
inline V vone_plus_scaled(V p, V, V k, long) {
  const V pow2n = SIMD::as_float(SIMD::slli<23>(SIMD::iadd(SIMD::as_int(k), SIMD::iset1(127))));
  return SIMD::fma(p, pow2n, SIMD::set1(1.f));
}

// 1 + exp(-x) for x in [-87.33, 86.5] (exp(-x) normal), NaN through: the Cody-Waite reduction of vexp_parts with x's
// sign folded into the constants, and a degree-6 polynomial (fitted for this file by iterated least squares on the
// relative error of exp over |r| <= ln2/2, constant term 1: 2.0e-9) instead of the degree-7 Taylor series. Degree 5
// (9.2e-8, an ulp) made the sigmoid correctly rounded half as often, which flipped a requantised step of an int8
// LSTM (tashkeel_rawi_v3's class argmax against onnxruntime).
inline V vone_plus_exp_neg(V x) {
  const V magic = SIMD::set1(12582912.f);
  const V k = SIMD::fma(x, SIMD::set1(-1.44269504088896341f), magic);
  const V n = SIMD::sub(k, magic);
  V r = SIMD::fma(n, SIMD::set1(0.693359375f), x);  // -(the reduced argument): odd coefficients negated below
  r = SIMD::fma(n, SIMD::set1(-2.12194440e-4f), r);
  V p = SIMD::set1(1.3843732886e-03f);
  p = SIMD::fma(p, r, SIMD::set1(-8.3741806448e-03f));
  p = SIMD::fma(p, r, SIMD::set1(4.1668001562e-02f));
  p = SIMD::fma(p, r, SIMD::set1(-1.6666430235e-01f));
  p = SIMD::fma(p, r, SIMD::set1(4.9999994040e-01f));
  p = SIMD::fma(p, r, SIMD::set1(-1.f));
  p = SIMD::fma(p, r, SIMD::set1(1.f));
  return vone_plus_scaled<SIMD>(p, n, k, 0);
}

// 1 / (1 + exp(-x)) on x clamped to [SIGMOID_FLUSH, SIGMOID_ONE], by a reciprocal estimate and a Newton step: about
// 19 vector operations (the e / (1 + e) split at 0, the degree-7 exponential, its subnormal check and the NaN blend
// were about 30). exp(-x)'s relative error reaches the result times e / (1 + e) < 1, so no split is needed for
// x << 0. The clamps return a NaN x (max / min give their second operand on NaN, on every ISA), and every later step
// carries it to the result.
inline V vsigmoid(V x) {
  const V xc = SIMD::min(SIMD::set1(SIGMOID_ONE), SIMD::max(SIMD::set1(SIGMOID_FLUSH), x));
  return SIMD::select(SIMD::lt(x, SIMD::set1(SIGMOID_FLUSH)), SIMD::zero(), vrecip(vone_plus_exp_neg(xc)));
}

inline V vsilu(V x) { return SIMD::mul(x, vsigmoid(x)); }

// SiLU for the activations the conv, depthwise and GEMM tiles apply in registers (dw_act_dispatch): 16 vector
// operations against vsilu's 20, about 0.22 ns an element on Zen 4 (a tenth of a few-channel conv's time an output).
// The exponential's polynomial is degree 5 (fitted for this file like vone_plus_exp_neg's, c0 = c1 = 1: 1.06e-7
// relative, against the degree 6's 2.0e-9), and instead of a compare and a blend for x < SIGMOID_FLUSH the
// multiplicand is clamped there too: x * sigmoid(x) is then -86.5 * sigmoid(-86.5) = -2.3e-36 (a normal float, no
// subnormal products later) instead of 0. NaN passes through both clamps (max / min give their second operand on
// NaN); +inf gives inf. vsilu (the standalone op, the LLMs' SwiGLU) keeps the degree-6 exponential and the exact 0.
inline V vsilu_act(V x) {
  const V xl = SIMD::max(SIMD::set1(SIGMOID_FLUSH), x);
  const V xc = SIMD::min(SIMD::set1(SIGMOID_ONE), xl);
  const V magic = SIMD::set1(12582912.f);
  const V k = SIMD::fma(xc, SIMD::set1(-1.44269504088896341f), magic);
  const V n = SIMD::sub(k, magic);
  // -(the reduced argument), odd coefficients negated below. One FMA by ln2 rounded to float (1.9e-9 off) instead of
  // the two of Cody-Waite: n's 125 at most (x = -86.5) make that 2.4e-7 relative, 5e-8 on |x| < 17. The scalar
  // path's fma is a product and a sum, two roundings (4e-6 at x = -72): it keeps Cody-Waite's exact n * hi.
  V r;
  if constexpr (SIMD::W == 1) {
    r = SIMD::fma(n, SIMD::set1(0.693359375f), xc);
    r = SIMD::fma(n, SIMD::set1(-2.12194440e-4f), r);
  } else {
    r = SIMD::fma(n, SIMD::set1(0.693147182464599609375f), xc);
  }
  V p = SIMD::set1(-8.3125019446e-03f);
  p = SIMD::fma(p, r, SIMD::set1(4.1890330613e-02f));
  p = SIMD::fma(p, r, SIMD::set1(-1.6667115688e-01f));
  p = SIMD::fma(p, r, SIMD::set1(4.9999231100e-01f));
  p = SIMD::fma(p, r, SIMD::set1(-1.f));
  p = SIMD::fma(p, r, SIMD::set1(1.f));
  return SIMD::mul(xl, vrecip(vone_plus_scaled<SIMD>(p, n, k, 0)));
}

// exp(x), flushed to 0 below 2^-126 (softmax's terms: none of them moves a sum of at least 1).
inline V vexp_flush(V x) {
  V e = vexp_core(SIMD::min(SIMD::max(x, SIMD::set1(EXP_FLUSH)), SIMD::set1(89.f)));
  return vnan_pass(x, SIMD::select(SIMD::lt(x, SIMD::set1(EXP_FLUSH)), SIMD::zero(), e));
}

inline V vhard_swish(V x) {
  const V h =
      SIMD::max(SIMD::min(SIMD::fma(SIMD::set1(1.f / 6.f), x, SIMD::set1(0.5f)), SIMD::set1(1.f)), SIMD::zero());
  return vnan_pass(x, SIMD::mul(x, h));
}

inline V verf(V x) {
  V a = SIMD::abs(x);
  // |x| < 0.5: Maclaurin series in x^2 (error < 1e-9).
  V z = SIMD::mul(x, x);
  V p = SIMD::set1(1.f / 9360.f);
  p = SIMD::fnma(p, z, SIMD::set1(1.f / 1320.f));
  p = SIMD::fnma(p, z, SIMD::set1(1.f / 216.f));
  p = SIMD::fnma(p, z, SIMD::set1(1.f / 42.f));
  p = SIMD::fnma(p, z, SIMD::set1(1.f / 10.f));
  p = SIMD::fnma(p, z, SIMD::set1(1.f / 3.f));
  p = SIMD::fnma(p, z, SIMD::set1(1.f));
  V small = SIMD::mul(SIMD::mul(p, a), SIMD::set1(1.12837916709551257f));
  // |x| >= 0.5: Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7, erf >= 0.52 there).
  V t = SIMD::div(SIMD::set1(1.f), SIMD::fma(SIMD::set1(0.3275911f), a, SIMD::set1(1.f)));
  V q = SIMD::set1(1.061405429f);
  q = SIMD::fma(q, t, SIMD::set1(-1.453152027f));
  q = SIMD::fma(q, t, SIMD::set1(1.421413741f));
  q = SIMD::fma(q, t, SIMD::set1(-0.284496736f));
  q = SIMD::fma(q, t, SIMD::set1(0.254829592f));
  q = SIMD::mul(q, t);
  V ex = vexp(SIMD::neg(SIMD::min(z, SIMD::set1(120.f))));
  V large = SIMD::fnma(q, ex, SIMD::set1(1.f));
  V r = SIMD::select(SIMD::lt(a, SIMD::set1(0.5f)), small, large);
  return vnan_pass(x, copysign_of(r, x));
}

// ------------------------------------------------------------------------------------------------------------
// Contiguous maps with a vector body and a padded tail (the tail goes through a W-wide stack buffer).
// ------------------------------------------------------------------------------------------------------------

template <class S, class = void>
struct has_part : std::false_type {};
template <class S>
struct has_part<S, std::void_t<decltype(S::load_part(nullptr, 0, 0.f))>> : std::true_type {};

// The first n (0 < n < W) values of p as a vector, `fill` in the other lanes; and the store of a vector's first n:
// masked where the ISA has it (AVX-512), else through a W-wide stack buffer. The same lanes either way.
template <class S = SIMD>
inline V load_tail(const float* p, i64 n, float fill) {
  if constexpr (has_part<S>::value) {
    return S::load_part(p, static_cast<int>(n), fill);
  } else {
    float t[W];
    for (int j = 0; j < W; ++j) t[j] = j < n ? p[j] : fill;
    return SIMD::load(t);
  }
}

template <class S = SIMD>
inline void store_tail(float* p, i64 n, V v) {
  if constexpr (has_part<S>::value) {
    S::store_part(p, static_cast<int>(n), v);
  } else {
    float t[W];
    SIMD::store(t, v);
    for (int j = 0; j < n; ++j) p[j] = t[j];
  }
}

template <class F>
inline void map1(const float* x, float* y, i64 n, F f) {
  i64 i = 0;
  for (; i + W <= n; i += W) SIMD::store(y + i, f(SIMD::load(x + i)));
  if (i < n) store_tail(y + i, n - i, f(load_tail(x + i, n - i, 0.f)));
}

template <class F>
inline void map2(int mode, const float* a, const float* b, float* y, i64 n, F f) {
  i64 i = 0;
  if (mode == hetero::BM_VV) {
    for (; i + W <= n; i += W) SIMD::store(y + i, f(SIMD::load(a + i), SIMD::load(b + i)));
  } else if (mode == hetero::BM_VS) {
    V vb = SIMD::set1(*b);
    for (; i + W <= n; i += W) SIMD::store(y + i, f(SIMD::load(a + i), vb));
  } else {
    V va = SIMD::set1(*a);
    for (; i + W <= n; i += W) SIMD::store(y + i, f(va, SIMD::load(b + i)));
  }
  if (i < n) {
    const V ta = mode == hetero::BM_SV ? SIMD::set1(*a) : load_tail(a + i, n - i, 1.f);
    const V tb = mode == hetero::BM_VS ? SIMD::set1(*b) : load_tail(b + i, n - i, 1.f);
    store_tail(y + i, n - i, f(ta, tb));
  }
}

// GELU, exact (erf) form: x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2. With a = |x| / sqrt 2 and erfc(a) = t P(t)
// exp(-a^2), t = 1 / (1 + p a) (Abramowitz & Stegun 7.1.26, absolute error 1.5e-7, as verf's |x| >= 0.5 branch),
// Phi is 1 - erfc(a) / 2 for x >= 0 and erfc(a) / 2 below: one form for every x (verf also runs a series for small
// |x|: only erf's relative accuracy near 0 needs it, not 1 + erf), no cancellation in 1 + erf for x < 0, and the
// reciprocal as an estimate and a Newton step instead of a division. From a = 9 (|x| > 12.7) Phi is 0 or 1 (erfc(9)
// < 1e-36): the cap keeps exp and the quotient normal, and -inf gives NaN as 0.5 x (1 + erf) does.
inline V vgelu(V v) {
  using S = SIMD;
  const V cap = S::set1(9.f);
  V a = S::min(S::abs(S::mul(v, S::set1(0.70710678118654752f))), cap);
  V t = vrecip(S::fma(S::set1(0.3275911f), a, S::set1(1.f)));
  V q = S::set1(1.061405429f);
  q = S::fma(q, t, S::set1(-1.453152027f));
  q = S::fma(q, t, S::set1(1.421413741f));
  q = S::fma(q, t, S::set1(-0.284496736f));
  q = S::fma(q, t, S::set1(0.254829592f));
  V half_erfc = S::mul(S::mul(q, t), S::mul(S::set1(0.5f), vexp_core(S::neg(S::mul(a, a)))));
  half_erfc = S::select(S::lt(a, cap), half_erfc, S::zero());
  V phi = S::select(S::lt(v, S::zero()), half_erfc, S::sub(S::set1(1.f), half_erfc));
  return vnan_pass(v, S::mul(v, phi));
}

// GELU, tanh form. 0.5 x (1 + tanh u) = x sigmoid(2u): one exp and a reciprocal estimate instead of tanh's expm1 (a
// series and an exp) and a division (magika's two GELUs: 0.74 ns a value), and no cancellation in 1 + tanh u for x < 0.
inline V vgelu_tanh(V v) {
  using S = SIMD;
  V u2 = S::mul(S::set1(2.f * 0.7978845608028654f), S::fma(S::mul(S::set1(0.044715f), v), S::mul(v, v), v));
  // |2u| > 80: sigmoid is 1 or under 1e-34 (0 in the tanh form; 0 x here), and clamping keeps the exp of
  // -|2u| out of subnormals, whose assists made magika's second GELU (large |x|) 6x slower.
  const V bound = S::set1(80.f);
  V g = S::mul(v, vsigmoid(S::min(S::max(u2, S::neg(bound)), bound)));
  return S::select(S::lt(u2, S::neg(bound)), S::mul(v, S::zero()), g);
}

void k_unary(int op, const float* x, float* y, i64 n, float alpha, float beta) {
  using S = SIMD;
  const V zero = S::zero(), one = S::set1(1.f);
  const V va = S::set1(alpha), vb = S::set1(beta);
  switch (op) {
    case hetero::U_RELU: map1(x, y, n, [&](V v) { return vnan_pass(v, S::max(v, zero)); }); break;
    case hetero::U_LEAKY_RELU:
      map1(x, y, n, [&](V v) { return S::select(S::lt(v, zero), S::mul(v, va), v); });
      break;
    case hetero::U_LEAKY_RELU_MIN:  // max(leaky_relu(x), beta): a fused conv's LeakyRelu and Max by a constant
      map1(x, y, n, [&](V v) { return vnan_pass(v, S::max(S::select(S::lt(v, zero), S::mul(v, va), v), vb)); });
      break;
    case hetero::U_ELU:
      map1(x, y, n, [&](V v) { return S::select(S::lt(v, zero), S::mul(va, vexpm1(v)), v); });
      break;
    case hetero::U_SELU:
      map1(x, y, n, [&](V v) { return S::mul(vb, S::select(S::gt(v, zero), v, S::mul(va, vexpm1(v)))); });
      break;
    case hetero::U_CELU:
      map1(x, y, n, [&](V v) {
        V neg = S::mul(va, vexpm1(S::div(v, va)));
        return vnan_pass(v, S::add(S::max(v, zero), S::min(neg, zero)));
      });
      break;
    case hetero::U_SIGMOID: map1(x, y, n, [&](V v) { return vsigmoid(v); }); break;
    case hetero::U_HARD_SIGMOID:
      map1(x, y, n, [&](V v) { return vnan_pass(v, S::max(S::min(S::fma(va, v, vb), one), zero)); });
      break;
    case hetero::U_HARD_SWISH: map1(x, y, n, [&](V v) { return vhard_swish(v); }); break;
    case hetero::U_SILU: map1(x, y, n, [&](V v) { return vsilu(v); }); break;
    case hetero::U_GELU: map1(x, y, n, [&](V v) { return vgelu(v); }); break;
    case hetero::U_GELU_TANH: map1(x, y, n, [&](V v) { return vgelu_tanh(v); }); break;
    case hetero::U_TANH: map1(x, y, n, [&](V v) { return vtanh(v); }); break;
    case hetero::U_SOFTPLUS:
      map1(x, y, n, [&](V v) {
        V r = S::add(S::max(v, zero), vlog1p_pos(vexp(S::neg(S::abs(v)))));
        return vnan_pass(v, r);
      });
      break;
    case hetero::U_SOFTSIGN: map1(x, y, n, [&](V v) { return S::div(v, S::add(one, S::abs(v))); }); break;
    case hetero::U_EXP: map1(x, y, n, [&](V v) { return vexp(v); }); break;
    case hetero::U_LOG: map1(x, y, n, [&](V v) { return vlog(v); }); break;
    case hetero::U_SQRT: map1(x, y, n, [&](V v) { return S::sqrt(v); }); break;
    case hetero::U_RSQRT: map1(x, y, n, [&](V v) { return S::div(one, S::sqrt(v)); }); break;
    case hetero::U_NEG: map1(x, y, n, [&](V v) { return S::neg(v); }); break;
    case hetero::U_ABS: map1(x, y, n, [&](V v) { return S::abs(v); }); break;
    case hetero::U_RECIPROCAL: map1(x, y, n, [&](V v) { return S::div(one, v); }); break;
    case hetero::U_ERF: map1(x, y, n, [&](V v) { return verf(v); }); break;
    case hetero::U_FLOOR: map1(x, y, n, [&](V v) { return S::floor(v); }); break;
    case hetero::U_CEIL: map1(x, y, n, [&](V v) { return S::ceil(v); }); break;
    case hetero::U_ROUND: map1(x, y, n, [&](V v) { return S::round(v); }); break;
    case hetero::U_SIN:  // not hot in any model we target: libm, scalar
      for (i64 i = 0; i < n; ++i) y[i] = std::sin(x[i]);
      break;
    case hetero::U_COS:
      for (i64 i = 0; i < n; ++i) y[i] = std::cos(x[i]);
      break;
    case hetero::U_CLIP: map1(x, y, n, [&](V v) { return vnan_pass(v, S::min(S::max(v, va), vb)); }); break;
    case hetero::U_MISH:
      map1(x, y, n, [&](V v) {
        V sp = S::add(S::max(v, zero), vlog1p_pos(vexp(S::neg(S::abs(v)))));
        return S::mul(v, vtanh(sp));
      });
      break;
    default: break;
  }
}

void k_binary(int op, int mode, const float* a, const float* b, float* y, i64 n) {
  using S = SIMD;
  switch (op) {
    case hetero::B_ADD: map2(mode, a, b, y, n, [](V p, V q) { return S::add(p, q); }); break;
    case hetero::B_SUB: map2(mode, a, b, y, n, [](V p, V q) { return S::sub(p, q); }); break;
    case hetero::B_MUL: map2(mode, a, b, y, n, [](V p, V q) { return S::mul(p, q); }); break;
    case hetero::B_DIV: map2(mode, a, b, y, n, [](V p, V q) { return S::div(p, q); }); break;
    // NaN propagates from either side (numpy maximum/minimum semantics).
    case hetero::B_MAX: map2(mode, a, b, y, n, [](V p, V q) { return vnan_pass(p, S::max(p, q)); }); break;
    case hetero::B_MIN: map2(mode, a, b, y, n, [](V p, V q) { return vnan_pass(p, S::min(p, q)); }); break;
    // Gelu(a) * b: the same bits as the Gelu pass then the Mul pass (the same vector ops, one rounding each)
    case hetero::B_GELU_MUL: map2(mode, a, b, y, n, [](V p, V q) { return S::mul(vgelu(p), q); }); break;
    case hetero::B_GELU_TANH_MUL: map2(mode, a, b, y, n, [](V p, V q) { return S::mul(vgelu_tanh(p), q); }); break;
    // Relu(a + b): the same bits as the Add pass then U_RELU's (NaN passes)
    case hetero::B_ADD_RELU:
      map2(mode, a, b, y, n, [](V p, V q) {
        const V s = S::add(p, q);
        return vnan_pass(s, S::max(s, S::zero()));
      });
      break;
    case hetero::B_POW: {
      const i64 sa = mode == hetero::BM_SV ? 0 : 1, sb = mode == hetero::BM_VS ? 0 : 1;
      for (i64 i = 0; i < n; ++i) y[i] = std::pow(a[i * sa], b[i * sb]);
      break;
    }
    default: break;
  }
}

// ------------------------------------------------------------------------------------------------------------
// Row kernels
// ------------------------------------------------------------------------------------------------------------

inline float row_max(const float* x, i64 n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  V m0 = SIMD::set1(ninf), m1 = m0;
  i64 i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    m0 = SIMD::max(SIMD::load(x + i), m0);
    m1 = SIMD::max(SIMD::load(x + i + W), m1);
  }
  for (; i + W <= n; i += W) m0 = SIMD::max(SIMD::load(x + i), m0);
  float m = SIMD::hmax(SIMD::max(m0, m1));
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// Lanes [0, r) of a vector (0 < r <= W): where a row's last, partial vector holds values.
template <int N>
struct LaneIndex {
  float v[N];
  constexpr LaneIndex() : v() {
    for (int i = 0; i < N; ++i) v[i] = static_cast<float>(i);
  }
};
inline constexpr LaneIndex<W> LANE_INDEX{};
inline M first_lanes(i64 r) { return SIMD::lt(SIMD::load(LANE_INDEX.v), SIMD::set1(static_cast<float>(r))); }

// The softmax of n > 0 values once their max mx is known (y may be x): the exps, their sum, the scaling.
inline void softmax_from_max(const float* x, float* y, i64 n, float mx) {
  const V vm = SIMD::set1(mx);
  V acc = SIMD::zero();
  i64 i = 0;
  float tail = 0.f;
  // probabilities under 2^-126 are 0 (no subnormal terms, products or results: see EXP_FLUSH)
  for (; i + W <= n; i += W) {
    V e = vexp_flush(SIMD::sub(SIMD::load(x + i), vm));
    SIMD::store(y + i, e);
    acc = SIMD::add(acc, e);
  }
  if (i < n) {
    map1(x + i, y + i, n - i, [&](V v) { return vexp_flush(SIMD::sub(v, vm)); });
    for (; i < n; ++i) tail += y[i];
  }
  const float total = SIMD::hsum(acc) + tail;
  const V inv = SIMD::set1(1.f / total), small = SIMD::set1(std::numeric_limits<float>::min() * total);
  map1(y, y, n, [&](V v) { return SIMD::mul(SIMD::select(SIMD::lt(v, small), SIMD::zero(), v), inv); });
}

// softmax_from_max on R rows of NV vectors each held in registers (v[r]: row r's n values, the lanes past n
// anything), row r stored to y + r * ldy: the same exps, sum order (the whole vectors' lanes, then the last one's
// values one by one: a dynamic-int8 T5 amplified the sum's last bit to a 0.991 cosine against onnxruntime) and
// scaling, the same bits, without writing the exps out and reading them back (a short row's masked tail store and
// its scalar reloads stalled on the store: T5's 70 scores a row), and R rows' dependency chains (max, exp, sum,
// reciprocal) side by side instead of one row's latency after another's.
template <int NV, int R>
inline void softmax_in_registers(V (&v)[R][NV], float* y, i64 ldy, i64 n) {
  const i64 full = n / W;
  V acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    // the largest value (the lanes past n left out; NaNs passed over, as row_max does)
    V mx = SIMD::set1(-std::numeric_limits<float>::infinity());
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) mx = SIMD::max(j < full ? v[r][j] : SIMD::select(first_lanes(n - j * W), v[r][j], mx), mx);
    const V vm = SIMD::set1(SIMD::hmax(mx));
    acc[r] = SIMD::zero();
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      v[r][j] = vexp_flush(SIMD::sub(v[r][j], vm));
      if (j < full) acc[r] = SIMD::add(acc[r], v[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    float tail = 0.f;
    if (full < NV) {  // a whole-vector store: its lanes reload from the store buffer (a masked one's did not)
      alignas(64) float last[W];
      SIMD::store(last, v[r][NV - 1]);
      for (i64 l = 0; l < n - full * W; ++l) tail += last[l];
    }
    const float total = SIMD::hsum(acc[r]) + tail;
    const V inv = SIMD::set1(1.f / total), small = SIMD::set1(std::numeric_limits<float>::min() * total);
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const V p = SIMD::mul(SIMD::select(SIMD::lt(v[r][j], small), SIMD::zero(), v[r][j]), inv);
      if (j < full)
        SIMD::store(y + r * ldy + j * W, p);
      else
        store_tail(y + r * ldy + j * W, n - j * W, p);
    }
  }
}

// rows of n (0 < n <= NV W) values from x (row stride ldx), each vector passed through f(v, row, first column),
// softmaxed in registers two rows at a time up to 5 vectors a row (T5's 70 scores), one at a time past that (two
// rows of 8 and exp's constants spilled: MiniLM-L3's 128 scores ran 2 % slower than the pass over memory), stored to
// y (row stride ldy; y may be x)
template <int NV, class F>
inline void softmax_rows_in_registers(const float* x, i64 ldx, float* y, i64 ldy, i64 rows, i64 n, F f) {
  const auto load = [&](V(&v)[NV], i64 i) {
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) {
      const float* p = x + i * ldx + j * W;
      v[j] = f(j * W + W <= n ? SIMD::load(p) : load_tail(p, n - j * W, 0.f), i, j * W);
    }
  };
  i64 i = 0;
  for (; NV <= 5 && i + 2 <= rows; i += 2) {
    V v[2][NV];
    load(v[0], i);
    load(v[1], i + 1);
    softmax_in_registers<NV, 2>(v, y + i * ldy, ldy, n);
  }
  for (; i < rows; ++i) {
    V v[1][NV];
    load(v[0], i);
    softmax_in_registers<NV, 1>(v, y + i * ldy, ldy, n);
  }
}

// softmax_rows_in_registers for rows of up to 8 vectors (MiniLM's 64 or 128 scores on AVX-512), dispatched on the
// vector count; false (nothing done) for longer rows.
template <class F>
inline bool short_softmax_rows(const float* x, i64 ldx, float* y, i64 ldy, i64 rows, i64 n, F f) {
  switch ((n + W - 1) / W) {
    case 1: softmax_rows_in_registers<1>(x, ldx, y, ldy, rows, n, f); return true;
    case 2: softmax_rows_in_registers<2>(x, ldx, y, ldy, rows, n, f); return true;
    case 3: softmax_rows_in_registers<3>(x, ldx, y, ldy, rows, n, f); return true;
    case 4: softmax_rows_in_registers<4>(x, ldx, y, ldy, rows, n, f); return true;
    case 5: softmax_rows_in_registers<5>(x, ldx, y, ldy, rows, n, f); return true;
    case 6: softmax_rows_in_registers<6>(x, ldx, y, ldy, rows, n, f); return true;
    case 7: softmax_rows_in_registers<7>(x, ldx, y, ldy, rows, n, f); return true;
    case 8: softmax_rows_in_registers<8>(x, ldx, y, ldy, rows, n, f); return true;
    default: return false;
  }
}

void k_softmax_row(const float* x, float* y, i64 n, bool log) {
  if (n <= 0) return;
  if (!log && short_softmax_rows(x, 0, y, 0, 1, n, [](V v, i64, i64) { return v; })) return;
  const float mx = row_max(x, n);
  if (!log) {
    softmax_from_max(x, y, n, mx);
  } else {
    const V vm = SIMD::set1(mx);
    V acc = SIMD::zero();
    i64 i = 0;
    float tail = 0.f;
    // log-softmax: x - max - log(sum exp(x - max)); y is only written once.
    float tmp[W];
    for (; i + W <= n; i += W) acc = SIMD::add(acc, vexp(SIMD::sub(SIMD::load(x + i), vm)));
    for (; i < n; ++i) {
      map1(x + i, tmp, 1, [&](V v) { return vexp(SIMD::sub(v, vm)); });
      tail += tmp[0];
    }
    // (x - max) - log(sum): subtracting max first keeps results near 0 accurate.
    const V ls = SIMD::set1(std::log(SIMD::hsum(acc) + tail));
    map1(x, y, n, [&](V v) { return SIMD::sub(SIMD::sub(v, vm), ls); });
  }
}

inline float row_sum(const float* x, i64 n) {
  V a0 = SIMD::zero(), a1 = a0;
  i64 i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    a0 = SIMD::add(a0, SIMD::load(x + i));
    a1 = SIMD::add(a1, SIMD::load(x + i + W));
  }
  for (; i + W <= n; i += W) a0 = SIMD::add(a0, SIMD::load(x + i));
  float s = SIMD::hsum(SIMD::add(a0, a1));
  for (; i < n; ++i) s += x[i];
  return s;
}

inline float row_sqdev(const float* x, i64 n, float mean) {
  V a0 = SIMD::zero(), a1 = a0, vm = SIMD::set1(mean);
  i64 i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    V d0 = SIMD::sub(SIMD::load(x + i), vm), d1 = SIMD::sub(SIMD::load(x + i + W), vm);
    a0 = SIMD::fma(d0, d0, a0);
    a1 = SIMD::fma(d1, d1, a1);
  }
  for (; i + W <= n; i += W) {
    V d0 = SIMD::sub(SIMD::load(x + i), vm);
    a0 = SIMD::fma(d0, d0, a0);
  }
  float s = SIMD::hsum(SIMD::add(a0, a1));
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

void k_layernorm_row(const float* x, const float* scale, const float* bias, float* y, i64 n, float eps,
                     float* mean_out, float* invstd_out) {
  // Two passes (mean, then squared deviations) for stability with large offsets.
  const float mean = n > 0 ? row_sum(x, n) / static_cast<float>(n) : 0.f;
  const float var = n > 0 ? row_sqdev(x, n, mean) / static_cast<float>(n) : 0.f;
  const float inv = 1.f / std::sqrt(var + eps);
  if (mean_out) *mean_out = mean;
  if (invstd_out) *invstd_out = inv;
  const V vm = SIMD::set1(mean), vi = SIMD::set1(inv);
  i64 i = 0;
  for (; i + W <= n; i += W) {
    V v = SIMD::mul(SIMD::mul(SIMD::sub(SIMD::load(x + i), vm), vi), SIMD::load(scale + i));
    if (bias) v = SIMD::add(v, SIMD::load(bias + i));
    SIMD::store(y + i, v);
  }
  for (; i < n; ++i) y[i] = (x[i] - mean) * inv * scale[i] + (bias ? bias[i] : 0.f);
}

// Sum of squares with each square rounded to float before it is added (no FMA), in row_sum's lane order: what a
// written-out Mul(x, x) -> ReduceMean computes, and what onnxruntime's RMS norm of exported models agrees with
// bit for bit. Dynamically quantized models (the T5 encoder) re-quantize activations from their own min / max, where
// one ulp of difference moves a whole quantization step and grows through the layers.
#if defined(__GNUC__) && !defined(__clang__)
#define HETERO_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define HETERO_NO_FP_CONTRACT
#endif
HETERO_NO_FP_CONTRACT inline float row_sum_squares(const float* x, i64 n) {
  V a0 = SIMD::zero(), a1 = a0;
  i64 i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const V v0 = SIMD::load(x + i), v1 = SIMD::load(x + i + W);
    a0 = SIMD::add(a0, SIMD::mul(v0, v0));
    a1 = SIMD::add(a1, SIMD::mul(v1, v1));
  }
  for (; i + W <= n; i += W) {
    const V v0 = SIMD::load(x + i);
    a0 = SIMD::add(a0, SIMD::mul(v0, v0));
  }
  float s = SIMD::hsum(SIMD::add(a0, a1));
  for (; i < n; ++i) {
    const float q = x[i] * x[i];
    s += q;
  }
  return s;
}

// The mean and mean + eps rounded separately (no FMA), as ReduceMean then Add.
HETERO_NO_FP_CONTRACT void k_rmsnorm_row(const float* x, const float* scale, float* y, i64 n, float eps) {
  const float ms = n > 0 ? row_sum_squares(x, n) * (1.f / static_cast<float>(n)) : 0.f;
  const float inv = 1.f / std::sqrt(ms + eps);
  const V vi = SIMD::set1(inv);
  i64 i = 0;
  for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::mul(SIMD::mul(SIMD::load(x + i), vi), SIMD::load(scale + i)));
  for (; i < n; ++i) y[i] = x[i] * inv * scale[i];
}

void k_axpby(const float* t, float* y, i64 n, float alpha, float beta) {
  const V va = SIMD::set1(alpha), vb = SIMD::set1(beta);
  i64 i = 0;
  if (beta == 0.f) {
    for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::mul(va, SIMD::load(t + i)));
    for (; i < n; ++i) y[i] = alpha * t[i];
  } else {
    for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::fma(va, SIMD::load(t + i), SIMD::mul(vb, SIMD::load(y + i))));
    for (; i < n; ++i) y[i] = alpha * t[i] + beta * y[i];
  }
}

void k_dw_row_accum(const float* in, float* out, i64 n, float w) {
  const V vw = SIMD::set1(w);
  i64 i = 0;
  for (; i + W <= n; i += W) SIMD::store(out + i, SIMD::fma(vw, SIMD::load(in + i), SIMD::load(out + i)));
  for (; i < n; ++i) out[i] += w * in[i];
}

// One row of hetero::BroadcastUnaryMatMul's quantized Add -> Tanh chain (chain_dot.cpp) in registers, where it
// took four passes over the row (add, tanh, min / max, quantize) and four calls: x = tanh(a + b) (a, b n values;
// the binary table's add and vtanh, so x is what the unfused kernels compute), *lo / *hi the least and greatest x
// that is not NaN (+inf / -inf when none: the range qlin::minmax and chain_dot's row_range give), and
// q = clamp(round(x / scale), -zp, 255 - zp) + zp, DynamicQuantizeLinear's uint8 (NaN -> 0), the bytes qlin's
// quantize8 writes. Every lane divides: quantize8's x * (1 / scale) with the lanes near a half step divided again
// branches on most vectors here (tanh near +-1 times 127.5, the reciprocal of [-1, 1]'s scale, is near a half
// step), and the divider is idle while tanh's multiplies run.
void k_add_tanh_quantize_row(const float* a, const float* b, i64 n, float scale, int zp, std::uint8_t* q, float* lo,
                             float* hi) {
  const float qlo = static_cast<float>(-zp), qhi = static_cast<float>(255 - zp);
  const V vs = SIMD::set1(scale), vlo = SIMD::set1(qlo), vhi = SIMD::set1(qhi);
  const V vzp = SIMD::set1(static_cast<float>(zp));
  V mn = SIMD::set1(std::numeric_limits<float>::infinity()), mx = SIMD::neg(mn);
  i64 i = 0;
  for (; i + W <= n; i += W) {
    const V x = vtanh(SIMD::add(SIMD::load(a + i), SIMD::load(b + i)));
    mn = SIMD::min(x, mn);  // x86 order: a NaN x keeps the accumulator
    mx = SIMD::max(x, mx);
    // max returns its second operand for NaN: NaN -> qlo
    const V y = SIMD::min(SIMD::max(SIMD::round(SIMD::div(x, vs)), vlo), vhi);
    SIMD::store_u8(q + i, SIMD::add(y, vzp));
  }
  float l = std::numeric_limits<float>::infinity(), h = -l;
  if (i < n) {  // the last values through a full vector (the lanes as the unfused kernels' tails), then one by one
    float t[W];
    SIMD::store(t, vtanh(SIMD::add(load_tail(a + i, n - i, 1.f), load_tail(b + i, n - i, 1.f))));
    for (i64 j = 0; j < n - i; ++j) {
      const float x = t[j];
      l = x < l ? x : l;
      h = x > h ? x : h;
      float v = std::nearbyint(x / scale);
      v = v >= qlo ? v : qlo;  // NaN -> qlo
      v = v <= qhi ? v : qhi;
      q[i + j] = static_cast<std::uint8_t>(static_cast<int>(v) + zp);
    }
  }
  // the accumulators hold no NaN: their lanes' least / greatest through the ISA's horizontal max
  *lo = std::min(l, -SIMD::hmax(SIMD::neg(mn)));
  *hi = std::max(h, SIMD::hmax(mx));
}

// ------------------------------------------------------------------------------------------------------------
// GEMV-shaped kernels (memory bound: stream B exactly once, keep several independent FMA chains).
// ------------------------------------------------------------------------------------------------------------

// m rows of A (1..4) times one packed B panel of NRV vectors per k.
template <int MROWS, int NRV>
inline void smallm_t(i64 k, const float* a, i64 lda, const float* panel, float* t) {
  V acc[2][MROWS][NRV];
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < MROWS; ++r)
      for (int v = 0; v < NRV; ++v) acc[s][r][v] = SIMD::zero();
  const i64 ld = static_cast<i64>(NRV) * W;
  i64 p = 0;
  // Two k steps per iteration into separate accumulators: hides FMA latency when MROWS is 1.
  for (; p + 2 <= k; p += 2) {
    // Panels are streamed once from memory: prefetch ~2 KB ahead so several lines are in flight.
    __builtin_prefetch(panel + (p + 32) * ld, 0, 3);
    if (ld > 16) __builtin_prefetch(panel + (p + 32) * ld + 16, 0, 3);
    for (int s = 0; s < 2; ++s) {
      const float* bp = panel + (p + s) * ld;
      for (int v = 0; v < NRV; ++v) {
        V bv = SIMD::load(bp + v * W);
        for (int r = 0; r < MROWS; ++r) acc[s][r][v] = SIMD::fma(SIMD::set1(a[r * lda + p + s]), bv, acc[s][r][v]);
      }
    }
  }
  for (; p < k; ++p) {
    const float* bp = panel + p * ld;
    for (int v = 0; v < NRV; ++v) {
      V bv = SIMD::load(bp + v * W);
      for (int r = 0; r < MROWS; ++r) acc[0][r][v] = SIMD::fma(SIMD::set1(a[r * lda + p]), bv, acc[0][r][v]);
    }
  }
  for (int r = 0; r < MROWS; ++r)
    for (int v = 0; v < NRV; ++v) SIMD::store(t + r * ld + v * W, SIMD::add(acc[0][r][v], acc[1][r][v]));
}

template <int NRV>
void k_smallm(int m, i64 k, const float* a, i64 lda, const float* panel, float* t) {
  switch (m) {
    case 1: smallm_t<1, NRV>(k, a, lda, panel, t); break;
    case 2: smallm_t<2, NRV>(k, a, lda, panel, t); break;
    case 3: smallm_t<3, NRV>(k, a, lda, panel, t); break;
    default: smallm_t<4, NRV>(k, a, lda, panel, t); break;
  }
}

// One row of A times NP packed panels at once (M == 1, the decode GEMV): NP independent memory streams keep
// more cache misses in flight than a single panel would.
template <int NP, int NRV>
inline void gemv_panels_t(i64 k, const float* a, const float* panels, i64 pstride, float* t) {
  V acc[NP][NRV];
  for (int q = 0; q < NP; ++q)
    for (int v = 0; v < NRV; ++v) acc[q][v] = SIMD::zero();
  const i64 ld = static_cast<i64>(NRV) * W;
  for (i64 p = 0; p < k; ++p) {
    const V av = SIMD::set1(a[p]);
    for (int q = 0; q < NP; ++q) {
      const float* bp = panels + q * pstride + p * ld;
      __builtin_prefetch(bp + 32 * ld, 0, 3);
      for (int v = 0; v < NRV; ++v) acc[q][v] = SIMD::fma(av, SIMD::load(bp + v * W), acc[q][v]);
    }
  }
  for (int q = 0; q < NP; ++q)
    for (int v = 0; v < NRV; ++v) SIMD::store(t + q * ld + v * W, acc[q][v]);
}

template <int NRV>
void k_gemv_panels(i64 k, const float* a, const float* panels, i64 pstride, int np, float* t) {
  switch (np) {
    case 1: gemv_panels_t<1, NRV>(k, a, panels, pstride, t); break;
    case 2: gemv_panels_t<2, NRV>(k, a, panels, pstride, t); break;
    case 3: gemv_panels_t<3, NRV>(k, a, panels, pstride, t); break;
    default: gemv_panels_t<4, NRV>(k, a, panels, pstride, t); break;
  }
}

void k_gemv_rows(i64 k, const float* a, const float* b, i64 ldb, i64 n, float* y) {
  // Column blocks of <= 2048 floats keep y in L1 while 4 rows of B stream through.
  const i64 JB = 2048;
  for (i64 j0 = 0; j0 < n; j0 += JB) {
    const i64 jn = imin(JB, n - j0);
    float* yy = y + j0;
    for (i64 j = 0; j < jn; ++j) yy[j] = 0.f;
    i64 p = 0;
    for (; p + 4 <= k; p += 4) {
      const float* b0 = b + p * ldb + j0;
      const float* b1 = b0 + ldb;
      const float* b2 = b1 + ldb;
      const float* b3 = b2 + ldb;
      const V a0 = SIMD::set1(a[p]), a1 = SIMD::set1(a[p + 1]), a2 = SIMD::set1(a[p + 2]), a3 = SIMD::set1(a[p + 3]);
      i64 j = 0;
      for (; j + W <= jn; j += W) {
        V v = SIMD::fma(a0, SIMD::load(b0 + j), SIMD::load(yy + j));
        V w = SIMD::mul(a1, SIMD::load(b1 + j));
        v = SIMD::fma(a2, SIMD::load(b2 + j), v);
        w = SIMD::fma(a3, SIMD::load(b3 + j), w);
        SIMD::store(yy + j, SIMD::add(v, w));
      }
      for (; j < jn; ++j) yy[j] += a[p] * b0[j] + a[p + 1] * b1[j] + a[p + 2] * b2[j] + a[p + 3] * b3[j];
    }
    for (; p < k; ++p) {
      const float* b0 = b + p * ldb + j0;
      const V a0 = SIMD::set1(a[p]);
      i64 j = 0;
      for (; j + W <= jn; j += W) SIMD::store(yy + j, SIMD::fma(a0, SIMD::load(b0 + j), SIMD::load(yy + j)));
      for (; j < jn; ++j) yy[j] += a[p] * b0[j];
    }
  }
}

void k_gemv_dot(i64 k, const float* a, const float* b, i64 ldb, i64 n, float* y) {
  i64 j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* r0 = b + j * ldb;
    const float* r1 = r0 + ldb;
    const float* r2 = r1 + ldb;
    const float* r3 = r2 + ldb;
    V c0 = SIMD::zero(), c1 = c0, c2 = c0, c3 = c0;
    i64 p = 0;
    for (; p + W <= k; p += W) {
      V av = SIMD::load(a + p);
      c0 = SIMD::fma(av, SIMD::load(r0 + p), c0);
      c1 = SIMD::fma(av, SIMD::load(r1 + p), c1);
      c2 = SIMD::fma(av, SIMD::load(r2 + p), c2);
      c3 = SIMD::fma(av, SIMD::load(r3 + p), c3);
    }
    float s0 = SIMD::hsum(c0), s1 = SIMD::hsum(c1), s2 = SIMD::hsum(c2), s3 = SIMD::hsum(c3);
    for (; p < k; ++p) {
      s0 += a[p] * r0[p];
      s1 += a[p] * r1[p];
      s2 += a[p] * r2[p];
      s3 += a[p] * r3[p];
    }
    y[j] = s0;
    y[j + 1] = s1;
    y[j + 2] = s2;
    y[j + 3] = s3;
  }
  for (; j < n; ++j) {
    const float* r0 = b + j * ldb;
    V c0 = SIMD::zero(), c1 = c0;
    i64 p = 0;
    for (; p + 2 * W <= k; p += 2 * W) {
      c0 = SIMD::fma(SIMD::load(a + p), SIMD::load(r0 + p), c0);
      c1 = SIMD::fma(SIMD::load(a + p + W), SIMD::load(r0 + p + W), c1);
    }
    for (; p + W <= k; p += W) c0 = SIMD::fma(SIMD::load(a + p), SIMD::load(r0 + p), c0);
    float s = SIMD::hsum(SIMD::add(c0, c1));
    for (; p < k; ++p) s += a[p] * r0[p];
    y[j] = s;
  }
}

}  // namespace
