// One value head of the gated delta rule, compiled once per ISA (gated_delta_{generic,avx2,avx512}.cpp include
// this with their own -m flags). Everything here has internal linkage so that no AVX code can be picked by the
// linker for another translation unit. SIMD through the GCC / Clang vector extension (the width follows the file's
// -m flags); the chunked form's small products run on one register-tiled micro-kernel (tile shape per ISA).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "gated_delta.hpp"

#ifndef GD_PHASE  // dev builds define it to time the chunk's phases; a no-op in the plugin
#define GD_PHASE(i)
#endif

namespace hetero {
namespace gd {
namespace {

// Tile of the micro-kernel: MR rows x NV vectors of accumulators (measured at the Qwen3.5 head size on an AVX-512
// Xeon: 8 x 2 beat 4 x 4 and 6 x 4 on the 64 x 128 x 128 products; on AVX2 4 x 2, 6 x 2 and 8 x 1 were even).
#if defined(__AVX512F__)
constexpr int W = 16;
constexpr int MR = 8, NV = 2;  // 16 of the 32 zmm registers; a B panel of K x 32 floats stays in L1
#elif defined(__AVX__)
constexpr int W = 8;
constexpr int MR = 4, NV = 2;  // 8 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers
#else
constexpr int W = 4;
constexpr int MR = 4, NV = 2;
#endif
typedef float vf __attribute__((vector_size(W * sizeof(float))));
typedef std::int32_t vi __attribute__((vector_size(W * sizeof(float))));

inline vf loadu(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }
// (not vf{} + x: adding 0 is no identity for -0, so it stays an add; element stores become masked inserts)
inline vf splat(float x) {
#if defined(__AVX512F__)
  return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#elif defined(__AVX__)
  return vf{x, x, x, x, x, x, x, x};
#else
  return vf{x, x, x, x};
#endif
}

inline i64 pad(i64 n) { return (n + 15) / 16 * 16; }  // buffer offsets in whole 64-byte lines

inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}

// exp(x) per lane without branches: 2^k * p(r), r = x - k ln2 in [-ln2/2, ln2/2], degree-6 Taylor polynomial
// (relative error < 2e-7); exactly 0 below -87.3 (the result would be denormal or 0) and clamped at 88 above.
inline vf vexp(vf x) {
  const vf lo = splat(-87.3f), hi = splat(88.f);
  const vf xc = x < lo ? lo : (x > hi ? hi : x);
  const vf magic = splat(12582912.f);  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const vf k = (xc * 1.44269504f + magic) - magic;
  const vf r = (xc - k * 0.693145752f) - k * 1.42860677e-6f;
  vf p = splat(1.f / 720.f);
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const vi bits = (__builtin_convertvector(k, vi) + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const vf y = p * scale;
  return x < lo ? vf{} : y;
}

// dst[i] = exp(src[i] + shift) for n values (a scalar tail through a padded vector).
inline void exp_row(float* dst, const float* src, float shift, i64 n) {
  i64 i = 0;
  for (; i + W <= n; i += W) storeu(dst + i, vexp(loadu(src + i) + shift));
  if (i < n) {
    float tmp[W];
    for (int j = 0; j < W; ++j) tmp[j] = i + j < n ? src[i + j] + shift : 0.f;
    storeu(tmp, vexp(loadu(tmp)));
    for (int j = 0; j < W && i + j < n; ++j) dst[i + j] = tmp[j];
  }
}

// Micro-kernel: C[R, NB * W] = cs * C + alpha * A[R, K] @ B[K, NB * W] (row-major; cs == 0 leaves C unread).
template <int R, int NB>
inline void tile(i64 K, const float* __restrict A, i64 lda, const float* __restrict B, i64 ldb, float* __restrict C,
                 i64 ldc, float cs, float alpha) {
  vf acc[R][NB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NB; ++v) acc[r][v] = vf{};
  for (i64 k = 0; k < K; ++k) {
    vf b[NB];
#pragma GCC unroll 8
    for (int v = 0; v < NB; ++v) b[v] = loadu(B + k * ldb + v * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf a = splat(A[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NB; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NB; ++v) {
      float* c = C + r * ldc + v * W;
      storeu(c, cs == 0.f ? alpha * acc[r][v] : cs * loadu(c) + alpha * acc[r][v]);
    }
}

// R rows of C[:, 0:N] (see gemm): full tiles, single-vector tiles, then scalar columns.
template <int R>
inline void row_block(i64 N, i64 K, const float* A, i64 lda, const float* B, i64 ldb, float* C, i64 ldc, float cs,
                      float alpha) {
  i64 j = 0;
  for (; j + NV * W <= N; j += NV * W) tile<R, NV>(K, A, lda, B + j, ldb, C + j, ldc, cs, alpha);
  for (; j + W <= N; j += W) tile<R, 1>(K, A, lda, B + j, ldb, C + j, ldc, cs, alpha);
  for (; j < N; ++j)
    for (int r = 0; r < R; ++r) {
      float s = 0.f;
      for (i64 k = 0; k < K; ++k) s += A[r * lda + k] * B[k * ldb + j];
      float* c = C + r * ldc + j;
      *c = cs == 0.f ? alpha * s : cs * *c + alpha * s;
    }
}

// C[M, N] = cs * C + alpha * A[M, K] @ B[K, N], row-major with leading dimensions (cs == 0: C is write-only).
// Column panels of NV vectors outside, row blocks inside, so that the panel of B (K x NV * W floats) stays in L1
// while every row block reads it. lower: only what a lower-triangular result / operand needs, in whole vectors:
// with lower == 1 (C lower-triangular, diagonal included) rows i..i+MR-1 stop at column i+MR rounded up to a
// vector; with lower == 2 (A lower-triangular, zero above its diagonal) they stop at k = i+MR.
inline void gemm(i64 M, i64 N, i64 K, const float* A, i64 lda, const float* B, i64 ldb, float* C, i64 ldc, float cs,
                 float alpha, int lower = 0) {
  constexpr i64 panel = NV * W;
  for (i64 j = 0; j < N; j += panel) {
    const i64 width = N - j < panel ? N - j : panel;
    const float* b = B + j;
    i64 i = 0;
    for (; i < M; i += MR) {
      const i64 rows = M - i < MR ? M - i : MR;
      i64 n = width, k = K;
      if (lower == 1) {
        const i64 end = (i + rows + W - 1) / W * W - j;
        if (end <= 0) continue;
        n = end < n ? end : n;
      }
      if (lower == 2) k = i + rows < K ? i + rows : K;
      const float* a = A + i * lda;
      float* c = C + i * ldc + j;
      if (rows == MR) {
        row_block<MR>(n, k, a, lda, b, ldb, c, ldc, cs, alpha);
      } else {
        for (i64 r = 0; r < rows; ++r) row_block<1>(n, k, a + r * lda, lda, b, ldb, c + r * ldc, ldc, cs, alpha);
      }
    }
  }
}

// y += a * x (n floats)
inline void axpy(float* __restrict y, float a, const float* __restrict x, i64 n) {
  i64 j = 0;
  const vf av = splat(a);
  for (; j + W <= n; j += W) storeu(y + j, loadu(y + j) + av * loadu(x + j));
  for (; j < n; ++j) y[j] += a * x[j];
}

// o (dv floats) -> out row, through the gated RMSNorm rmsnorm(o) * norm_w * silu(z) when z is given.
inline void emit(const Problem& p, const float* o, i64 t, i64 head) {
  const i64 dv = p.dv;
  float* dst = p.out + t * p.hv * dv + head * dv;
  if (!p.z) {
    std::memcpy(dst, o, static_cast<std::size_t>(dv) * sizeof(float));
    return;
  }
  vf acc{};
  i64 j = 0;
  for (; j + W <= dv; j += W) {
    const vf x = loadu(o + j);
    acc += x * x;
  }
  float ss = hsum(acc);
  for (; j < dv; ++j) ss += o[j] * o[j];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(dv) + p.norm_eps);
  const float* z = p.z + t * p.hv * dv + head * dv;
  for (j = 0; j + W <= dv; j += W) {
    const vf zj = loadu(z + j);
    storeu(dst + j, loadu(o + j) * inv * loadu(p.norm_w + j) * (zj / (1.f + vexp(-zj))));
  }
  for (; j < dv; ++j) {
    const float zj = z[j];
    dst[j] = o[j] * inv * p.norm_w[j] * (zj / (1.f + std::exp(-zj)));
  }
}

// Rows [t0, t0 + L) of the causal depthwise conv (+ SiLU) of channels [c0, c0 + n) -> dst [L, n]; then, for q / k
// parts, the L2 normalisation and the factor f (the q scale). Fused into the head so that the conv output never
// makes a round trip through memory; one pass per row with the taps' sum in registers.
inline void conv_rows(const HeadArgs& h, i64 c0, i64 n, i64 t0, i64 L, float* dst, bool qk, float f) {
  const Problem& p = *h.p;
  const i64 C = 2 * p.hk * p.dk + p.hv * p.dv, K = p.kernel;
  // Rows of the window lie C floats apart (a page or more): prefetching PREFETCH rows ahead hides the first
  // touch's memory latency.
  constexpr i64 PREFETCH = 8;
  const i64 rows = p.T + K - 1;
  const float* bias = p.conv_b ? p.conv_b + c0 : nullptr;
  for (i64 t = 0; t < L; ++t) {
    const i64 ahead = t0 + t + K - 1 + PREFETCH;
    if (ahead < rows)
      for (i64 i = 0; i < n; i += 16) __builtin_prefetch(p.window + ahead * C + c0 + i, 0, 3);
    const float* x = p.window + (t0 + t) * C + c0;  // tap j reads row t + j
    const float* w = h.taps + c0;
    float* d = dst + t * n;
    vf ssv{};
    i64 i = 0;
    for (; i + W <= n; i += W) {
      vf acc = bias ? loadu(bias + i) : vf{};
      for (i64 j = 0; j < K; ++j) acc += loadu(w + j * C + i) * loadu(x + j * C + i);
      if (p.conv_silu) acc = acc / (1.f + vexp(-acc));
      ssv += acc * acc;
      storeu(d + i, acc);
    }
    float ss = hsum(ssv);
    for (; i < n; ++i) {
      float acc = bias ? bias[i] : 0.f;
      for (i64 j = 0; j < K; ++j) acc += w[j * C + i] * x[j * C + i];
      if (p.conv_silu) acc = acc / (1.f + std::exp(-acc));
      ss += acc * acc;
      d[i] = acc;
    }
    if (!qk) continue;
    const float g = p.l2norm ? f / std::sqrt(ss + p.l2_eps) : f;
    if (g != 1.f)
      for (i = 0; i < n; ++i) d[i] *= g;
  }
}

// Channel offsets of value head `head`'s q, k (its key head's) and v in the packed qkv rows.
inline void channels(const Problem& p, i64 head, i64* cq, i64* ck, i64* cv) {
  const i64 kh = head / (p.hv / p.hk);
  *cq = kh * p.dk;
  *ck = p.hk * p.dk + kh * p.dk;
  *cv = 2 * p.hk * p.dk + head * p.dv;
}

void recurrent(const HeadArgs& h, i64 t0, i64 len) {
  const Problem& p = *h.p;
  const i64 dk = p.dk, dv = p.dv;
  i64 cq, ck, cv;
  channels(p, h.head, &cq, &ck, &cv);
  float* S = p.state + h.head * dk * dv;
  float* kv = h.scratch;
  float* o = kv + pad(dv);
  float* q = o + pad(dv);
  float* k = q + pad(dk);
  float* v = k + pad(dk);
  for (i64 t = t0; t < t0 + len; ++t) {
    if (p.out) conv_rows(h, cq, dk, t, 1, q, true, p.scale);
    conv_rows(h, ck, dk, t, 1, k, true, 1.f);
    conv_rows(h, cv, dv, t, 1, v, false, 1.f);
    const float decay = std::exp(h.g[t * p.hv + h.head]);
    const float beta = h.beta[t * p.hv + h.head];
    for (i64 j = 0; j < dv; ++j) kv[j] = 0.f;
    for (i64 i = 0; i < dk; ++i) {
      float* s = S + i * dv;
      const float ki = k[i];
      for (i64 j = 0; j < dv; ++j) {
        s[j] *= decay;
        kv[j] += ki * s[j];
      }
    }
    for (i64 j = 0; j < dv; ++j) kv[j] = beta * (v[j] - kv[j]);  // u
    for (i64 j = 0; j < dv; ++j) o[j] = 0.f;
    for (i64 i = 0; i < dk; ++i) {
      float* s = S + i * dv;
      const float ki = k[i], qi = q[i];
      for (i64 j = 0; j < dv; ++j) {
        s[j] += ki * kv[j];
        o[j] += qi * s[j];  // (q is stale when there is no output: o is then unused)
      }
    }
    if (p.out) emit(p, o, t, h.head);
  }
}

// Rows of the forward substitution solved one by one inside a block; the blocks below read the solved rows
// through one product.
constexpr i64 SOLVE_BLOCK = 8;

// One chunk of L positions starting at t0 (see hetero.ops.gated_delta for the math). With R = βV - (β e^G K) S,
// U = (I + A)^-1 R is one triangular solve of dv columns (the WY form's two solves folded into one, since the
// inverse is linear); O = (e^G Q) S + P U; S' = e^{G_L} S + (e^{G_L - G} K)^T U.
void chunk(const HeadArgs& h, i64 t0, i64 L) {
  const Problem& p = *h.p;
  const i64 dk = p.dk, dv = p.dv, CH = p.chunk;
  float* S = p.state + h.head * dk * dv;
  float* K = h.scratch;           // [CH, dk]: K, then β e^G K
  float* Q = K + pad(CH * dk);    // [CH, dk]: Q, then e^G Q
  float* KT = Q + pad(CH * dk);   // [dk, CH]: K^T, then e^{G_L - G} K^T
  float* U = KT + pad(dk * CH);   // [CH, dv]: V, β V, then R, then U
  float* O = U + pad(CH * dv);    // [CH, dv]
  float* A = O + pad(CH * dv);    // [CH, CH]: K K^T, then the strictly lower A
  float* P = A + pad(CH * CH);    // [CH, CH]: Q K^T, then its decayed lower part
  float* G = P + pad(CH * CH);    // [CH + W]: cumulative gates (padded with the last one)
  float* B = G + pad(CH + W);     // [CH] β
  float* EG = B + pad(CH);        // [CH] e^G
  float* EL = EG + pad(CH);       // [CH + W] e^{G_L - G}
  i64 cq, ck, cv;
  channels(p, h.head, &cq, &ck, &cv);
  if (p.out) conv_rows(h, cq, dk, t0, L, Q, true, p.scale);
  conv_rows(h, ck, dk, t0, L, K, true, 1.f);
  conv_rows(h, cv, dv, t0, L, U, false, 1.f);
  double cum = 0.0;
  for (i64 t = 0; t < L; ++t) {
    cum += h.g[(t0 + t) * p.hv + h.head];
    G[t] = static_cast<float>(cum);
    const float b = B[t] = h.beta[(t0 + t) * p.hv + h.head];
    for (i64 j = 0; j < dv; ++j) U[t * dv + j] *= b;
  }
  const float last = G[L - 1];
  for (i64 t = L; t < L + W; ++t) G[t] = last;
  exp_row(EG, G, 0.f, L);
  for (i64 t = 0; t < L; ++t) EL[t] = last - G[t];
  exp_row(EL, EL, 0.f, L);
  for (i64 t = 0; t < L; ++t)
    for (i64 i = 0; i < dk; ++i) KT[i * CH + t] = K[t * dk + i];
  GD_PHASE(0);
  // K K^T and Q K^T, lower triangles (whole tiles)
  gemm(L, L, dk, K, dk, KT, CH, A, CH, 0.f, 1.f, 1);
  if (p.out) gemm(L, L, dk, Q, dk, KT, CH, P, CH, 0.f, 1.f, 1);
  GD_PHASE(1);
  // decays D[t, s] = e^{G_t - G_s}: A = β_t D ∘ K K^T strictly below the diagonal, P = D ∘ Q K^T on and below it
  float* D = EL + pad(CH + W);
  for (i64 t = 0; t < L; ++t) {
    const i64 n = t + 1;
    for (i64 s = 0; s < n; ++s) D[s] = G[t] - G[s];
    exp_row(D, D, 0.f, n);
    float* a = A + t * CH;
    const float bt = B[t];
    for (i64 s = 0; s < t; ++s) a[s] *= bt * D[s];
    for (i64 s = t; s < L; ++s) a[s] = 0.f;
    if (p.out) {
      float* pr = P + t * CH;
      for (i64 s = 0; s < n; ++s) pr[s] *= D[s];
      for (i64 s = n; s < L; ++s) pr[s] = 0.f;
    }
  }
  GD_PHASE(2);
  // R = βV - (β e^G K) S, O = (e^G Q) S
  for (i64 t = 0; t < L; ++t) {
    const float fk = B[t] * EG[t], fq = EG[t];
    for (i64 i = 0; i < dk; ++i) K[t * dk + i] *= fk;
    if (p.out)
      for (i64 i = 0; i < dk; ++i) Q[t * dk + i] *= fq;
  }
  gemm(L, dv, dk, K, dk, S, dv, U, dv, 1.f, -1.f);
  if (p.out) gemm(L, dv, dk, Q, dk, S, dv, O, dv, 0.f, 1.f);
  GD_PHASE(3);
  // U = (I + A)^-1 R by blocked forward substitution
  for (i64 b0 = 0; b0 < L; b0 += SOLVE_BLOCK) {
    const i64 b1 = b0 + SOLVE_BLOCK < L ? b0 + SOLVE_BLOCK : L;
    if (b0) gemm(b1 - b0, dv, b0, A + b0 * CH, CH, U, dv, U + b0 * dv, dv, 1.f, -1.f);
    for (i64 t = b0 + 1; t < b1; ++t)
      for (i64 s = b0; s < t; ++s) axpy(U + t * dv, -A[t * CH + s], U + s * dv, dv);
  }
  GD_PHASE(4);
  if (p.out) {
    gemm(L, dv, L, P, CH, U, dv, O, dv, 1.f, 1.f, 2);
    for (i64 t = 0; t < L; ++t) {
      // z and out rows lie Hv * Dv floats apart: prefetch a few rows ahead (out with write intent)
      if (t + 4 < L) {
        const i64 row = (t0 + t + 4) * p.hv * dv + h.head * dv;
        for (i64 j = 0; j < dv; j += 16) {
          if (p.z) __builtin_prefetch(p.z + row + j, 0, 3);
          __builtin_prefetch(p.out + row + j, 1, 3);
        }
      }
      emit(p, O + t * dv, t0 + t, h.head);
    }
  }
  GD_PHASE(5);
  // S = e^{G_L} S + (e^{G_L - G} K)^T U
  for (i64 i = 0; i < dk; ++i)
    for (i64 t = 0; t < L; ++t) KT[i * CH + t] *= EL[t];
  gemm(dk, dv, L, KT, CH, U, dv, S, dv, EG[L - 1], 1.f);
  GD_PHASE(6);
}

// Denormals flushed to zero while a head runs: strongly decaying gates drive e^G and the decayed state through the
// denormal range, where every multiply takes a slow microcode path (measured 3x slower chunks); such values are
// below 1e-38 of the outputs they feed. The caller's mode is restored on return.
struct FlushDenormals {
#if defined(__SSE__)
  unsigned saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved); }
#endif
};

void head_impl(const HeadArgs& h) {
  const FlushDenormals ftz;
  const Problem& p = *h.p;
  if (p.chunk <= 0) {
    recurrent(h, 0, p.T);
    return;
  }
  i64 t = 0, len = p.first < 1 || p.first > p.chunk ? p.chunk : p.first;
  while (t < p.T) {
    const i64 n = len < p.T - t ? len : p.T - t;
    chunk(h, t, n);
    t += n;
    len = p.chunk;
  }
}

}  // namespace
}  // namespace gd
}  // namespace hetero
