// Extra ONNX kernels of the CPU plugin (reductions, comparisons, Where, ArgMax/TopK, softmax over any axis,
// instance/group norm, PRelu, depthwise conv rows, Pad, Resize, ConvTranspose, LSTM/GRU).
//
// Like the main `Kernels` table (common.hpp), the vector bodies live in onnx_impl.hpp and are compiled once per
// ISA (onnx_kernels_<isa>.cpp, with that file's -m flags); the drivers in onnx_extra.cpp / rnn.cpp /
// conv_transpose.cpp are compiled without special flags and call through the table matching the active ISA.
#pragma once
#include <cstdint>

#include "common.hpp"
#include "conv.hpp"

namespace hetero {

enum ReduceOp : int { R_SUM, R_SUMSQ, R_L1, R_MAX, R_MIN, R_PROD, R_COUNT };
enum CmpOp : int { C_EQ, C_LT, C_LE, C_GT, C_GE, C_COUNT };

struct ExtraKernels {
  const char* name;
  // Reduction of one contiguous row (max/min propagate NaN).
  float (*reduce_row)(int op, const float* x, i64 n);
  // y[i] = op(y[i], x[i]) (for R_SUMSQ / R_L1 the x term is squared / absolute first).
  void (*reduce_acc)(int op, float* y, const float* x, i64 n);
  // The min and the max of one contiguous row in one pass (n >= 1; NaN propagates to both).
  void (*minmax_row)(const float* x, i64 n, float* lo, float* hi);
  // sum_i exp(x[i] - shift)
  float (*sumexp_row)(const float* x, i64 n, float shift);
  // y[i] += exp(x[i] - shift[i])
  void (*sumexp_acc)(float* y, const float* x, const float* shift, i64 n);
  // Softmax (or log-softmax) over the n rows of an (n, inner) block of rows ld floats apart, independently per
  // column. scratch: 2*inner.
  void (*softmax_cols)(const float* x, float* y, i64 n, i64 inner, i64 ld, bool log, float* scratch);
  // y = a * (x - m) + b (centring first keeps large offsets exact)
  void (*affine_row)(const float* x, float* y, i64 n, float m, float a, float b);
  // Two-pass mean and population variance.
  void (*mean_var_row)(const float* x, i64 n, float* mean, float* var);
  // y = x >= 0 ? x : slope * x; slope a scalar (*slope) when slope_vec is false.
  void (*prelu_row)(const float* x, const float* slope, bool slope_vec, float* y, i64 n);
  // Depthwise taps: out[oy*Wo + ox] = bias + sum_t w[t] * base[oy*ystride + off[t] + ox] for ox in [0, Wo). The last
  // columns of a row run as one whole vector: base must be readable `lanes` floats past the last value a tap reads.
  // Then the activation `act` (UnaryOp, -1 none; alpha / beta as k_unary's) where it is one the kernel applies in
  // registers (ReLU, Clip, HardSwish, HardSigmoid, SiLU): true; false leaves it to the caller. kh: the taps' rows
  // (ntaps / kh each), sh: input rows an output row (ystride / sh floats apart): where off[] is such a grid with
  // dilation 1, a kernel may load each input row once for the output rows it feeds. [vlo, vhi): the buffer's rows
  // (ystride / sh floats apart from base) that hold input; the others are zero padding a kernel may skip.
  bool (*dw_taps)(const float* base, i64 ystride, const i64* off, const float* w, int ntaps, int kh, int sh,
                  float bias, float* out, i64 Ho, i64 Wo, i64 vlo, i64 vhi, int act, float alpha, float beta);
  // dst[r*ld_dst + i] = src[r*ld_src + i] for r < rows, i < n: a plane's rows into its padded copy, where a memcpy
  // call for each short row cost as much as the depthwise taps.
  void (*copy_rows)(const float* src, i64 ld_src, float* dst, i64 ld_dst, i64 rows, i64 n);
  // src[0, 2, 4, ...] -> even, src[1, 3, ...] -> odd (n values in all): the column phases of stride-2 convs / pools.
  void (*deinterleave)(const float* src, i64 n, float* even, float* odd);
  // deinterleave of `rows` rows: row r of src at src + r ld_src, its phases at even / odd + r ld_dst.
  void (*deinterleave_rows)(const float* src, i64 ld_src, i64 n, i64 rows, float* even, float* odd, i64 ld_dst);
  // Depthwise conv of channels [c0, c0 + nc), nc <= lanes, of one image (x, out: the image's NCHW planes; w: the
  // (C, kh*kw) weights), channel-blocked: a vector of nc channels per output position (small planes, where a row is
  // less than a vector). Activation as dw_taps (false: the caller applies it). scratch: dw_nchwc_scratch floats.
  bool (*dw_nchwc)(const ConvGeom& g, const float* x, const float* w, const float* bias, i64 c0, i64 nc, float* out,
                   float* scratch, int act, float alpha, float beta);
  // y[i] = a[i] op b[i] (mode: BinaryMode of common.hpp), 0/1 bytes.
  void (*cmp_f32)(int op, int mode, const float* a, const float* b, std::uint8_t* y, i64 n);
  // out[j] = max over the kh rows (row r at x + r*ld) of x[r*ld + j]; NaN propagates.
  void (*max_rows)(const float* x, i64 ld, i64 rows, float* out, i64 n);
  // One output row of a max pool of stride 2 along W (dilation 1 along W, kw <= 3): v[pl + i] = max over the nrows
  // input rows (row r at x + r*ld, w values each) of column i, then out[j] = max(v[2j], ..., v[2j + kw - 1]) for
  // j < wo. v: the caller's row, -inf at [0, pl) and from pl + w to 2 wo + kw (so taps past the input are -inf); only
  // [pl, pl + w) is written. scratch: 2 wo + 2 floats. NaN propagates.
  void (*max_pool_s2_row)(const float* x, i64 ld, i64 nrows, i64 w, i64 pl, i64 kw, float* v, float* out, i64 wo,
                          float* scratch);
  // y = clamp(y + b, lo, hi) (NaN passes through): the bias + ReLU / ReLU6 / Clip epilogue in one pass.
  void (*bias_clamp_row)(float* y, i64 n, float b, float lo, float hi);
  // y = act(y + b) in one pass for the activations conv models fuse most (SiLU, sigmoid, hard-swish); false, y
  // untouched, for another act.
  bool (*bias_act_row)(float* y, i64 n, float b, int act, float alpha, float beta);
  // Packed-B panels (width nr) of columns [j0, j0 + ncols) of the im2col matrix of one image/group (conv.cpp).
  void (*im2col_block)(const ConvGeom& g, const float* x, i64 cin_g, int nr, i64 j0, i64 ncols, float* dst);
  // c[i*ldc + j] = dot(row i of a, row j of b) for i < m, j < n; k a multiple of 16, both sides zero-padded to it
  // (the small-output convolution of conv.cpp: weight rows against input patches).
  void (*dot_nt)(const float* a, i64 lda, i64 m, const float* b, i64 ldb, i64 n, i64 k, float* c, i64 ldc);
  // Direct-convolution tile (mr x nr, the GEMM's): c[r][j] = sum_k a[k*mr + r] * base[off[k] + j] (a: one packed A
  // panel; base + off[k]: row k of B in place in the padded input), nrows x ncols of it stored. False where this
  // ISA has no kernel for that tile shape.
  bool (*conv_tile)(int mr, int nr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc,
                    int nrows, int ncols);
  // conv_tile with the epilogue in registers: c = act(tile + bias[r]) (bias[r] for tile row r; null: none), act one
  // of those the depthwise kernels apply in registers (-1 none, ReLU, Clip, LeakyRelu, LeakyReluMin, HardSwish,
  // HardSigmoid, SiLU). False, nothing computed, for another activation or tile shape.
  bool (*conv_tile_ep)(int mr, int nr, i64 K, const float* a, const float* base, const i64* off, float* c,
                       i64 ldc, int nrows, int ncols, const float* bias, int act, float alpha, float beta);
  // Channel-blocked direct convolution of `rows` output rows of n positions (position p of row r reads
  // base[r * rs + off[k] + p * sw], sw 1 or 2) for one block of 2 x lanes output channels (lanes >= 8: the caller
  // checks): w the block's K x (2 lanes) packed weights, bias 2 x lanes floats, out[c * ldo + r * n + p] for c < nc.
  // Activation as dw_taps's (false: bias alone applied, the caller runs the activation).
  bool (*conv_cblk)(int sw, i64 K, const float* w, const float* base, const i64* off, const float* bias, int nc,
                    float* out, i64 ldo, i64 n, i64 rows, i64 rs, int act, float alpha, float beta);
  // Winograd F(4x4, 3x3) input / output transforms of `lanes` tiles at once (conv_winograd.cpp; layouts in
  // onnx_impl.hpp): lane l of each of the 36 (or 16) vectors belongs to tile l.
  void (*wino_in)(const float* chan, const std::int32_t* off, const i64* eoff, bool consecutive, float* v,
                  i64 vstride);
  void (*wino_out)(const float* m, i64 mstride, float bias, float* y);
  // wino_out + activation + the tiles' stores into the output plane (onnx_impl.hpp x_wino_store); false: not done
  bool (*wino_store)(const float* m, i64 mstride, float bias, int act, float alpha, float beta,
                     const std::int32_t* out_off, const std::int32_t* extent, int n, float* plane, i64 Wo, float* y);
  // dst[k*nr + j] = float(q[k*nr + j]) * scale[j] for k < rows, j < nr: an int8 weight panel as the GEMM's floats.
  void (*dequant_panel_s8)(const std::int8_t* q, const float* scale, i64 rows, int nr, float* dst);
  // c[i*ldc + j] = dot(row i of a, column j of B) (+ bias[j], bias may be null) for i in [i0, i1), j < n <= 8:
  // gemm.cpp's few-column product; bt: B as gemm_narrow_pack lays it out (needs k >= lanes).
  void (*gemm_narrow)(const float* a, i64 lda, i64 i0, i64 i1, i64 k, const float* bt, i64 n, float* c, i64 ldc,
                      const float* bias);
  // Winograd F(4, 3) transforms along one axis of runs of n consecutive tiles (conv_winograd1d.cpp; layouts in
  // onnx_impl.hpp): the whole vectors of the run, returning how many tiles they covered (the caller does the rest).
  i64 (*wino1d_in)(const float* const* tap, i64 n, float* v, i64 vstride);
  i64 (*wino1d_out)(const float* m, i64 mstride, float bias, i64 n, float* y, i64 ldy, float* probe);
  // The same for F(4, 5) (five-tap kernels): 8 taps in, 8 products out.
  i64 (*wino1d5_in)(const float* const* tap, i64 n, float* v, i64 vstride);
  i64 (*wino1d5_out)(const float* m, i64 mstride, float bias, i64 n, float* y, i64 ldy, float* probe);
  // Rows of attention scores in place (row r at s + r * ld): s = s / divisor (skipped at 1) + mask (null: none; row
  // r's at mask + r * mask_rs; mask_vec: n values, else its first for all), then the softmax, rounded as the binary
  // ops and softmax_row run apart (the same bits) with one pass over the row fewer and no call per row or step.
  // x: the scores read (row r at x + r * ld), s: where they go (may be x).
  void (*scores_softmax_rows)(const float* x, float* s, i64 rows, i64 ld, i64 n, float divisor, const float* mask,
                              i64 mask_rs,
                              bool mask_vec);
  // conv_tile with A as rows in place (row r at a + r * lda) rather than a packed panel, nrows == mr: the same
  // bits. False where this ISA has no such tile, or for a short panel (the caller packs A).
  bool (*rows_tile)(int mr, int nr, i64 K, const float* a, i64 lda, const float* base, const i64* off, float* c,
                    i64 ldc, int nrows, int ncols);
  // dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols: W x W blocks transposed in registers where
  // the ISA has that (attention's K read through strides as K^T), the edges one value at a time.
  void (*transpose_into)(const float* src, i64 ld_src, i64 rows, i64 cols, float* dst, i64 ld_dst);
  bool transposes_in_registers;  // whether transpose_into moves whole blocks (else it is a scalar loop)
  int lanes;  // the SIMD width in floats: every kernel table's nr is a multiple of it
  // A 3x3 stride-2 depthwise conv (dilation 1, one column of padding on the left, pt rows on top) of one H x W plane
  // read in place, Ho x Wo outputs (+ bias, activation as dw_taps); zrow: W zeros (the rows of padding). The same
  // bits as dw_taps over depthwise's phase copy; its return as dw_taps's. nullptr where this ISA has no such kernel.
  bool (*dw3s2_plane)(const float* in, i64 H, i64 W, i64 pt, const float* zrow, const float* w, float bias,
                      float* out, i64 Ho, i64 Wo, int act, float alpha, float beta);
  // ncols (1 to 8) columns of conv_tile's product, each as one vector over the panel's mr rows (c[r * ldc + j] for r
  // < nrows, j < ncols): the same bits as the tile's columns. False where mr exceeds the lanes or ncols is out of
  // range.
  bool (*col_tile)(int mr, i64 K, const float* a, const float* base, const i64* off, float* c, i64 ldc, int nrows,
                   int ncols);
  // copy_rows of src + add (each value's float32 sum, as an Add node's): a depthwise conv's plane copy with the
  // scalar Add before it folded in (hetero.ConvInputShift).
  void (*copy_rows_add)(const float* src, i64 ld_src, float* dst, i64 ld_dst, i64 rows, i64 n, float add);
};

// Floats of scratch dw_nchwc needs at `lanes` channels (the interleaved padded planes, weights, output tile, offsets).
inline i64 dw_nchwc_scratch(const ConvGeom& g, int lanes) {
  const i64 Hp = (g.Ho - 1) * g.sh + (g.kh - 1) * g.dh + 1, Wp = (g.Wo - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  return (Hp * Wp + g.kh * g.kw + g.Ho * g.Wo) * lanes + 2 * (g.kh * g.kw + g.Ho * g.Wo) + 16;
}

const ExtraKernels* extra_generic();
const ExtraKernels* extra_avx2();    // nullptr unless x86-64
const ExtraKernels* extra_avx512();  // nullptr unless x86-64
const ExtraKernels* extra_neon();    // nullptr unless aarch64

// The table compiled for the same ISA as `kr` (generic if none).
const ExtraKernels& extra_for(const Kernels& kr);
inline const ExtraKernels& extra_active() { return extra_for(active()); }

}  // namespace hetero
