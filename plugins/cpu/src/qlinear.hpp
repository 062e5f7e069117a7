// 8-bit integer matrix products for the quantized ONNX ops (MatMulInteger, QLinearMatMul, QLinearConv, and the
// fused MatMulInteger -> Cast -> Mul of dynamically quantized models), and DynamicQuantizeLinear.
//
// Exact integer semantics: with a' = a (uint8) or a + 128 (int8, so a' is uint8) and b' = b (int8) or b - 128
// (uint8, so b' is int8), and the zero points moved the same way,
//   sum_k (a - za)(b - zb) = sum_k a'b' - za' colsum(b') - zb' rowsum(a') + K za' zb'
// where every term is int32 (wrapping like onnxruntime's int32 accumulators for absurd K). The raw sums a'b' are
// computed per ISA (qlinear_<isa>.cpp, instantiated from qlinear_impl.hpp): AVX-512 VNNI `vpdpbusd`; AVX2 widens to
// 16 bits and uses `vpmaddwd` (exact, unlike `vpmaddubsw`, which saturates pairs of u8 x s8 products); generic C++.
//
// Packed B: ceil(N / 16) panels of 16 columns; a panel holds ceil(K / 4) groups of 16 columns x 4 consecutive k
// (64 bytes, the operand layout of vpdpbusd), zero past K and N.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "common.hpp"

namespace hetero {
namespace qlin {

constexpr int kPanel = 16;  // columns per packed panel
constexpr int kMR = 4;      // rows per tile
constexpr int kNP = 4;      // panels per tile (64 columns)
// B of at most this many columns also keeps each column's bytes contiguous (QPacked::cols): a product by it runs as
// row . column dots (DotFn), not tiles of a 16-column panel that is 15 / 16 zeros for one column.
constexpr int kDotColumns = 4;

// Raw tile: c[r * ldc + j] = sum_g sum_t a[r * lda + 4 g + t] * panel_p[g][j % 16][t] for r < m, j < np * 16,
// panels at b + p * pstride (bytes), k4 groups of 4 (a rows padded to 4 k4 bytes).
using TileFn = void (*)(int m, int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride,
                        std::int32_t* c, i64 ldc);
// Raw sums of a narrow product: raw[r * ldraw + j] = sum_k a[r * lda + k] * cols[j * kp + k] for r < rows, j < ncols
// (<= kDotColumns), k < kp (a multiple of 4; a rows padded with zeros to kp bytes).
using DotFn = void (*)(const std::uint8_t* a, i64 rows, i64 lda, const std::int8_t* cols, int ncols, i64 kp,
                       std::int32_t* raw, i64 ldraw);
// y[i] = saturate(round_half_even(x[i] / scale) + zp) to [qmin, qmax] (uint8: 0, 255; int8: -128, 127), stored as
// bytes; NaN -> qmin (what the reference gives for uint8: its float -> int cast of NaN reads 0).
using QuantizeFn = void (*)(const float* x, i64 n, float scale, int zp, int qmin, int qmax, std::uint8_t* y);
// x[i] = float32(quantized(x[i]) - zp) * scale (+ bias[i]): QuantizeFn's bytes dequantized (and a bias added) in place.
using FakeQuantFn = void (*)(float* x, i64 n, float scale, int zp, int qmin, int qmax, const float* bias);
// min and max of x[0:n] (n >= 1).
using MinMaxFn = void (*)(const float* x, i64 n, float* lo, float* hi);

// How the finished int32 sums leave the GEMM: value (m, n) = raw - za[m] colsum[n] - zb[n] (rowsum[m] - K za[m]),
// then int32 as it is, or float32(value (+ ibias[n])) * scale[n] (+ bias[n]), or requantized to 8 bits:
// saturate(round_half_even(float32(value + ibias[n]) * scale[n]) + y_zp).
struct OutStage {
  enum Kind { I32, F32, Q8 } kind = I32;
  void* out = nullptr;
  i64 rs = 0, cs = 0;                   // element strides of out (row m, column n)
  const float* scale = nullptr;         // F32 / Q8: N multipliers
  const float* fbias = nullptr;         // F32: N values added after the multiply
  const float* addend = nullptr;        // F32: a value per output added last (rows add_rs apart, columns adjacent)
  i64 add_rs = 0;
  const std::int32_t* ibias = nullptr;  // F32 / Q8: N values added to the int32 value first (wrapping)
  int y_zp = 0, qmin = 0, qmax = 255;   // Q8
  bool y_unsigned = true;
};

// The column terms of one GEMM (from the packed B) and the row terms (from A).
struct Corrections {
  const std::int32_t* colsum;  // [N]
  const std::int32_t* zb;      // [N]
  const std::int32_t* rowsum;  // [M]
  const std::int32_t* za;      // [M], or one value when za_count == 1
  i64 za_count, k;
};

// Finishes rows [m0, m0 + rows) x columns [n0, n0 + ncols) from raw sums (raw[r * ldraw + j]).
using FinishFn = void (*)(const OutStage& st, const Corrections& cr, i64 m0, int rows, i64 n0, int ncols,
                          const std::int32_t* raw, i64 ldraw);
// rowsum[r] = sum of the first k bytes of row r (rows lda apart).
using RowSumFn = void (*)(const std::uint8_t* a, i64 rows, i64 k, i64 lda, std::int32_t* rowsum);

// The tile (TileFn's m, np, panels) of rows [m0, m0 + m) and columns [n0, n0 + ncols) finished straight into an F32
// stage with contiguous rows (st.cs == 1), as tile then finish would.
using TileF32Fn = void (*)(int m, int np, i64 k4, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride,
                           const Corrections& cr, const OutStage& st, i64 m0, i64 n0, int ncols);

struct QKernels {
  const char* name;
  int mr, np;  // the tile this ISA's registers hold: rows, panels
  TileFn tile;
  QuantizeFn quantize8;
  MinMaxFn minmax;
  FinishFn finish;
  RowSumFn rowsums;
  TileF32Fn tile_f32;  // nullptr: tile, then finish
  int f32_mr, f32_np;  // tile_f32's rows and panels
  DotFn dot;           // products by B of <= kDotColumns columns
  FakeQuantFn fake_quant;
  // vpmaddubsw tile over QPacked::pairs' bounded copy of B (nullptr: none), rows per call <= kMR, any np
  TileFn tile_pairs;
};

// AMX (qlinear_amx.cpp): whether this CPU has AMX-INT8 and the kernel let this process use the tile registers, and
// the 32 x 32 block: raw[32][32] (ldraw 32) = A rows [0, 32) (lda apart) . B panels p0, p0 + 1 over k (k % 64 == 0).
bool amx_available();
void amx_begin();  // loads the tile configuration on this thread
void amx_end();    // releases it
void amx_block32(i64 k, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* raw);
void amx_block16(i64 k, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride, std::int32_t* raw);  // rows 0-15
// raw (16 rows x 16 np columns, ldraw apart) = A rows [0, 16) . B panels [0, np) (panels pstride apart, k % 64 == 0):
// the recurrent product of a quantized LSTM step (a few rows, its slice of panels read once)
void amx_panels16(i64 k, int np, const std::uint8_t* a, i64 lda, const std::int8_t* b, i64 pstride,
                  std::int32_t* raw, i64 ldraw);

template <class T>
struct AlignedVec {  // 64-byte aligned, for the packed panels' aligned loads
  T* p = nullptr;
  std::size_t n = 0;
  explicit AlignedVec(std::size_t count) : n(count) {
    const std::size_t bytes = ((count * sizeof(T) + 63) / 64) * 64;
    p = static_cast<T*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes == 0 ? 64 : bytes);
  }
  AlignedVec(const AlignedVec&) = delete;
  AlignedVec& operator=(const AlignedVec&) = delete;
  ~AlignedVec() { std::free(p); }
};

// B's panels rewritten so that no vpmaddubsw pair sum can saturate int16 for any uint8 a: in each pair of bytes
// (k 0+1, k 2+3 of a group) the positive parts sum to <= 128 and the negative parts to >= -128 (255 * 128 = 32640),
// the second byte moved toward zero where they do not; fix-ups give the moved part back exactly (raw += a[k] r).
// Real weights need few: the T5 encoder's 56 int8 matrices, 910 of 9.4 M pairs.
constexpr int kMaxPairFixShare = 32;   // B keeps a PairSafe only where at most 1 in this many pairs needs a fix-up
struct PairFix {
  std::int32_t k, col, r;  // column col (in its panel, 0-15) += a[k] * r
};
struct PairSafe {
  std::unique_ptr<AlignedVec<std::int8_t>> data;  // QPacked::data's layout
  std::vector<PairFix> fixes;                      // by panel
  std::vector<i64> first;                          // fixes of panel q: [first[q], first[q + 1])
};

// B (K x N, int8 or uint8) in panels, with its zero point(s) and column sums in the b' = int8 domain.
struct QPacked {
  i64 k = 0, n = 0, k4 = 0, panels = 0;
  bool b_unsigned = false;
  std::unique_ptr<AlignedVec<std::int8_t>> data;
  std::vector<std::int32_t> colsum;  // sum_k b'[k][n]
  std::vector<std::int32_t> zb;      // zb'[n]
  std::vector<std::int8_t> cols;     // n <= kDotColumns: column j's 4 k4 bytes of b' at j * 4 k4, zero past K
  std::unique_ptr<PairSafe> pairs;   // built where the active kernels have tile_pairs (AVX2)
  i64 pstride() const { return k4 * 64; }
};

// The A operand of qgemm.
struct AOperand {
  const std::uint8_t* a;  // rows of a' (uint8), lda bytes apart, K real values then zeros to 4 * k4
  i64 lda;
  const std::int32_t* za;  // za'[m] (one value when za_count == 1)
  i64 za_count;
};

// b: K x N at (rs, cs) element strides (p.k, p.n set first); zero point: one or N values.
void pack_into(QPacked& p, const std::uint8_t* b, i64 rs, i64 cs, bool b_unsigned, const std::int32_t* zp,
               i64 zp_count);
// The threaded integer GEMM over rows [0, M) of a, through the output stage (nested in a parallel_for: serial).
// Up to kMR rows run on the ISA's vector tiles (not AMX), split across threads by the bytes of B.
void qgemm(const QPacked& p, const AOperand& a, i64 M, const OutStage& st);
// The copy of B the active kernels' tile_pairs runs on (AVX2, where pack_into built one), else null: B packed under
// another ISA than the one running keeps to the plain tiles on p.data.
inline const PairSafe* pair_safe(const QKernels& kr, const QPacked& p) {
  return kr.tile_pairs ? p.pairs.get() : nullptr;
}
// raw (m <= kMR rows, ldc apart) = A rows . panels [p0, p0 + np) of B: tile_pairs on ps plus its fix-ups where ps is
// given (pair_safe), else kr.tile on p.data; the same exact int32 sums either way.
void tile_raw(const QKernels& kr, const QPacked& p, const PairSafe* ps, int m, int np, i64 p0, const std::uint8_t* a,
              i64 lda, std::int32_t* raw, i64 ldc);
// out[n] = float32(scale[ns == 1 ? 0 : n] * factor[nf == 1 ? 0 : n]) (no factor: scale), the F32 stage's multipliers.
void column_scales(const float* scale, i64 ns, const float* factor, i64 nf, i64 n, std::vector<float>& out);
// DynamicQuantizeLinear's scale (hi - lo) / 255 and zero point round(-lo / scale) for lo = min(x, 0), hi = max(x, 0).
void dynamic_quant_params(float lo, float hi, float* scale, int* zero_point);

const QKernels* qkernels_generic();
const QKernels* qkernels_avx2();        // nullptr unless x86-64
const QKernels* qkernels_avx512vnni();  // nullptr unless x86-64
const QKernels& qk();                   // the active ISA's

}  // namespace qlin
}  // namespace hetero
