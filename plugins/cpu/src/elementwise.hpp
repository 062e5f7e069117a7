// Elementwise / row-wise driver entry points (elementwise.cpp).
#pragma once
#include "common.hpp"

namespace hetero {

enum class DType { F32, I32, I64 };
enum class RowOp { Softmax, LayerNorm, RmsNorm };

// out (contiguous, `shape`) = op(a, b); a and b strided in bytes with the same shape (0-strides broadcast).
void binary_nd(const Kernels& kr, int op, DType dt, const char* a, const i64* sa, const char* b, const i64* sb,
               char* out, int ndim, const i64* shape);

// out (contiguous) = op(x), x strided in bytes.
void unary_nd(const Kernels& kr, int op, const char* x, const i64* sx, float* out, int ndim, const i64* shape,
              float alpha, float beta);

// Row kernels over a (rows, n) float view with byte strides; out contiguous (rows, n). `addend` (contiguous (rows,
// n), or null): each row of x plus its row, in an L1 row buffer, is what the row op reads (an Add before a LayerNorm);
// `sum_out` (contiguous (rows, n), or null; with addend alone): that sum's row is written there instead.
void rows_nd(const Kernels& kr, RowOp rop, const char* x, i64 rows, i64 n, i64 row_stride, i64 col_stride,
             float* out, const float* scale, const float* bias, float eps, float* mean_out, float* invstd_out,
             bool log, const float* addend = nullptr, float* sum_out = nullptr);

}  // namespace hetero
