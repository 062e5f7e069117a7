// One value head of the gated delta rule, compiled once per ISA (gated_delta_{generic,avx2,avx512}.cpp include
// this with their own -m flags). Everything here has internal linkage so that no AVX code can be picked by the
// linker for another translation unit. Plain loops written for the auto-vectoriser: fixed-width register tiles
// (4 rows x 2 vectors, GCC/Clang vector extension) in the small GEMMs.
#pragma once

#include <cmath>
#include <cstring>

#include "gated_delta.hpp"

namespace hetero {
namespace gd {
namespace {

// SIMD vectors through the GCC / Clang vector extension: the width follows this file's -m flags.
#if defined(__AVX512F__)
constexpr int W = 16;
#elif defined(__AVX__)
constexpr int W = 8;
#else
constexpr int W = 4;
#endif
typedef float vf __attribute__((vector_size(W * sizeof(float))));

inline vf loadu(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(vf));
  return v;
}
inline void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof(vf)); }

// C[M, N] += alpha * A[M, K] @ B[K, N] (row-major, leading dimensions given): register tiles of 4 rows x 2 vectors.
inline void gemm_acc(i64 M, i64 N, i64 K, const float* __restrict A, i64 lda, const float* __restrict B, i64 ldb,
                     float* __restrict C, i64 ldc, float alpha) {
  constexpr int MR = 4, NR = 2 * W;
  i64 i0 = 0;
  for (; i0 + MR <= M; i0 += MR) {
    i64 j0 = 0;
    for (; j0 + NR <= N; j0 += NR) {
      vf c00 = {}, c01 = {}, c10 = {}, c11 = {}, c20 = {}, c21 = {}, c30 = {}, c31 = {};
      const float* a0 = A + i0 * lda;
      for (i64 k = 0; k < K; ++k) {
        const vf b0 = loadu(B + k * ldb + j0), b1 = loadu(B + k * ldb + j0 + W);
        const float x0 = a0[k], x1 = a0[lda + k], x2 = a0[2 * lda + k], x3 = a0[3 * lda + k];
        c00 += x0 * b0;
        c01 += x0 * b1;
        c10 += x1 * b0;
        c11 += x1 * b1;
        c20 += x2 * b0;
        c21 += x2 * b1;
        c30 += x3 * b0;
        c31 += x3 * b1;
      }
      const vf* acc[MR][2] = {{&c00, &c01}, {&c10, &c11}, {&c20, &c21}, {&c30, &c31}};
      for (int r = 0; r < MR; ++r) {
        float* c = C + (i0 + r) * ldc + j0;
        storeu(c, loadu(c) + alpha * *acc[r][0]);
        storeu(c + W, loadu(c + W) + alpha * *acc[r][1]);
      }
    }
    for (; j0 < N; ++j0)
      for (int r = 0; r < MR; ++r) {
        float s = 0.f;
        for (i64 k = 0; k < K; ++k) s += A[(i0 + r) * lda + k] * B[k * ldb + j0];
        C[(i0 + r) * ldc + j0] += alpha * s;
      }
  }
  for (; i0 < M; ++i0)
    for (i64 k = 0; k < K; ++k) {
      const float a = alpha * A[i0 * lda + k];
      const float* b = B + k * ldb;
      float* c = C + i0 * ldc;
      for (i64 j = 0; j < N; ++j) c[j] += a * b[j];
    }
}

inline void axpy(float* __restrict y, float a, const float* __restrict x, i64 n) {
  for (i64 j = 0; j < n; ++j) y[j] += a * x[j];
}

inline float sigmoidf(float x) { return 1.f / (1.f + std::exp(-x)); }

// o (dv floats) -> out row, through the gated RMSNorm when z is given.
inline void emit(const Problem& p, const float* o, i64 t, i64 head) {
  const i64 dv = p.dv;
  float* dst = p.out + t * p.hv * dv + head * dv;
  if (!p.z) {
    std::memcpy(dst, o, static_cast<std::size_t>(dv) * sizeof(float));
    return;
  }
  double ss = 0.0;
  for (i64 j = 0; j < dv; ++j) ss += static_cast<double>(o[j]) * o[j];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dv) + p.norm_eps));
  const float* z = p.z + t * p.hv * dv + head * dv;
  for (i64 j = 0; j < dv; ++j) {
    const float zj = z[j];
    dst[j] = o[j] * inv * p.norm_w[j] * (zj * sigmoidf(zj));
  }
}

void recurrent(const HeadArgs& h, i64 t0, i64 len) {
  const Problem& p = *h.p;
  const i64 dk = p.dk, dv = p.dv, C = 2 * p.hk * p.dk + p.hv * p.dv;
  const i64 kh = h.head / (p.hv / p.hk);
  float* S = p.state + h.head * dk * dv;
  float* kv = h.scratch;
  float* o = kv + dv;
  for (i64 t = t0; t < t0 + len; ++t) {
    const float* row = h.y + t * C;
    const float* q = row + kh * dk;
    const float* k = row + p.hk * dk + kh * dk;
    const float* v = row + 2 * p.hk * dk + h.head * dv;
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
        o[j] += qi * s[j];
      }
    }
    if (p.out) emit(p, o, t, h.head);
  }
}

// One chunk of L positions starting at t0 (see hetero.ops.gated_delta for the math).
void chunk(const HeadArgs& h, i64 t0, i64 L) {
  const Problem& p = *h.p;
  const i64 dk = p.dk, dv = p.dv, C = 2 * p.hk * p.dk + p.hv * p.dv, CH = p.chunk;
  const i64 kh = h.head / (p.hv / p.hk);
  float* S = p.state + h.head * dk * dv;
  float* Q = h.scratch;        // [CH, dk]
  float* K = Q + CH * dk;      // [CH, dk]
  float* KT = K + CH * dk;     // [dk, CH]
  float* XV = KT + dk * CH;    // [CH, dv]: beta V, solved; then U
  float* XK = XV + CH * dv;    // [CH, dk]: beta exp(G) K, solved
  float* O = XK + CH * dk;     // [CH, dv]
  float* A = O + CH * dv;      // [CH, CH]
  float* P = A + CH * CH;      // [CH, CH]
  float* G = P + CH * CH;      // [CH]
  float* B = G + CH;           // [CH]
  double cum = 0.0;
  for (i64 t = 0; t < L; ++t) {
    const float* row = h.y + (t0 + t) * C;
    std::memcpy(Q + t * dk, row + kh * dk, static_cast<std::size_t>(dk) * sizeof(float));
    std::memcpy(K + t * dk, row + p.hk * dk + kh * dk, static_cast<std::size_t>(dk) * sizeof(float));
    const float* v = row + 2 * p.hk * dk + h.head * dv;
    cum += h.g[(t0 + t) * p.hv + h.head];
    G[t] = static_cast<float>(cum);
    B[t] = h.beta[(t0 + t) * p.hv + h.head];
    for (i64 j = 0; j < dv; ++j) XV[t * dv + j] = B[t] * v[j];
    const float f = B[t] * std::exp(G[t]);
    for (i64 i = 0; i < dk; ++i) XK[t * dk + i] = f * K[t * dk + i];
  }
  for (i64 t = 0; t < L; ++t)
    for (i64 i = 0; i < dk; ++i) KT[i * CH + t] = K[t * dk + i];
  // A = K K^T, P = Q K^T (full L x L products; only the lower parts are used)
  std::memset(A, 0, static_cast<std::size_t>(L * CH) * sizeof(float));
  gemm_acc(L, L, dk, K, dk, KT, CH, A, CH, 1.f);
  if (p.out) {
    std::memset(P, 0, static_cast<std::size_t>(L * CH) * sizeof(float));
    gemm_acc(L, L, dk, Q, dk, KT, CH, P, CH, 1.f);
  }
  for (i64 t = 0; t < L; ++t) {
    for (i64 s = 0; s <= t; ++s) {
      const float d = std::exp(G[t] - G[s]);
      A[t * CH + s] = s < t ? B[t] * d * A[t * CH + s] : 0.f;
      if (p.out) P[t * CH + s] *= d;
    }
    for (i64 s = t + 1; s < L; ++s) {
      A[t * CH + s] = 0.f;
      if (p.out) P[t * CH + s] = 0.f;
    }
  }
  // forward substitution with the unit lower-triangular (I + A): rows of XV and XK
  for (i64 t = 1; t < L; ++t)
    for (i64 s = 0; s < t; ++s) {
      const float a = A[t * CH + s];
      if (a == 0.f) continue;
      axpy(XV + t * dv, -a, XV + s * dv, dv);
      axpy(XK + t * dk, -a, XK + s * dk, dk);
    }
  // U = XV - XK S  (in XV)
  gemm_acc(L, dv, dk, XK, dk, S, dv, XV, dv, -1.f);
  if (p.out) {
    for (i64 t = 0; t < L; ++t) {
      const float e = std::exp(G[t]);
      for (i64 i = 0; i < dk; ++i) Q[t * dk + i] *= e;
    }
    std::memset(O, 0, static_cast<std::size_t>(L * dv) * sizeof(float));
    gemm_acc(L, dv, dk, Q, dk, S, dv, O, dv, 1.f);
    gemm_acc(L, dv, L, P, CH, XV, dv, O, dv, 1.f);
    for (i64 t = 0; t < L; ++t) emit(p, O + t * dv, t0 + t, h.head);
  }
  // S = exp(G_L) S + (exp(G_L - G) K)^T U
  const float last = G[L - 1];
  const float e = std::exp(last);
  for (i64 i = 0; i < dk * dv; ++i) S[i] *= e;
  for (i64 t = 0; t < L; ++t) {
    const float f = std::exp(last - G[t]);
    for (i64 i = 0; i < dk; ++i) KT[i * CH + t] *= f;
  }
  gemm_acc(dk, dv, L, KT, CH, XV, dv, S, dv, 1.f);
}

void head_impl(const HeadArgs& h) {
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
