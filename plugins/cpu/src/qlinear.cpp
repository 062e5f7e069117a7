// Drivers and bindings of the int8 kernels (qlinear.hpp): B packing, the threaded integer GEMM with its
// zero-point corrections and output stages (int32, scaled float, requantized 8-bit), im2col for QLinearConv, and
// DynamicQuantizeLinear. Compiled without ISA flags; the kernels run through qk().
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "onnx_py.hpp"
#include "qlinear.hpp"
#include "step.hpp"

namespace py = pybind11;

namespace hetero {
namespace qlin {
#ifndef HETERO_QLIN_X86
const QKernels* qkernels_avx2() { return nullptr; }
const QKernels* qkernels_avx512vnni() { return nullptr; }
#endif

namespace {

using pyx::fail;

bool cpu_has_vnni() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

}  // namespace

const QKernels& qk() {
  static const bool vnni = qkernels_avx512vnni() != nullptr && cpu_has_vnni();
  const Kernels* a = &active();
  if (a == kernels_avx512() && a != nullptr && vnni) return *qkernels_avx512vnni();
  if ((a == kernels_avx512() || a == kernels_avx2()) && a != nullptr && qkernels_avx2()) return *qkernels_avx2();
  return *qkernels_generic();
}

namespace {

// A narrow B's columns copied out of its panel (QPacked::cols), for qgemm_dot.
void keep_columns(QPacked& p) {
  p.cols.clear();
  if (p.n > kDotColumns) return;
  const i64 kp = 4 * p.k4;
  p.cols.assign(static_cast<std::size_t>(p.n * kp), 0);
  for (i64 j = 0; j < p.n; ++j)
    for (i64 kk = 0; kk < p.k; ++kk)
      p.cols[static_cast<std::size_t>(j * kp + kk)] = p.data->p[(kk / 4) * 64 + j * 4 + kk % 4];
}

}  // namespace

// b: K x N at (rs, cs) element strides; zero point: one or N values.
#if defined(__SSE2__)
// pack_into's contiguous-rows case a 16-column panel at a time: each 4 rows x 16 bytes (uint8 moved to int8 by
// flipping the top bit: v - 128) transposed by two rounds of unpacks into the panel's 16 columns x 4 bytes, and each
// column's sum of those 4 bytes (their halves sign-extended, summed by pmaddwd) added to its running sum. The scalar
// loop's bytes and sums (rows past K and columns past N stay 0); a QDQ attention packs 24 such heads a call, where
// the byte loop took about half of MiniLM's 64 x 32 x 64 head products.
static void pack_rows_sse2(QPacked& p, const std::uint8_t* b, i64 rs, bool b_unsigned) {
  const std::uint8_t flip = b_unsigned ? 0x80 : 0;
  const __m128i vflip = _mm_set1_epi8(static_cast<char>(flip)), ones = _mm_set1_epi16(1);
  for (i64 j0 = 0; j0 < p.n; j0 += kPanel) {
    const i64 w = std::min<i64>(kPanel, p.n - j0);
    std::int8_t* panel = p.data->p + (j0 / kPanel) * p.pstride();
    __m128i sums[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
    for (i64 g = 0; g < p.k4; ++g) {
      __m128i r[4];
      for (int u = 0; u < 4; ++u) {
        const i64 kk = 4 * g + u;
        if (kk >= p.k) {
          r[u] = _mm_setzero_si128();
          continue;
        }
        if (w == kPanel) {
          r[u] = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kk * rs + j0)), vflip);
        } else {  // the last panel's columns past N: bytes that flip to 0
          alignas(16) std::uint8_t part[kPanel];
          std::memset(part, flip, sizeof(part));
          std::memcpy(part, b + kk * rs + j0, static_cast<std::size_t>(w));
          r[u] = _mm_xor_si128(_mm_load_si128(reinterpret_cast<const __m128i*>(part)), vflip);
        }
      }
      const __m128i ab_lo = _mm_unpacklo_epi8(r[0], r[1]), ab_hi = _mm_unpackhi_epi8(r[0], r[1]);
      const __m128i cd_lo = _mm_unpacklo_epi8(r[2], r[3]), cd_hi = _mm_unpackhi_epi8(r[2], r[3]);
      const __m128i cols[4] = {_mm_unpacklo_epi16(ab_lo, cd_lo), _mm_unpackhi_epi16(ab_lo, cd_lo),
                               _mm_unpacklo_epi16(ab_hi, cd_hi), _mm_unpackhi_epi16(ab_hi, cd_hi)};
      for (int q = 0; q < 4; ++q) {
        _mm_store_si128(reinterpret_cast<__m128i*>(panel + g * 64 + 16 * q), cols[q]);
        const __m128i even = _mm_srai_epi16(_mm_slli_epi16(cols[q], 8), 8), odd = _mm_srai_epi16(cols[q], 8);
        sums[q] = _mm_add_epi32(sums[q], _mm_madd_epi16(_mm_add_epi16(even, odd), ones));
      }
    }
    alignas(16) std::int32_t total[kPanel];
    for (int q = 0; q < 4; ++q) _mm_store_si128(reinterpret_cast<__m128i*>(total + 4 * q), sums[q]);
    for (i64 j = 0; j < w; ++j) p.colsum[static_cast<std::size_t>(j0 + j)] = total[j];
  }
}
#endif

namespace {

// PairSafe of packed B (the bounds in qlinear.hpp), kept where at most 1 / kMaxPairFixShare of the pairs need a
// fix-up: per pair, the second byte moved toward zero until the positive
// (negative) parts sum to 128 (-128) at most, the moved part kept as a fix-up of its panel.
void build_pair_safe(QPacked& p) {
  const std::size_t bytes = static_cast<std::size_t>((p.panels + 1) / 2 * 2 * p.pstride());
  auto ps = std::make_unique<PairSafe>();
  ps->data = std::make_unique<AlignedVec<std::int8_t>>(bytes);
  std::memcpy(ps->data->p, p.data->p, bytes);
  ps->first.assign(static_cast<std::size_t>(p.panels + 1), 0);
  for (i64 q = 0; q < p.panels; ++q) {
    ps->first[static_cast<std::size_t>(q)] = static_cast<i64>(ps->fixes.size());
    std::int8_t* panel = ps->data->p + q * p.pstride();
    for (i64 i = 0; i < p.pstride(); i += 2) {  // byte pairs: group i / 64, column (i % 64) / 4, k (i % 4) and + 1
      const int w0 = panel[i], w1 = panel[i + 1];
      int keep = w1;
      if (w0 > 0 && w1 > 0 && w0 + w1 > 128) keep = 128 - w0;
      if (w0 < 0 && w1 < 0 && w0 + w1 < -128) keep = -128 - w0;
      if (keep == w1) continue;
      panel[i + 1] = static_cast<std::int8_t>(keep);
      const i64 k = i / 64 * 4 + i % 4 + 1;
      ps->fixes.push_back({static_cast<std::int32_t>(k), static_cast<std::int32_t>(i % 64 / 4), w1 - keep});
    }
  }
  ps->first[static_cast<std::size_t>(p.panels)] = static_cast<i64>(ps->fixes.size());
  // a fix-up costs a scattered scalar multiply-add per row: uniform random bytes (25 % fixed) ran 8x slower than the
  // widening tile; at 1 in 512 the cutoff also dropped magika_qlinearconv's and smart_turn_int8's gains (Zen 3)
  if (static_cast<i64>(ps->fixes.size()) * kMaxPairFixShare > p.k4 * 2 * p.n) return;
  p.pairs = std::move(ps);
}

// raw (rows x the panels from p0, ldraw apart) += the fix-ups of those panels: a[m][k] * r, wrapping as the sums.
void apply_pair_fixes(const PairSafe& ps, i64 p0, int np, const std::uint8_t* a, i64 lda, int rows,
                      std::int32_t* raw, i64 ldraw) {
  for (i64 q = p0; q < p0 + np; ++q) {
    const i64 end = ps.first[static_cast<std::size_t>(q + 1)];
    std::int32_t* col0 = raw + (q - p0) * kPanel;
    for (i64 f = ps.first[static_cast<std::size_t>(q)]; f < end; ++f) {
      const PairFix& x = ps.fixes[static_cast<std::size_t>(f)];
      for (int r = 0; r < rows; ++r) {
        const std::uint32_t add = static_cast<std::uint32_t>(a[r * lda + x.k] * x.r);
        col0[r * ldraw + x.col] = static_cast<std::int32_t>(static_cast<std::uint32_t>(col0[r * ldraw + x.col]) + add);
      }
    }
  }
}

}  // namespace

void pack_into(QPacked& p, const std::uint8_t* b, i64 rs, i64 cs, bool b_unsigned, const std::int32_t* zp,
               i64 zp_count) {
  p.k4 = (p.k + 3) / 4;
  p.panels = (p.n + kPanel - 1) / kPanel;
  p.b_unsigned = b_unsigned;
  // an even number of panels (the last one zero when N needs an odd count): the AMX block takes them in pairs
  p.data = std::make_unique<AlignedVec<std::int8_t>>(static_cast<std::size_t>((p.panels + 1) / 2 * 2 * p.pstride()));
  p.colsum.assign(static_cast<std::size_t>(p.n), 0);
  p.zb.assign(static_cast<std::size_t>(p.n), 0);
  const int shift = b_unsigned ? -128 : 0;
  if (cs == 1 && rs == p.n && p.n > kDotColumns) {
    // Contiguous rows (a run-time B packed at each call: a QDQ attention's K^T / V heads): read B row by row, the
    // column sums one running row, where the column walk below strides N bytes a value. Same bytes, same sums.
#if defined(__SSE2__)
    pack_rows_sse2(p, b, rs, b_unsigned);
#else
    for (i64 kk = 0; kk < p.k; ++kk) {
      const std::uint8_t* row = b + kk * rs;
      std::int8_t* dst = p.data->p + (kk / 4) * 64 + kk % 4;
      for (i64 j = 0; j < p.n; ++j) {
        const int v = (b_unsigned ? static_cast<int>(row[j]) : static_cast<int>(static_cast<std::int8_t>(row[j]))) +
                      shift;
        dst[(j / kPanel) * p.pstride() + (j % kPanel) * 4] = static_cast<std::int8_t>(v);
        p.colsum[static_cast<std::size_t>(j)] += v;
      }
    }
#endif
    for (i64 j = 0; j < p.n; ++j) p.zb[static_cast<std::size_t>(j)] = zp[zp_count == 1 ? 0 : j] + shift;
    if (qk().tile_pairs) build_pair_safe(p);
    return;  // N > kDotColumns: no column copies (keep_columns)
  }
  for (i64 j = 0; j < p.n; ++j) {
    std::int8_t* panel = p.data->p + (j / kPanel) * p.pstride();
    const i64 col = j % kPanel;
    std::int32_t sum = 0;
    for (i64 kk = 0; kk < p.k; ++kk) {
      const std::uint8_t raw = b[kk * rs + j * cs];
      const int v = (b_unsigned ? static_cast<int>(raw) : static_cast<int>(static_cast<std::int8_t>(raw))) + shift;
      panel[(kk / 4) * 64 + col * 4 + kk % 4] = static_cast<std::int8_t>(v);
      sum += v;
    }
    p.colsum[static_cast<std::size_t>(j)] = sum;
    p.zb[static_cast<std::size_t>(j)] = zp[zp_count == 1 ? 0 : j] + shift;
  }
  keep_columns(p);
  if (p.cols.empty() && qk().tile_pairs) build_pair_safe(p);  // B of kDotColumns or fewer runs on dot
}

namespace {
std::atomic<bool> g_use_amx{true};
}  // namespace

// The AMX path: blocks of 32 rows x 2 panels, when the CPU and OS allow it, the active ISA is avx512 and K is whole
// 64-byte tile rows.
static bool amx_for(const QKernels& kr, const QPacked& p) {
  return p.k % 64 == 0 && &kr == qkernels_avx512vnni() && g_use_amx.load(std::memory_order_relaxed) &&
         amx_available();
}

namespace {

// A rows up to this size run in one row block (see qgemm).
constexpr i64 kARowsL2Bytes = 256 * 1024;

// Brings the column block a task will likely take next (the pool hands tasks out in order, so with T threads the one
// T blocks on) into L2 a slice per row tile: its first rows then read the weights from L2, not memory (on Zen 4 the
// first pass over a block streaming from memory was ~12 % of a T5 encoder's int8 GEMM time). Not for a block of one
// row tile (M <= 8: a GEMV-like product, an LSTM's input projection): its whole slice would go out in one burst that
// stalls the core on the misses it queues, where the hardware prefetcher already streams the contiguous panels
// (Zen 4, 1 thread, K 512 x N 2048 from L3: M = 1 20.0 -> 16.1 us, M = 8 48.3 -> 42.9).
class BlockPrefetch {
 public:
  // data: the panels the tiles read (p.data, or its PairSafe copy)
  BlockPrefetch(const QPacked& p, const std::int8_t* data, i64 first_panel, i64 panels, i64 steps) {
    if (first_panel >= p.panels || steps <= 1) return;
    begin_ = reinterpret_cast<const char*>(data + first_panel * p.pstride());
    const i64 bytes = std::min(panels, p.panels - first_panel) * p.pstride();
    lines_ = bytes / 64;
    per_step_ = (lines_ + steps - 1) / steps;
  }
  void step() {
    const i64 end = std::min(lines_, done_ + per_step_);
#if defined(__GNUC__) || defined(__clang__)
    for (; done_ < end; ++done_) __builtin_prefetch(begin_ + done_ * 64, 0, 2);  // prefetcht1: into L2
#else
    done_ = end;
#endif
  }

 private:
  const char* begin_ = nullptr;
  i64 lines_ = 0, per_step_ = 0, done_ = 0;
};

}  // namespace

// The GEMM over rows [0, M): tasks are (row block, column block) pairs.
// A product by B of <= kDotColumns columns: blocks of rows, each row dotted with every column (the ISA's dot), then
// the output stage as after a tile. The sums and the stage are the tiles', so are the results, bit for bit.
static void qgemm_dot(const QKernels& kr, const QPacked& p, const AOperand& a, i64 M, const OutStage& st,
                      const Corrections& cr, double work) {
  constexpr i64 kRows = 64;
  const int ncols = static_cast<int>(p.n);
  parallel_for((M + kRows - 1) / kRows, threads_for(work, 2e6), [&](i64 task) {
    alignas(64) std::int32_t raw[kRows * kDotColumns];
    const i64 m0 = task * kRows, rows = std::min(M, m0 + kRows) - m0;
    kr.dot(a.a + m0 * a.lda, rows, a.lda, p.cols.data(), ncols, 4 * p.k4, raw, ncols);
    kr.finish(st, cr, m0, static_cast<int>(rows), 0, ncols, raw, ncols);
  });
}

void tile_raw(const QKernels& kr, const QPacked& p, const PairSafe* ps, int m, int np, i64 p0, const std::uint8_t* a,
              i64 lda, std::int32_t* raw, i64 ldc) {
  if (!ps) return kr.tile(m, np, p.k4, a, lda, p.data->p + p0 * p.pstride(), p.pstride(), raw, ldc);
  kr.tile_pairs(m, np, p.k4, a, lda, ps->data->p + p0 * p.pstride(), p.pstride(), raw, ldc);
  apply_pair_fixes(*ps, p0, np, a, lda, m, raw, ldc);
}

void qgemm(const QPacked& p, const AOperand& a, i64 M, const OutStage& st) {
  if (M == 0 || p.n == 0) return;
  const QKernels& kr = qk();
  std::vector<std::int32_t> rowsum(static_cast<std::size_t>(M));
  kr.rowsums(a.a, M, p.k, a.lda, rowsum.data());
  const Corrections cr{p.colsum.data(), p.zb.data(), rowsum.data(), a.za, a.za_count, p.k};
  const double work = static_cast<double>(M) * static_cast<double>(p.n) * static_cast<double>(p.k);
  // A few rows (a GEMV-like product): AMX would compute 16 rows for them, and what a second thread gains is its
  // share of B's bytes read (kSmallMSplitBytes), not of the multiply-adds.
  const bool few_rows = M <= kMR;
  if (!few_rows && amx_for(kr, p)) {
    // Tasks are column groups; each runs its panel pairs over every row block, so a pair (2 x K x 16 bytes) is read
    // from memory once and stays in L1 while the row blocks pass. The last rows (M % 32) are copied once, zero-padded
    // to whole 16-row tiles.
    const i64 full = M / 32 * 32, rest = M - full;
    const int tail_rows = rest == 0 ? 0 : (rest <= 16 ? 16 : 32);
    std::vector<std::uint8_t> tail(static_cast<std::size_t>(tail_rows * p.k), 0);
    for (i64 r = 0; r < rest; ++r)
      std::memcpy(tail.data() + r * p.k, a.a + (full + r) * a.lda, static_cast<std::size_t>(p.k));
    const i64 pairs = (p.panels + 1) / 2, pairs_per_task = 2;
    const i64 tasks = (pairs + pairs_per_task - 1) / pairs_per_task;
    parallel_for(tasks, threads_for(work, 4e6), [&](i64 task) {
      alignas(64) std::int32_t raw[32 * 32];
      amx_begin();
      for (i64 q = task * pairs_per_task; q < std::min(pairs, (task + 1) * pairs_per_task); ++q) {
        const std::int8_t* b = p.data->p + 2 * q * p.pstride();
        const i64 n0 = 2 * q * kPanel;
        const int ncols = static_cast<int>(std::min<i64>(32, p.n - n0));
        for (i64 m0 = 0; m0 < full; m0 += 32) {
          amx_block32(p.k, a.a + m0 * a.lda, a.lda, b, p.pstride(), raw);
          kr.finish(st, cr, m0, 32, n0, ncols, raw, 32);
        }
        if (rest) {
          (tail_rows == 16 ? amx_block16 : amx_block32)(p.k, tail.data(), p.k, b, p.pstride(), raw);
          kr.finish(st, cr, full, static_cast<int>(rest), n0, ncols, raw, 32);
        }
      }
      amx_end();
    });
    return;
  }
  if (!p.cols.empty()) return qgemm_dot(kr, p, a, M, st, cr, work);
  // the tile's shape: the F32 stage in registers where the ISA has it (its own shape), else tile then finish
  const bool f32_in_tile = kr.tile_f32 && st.kind == OutStage::F32 && st.cs == 1 && !st.ibias;
  // B packed under the ISA of tile_pairs (a switch of ISA after packing: the other tiles, on p.data)
  const PairSafe* pairs = pair_safe(kr, p);
  const int tile_rows = f32_in_tile ? kr.f32_mr : (pairs ? kMR : kr.mr), tile_panels = f32_in_tile ? kr.f32_np : kr.np;
  const i64 panels_per_block = f32_in_tile ? tile_panels : std::max(kr.np, 4);
  const i64 nblocks = (p.panels + panels_per_block - 1) / panels_per_block;
  int T = threads_for(work, 2e6);
  bool wake = true;
  if (few_rows) {
    const double bytes = static_cast<double>(p.k4) * 4.0 * static_cast<double>(p.n);
    T = std::max(T, threads_for(bytes, kSmallMSplitBytes));
    wake = bytes >= 512.0 * 1024 || work >= 4e6;  // as the float small-M path: a small split wakes no sleeper
  }
  // Rows per task: all of them while A stays in L2 and the column blocks alone give every thread two or more tasks
  // (a transformer's tokens: each column block of B is then read from memory once, where 64-row blocks read the
  // weights again per block), else 64.
  const bool all_rows = M * a.lda <= kARowsL2Bytes && nblocks >= 2 * static_cast<i64>(T);
  const i64 rows_per_block = all_rows ? M : 64;
  const i64 mblocks = (M + rows_per_block - 1) / rows_per_block;
  parallel_for(mblocks * nblocks, T, [&](i64 task) {
    const i64 mb = task / nblocks, nb = task % nblocks;
    const i64 m_begin = mb * rows_per_block, m_end = std::min(M, m_begin + rows_per_block);
    const i64 p_end = std::min(p.panels, (nb + 1) * panels_per_block);
    BlockPrefetch next(p, pairs ? pairs->data->p : p.data->p, (nb + T) * panels_per_block, panels_per_block,
                       (m_end - m_begin + tile_rows - 1) / tile_rows);
    alignas(64) std::int32_t raw[kMR * kNP * kPanel];
    for (i64 m0 = m_begin; m0 < m_end; m0 += tile_rows) {
      const int mr = static_cast<int>(std::min<i64>(tile_rows, m_end - m0));
      next.step();
      for (i64 p0 = nb * panels_per_block; p0 < p_end; p0 += tile_panels) {
        const int np = static_cast<int>(std::min<i64>(tile_panels, p_end - p0));
        const i64 ldc = np * kPanel, n0 = p0 * kPanel;
        const int ncols = static_cast<int>(std::min<i64>(ldc, p.n - n0));
        const std::uint8_t* ar = a.a + m0 * a.lda;
        const std::int8_t* b = p.data->p + p0 * p.pstride();
        if (f32_in_tile) {
          kr.tile_f32(mr, np, p.k4, ar, a.lda, b, p.pstride(), cr, st, m0, n0, ncols);
          continue;
        }
        tile_raw(kr, p, pairs, mr, np, p0, ar, a.lda, raw, ldc);
        kr.finish(st, cr, m0, mr, n0, ncols, raw, ldc);
      }
    }
  }, wake);
}

// The N column multipliers of qgemm_f32: scale (1 or N values) times factor (none, 1 or N), rounded to float32.
void column_scales(const float* scale, i64 ns, const float* factor, i64 nf, i64 n, std::vector<float>& out) {
  out.assign(static_cast<std::size_t>(n), scale[0]);
  if (ns != 1) std::memcpy(out.data(), scale, static_cast<std::size_t>(n) * 4);
  if (factor)
    for (i64 j = 0; j < n; ++j) out[static_cast<std::size_t>(j)] *= factor[nf == 1 ? 0 : j];
}

// DynamicQuantizeLinear's scale and zero point from min(x, 0) and max(x, 0), in float32 arithmetic.
void dynamic_quant_params(float lo, float hi, float* scale, int* zero_point) {
  const float s = (hi - lo) / 255.f;
  int z = 0;
  if (s != 0.f) {
    const float zf = std::nearbyint((0.f - lo) / s);
    z = static_cast<int>(std::min(255.f, std::max(0.f, zf)));
  }
  *scale = s;
  *zero_point = z;
}

namespace {

// An empty K: every sum is 0 (the output stage still applies: scale, bias, zero point).
void qgemm_empty_k(const QPacked& p, i64 M, const OutStage& st) {
  const std::vector<std::int32_t> zeros(static_cast<std::size_t>(p.n), 0), none(static_cast<std::size_t>(M), 0);
  const std::int32_t za = 0;
  const Corrections cr{zeros.data(), zeros.data(), none.data(), &za, 1, 0};
  for (i64 m = 0; m < M; ++m) qk().finish(st, cr, m, 1, 0, static_cast<int>(p.n), zeros.data(), 0);
}

bool is_u8(const py::array& a) { return pyx::dkey(a) == "u1"; }
bool is_s8(const py::array& a) { return pyx::dkey(a) == "i1"; }

void need_8bit(const py::array& a, const char* fn, const char* name) {
  if (!is_u8(a) && !is_s8(a)) fail(std::string(fn) + ": " + name + " must be uint8 or int8, got " +
                                   std::string(py::str(a.dtype())));
}

std::vector<std::int32_t> zero_points(const py::object& zp, const py::array& like, i64 count, const char* fn,
                                      const char* name) {
  std::vector<std::int32_t> v;
  if (zp.is_none()) return {0};
  const py::array z = py::array::ensure(zp);
  if (pyx::dkey(z) != pyx::dkey(like))
    fail(std::string(fn) + ": " + name + " must have the dtype of its operand (" + std::string(py::str(like.dtype())) + ")");
  const py::array zc = py::array::ensure(z, py::array::c_style);
  const i64 size = static_cast<i64>(zc.size());
  if (size != 1 && size != count)
    fail(std::string(fn) + ": " + name + " has " + std::to_string(size) + " values, expected 1 or " + std::to_string(count));
  for (i64 i = 0; i < size; ++i)
    v.push_back(is_u8(zc) ? static_cast<std::int32_t>(static_cast<const std::uint8_t*>(zc.data())[i])
                          : static_cast<std::int32_t>(static_cast<const std::int8_t*>(zc.data())[i]));
  return v;
}

std::shared_ptr<QPacked> py_qpack_b(const py::array& b, const py::object& zp) {
  need_8bit(b, "qpack_b", "b");
  if (b.ndim() != 2) fail("qpack_b: b must be 2-D (K, N), got " + pyx::shape_str(b));
  auto p = std::make_shared<QPacked>();
  p->k = b.shape(0);
  p->n = b.shape(1);
  const std::vector<std::int32_t> z = zero_points(zp, b, p->n, "qpack_b", "b_zero_point");
  pack_into(*p, static_cast<const std::uint8_t*>(b.data()), b.strides(0), b.strides(1), is_u8(b), z.data(),
            static_cast<i64>(z.size()));
  return p;
}

// A (M x K rows of uint8 / int8) as the GEMM's operand: used in place when it is uint8, C-contiguous and K % 4 == 0
// (reading whole 4-byte groups stays inside each row), else copied to rows of 4 * k4 bytes (int8 moved to uint8).
struct APrepared {
  AOperand op{};
  std::vector<std::uint8_t> copy;
  std::vector<std::int32_t> za;
};

void prepare_a(const py::array& a, i64 M, const QPacked& p, const py::object& zp, APrepared& out) {
  need_8bit(a, "qgemm", "a");
  if (!pyx::c_contig(a)) fail("qgemm: a must be C-contiguous");
  if (a.ndim() < 1 || a.shape(a.ndim() - 1) != p.k)
    fail("qgemm: a has shape " + pyx::shape_str(a) + ", its last dimension must be K = " + std::to_string(p.k));
  out.za = zero_points(zp, a, M, "qgemm", "a_zero_point");
  const bool s8 = is_s8(a);
  if (s8)
    for (auto& z : out.za) z += 128;
  const auto* src = static_cast<const std::uint8_t*>(a.data());
  if (!s8 && p.k % 4 == 0) {
    out.op = {src, p.k, out.za.data(), static_cast<i64>(out.za.size())};
    return;
  }
  const i64 lda = p.k4 * 4;
  out.copy.assign(static_cast<std::size_t>(M * lda + 4), 0);
  for (i64 m = 0; m < M; ++m)
    for (i64 kk = 0; kk < p.k; ++kk)
      out.copy[static_cast<std::size_t>(m * lda + kk)] = static_cast<std::uint8_t>(src[m * p.k + kk] ^ (s8 ? 0x80 : 0));
  out.op = {out.copy.data(), lda, out.za.data(), static_cast<i64>(out.za.size())};
}

i64 rows_of(const py::array& a, i64 k) { return k == 0 ? 0 : static_cast<i64>(a.size()) / k; }

void need_out_size(const py::array& out, i64 count, const char* fn) {
  pyx::need_out(out, fn);
  if (static_cast<i64>(out.size()) != count)
    fail(std::string(fn) + ": out has " + std::to_string(out.size()) + " elements, expected " + std::to_string(count));
}

// out (int32) = (a - a_zp) @ (b - b_zp)
void py_qgemm_i32(const py::array& a, const QPacked& p, const py::object& a_zp, const py::array& out) {
  const i64 M = rows_of(a, p.k);
  if (pyx::dkey(out) != "i4") fail("qgemm_i32: out must be int32");
  need_out_size(out, M * p.n, "qgemm_i32");
  if (p.k == 0) {
    std::memset(pyx::mptr<void>(out), 0, static_cast<std::size_t>(out.nbytes()));
    return;
  }
  APrepared ap;
  prepare_a(a, M, p, a_zp, ap);
  OutStage st;
  st.out = pyx::mptr<void>(out);
  st.rs = p.n;
  st.cs = 1;
  py::gil_scoped_release nogil;
  qgemm(p, ap.op, M, st);
}

void check_factor(const py::array& f, i64 n) {
  pyx::need_f32(f, "qgemm_f32", "factor");
  pyx::need_contig(f, "qgemm_f32", "factor");
  if (f.size() != 1 && static_cast<i64>(f.size()) != n)
    fail("qgemm_f32: factor has " + std::to_string(f.size()) + " values, expected 1 or N = " + std::to_string(n));
}

// qgemm_f32 as a replay step's op (LlmStep.add_call): A used in place (uint8, C-contiguous, K a multiple of 4:
// anything else would be copied at the call, and the step refuses it), and the zero point, scale and factor read
// when the step runs (DynamicQuantizeLinear writes them at each run).
Op prep_qgemm_f32(const py::tuple& args) {
  const char* fn = "qgemm_f32";
  step_arity(args, 6, 8, fn);
  const py::array a = step_array(args, 0, fn), scale = step_array(args, 3, fn), out = step_array(args, 5, fn);
  const QPacked& p = args[1].cast<const QPacked&>();
  const i64 M = rows_of(a, p.k);
  pyx::need_f32(out, fn, "out");
  pyx::need_f32(scale, fn, "scale");
  pyx::need_contig(scale, fn, "scale");
  need_out_size(out, M * p.n, fn);
  if (scale.size() != 1 && static_cast<i64>(scale.size()) != p.n) fail("qgemm_f32: scale must have 1 or N values");
  if (!is_u8(a) || !pyx::c_contig(a) || p.k % 4 != 0 || p.k == 0 || a.shape(a.ndim() - 1) != p.k)
    fail("qgemm_f32: a strided operand is copied at each call; it cannot be prepared (uint8 A of K % 4 == 0 only)");
  const std::uint8_t* zp = nullptr;
  i64 nz = 0;
  if (!args[2].is_none()) {
    const py::array z = step_array(args, 2, fn);
    if (!is_u8(z) || (z.size() != 1 && static_cast<i64>(z.size()) != M) || !pyx::c_contig(z))
      fail("qgemm_f32: a_zero_point must be 1 or M uint8 values");
    zp = static_cast<const std::uint8_t*>(z.data());
    nz = static_cast<i64>(z.size());
  }
  const float* fv = nullptr;
  i64 nf = 0;
  if (args.size() > 6 && !args[6].is_none()) {
    const py::array f = step_array(args, 6, fn);
    check_factor(f, p.n);
    fv = pyx::cptr<float>(f);
    nf = static_cast<i64>(f.size());
  }
  const float* bias = nullptr;
  if (!args[4].is_none()) {
    const py::array b = step_array(args, 4, fn);
    pyx::need_f32(b, fn, "bias");
    pyx::need_contig(b, fn, "bias");
    if (static_cast<i64>(b.size()) != p.n) fail("qgemm_f32: bias must have N = " + std::to_string(p.n) + " values");
    bias = pyx::cptr<float>(b);
  }
  const float* addend = nullptr;
  if (args.size() > 7 && !args[7].is_none()) {
    const py::array r = step_array(args, 7, fn);
    pyx::need_f32(r, fn, "addend");
    pyx::need_contig(r, fn, "addend");
    if (static_cast<i64>(r.size()) != M * p.n) fail("qgemm_f32: addend must have M x N values, as out");
    addend = pyx::cptr<float>(r);
  }
  const auto* src = static_cast<const std::uint8_t*>(a.data());
  const float* ps = pyx::cptr<float>(scale);
  const i64 ns = static_cast<i64>(scale.size());
  void* po = pyx::mptr<void>(out);
  const QPacked* pp = &p;
  return [=] {
    std::vector<std::int32_t> za(static_cast<std::size_t>(std::max<i64>(1, nz)), 0);
    for (i64 i = 0; i < nz; ++i) za[static_cast<std::size_t>(i)] = zp[i];
    std::vector<float> scales;
    column_scales(ps, ns, fv, nf, pp->n, scales);
    OutStage st;
    st.kind = OutStage::F32;
    st.out = po;
    st.rs = pp->n;
    st.cs = 1;
    st.scale = scales.data();
    st.fbias = bias;
    st.addend = addend;
    st.add_rs = pp->n;
    qgemm(*pp, AOperand{src, pp->k, za.data(), static_cast<i64>(za.size())}, M, st);
  };
}

// out (float32) = float32((a - a_zp) @ (b - b_zp)) * scale [* factor] (+ bias): scale and factor one value or N
// (their product rounded to float32 first, as the graph's Mul of the activation and weight scales computed it), bias N.
void py_qgemm_f32(const py::array& a, const QPacked& p, const py::object& a_zp, const py::array& scale,
                  const py::object& bias, const py::array& out, const py::object& factor, const py::object& addend) {
  const i64 M = rows_of(a, p.k);
  pyx::need_f32(out, "qgemm_f32", "out");
  pyx::need_f32(scale, "qgemm_f32", "scale");
  pyx::need_contig(scale, "qgemm_f32", "scale");
  need_out_size(out, M * p.n, "qgemm_f32");
  if (scale.size() != 1 && static_cast<i64>(scale.size()) != p.n)
    fail("qgemm_f32: scale has " + std::to_string(scale.size()) + " values, expected 1 or N = " + std::to_string(p.n));
  OutStage st;
  st.kind = OutStage::F32;
  st.out = pyx::mptr<void>(out);
  st.rs = p.n;
  st.cs = 1;
  std::vector<float> scales;
  const bool has_f = !factor.is_none();
  const py::array f = has_f ? py::array::ensure(factor) : py::array();
  if (has_f) check_factor(f, p.n);
  column_scales(pyx::cptr<float>(scale), static_cast<i64>(scale.size()), has_f ? pyx::cptr<float>(f) : nullptr,
                has_f ? static_cast<i64>(f.size()) : 0, p.n, scales);
  st.scale = scales.data();
  py::array bias_arr;
  if (!bias.is_none()) {
    bias_arr = py::array::ensure(bias);
    pyx::need_f32(bias_arr, "qgemm_f32", "bias");
    pyx::need_contig(bias_arr, "qgemm_f32", "bias");
    if (static_cast<i64>(bias_arr.size()) != p.n) fail("qgemm_f32: bias must have N = " + std::to_string(p.n) + " values");
    st.fbias = pyx::cptr<float>(bias_arr);
  }
  py::array add_arr;
  if (!addend.is_none()) {  // a residual added last: one value per output, laid out as out
    add_arr = py::array::ensure(addend);
    pyx::need_f32(add_arr, "qgemm_f32", "addend");
    pyx::need_contig(add_arr, "qgemm_f32", "addend");
    if (static_cast<i64>(add_arr.size()) != M * p.n) fail("qgemm_f32: addend must have M x N values, as out");
    st.addend = pyx::cptr<float>(add_arr);
    st.add_rs = p.n;
  }
  APrepared ap;
  if (p.k > 0) prepare_a(a, M, p, a_zp, ap);
  py::gil_scoped_release nogil;
  if (p.k == 0) return qgemm_empty_k(p, M, st);
  qgemm(p, ap.op, M, st);
}

// out[i] = float32((a[i] - a_zp) @ (b[i] - b_zp)) * scale [* factor] for each batch i of two run-time 8-bit operands
// (a QDQ attention's Q K^T and P V, MatMulIntegerScaled with B computed: one scale and zero point each). Each
// batch's B is packed here (K x N bytes) and the batches split over the threads: at MiniLM's 64 x 32 x 64 heads a
// Python loop of qpack_b + qgemm_f32 calls cost more than its products, and the float product of the dequantized
// operands (what ran instead) did the multiply-adds at a quarter of vpdpbusd's rate.
void py_qgemm_batched_f32(const py::array& a, const py::array& b, const py::object& a_zp, const py::object& b_zp,
                          const py::array& scale, const py::object& factor, const py::array& out) {
  const char* fn = "qgemm_batched_f32";
  need_8bit(a, fn, "a");
  need_8bit(b, fn, "b");
  if (!pyx::c_contig(a) || !pyx::c_contig(b)) fail(std::string(fn) + ": a and b must be C-contiguous");
  if (a.ndim() < 2 || a.ndim() != b.ndim())
    fail(std::string(fn) + ": a and b must have one rank >= 2, got " + pyx::shape_str(a) + " and " + pyx::shape_str(b));
  const int nd = static_cast<int>(a.ndim());
  i64 batch = 1;
  for (int d = 0; d < nd - 2; ++d) {
    if (a.shape(d) != b.shape(d)) fail(std::string(fn) + ": batch dims differ: " + pyx::shape_str(a) + " and " +
                                       pyx::shape_str(b));
    batch *= a.shape(d);
  }
  const i64 M = a.shape(nd - 2), K = a.shape(nd - 1), N = b.shape(nd - 1);
  if (b.shape(nd - 2) != K) fail(std::string(fn) + ": a " + pyx::shape_str(a) + " and b " + pyx::shape_str(b) +
                                 " do not chain");
  pyx::need_f32(out, fn, "out");
  need_out_size(out, batch * M * N, fn);
  pyx::need_f32(scale, fn, "scale");
  pyx::need_contig(scale, fn, "scale");
  if (scale.size() != 1) fail(std::string(fn) + ": scale must be one value");
  const float* fv = nullptr;
  py::array f;
  if (!factor.is_none()) {
    f = py::array::ensure(factor);
    pyx::need_f32(f, fn, "factor");
    pyx::need_contig(f, fn, "factor");
    if (f.size() != 1) fail(std::string(fn) + ": factor must be one value");
    fv = pyx::cptr<float>(f);
  }
  const bool a_s8 = is_s8(a), b_u8 = is_u8(b);
  const std::int32_t za = zero_points(a_zp, a, 1, fn, "a_zero_point")[0] + (a_s8 ? 128 : 0);
  const std::int32_t zb = zero_points(b_zp, b, 1, fn, "b_zero_point")[0];
  std::vector<float> scales;
  column_scales(pyx::cptr<float>(scale), 1, fv, fv ? 1 : 0, N, scales);
  const auto* pa = static_cast<const std::uint8_t*>(a.data());
  const auto* pb = static_cast<const std::uint8_t*>(b.data());
  float* po = pyx::mptr<float>(out);
  py::gil_scoped_release nogil;
  if (batch == 0 || M == 0 || N == 0) return;
  // A used in place when its rows are whole 4-byte groups of uint8, else copied per batch (int8 moved to uint8)
  const bool in_place = !a_s8 && K % 4 == 0;
  const i64 lda = in_place ? K : (K + 3) / 4 * 4;
  const double work = static_cast<double>(batch) * static_cast<double>(M) * static_cast<double>(N) *
                      static_cast<double>(K);
  parallel_for(batch, threads_for(work, 2e6), [&](i64 i) {
    QPacked p;
    p.k = K;
    p.n = N;
    OutStage st;
    st.kind = OutStage::F32;
    st.out = po + i * M * N;
    st.rs = N;
    st.cs = 1;
    st.scale = scales.data();
    if (K == 0) {
      p.k4 = 0;
      return qgemm_empty_k(p, M, st);
    }
    pack_into(p, pb + i * K * N, N, 1, b_u8, &zb, 1);
    const std::uint8_t* ai = pa + i * M * K;
    std::vector<std::uint8_t> copy;
    if (!in_place) {
      copy.assign(static_cast<std::size_t>(M * lda + 4), 0);
      for (i64 m = 0; m < M; ++m)
        for (i64 kk = 0; kk < K; ++kk)
          copy[static_cast<std::size_t>(m * lda + kk)] = static_cast<std::uint8_t>(ai[m * K + kk] ^ (a_s8 ? 0x80 : 0));
      ai = copy.data();
    }
    qgemm(p, AOperand{ai, lda, &za, 1}, M, st);
  }, work >= kWakeFlops / 2);
}

// The requantizing stage of QLinearMatMul / QLinearConv: multiplier[n] = a_scale * b_scale[n] / y_scale (float, as
// onnxruntime computes it), y = saturate(round_half_even(float(acc (+ bias)) * multiplier) + y_zp).
void requant_stage(OutStage& st, std::vector<float>& mult, const py::array& a_scale, const py::array& b_scale,
                   const py::array& y_scale, const py::array& y_zp, i64 n, const char* fn) {
  for (const py::array* s : {&a_scale, &b_scale, &y_scale}) {
    pyx::need_f32(*s, fn, "scale");
    pyx::need_contig(*s, fn, "scale");
  }
  if (a_scale.size() != 1 || y_scale.size() != 1) fail(std::string(fn) + ": a / y scales must be single values");
  if (b_scale.size() != 1 && static_cast<i64>(b_scale.size()) != n)
    fail(std::string(fn) + ": the weight scale has " + std::to_string(b_scale.size()) + " values, expected 1 or " +
         std::to_string(n));
  if (y_zp.size() != 1) fail(std::string(fn) + ": y_zero_point must be a single value");
  need_8bit(y_zp, fn, "y_zero_point");
  const float as = pyx::cptr<float>(a_scale)[0], ys = pyx::cptr<float>(y_scale)[0];
  const float* bs = pyx::cptr<float>(b_scale);
  mult.resize(static_cast<std::size_t>(n));
  for (i64 j = 0; j < n; ++j) mult[static_cast<std::size_t>(j)] = as * bs[b_scale.size() == 1 ? 0 : j] / ys;
  st.kind = OutStage::Q8;
  st.scale = mult.data();
  st.y_unsigned = is_u8(y_zp);
  st.y_zp = st.y_unsigned ? static_cast<int>(pyx::cptr<std::uint8_t>(y_zp)[0])
                          : static_cast<int>(pyx::cptr<std::int8_t>(y_zp)[0]);
  st.qmin = st.y_unsigned ? 0 : -128;
  st.qmax = st.y_unsigned ? 255 : 127;
}

void py_qgemm_requant(const py::array& a, const QPacked& p, const py::object& a_zp, const py::array& a_scale,
                      const py::array& b_scale, const py::array& y_scale, const py::array& y_zp,
                      const py::array& out) {
  const i64 M = rows_of(a, p.k);
  need_out_size(out, M * p.n, "qgemm_requant");
  if (pyx::dkey(out) != pyx::dkey(y_zp)) fail("qgemm_requant: out must have y_zero_point's dtype");
  OutStage st;
  std::vector<float> mult;
  requant_stage(st, mult, a_scale, b_scale, y_scale, y_zp, p.n, "qgemm_requant");
  st.out = pyx::mptr<void>(out);
  st.rs = p.n;
  st.cs = 1;
  APrepared ap;
  if (p.k > 0) prepare_a(a, M, p, a_zp, ap);
  py::gil_scoped_release nogil;
  if (p.k == 0) return qgemm_empty_k(p, M, st);
  qgemm(p, ap.op, M, st);
}

// QLinearConv, 2-D NCHW (a 1-D conv as H = 1): per group, im2col of the input (padding = x's zero point, so padded
// taps contribute nothing) into rows of output positions, the GEMM against that group's packed weights, requantized
// straight into the NCHW output (column stride = positions).
struct QConv {
  i64 cout = 0, cin_g = 0, kh = 0, kw = 0, groups = 1;
  std::vector<std::shared_ptr<QPacked>> packed;  // per group: K = cin_g * kh * kw, N = cout / groups
  std::vector<std::int32_t> depthwise;           // one channel per group: w - w_zero_point, [cout][kh * kw]
};

std::shared_ptr<QConv> py_qconv_pack(const py::array& w, const py::object& zp, i64 groups) {
  need_8bit(w, "qconv_pack", "w");
  if (w.ndim() != 4) fail("qconv_pack: w must be 4-D (Cout, Cin/groups, kh, kw), got " + pyx::shape_str(w));
  if (!pyx::c_contig(w)) fail("qconv_pack: w must be C-contiguous");
  auto c = std::make_shared<QConv>();
  c->cout = w.shape(0);
  c->cin_g = w.shape(1);
  c->kh = w.shape(2);
  c->kw = w.shape(3);
  c->groups = groups;
  if (groups < 1 || c->cout % groups) fail("qconv_pack: Cout must be a multiple of groups");
  const i64 og = c->cout / groups, K = c->cin_g * c->kh * c->kw;
  const std::vector<std::int32_t> z = zero_points(zp, w, c->cout, "qconv_pack", "w_zero_point");
  const auto* src = static_cast<const std::uint8_t*>(w.data());
  // The GEMM's k runs over (ky, kx, ci), channels innermost: py_qconv's rows of A are then runs of an image
  // position's channels (the integer sums do not depend on the order of k).
  const i64 taps = c->kh * c->kw;
  std::vector<std::uint8_t> wk(static_cast<std::size_t>(og * K));
  for (i64 g = 0; g < groups; ++g) {
    for (i64 n = 0; n < og; ++n)
      for (i64 ci = 0; ci < c->cin_g; ++ci)
        for (i64 t = 0; t < taps; ++t)
          wk[static_cast<std::size_t>(n * K + t * c->cin_g + ci)] = src[(g * og + n) * K + ci * taps + t];
    auto p = std::make_shared<QPacked>();
    p->k = K;
    p->n = og;
    // B[k][n] = wk[n][k]: row stride 1, column stride K
    pack_into(*p, wk.data(), 1, K, is_u8(w), z.size() == 1 ? z.data() : z.data() + g * og, z.size() == 1 ? 1 : og);
    c->packed.push_back(p);
  }
  if (c->cin_g == 1 && og == 1) {  // depthwise: taps accumulated directly (a GEMM per channel would have N = 1)
    const bool u8 = is_u8(w);
    for (i64 o = 0; o < c->cout; ++o)
      for (i64 t = 0; t < K; ++t) {
        const std::uint8_t raw = src[o * K + t];
        const int v = u8 ? static_cast<int>(raw) : static_cast<int>(static_cast<std::int8_t>(raw));
        c->depthwise.push_back(v - z[z.size() == 1 ? 0 : o]);
      }
  }
  return c;
}

#if defined(__SSE2__)
// Rows of 16 bytes transposed: d[c * ds + r] = s[r * ss + c] ^ flip for r, c < 16 (four rounds of unpacks, each
// doubling the run of one column's rows in a register: 2, 4, 8, then 16).
inline void transpose16(const std::uint8_t* s, i64 ss, std::uint8_t* d, i64 ds, std::uint8_t flip) {
  const __m128i f = _mm_set1_epi8(static_cast<char>(flip));
  __m128i x[16], y[16];
  for (int r = 0; r < 16; ++r) x[r] = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + r * ss)), f);
  for (int i = 0; i < 8; ++i) {  // y[i]: columns 0-7 of rows 2i, 2i + 1; y[8 + i]: columns 8-15
    y[i] = _mm_unpacklo_epi8(x[2 * i], x[2 * i + 1]);
    y[8 + i] = _mm_unpackhi_epi8(x[2 * i], x[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h)  // x[q * 4 + i]: columns 4q .. 4q + 3 of rows 4i .. 4i + 3
    for (int i = 0; i < 4; ++i) {
      x[h * 8 + i] = _mm_unpacklo_epi16(y[h * 8 + 2 * i], y[h * 8 + 2 * i + 1]);
      x[h * 8 + 4 + i] = _mm_unpackhi_epi16(y[h * 8 + 2 * i], y[h * 8 + 2 * i + 1]);
    }
  for (int q = 0; q < 4; ++q)  // y[q * 4 + i]: columns 4q, 4q + 1 of rows 8i .. 8i + 7; y[q * 4 + 2 + i]: 4q + 2, 4q + 3
    for (int i = 0; i < 2; ++i) {
      y[q * 4 + i] = _mm_unpacklo_epi32(x[q * 4 + 2 * i], x[q * 4 + 2 * i + 1]);
      y[q * 4 + 2 + i] = _mm_unpackhi_epi32(x[q * 4 + 2 * i], x[q * 4 + 2 * i + 1]);
    }
  for (int p = 0; p < 8; ++p) {  // columns 2p and 2p + 1, all 16 rows
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * p * ds), _mm_unpacklo_epi64(y[2 * p], y[2 * p + 1]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * p + 1) * ds), _mm_unpackhi_epi64(y[2 * p], y[2 * p + 1]));
  }
}
#endif

// image[pp * cg + ci] = planes[ci * HW + pp] ^ flip for positions [p0, p1) and channels [c0, c1): NCHW planes to a
// channels-innermost image, whole 16 x 16 blocks as one transpose where the ISA has one.
void to_channels_last(const std::uint8_t* planes, i64 HW, std::uint8_t* image, i64 cg, i64 p0, i64 p1, i64 c0,
                      i64 c1, std::uint8_t flip) {
  i64 pe = p0, ce = c0;  // the blocks' ends
#if defined(__SSE2__)
  pe = p0 + (p1 - p0) / 16 * 16;
  ce = c0 + (c1 - c0) / 16 * 16;
  for (i64 pp = p0; pp < pe; pp += 16)
    for (i64 ci = c0; ci < ce; ci += 16) transpose16(planes + ci * HW + pp, HW, image + pp * cg + ci, cg, flip);
#endif
  for (i64 pp = p0; pp < p1; ++pp) {
    std::uint8_t* d = image + pp * cg;
    for (i64 ci = pp < pe ? ce : c0; ci < c1; ++ci) d[ci] = static_cast<std::uint8_t>(planes[ci * HW + pp] ^ flip);
  }
}

// Depthwise QLinearConv, one channel of one image: acc[P] = sum over taps of (x - x_zp) (w - w_zp), exact int32.
template <class T>
void depthwise_channel(const T* plane, i64 H, i64 W, const std::int32_t* w, i64 kh, i64 kw, i64 sh, i64 sw, i64 dh,
                       i64 dw, i64 pt, i64 pl, i64 Ho, i64 Wo, std::int32_t zx, std::int32_t* acc) {
  std::fill(acc, acc + Ho * Wo, 0);
  for (i64 ky = 0; ky < kh; ++ky)
    for (i64 kx = 0; kx < kw; ++kx) {
      const std::int32_t wt = w[ky * kw + kx];
      const i64 off = kx * dw - pl;
      const i64 lo = std::min(Wo, off >= 0 ? i64{0} : (-off + sw - 1) / sw);
      const i64 hi = std::max(lo, std::min(Wo, W - 1 - off < 0 ? i64{0} : (W - 1 - off) / sw + 1));
      for (i64 oy = 0; oy < Ho; ++oy) {
        const i64 iy = oy * sh - pt + ky * dh;
        if (iy < 0 || iy >= H) continue;  // padding: x - x_zp = 0
        const T* srow = plane + iy * W + off;
        std::int32_t* a = acc + oy * Wo;
        if (sw == 1)
          for (i64 ox = lo; ox < hi; ++ox) a[ox] += (static_cast<std::int32_t>(srow[ox]) - zx) * wt;
        else
          for (i64 ox = lo; ox < hi; ++ox) a[ox] += (static_cast<std::int32_t>(srow[ox * sw]) - zx) * wt;
      }
    }
}

// The body of qconv / qconv_i32: x checked against the packed weights, then per image and group the GEMM into the
// output stage st (out: N x Cout x Ho x Wo elements of elem bytes; the stage's kind says which).
void run_qconv(const py::array& x, const QConv& c, const py::object& x_zp, OutStage st, i64 elem,
               const std::vector<i64>& strides, const std::vector<i64>& pads, const std::vector<i64>& dilations,
               const py::array& out, const char* fn) {
  need_8bit(x, fn, "x");
  pyx::need_contig(x, fn, "x");
  if (x.ndim() != 4) fail(std::string(fn) + ": x must be 4-D NCHW, got " + pyx::shape_str(x));
  const i64 N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  if (C != c.cin_g * c.groups)
    fail(std::string(fn) + ": x has " + std::to_string(C) + " channels, the weights expect " +
         std::to_string(c.cin_g * c.groups));
  const i64 sh = strides[0], sw = strides[1], dh = dilations[0], dw = dilations[1];
  const i64 pt = pads[0], pl = pads[1], pb = pads[2], pr = pads[3];
  const i64 Ho = (H + pt + pb - dh * (c.kh - 1) - 1) / sh + 1, Wo = (W + pl + pr - dw * (c.kw - 1) - 1) / sw + 1;
  if (Ho <= 0 || Wo <= 0) fail(std::string(fn) + ": empty output");
  const i64 P = Ho * Wo, og = c.cout / c.groups, K = c.cin_g * c.kh * c.kw;
  need_out_size(out, N * c.cout * P, fn);
  const std::vector<std::int32_t> zx = zero_points(x_zp, x, 1, fn, "x_zero_point");
  const std::int32_t* ibias = st.ibias;
  const bool s8 = is_s8(x);
  const std::uint8_t flip = s8 ? 0x80 : 0;
  const std::int32_t za = zx[0] + (s8 ? 128 : 0);
  const std::uint8_t pad_value = static_cast<std::uint8_t>(za);  // a' of the zero point: contributes nothing
  const i64 lda = ((K + 3) / 4) * 4;
  const auto* xs = static_cast<const std::uint8_t*>(x.data());
  auto* o = static_cast<std::uint8_t*>(pyx::mptr<void>(out));
  py::gil_scoped_release nogil;
  if (!c.depthwise.empty()) {
    // per channel: exact sums, then the output stage with this channel's multiplier and bias along the positions
    const std::vector<std::int32_t> zeros(static_cast<std::size_t>(std::max(P, c.cout)), 0);  // no corrections
    const Corrections cr{zeros.data(), zeros.data(), zeros.data(), zeros.data(), 1, 0};
    parallel_for(N * c.cout, threads_for(static_cast<double>(N * c.cout * P * K), 2e5), [&](i64 task) {
      const i64 n = task / c.cout, ch = task % c.cout;
      std::vector<std::int32_t> acc(static_cast<std::size_t>(P));
      std::vector<float> sc(static_cast<std::size_t>(P), st.scale ? st.scale[ch] : 0.0f);
      std::vector<std::int32_t> ib(static_cast<std::size_t>(P), ibias ? ibias[ch] : 0);
      const std::int32_t* w = c.depthwise.data() + ch * K;
      if (s8)
        depthwise_channel(reinterpret_cast<const std::int8_t*>(xs) + (n * C + ch) * H * W, H, W, w, c.kh, c.kw, sh,
                          sw, dh, dw, pt, pl, Ho, Wo, zx[0], acc.data());
      else
        depthwise_channel(xs + (n * C + ch) * H * W, H, W, w, c.kh, c.kw, sh, sw, dh, dw, pt, pl, Ho, Wo, zx[0],
                          acc.data());
      OutStage sc_st = st;  // row = the channel, columns = its positions
      sc_st.scale = sc.data();
      sc_st.ibias = ib.data();
      sc_st.out = o + (n * c.cout) * P * elem;
      sc_st.rs = P;
      sc_st.cs = 1;
      qk().finish(sc_st, cr, ch, 1, 0, static_cast<int>(P), acc.data(), P);
    });
    return;
  }
  const i64 HW = H * W, cg = c.cin_g;
  // A kh x 1 kernel on a one-column image (a 1-D convolution: magika's), undilated: row p of the im2col matrix is
  // kh consecutive positions of the channels-innermost image, so the GEMM reads that image in place (rows sh * cg
  // bytes apart, the pads as rows of the zero point) and the im2col copy is skipped.
  const bool column_image = W == 1 && c.kw == 1 && Wo == 1 && dh == 1;
  // A 1 x 1 kernel, unstrided and unpadded: row p of the im2col matrix is position p's channels, the image itself.
  const bool pointwise = c.kh == 1 && c.kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && pb == 0 && pr == 0;
  const bool in_place = column_image || pointwise;
  const i64 pad_rows = column_image ? pt + pb : 0;
  std::vector<std::uint8_t> cols(in_place ? 0 : static_cast<std::size_t>(P * lda + 4), 0);
  std::vector<std::uint8_t> hwc(static_cast<std::size_t>((HW + pad_rows) * cg + 4), pad_value);
  std::uint8_t* image = hwc.data() + (column_image ? pt * cg : 0);
  const double work = static_cast<double>(P * K + HW * cg);
  const int T = threads_for(work, 1 << 17);
  const bool wake = work >= kWakeElementWork;
  for (i64 n = 0; n < N; ++n)
    for (i64 g = 0; g < c.groups; ++g) {
      // The group's channels moved innermost (hwc[position][ci], a' = x ^ flip), in 32 x 32 blocks; then row p of
      // A is, tap by tap, that tap's input position's channels (one copy of cin_g bytes) or the zero point's a'.
      const std::uint8_t* planes = xs + ((n * C) + g * cg) * HW;
      const i64 pblocks = (HW + 31) / 32;
      parallel_for(pblocks, T, [&](i64 pb) {
        const i64 p0 = pb * 32, p1 = std::min(HW, p0 + 32);
        for (i64 c0 = 0; c0 < cg; c0 += 32) {
          const i64 c1 = std::min(cg, c0 + 32);
          to_channels_last(planes, HW, image, cg, p0, p1, c0, c1, flip);
        }
      }, wake);
      if (!in_place) parallel_for((P + 15) / 16, T, [&](i64 rb) {
        for (i64 pp = rb * 16; pp < std::min(P, rb * 16 + 16); ++pp) {
          const i64 oy = pp / Wo, ox = pp % Wo;
          std::uint8_t* d = cols.data() + pp * lda;
          for (i64 ky = 0; ky < c.kh; ++ky) {
            const i64 iy = oy * sh - pt + ky * dh;
            for (i64 kx = 0; kx < c.kw; ++kx, d += cg) {
              const i64 ix = ox * sw - pl + kx * dw;
              const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
              if (cg == 1)  // one channel (a grey image's first conv): a byte, not a library call
                *d = inside ? image[iy * W + ix] : pad_value;
              else if (inside)
                std::memcpy(d, image + (iy * W + ix) * cg, static_cast<std::size_t>(cg));
              else
                std::memset(d, pad_value, static_cast<std::size_t>(cg));
            }
          }
        }
      }, wake);
      const QPacked& p = *c.packed[static_cast<std::size_t>(g)];
      OutStage sg = st;
      sg.scale = st.scale ? st.scale + g * og : nullptr;
      sg.ibias = ibias ? ibias + g * og : nullptr;
      sg.out = o + ((n * c.cout) + g * og) * P * elem;
      sg.rs = 1;
      sg.cs = P;
      const AOperand ao = column_image ? AOperand{hwc.data(), sh * cg, &za, 1}
                          : pointwise  ? AOperand{hwc.data(), cg, &za, 1}
                                       : AOperand{cols.data(), lda, &za, 1};
      qgemm(p, ao, P, sg);
    }
}

void py_qconv(const py::array& x, const QConv& c, const py::object& x_zp, const py::array& x_scale,
              const py::array& w_scale, const py::array& y_scale, const py::array& y_zp, const py::object& bias,
              const std::vector<i64>& strides, const std::vector<i64>& pads, const std::vector<i64>& dilations,
              const py::array& out) {
  if (pyx::dkey(out) != pyx::dkey(y_zp)) fail("qconv: out must have y_zero_point's dtype");
  OutStage st;
  std::vector<float> mult;
  requant_stage(st, mult, x_scale, w_scale, y_scale, y_zp, c.cout, "qconv");
  py::array bias_arr;
  if (!bias.is_none()) {
    bias_arr = py::array::ensure(bias, py::array::c_style);
    if (pyx::dkey(bias_arr) != "i4" || static_cast<i64>(bias_arr.size()) != c.cout)
      fail("qconv: bias must be int32 with Cout values");
    st.ibias = pyx::cptr<std::int32_t>(bias_arr);
  }
  run_qconv(x, c, x_zp, st, 1, strides, pads, dilations, out, "qconv");
}

// ConvInteger: the exact int32 sums of (x - x_zero_point) (w - w_zero_point), NCHW.
void py_qconv_i32(const py::array& x, const QConv& c, const py::object& x_zp, const std::vector<i64>& strides,
                  const std::vector<i64>& pads, const std::vector<i64>& dilations, const py::array& out) {
  if (pyx::dkey(out) != "i4") fail("qconv_i32: out must be int32");
  OutStage st;  // I32
  run_qconv(x, c, x_zp, st, 4, strides, pads, dilations, out, "qconv_i32");
}

// ConvInteger -> Add (an int32 bias per output channel) -> Cast -> Mul (a scale, times an optional factor of one
// value or one per output channel: the activation scale x weight scale) of dynamically quantized CNNs, as one
// conv: float32(acc + ibias[c]) * float32(scale * factor), the values those nodes compute.
void py_qconv_f32(const py::array& x, const QConv& c, const py::object& x_zp, const py::array& scale,
                  const py::object& factor, const py::object& ibias, const std::vector<i64>& strides,
                  const std::vector<i64>& pads, const std::vector<i64>& dilations, const py::array& out) {
  const char* fn = "qconv_f32";
  pyx::need_f32(out, fn, "out");
  pyx::need_f32(scale, fn, "scale");
  if (scale.size() != 1) fail("qconv_f32: scale must be a single value");
  py::array factor_arr, bias_arr;
  const float* f = nullptr;
  if (!factor.is_none()) {
    factor_arr = py::array::ensure(factor, py::array::c_style);
    pyx::need_f32(factor_arr, fn, "factor");
    // one value, or one per output channel (a QDQ model's per-channel weight scales: fuse_qdq_conv)
    if (factor_arr.size() != 1 && static_cast<i64>(factor_arr.size()) != c.cout)
      fail("qconv_f32: factor must have 1 or Cout (" + std::to_string(c.cout) + ") values");
    f = pyx::cptr<float>(factor_arr);
  }
  OutStage st;
  st.kind = OutStage::F32;
  std::vector<float> mult;
  const py::array sc = py::array::ensure(scale, py::array::c_style);
  column_scales(pyx::cptr<float>(sc), 1, f, f ? static_cast<i64>(factor_arr.size()) : 0, c.cout, mult);
  st.scale = mult.data();
  if (!ibias.is_none()) {
    bias_arr = py::array::ensure(ibias, py::array::c_style);
    if (pyx::dkey(bias_arr) != "i4" || static_cast<i64>(bias_arr.size()) != c.cout)
      fail("qconv_f32: the bias must be int32 with Cout (" + std::to_string(c.cout) + ") values");
    st.ibias = pyx::cptr<std::int32_t>(bias_arr);
  }
  run_qconv(x, c, x_zp, st, 4, strides, pads, dilations, out, fn);
}

// y = saturate(round(x / scale) + zp) with scale = (max(x, 0) - min(x, 0)) / 255 and
// zp = saturate(round(-min / scale)), in float32 arithmetic; an all-zero x gives scale 0, zp 0, y 0.
Op prep_dynamic_quantize(const py::array& x, const py::array& y, const py::array& scale, const py::array& zp) {
  const char* fn = "dynamic_quantize";
  pyx::need_f32(x, fn, "x");
  pyx::need_contig(x, fn, "x");
  pyx::need_out(y, fn, "y");
  if (!is_u8(y) || y.size() != x.size()) fail("dynamic_quantize: y must be uint8 with x's size");
  pyx::need_out(scale, fn, "scale");
  pyx::need_f32(scale, fn, "scale");
  pyx::need_out(zp, fn, "zero_point");
  if (!is_u8(zp) || scale.size() != 1 || zp.size() != 1) fail("dynamic_quantize: scale / zero_point: one float32 / uint8");
  const i64 n = static_cast<i64>(x.size());
  const float* xs = pyx::cptr<float>(x);
  auto* ys = static_cast<std::uint8_t*>(pyx::mptr<void>(y));
  float* s_out = pyx::mptr<float>(scale);
  auto* z_out = static_cast<std::uint8_t*>(pyx::mptr<void>(zp));
  return [n, xs, ys, s_out, z_out] {
    const QKernels& kr = qk();
    float lo = 0.f, hi = 0.f;
    if (n > 0) kr.minmax(xs, n, &lo, &hi);
    float s = 0.f;
    int z = 0;
    dynamic_quant_params(std::min(lo, 0.f), std::max(hi, 0.f), &s, &z);
    *s_out = s;
    *z_out = static_cast<std::uint8_t>(z);
    if (s == 0.f) {
      std::memset(ys, 0, static_cast<std::size_t>(n));
      return;
    }
    const i64 chunk = 1 << 16;
    const i64 tasks = (n + chunk - 1) / chunk;
    parallel_for(tasks, threads_for(static_cast<double>(n), 1 << 16), [&](i64 t) {
      const i64 b = t * chunk;
      kr.quantize8(xs + b, std::min(chunk, n - b), s, z, 0, 255, ys + b);
    }, static_cast<double>(n) >= kWakeElementWork);
  };
}

void py_dynamic_quantize(const py::array& x, const py::array& y, const py::array& scale, const py::array& zp) {
  run_now(prep_dynamic_quantize, x, y, scale, zp);
}

// The checked arguments of a per-tensor QuantizeLinear (one scale, one zero point; float32 in, 8-bit out).
struct PerTensorQuant {
  i64 n;
  const float* xs;
  std::uint8_t* ys;
  float scale;
  std::int32_t zero;
  int lo, hi;  // the output type's range
};

PerTensorQuant per_tensor_quant(const py::array& x, const py::array& scale, const py::object& zp,
                                const py::array& y, const char* fn) {
  pyx::need_f32(x, fn, "x");
  pyx::need_contig(x, fn, "x");
  pyx::need_f32(scale, fn, "scale");
  if (scale.size() != 1) fail(std::string(fn) + ": scale must be one value");
  need_8bit(y, fn, "y");
  need_out_size(y, static_cast<i64>(x.size()), fn);
  const std::vector<std::int32_t> z = zero_points(zp, y, 1, fn, "zero_point");
  const bool u8 = is_u8(y);
  return {static_cast<i64>(x.size()), pyx::cptr<float>(x), static_cast<std::uint8_t*>(pyx::mptr<void>(y)),
          pyx::cptr<float>(scale)[0], z[0], u8 ? 0 : -128, u8 ? 255 : 127};
}

// QuantizeLinear / DequantizeLinear with one scale and zero point (float32 <-> uint8 / int8).
void py_quantize_linear(const py::array& x, const py::array& scale, const py::object& zp, const py::array& y) {
  const PerTensorQuant q = per_tensor_quant(x, scale, zp, y, "quantize_linear");
  py::gil_scoped_release nogil;
  const QKernels& kr = qk();
  const i64 chunk = 1 << 16;
  parallel_for((q.n + chunk - 1) / chunk, threads_for(static_cast<double>(q.n), 1 << 16), [&](i64 t) {
    const i64 b = t * chunk;
    kr.quantize8(q.xs + b, std::min(chunk, q.n - b), q.scale, q.zero, q.lo, q.hi, q.ys + b);
  }, static_cast<double>(q.n) >= kWakeElementWork);
}

// y = QuantizeLinear(Gelu(x)) (exact or tanh form) with one scale and zero point: the Gelu kernel's floats for a
// block of x in an L1 buffer, then quantize8 on them -- the same bits as the two nodes, without the float tensor
// written and read back (a QDQ encoder's fc1 activation: MiniLM's 128 x 1536 values are 0.8 MB, past L1 / L2 reuse).
void py_gelu_quantize(const py::array& x, const py::array& scale, const py::object& zp, const py::array& y,
                      bool tanh_form) {
  const PerTensorQuant q = per_tensor_quant(x, scale, zp, y, "gelu_quantize");
  const int op = tanh_form ? U_GELU_TANH : U_GELU;
  py::gil_scoped_release nogil;
  const Kernels& ek = active();
  const QKernels& kr = qk();
  const i64 chunk = 1 << 14;  // a task's values; each through an L1 block of kBlock
  parallel_for((q.n + chunk - 1) / chunk, threads_for(static_cast<double>(q.n) * 8, 1 << 16), [&](i64 t) {
    constexpr i64 kBlock = 2048;  // 8 KB of floats: written by the Gelu, read at once by the quantize
    alignas(64) float buf[kBlock];
    const i64 end = std::min(q.n, (t + 1) * chunk);
    for (i64 b = t * chunk; b < end; b += kBlock) {
      const i64 m = std::min(kBlock, end - b);
      ek.unary(op, q.xs + b, buf, m, 0.f, 0.f);
      kr.quantize8(buf, m, q.scale, q.zero, q.lo, q.hi, q.ys + b);
    }
  }, static_cast<double>(q.n) * 8 >= kWakeElementWork);
}

void py_dequantize_linear(const py::array& x, const py::array& scale, const py::object& zp, const py::array& y) {
  const char* fn = "dequantize_linear";
  need_8bit(x, fn, "x");
  pyx::need_contig(x, fn, "x");
  pyx::need_f32(scale, fn, "scale");
  pyx::need_f32(y, fn, "y");
  need_out_size(y, static_cast<i64>(x.size()), fn);
  const std::vector<std::int32_t> z = zero_points(zp, x, 1, fn, "zero_point");
  const float s = pyx::cptr<float>(scale)[0];
  const i64 n = static_cast<i64>(x.size());
  float* ys = pyx::mptr<float>(y);
  const int zero = z[0];
  py::gil_scoped_release nogil;
  // (x - zp) is exact and its product with the float32 scale rounds once: the reference's float64 result rounded
  if (is_u8(x)) {
    const std::uint8_t* xs = pyx::cptr<std::uint8_t>(x);
    for (i64 i = 0; i < n; ++i) ys[i] = static_cast<float>(static_cast<int>(xs[i]) - zero) * s;
  } else {
    const std::int8_t* xs = pyx::cptr<std::int8_t>(x);
    for (i64 i = 0; i < n; ++i) ys[i] = static_cast<float>(static_cast<int>(xs[i]) - zero) * s;
  }
}

// x = DequantizeLinear(QuantizeLinear(x)) (+ bias[j] along the last axis) in place: a QDQ model's quantize-dequantize
// of a MatMulIntegerScaled's output, and the bias Add after it (`fuse_matmul_integer_fake_quant`), run on the
// product while it is still in cache, without the uint8 tensor and two more passes. The same arithmetic as
// quantize_linear (this ISA's quantize8), dequantize_linear and the float Add, so the same bits.
void py_fake_quant(const py::array& x, const py::array& scale, const py::array& zp, const py::object& bias) {
  const char* fn = "fake_quant";
  pyx::need_f32(x, fn, "x");
  pyx::need_out(x, fn);
  pyx::need_f32(scale, fn, "scale");
  need_8bit(zp, fn, "zero_point");
  if (scale.size() != 1 || zp.size() != 1) fail(std::string(fn) + ": scale and zero_point must be single values");
  const std::int32_t z = zero_points(zp, zp, 1, fn, "zero_point")[0];
  const bool u8 = is_u8(zp);
  const float s = pyx::cptr<float>(scale)[0];
  const i64 n = static_cast<i64>(x.size());
  const i64 cols = x.ndim() == 0 ? 1 : x.shape(x.ndim() - 1);
  const float* b = nullptr;
  py::array barr;
  if (!bias.is_none()) {
    barr = py::array::ensure(bias);
    pyx::need_f32(barr, fn, "bias");
    pyx::need_contig(barr, fn, "bias");
    if (static_cast<i64>(barr.size()) != cols) fail(std::string(fn) + ": bias must have one value a column");
    b = pyx::cptr<float>(barr);
  }
  float* xs = pyx::mptr<float>(x);
  py::gil_scoped_release nogil;
  if (n == 0 || cols == 0) return;
  const QKernels& kr = qk();
  const int qmin = u8 ? 0 : -128, qmax = u8 ? 255 : 127;
  const i64 rows = n / cols;
  parallel_for(rows, threads_for(static_cast<double>(n), 1 << 16), [&](i64 r) {
    kr.fake_quant(xs + r * cols, cols, s, z, qmin, qmax, b);
  }, static_cast<double>(n) >= kWakeElementWork);
}

}  // namespace

void bind(py::module_& m) {
  py::class_<QPacked, std::shared_ptr<QPacked>>(m, "QPacked", "An 8-bit B matrix packed for qgemm_* (qpack_b).")
      .def_property_readonly("k", [](const QPacked& p) { return p.k; })
      .def_property_readonly("n", [](const QPacked& p) { return p.n; });
  py::class_<QConv, std::shared_ptr<QConv>>(m, "QConvWeights", "8-bit conv weights packed per group (qconv_pack).")
      .def_property_readonly("groups", [](const QConv& c) { return c.groups; });
  m.def("qlinear_isa", [] { return std::string(qk().name); }, "The int8 kernel path in use (avx512vnni/avx2/generic).");
  m.def("qlinear_amx", [] { return amx_available() && g_use_amx.load(); },
        "Whether the int8 GEMM takes AMX blocks (when the active ISA is avx512 and K is a multiple of 64).");
  m.def("qlinear_use_amx", [](bool on) { g_use_amx.store(on); }, py::arg("on"),
        "Allow / forbid the AMX blocks (tests, benchmarks).");
  m.def("qpack_b", &py_qpack_b, py::arg("b"), py::arg("b_zero_point") = py::none());
  m.def("qgemm_i32", &py_qgemm_i32, py::arg("a"), py::arg("packed"), py::arg("a_zero_point"), py::arg("out"));
  m.def("qgemm_f32", &py_qgemm_f32, py::arg("a"), py::arg("packed"), py::arg("a_zero_point"), py::arg("scale"),
        py::arg("bias"), py::arg("out"), py::arg("factor") = py::none(), py::arg("addend") = py::none());
  m.def("qgemm_batched_f32", &py_qgemm_batched_f32, py::arg("a"), py::arg("b"), py::arg("a_zero_point"),
        py::arg("b_zero_point"), py::arg("scale"), py::arg("factor"), py::arg("out"),
        "out[i] = float32((a[i] - a_zp) @ (b[i] - b_zp)) * scale [* factor], both 8-bit operands at run time.");
  m.def("fake_quant", &py_fake_quant, py::arg("x"), py::arg("scale"), py::arg("zero_point"), py::arg("bias"),
        "x = DequantizeLinear(QuantizeLinear(x)) (+ bias along the last axis) in place, one scale and zero point.");
  m.def("qgemm_requant", &py_qgemm_requant, py::arg("a"), py::arg("packed"), py::arg("a_zero_point"),
        py::arg("a_scale"), py::arg("b_scale"), py::arg("y_scale"), py::arg("y_zero_point"), py::arg("out"));
  m.def("qconv_pack", &py_qconv_pack, py::arg("w"), py::arg("w_zero_point"), py::arg("groups"));
  m.def("qconv", &py_qconv, py::arg("x"), py::arg("weights"), py::arg("x_zero_point"), py::arg("x_scale"),
        py::arg("w_scale"), py::arg("y_scale"), py::arg("y_zero_point"), py::arg("bias"), py::arg("strides"),
        py::arg("pads"), py::arg("dilations"), py::arg("out"));
  m.def("qconv_i32", &py_qconv_i32, py::arg("x"), py::arg("weights"), py::arg("x_zero_point"), py::arg("strides"),
        py::arg("pads"), py::arg("dilations"), py::arg("out"),
        "ConvInteger: int32 sums of (x - x_zero_point)(w - w_zero_point), 2-D NCHW (a 1-D conv as H = 1).");
  m.def("qconv_f32", &py_qconv_f32, py::arg("x"), py::arg("weights"), py::arg("x_zero_point"), py::arg("scale"),
        py::arg("factor"), py::arg("bias"), py::arg("strides"), py::arg("pads"), py::arg("dilations"), py::arg("out"),
        "hetero::ConvIntegerScaled: float32(ConvInteger + int32 bias[c]) * float32(scale * factor), 2-D NCHW.");
  m.def("quantize_linear", &py_quantize_linear, py::arg("x"), py::arg("scale"), py::arg("zero_point"), py::arg("y"));
  m.def("dequantize_linear", &py_dequantize_linear, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("y"));
  m.def("gelu_quantize", &py_gelu_quantize, py::arg("x"), py::arg("scale"), py::arg("zero_point"), py::arg("y"),
        py::arg("tanh") = false, "hetero::GeluQuantizeLinear: QuantizeLinear(Gelu(x)), one scale and zero point.");
  m.def("dynamic_quantize", &py_dynamic_quantize, py::arg("x"), py::arg("y"), py::arg("scale"), py::arg("zero_point"));
  register_step_op("qgemm_f32", prep_qgemm_f32);
  register_step_op("dynamic_quantize", [](const py::tuple& a) {
    step_arity(a, 4, 4, "dynamic_quantize");
    return prep_dynamic_quantize(step_array(a, 0, "dynamic_quantize"), step_array(a, 1, "dynamic_quantize"),
                                 step_array(a, 2, "dynamic_quantize"), step_array(a, 3, "dynamic_quantize"));
  });
}

}  // namespace qlin

void bind_qlinear(py::module_& m) { qlin::bind(m); }

}  // namespace hetero
