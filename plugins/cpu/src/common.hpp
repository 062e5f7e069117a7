// Shared declarations of the hetero CPU kernel library.
//
// Layout: the ISA-specific translation units (kernels_generic/avx2/avx512/neon.cpp) each fill one `Kernels`
// table; the drivers (gemm.cpp, elementwise.cpp, conv.cpp, data.cpp) are compiled once without special flags
// and call through the active table, so no AVX instruction can leak into code that runs before dispatch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace hetero {

using i64 = std::int64_t;

// ---- unary / binary / activation op ids (shared by all ISA tables) ----
enum UnaryOp : int {
  U_RELU, U_LEAKY_RELU, U_ELU, U_SELU, U_CELU, U_SIGMOID, U_HARD_SIGMOID, U_HARD_SWISH, U_SILU, U_GELU,
  U_GELU_TANH, U_TANH, U_SOFTPLUS, U_SOFTSIGN, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_NEG, U_ABS, U_RECIPROCAL,
  U_ERF, U_FLOOR, U_CEIL, U_ROUND, U_SIN, U_COS, U_CLIP, U_MISH, U_LEAKY_RELU_MIN, U_COUNT
};

// B_GELU_MUL / B_GELU_TANH_MUL: Gelu(a) * b in one pass (T5's GeGLU: Gelu of one projection times the other);
// B_ADD_RELU: Relu(a + b) in one pass (a residual net's Add then Relu)
enum BinaryOp : int {
  B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN, B_POW, B_GELU_MUL, B_GELU_TANH_MUL, B_ADD_RELU, B_COUNT
};

// How the two operands of a contiguous binary run advance: both vectors, b scalar, a scalar.
enum BinaryMode : int { BM_VV, BM_VS, BM_SV };

// ---- the per-ISA kernel table ----
struct LstmQPair;
struct Kernels {
  const char* name;
  // GEMM register/cache blocking. Packed B layout: ceil(N/nr) panels, each K x nr (row k holds nr floats).
  // Packed A layout: ceil(M/mr) panels, each K x mr.
  int mr, nr, kc, mc, nc;
  // Full mr x nr tile: c = alpha * (a_panel @ b_panel) + beta * c; beta == 0 never reads c.
  void (*ukernel)(i64 kc, const float* a, const float* b, float* c, i64 ldc, float alpha, float beta);
  // Small-M rows (1 <= m <= 4) against one packed B panel over the full K; a rows contiguous along k (lda
  // between rows). Writes the raw m x nr products to t (row stride nr).
  void (*smallm)(int m, i64 k, const float* a, i64 lda, const float* panel, float* t);
  // One row of A (contiguous) times np (1..4) packed panels, panel i at panels + i*pstride; writes np*nr floats.
  void (*gemv_panels)(i64 k, const float* a, const float* panels, i64 pstride, int np, float* t);
  // GEMV on an unpacked row-major B: y[0:n] = sum_k a[k] * b[k*ldb + 0:n]  (y overwritten).
  void (*gemv_rows)(i64 k, const float* a, const float* b, i64 ldb, i64 n, float* y);
  // GEMV on an unpacked B^T (n rows of length k): y[j] = dot(a, b[j*ldb : j*ldb+k]).
  void (*gemv_dot)(i64 k, const float* a, const float* b, i64 ldb, i64 n, float* y);
  // Elementwise on contiguous runs (in-place allowed: y may alias x / a / b).
  void (*unary)(int op, const float* x, float* y, i64 n, float alpha, float beta);
  void (*binary)(int op, int mode, const float* a, const float* b, float* y, i64 n);
  // Row kernels.
  void (*softmax_row)(const float* x, float* y, i64 n, bool log);
  void (*layernorm_row)(const float* x, const float* scale, const float* bias, float* y, i64 n, float eps,
                        float* mean_out, float* invstd_out);
  void (*rmsnorm_row)(const float* x, const float* scale, float* y, i64 n, float eps);
  // y = alpha * t + beta * y (beta == 0: y not read), n contiguous floats.
  void (*axpby)(const float* t, float* y, i64 n, float alpha, float beta);
  // One depthwise channel, stride 1 along w: see conv.cpp for the contract.
  void (*dw_row_accum)(const float* in, float* out, i64 n, float w);
  // One row of BroadcastUnaryMatMul's quantized Add -> Tanh chain: q = uint8 of tanh(a + b) at (scale, zp), and the
  // range of tanh(a + b) (see kernels_impl.hpp).
  void (*add_tanh_quantize_row)(const float* a, const float* b, i64 n, float scale, int zp, std::uint8_t* q,
                                float* lo, float* hi);
  // The quantized bidirectional LSTM's overlapped step (rnn.cpp; null where the ISA has none): see LstmQPair.
  void (*lstm_q_pair)(const LstmQPair& a);
};

// One call of Kernels::lstm_q_pair, batch 1, H % 16 == 0: one direction's recurrent tile (1 row, int8 R in the
// qlinear panels, 4 panels an item: raw_out[j] = sum_k hq[k] R'[k][j], exact int32) and, one 16-unit block before
// each item, the other direction's cell update from its previous tile's raw sums (the F32 stage, the input side, the
// default gates, no peepholes / clip / input_forget), with the same operations per value as rnn.cpp's finish +
// lstm_cell (so the same bits). hq == nullptr: no tile (run_direction's cells of one batch row: units from the
// pointers on); raw_in == nullptr: no cells.
struct LstmQPair {
  i64 k4 = 0, panels = 0, pstride = 0;  // tile: k groups of 4, panels (a multiple of 4), bytes between panels
  const std::uint8_t* hq = nullptr;
  const std::int8_t* b = nullptr;
  std::int32_t* raw_out = nullptr;
  i64 H = 0;                                  // cells: hidden units (the gates' stride in raw_in / colsum / ...)
  i64 units = 0;                              // cells: units from the pointers on (a multiple of 16), 0: H
  const std::int32_t* raw_in = nullptr;       // 4H raw sums (i, o, f, c gates)
  const std::int32_t* colsum = nullptr;       // the corrections of qlin::Corrections, one row
  const std::int32_t* zb = nullptr;
  std::int32_t za = 0, rowsum = 0;
  i64 K = 0;
  const float* col = nullptr;                 // 4H column multipliers
  const float* xw = nullptr;                  // 4H input side (bias included)
  float* c = nullptr;                         // H cell, updated
  float* h = nullptr;                         // H hidden, written
  float* y = nullptr;                         // H more copies of h, or null
};

// Tables defined by the ISA translation units (null when not compiled for this target).
const Kernels* kernels_generic();
const Kernels* kernels_avx2();    // nullptr unless x86-64
const Kernels* kernels_avx512();  // nullptr unless x86-64
const Kernels* kernels_neon();    // nullptr unless aarch64

// Active table (set_isa / auto detection in isa.cpp).
const Kernels& active();
std::string isa_name();
std::vector<std::string> available_isas();
void set_isa(const std::string& name);
const Kernels* kernels_by_name(const std::string& name);

// ---- threading (threadpool.cpp) ----
int num_threads();
void set_num_threads(int n);
// Runs f(task) for task in [0, ntasks) on at most max_threads threads (the caller takes part). Falls back to a
// serial loop when ntasks or max_threads is 1, when called from inside a pool task, or while another Python
// thread is using the pool (so concurrent callers never deadlock). With wake_sleepers false the tasks run on the
// caller alone when every worker is asleep: for work smaller than waking one costs (a futex wake of an idle core,
// tens of microseconds on a virtual machine). The tasks are the same either way, so the results are too.
void parallel_for_pooled(i64 ntasks, int max_threads, const std::function<void(i64)>& f, bool wake_sleepers);
bool pool_stats_enabled();
template <class F>
inline void parallel_for(i64 ntasks, int max_threads, const F& f, bool wake_sleepers = true) {
  // One thread: the loop runs here, before f becomes a std::function (a heap block for a lambda that captures more
  // than two pointers, on every call of a one-thread run). With statistics on, the pooled path counts the call.
  if (max_threads <= 1 && !pool_stats_enabled()) {
    for (i64 t = 0; t < ntasks; ++t) f(t);
    return;
  }
  parallel_for_pooled(ntasks, max_threads, f, wake_sleepers);
}

inline i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }  // a, b > 0
inline i64 floor_div(i64 a, i64 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }  // b > 0, a of either sign

// Threads worth using for `work` units of cost when one thread should get at least `grain` units.
inline int threads_for(double work, double grain) {
  int t = num_threads();
  if (work < 2 * grain || t <= 1) return 1;
  double want = work / grain;
  return want < t ? static_cast<int>(want) : t;
}

// Work below which a call runs on the caller alone when every pool worker is asleep (parallel_for's wake_sleepers):
// about what waking one costs on a virtual machine (20-40 us of one core). In fp32 flops (GEMM convolutions), and
// in the elementwise / row kernels' cost units (the `work` they pass to threads_for: element visits, x4 for
// transcendental and row ops).
constexpr double kWakeFlops = 4e6;
constexpr double kWakeElementWork = 2.5e5;
// Bytes of a weight each thread of a GEMV-like product (a few rows times a streamed B) should read for a split to pay
// (a pool round trip with the workers spinning is ~1-2 us; 128 KB from L3 takes ~4-5 us on one core).
constexpr double kSmallMSplitBytes = 128.0 * 1024;

// ---- aligned, grow-only scratch buffers ----
struct AlignedBuf {
  float* p = nullptr;
  std::size_t cap = 0;  // in floats
  AlignedBuf() = default;
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  ~AlignedBuf() { std::free(p); }
  void reset() {
    std::free(p);
    p = nullptr;
    cap = 0;
  }
  float* get(std::size_t n) {
    if (n > cap) {
      std::free(p);
      p = nullptr;
      std::size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
      p = static_cast<float*>(std::aligned_alloc(64, bytes == 0 ? 64 : bytes));
      if (!p) throw std::bad_alloc();
      cap = n;
    }
    return p;
  }
};

// Thread-local scratch slots (one per purpose, reused across calls).
AlignedBuf& tl_buf(int slot);
enum {
  TL_PACK_A = 0, TL_PACK_B = 1, TL_TMP = 2, TL_SMALLA = 3, TL_IM2COL = 4, TL_MISC = 5, TL_DEQUANT = 6, TL_BF16 = 7,
  TL_CONV_IN = 8, TL_CONV_OUT = 9, TL_NSLOTS = 10
};

// ---- GEMM (gemm.cpp) ----

// Epilogue applied once per finished output block: c += bias (broadcast through its strides), then activation.
struct Epilogue {
  const float* bias = nullptr;  // element (i, j) at bias[i*bias_rs + j*bias_cs]
  i64 bias_rs = 0, bias_cs = 0;
  int act = -1;  // UnaryOp id, -1 = none
  float act_alpha = 0.f, act_beta = 0.f;
  bool empty() const { return bias == nullptr && act < 0; }
};

// A general strided matrix view (strides in elements).
struct MatView {
  const float* p;
  i64 rows, cols, rs, cs;
  // group_rows > 0: the rows in groups of group_rows, group g's first at p + g * gs (a Conv1D's windows over a batch
  // of sequences, read in place as overlapping rows of the input). Only pack_a_block reads such a view (run_packed
  // sees to it); every other reader takes the plain form.
  i64 group_rows = 0, gs = 0;
  const float* row(i64 i) const {
    return group_rows > 0 ? p + (i / group_rows) * gs + (i % group_rows) * rs : p + i * rs;
  }
};

// Packs B (K x N view) into the panel layout of `kr`; dst holds ceil(N/nr)*nr*K floats.
void pack_b_panels(const Kernels& kr, const MatView& b, float* dst, int nthreads);

// A packed B held as int8 with one fp32 scale per column: the float panel layout with int8 values (ceil(N/nr)
// panels of K x nr), scale padded to whole panels. For weights that are int8 x scale exactly (a constant-folded
// Cast + Mul or DequantizeLinear): the GEMM turns each panel back into the same floats (one fp32 product per value)
// just before the micro-kernel reads it, so the results are those of the float panels, bit for bit, and a weight
// read from L3 or memory is a quarter of the bytes.
struct S8Panels {
  const std::int8_t* q;
  const float* scale;
};
// Packs b into dst (ceil(N/nr)*nr*K bytes) and scale (ceil(N/nr)*nr floats) when every column j is
// float(q) * scale[j] with q in [-128, 127], bit for bit (a -0 or a non-finite value is not); false otherwise
// (dst / scale then undefined).
bool pack_b_panels_s8(const Kernels& kr, const MatView& b, std::int8_t* dst, float* scale);
// Packs A (M x K view) into full-K mr panels; dst holds ceil(M/mr)*mr*K floats.
void pack_a_panels(const Kernels& kr, const MatView& a, float* dst);

// C (M x N, row stride ldc) = alpha * A @ Bp + beta * C, then epilogue. A is a strided view (packed per block)
// or, when a_packed != nullptr, full-K mr panels. Bp is full-K nr panels.
// With s8 set, B is int8 panels (bp unused).
void gemm_prepacked_b(const Kernels& kr, i64 M, i64 N, i64 K, const MatView* a, const float* a_packed,
                      const float* bp, float* c, i64 ldc, float alpha, float beta, const Epilogue& ep,
                      int nthreads, const S8Panels* s8 = nullptr);

// Full GEMM from strided views; chooses GEMV / small-M / blocked paths.
void gemm_views(const Kernels& kr, const MatView& a, const MatView& b, float* c, i64 ldc, float alpha, float beta,
                const Epilogue& ep, int nthreads);

// m (<= 4) rows of A times pre-packed B (the GEMV / decode path for packed weights).
void gemm_small_m_packed(const Kernels& kr, const MatView& a, const float* bp, i64 N, float* c, i64 ldc, float alpha,
                         float beta, const Epilogue& ep, int nthreads, const S8Panels* s8 = nullptr);

// Few-column products (N <= kNarrowMaxN, K >= the kernel table's lanes): B as N columns of whole vectors, each
// row of A against each column in registers, instead of 32-column panels that are mostly zeros (a dense layer to 5
// outputs over a Conv1D's positions). gemm_narrow_fits says whether `kr` takes a K x N weight so;
// gemm_narrow_values is the floats gemm_narrow_pack writes.
constexpr i64 kNarrowMaxN = 8;
bool gemm_narrow_fits(const Kernels& kr, i64 K, i64 N);
i64 gemm_narrow_values(const Kernels& kr, i64 K, i64 N);
void gemm_narrow_pack(const Kernels& kr, const MatView& b, float* dst);
// c = a bt (+ epilogue); false (nothing written) where alpha != 1, beta != 0 or A is not unit-stride along K.
bool gemm_narrow(const Kernels& kr, const MatView& a, const float* bt, i64 N, float* c, i64 ldc, float alpha,
                 float beta, const Epilogue& ep, int nthreads);

// Applies the epilogue to an m x n block of c.
void apply_epilogue(const Kernels& kr, float* c, i64 ldc, i64 row0, i64 col0, i64 m, i64 n, const Epilogue& ep);

}  // namespace hetero
