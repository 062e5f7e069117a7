// Elementwise and row-wise drivers: broadcasting/strided iteration, threading, dtype dispatch. The arithmetic
// itself runs in the active ISA table (float32) or in the integer loops below.
#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "elementwise.hpp"
#include "nd.hpp"

namespace hetero {
namespace {

constexpr i64 kChunk = 16384;  // elements per task

template <class T>
T int_op(int op, T x, T y) {
  using U = typename std::make_unsigned<T>::type;
  switch (op) {
    case B_ADD: return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));  // wraps, no UB
    case B_SUB: return static_cast<T>(static_cast<U>(x) - static_cast<U>(y));
    case B_MUL: return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
    case B_MAX: return x > y ? x : y;
    case B_MIN: return x < y ? x : y;
    case B_DIV:
      // ONNX Div on integers truncates toward zero (C semantics). x / 0 gives 0 (numpy's answer) and
      // MIN / -1 wraps, instead of trapping.
      if (y == 0) return 0;
      if (y == -1) return static_cast<T>(U(0) - static_cast<U>(x));
      return static_cast<T>(x / y);
    default: return 0;
  }
}

template <class T>
void int_row(int op, const char* a, i64 sa, const char* b, i64 sb, T* y, i64 n) {
  if (sa == sizeof(T) && sb == sizeof(T)) {
    const T* pa = reinterpret_cast<const T*>(a);
    const T* pb = reinterpret_cast<const T*>(b);
    switch (op) {  // separate loops so the compiler vectorises the common ops
      case B_ADD: for (i64 i = 0; i < n; ++i) y[i] = int_op<T>(B_ADD, pa[i], pb[i]); return;
      case B_SUB: for (i64 i = 0; i < n; ++i) y[i] = int_op<T>(B_SUB, pa[i], pb[i]); return;
      case B_MUL: for (i64 i = 0; i < n; ++i) y[i] = int_op<T>(B_MUL, pa[i], pb[i]); return;
      case B_MAX: for (i64 i = 0; i < n; ++i) y[i] = pa[i] > pb[i] ? pa[i] : pb[i]; return;
      case B_MIN: for (i64 i = 0; i < n; ++i) y[i] = pa[i] < pb[i] ? pa[i] : pb[i]; return;
      default: break;
    }
  }
  for (i64 i = 0; i < n; ++i) {
    T x, z;
    std::memcpy(&x, a + i * sa, sizeof(T));
    std::memcpy(&z, b + i * sb, sizeof(T));
    y[i] = int_op<T>(op, x, z);
  }
}

// One float row: picks the vector mode from the inner strides, gathering strided operands into scratch.
void float_row(const Kernels& kr, int op, const char* a, i64 sa, const char* b, i64 sb, float* y, i64 n,
               float* scratch_a, float* scratch_b) {
  const float* pa = reinterpret_cast<const float*>(a);
  const float* pb = reinterpret_cast<const float*>(b);
  int ma = sa == 0 ? 0 : (sa == 4 ? 1 : 2);
  int mb = sb == 0 ? 0 : (sb == 4 ? 1 : 2);
  if (ma == 2) {
    for (i64 i = 0; i < n; ++i) std::memcpy(scratch_a + i, a + i * sa, 4);
    pa = scratch_a;
    ma = 1;
  }
  if (mb == 2) {
    for (i64 i = 0; i < n; ++i) std::memcpy(scratch_b + i, b + i * sb, 4);
    pb = scratch_b;
    mb = 1;
  }
  if (ma == 1 && mb == 1) {
    kr.binary(op, BM_VV, pa, pb, y, n);
  } else if (ma == 1) {
    kr.binary(op, BM_VS, pa, pb, y, n);
  } else if (mb == 1) {
    kr.binary(op, BM_SV, pa, pb, y, n);
  } else {  // both broadcast along the row: compute once, fill
    float v;
    kr.binary(op, BM_VV, pa, pb, &v, 1);
    std::fill(y, y + n, v);
  }
}

}  // namespace

void binary_nd(const Kernels& kr, int op, DType dt, const char* a, const i64* sa, const char* b, const i64* sb,
               char* out, int ndim, const i64* shape) {
  const i64 es = dt == DType::I64 ? 8 : 4;
  i64 so[kMaxDims];
  if (ndim > kMaxDims) throw std::invalid_argument("binary: at most 16 dimensions supported");
  {
    i64 s = es;
    for (int d = ndim - 1; d >= 0; --d) {
      so[d] = s;
      s *= shape[d];
    }
  }
  i64 total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  if (total == 0) return;
  const i64* strides[3] = {so, sa, sb};
  NdIter it(ndim, shape, 3, strides);
  const i64 n = it.inner(), rows = it.outer();
  // Tasks: blocks of whole rows, or pieces of one long row.
  const i64 rows_per_task = std::max<i64>(1, kChunk / std::max<i64>(n, 1));
  const i64 pieces = n > kChunk ? (n + kChunk - 1) / kChunk : 1;
  const i64 row_tasks = (rows + rows_per_task - 1) / rows_per_task;
  const i64 ntasks = row_tasks * pieces;
  const int T = threads_for(static_cast<double>(total), 32768);
  const i64 ia = it.st[1][it.nd - 1], ib = it.st[2][it.nd - 1];
  parallel_for(ntasks, T, [&](i64 t) {
    const i64 rt = t / pieces, pc = t % pieces;
    const i64 c0 = pc * kChunk, c1 = std::min<i64>(n, c0 + (pieces > 1 ? kChunk : n));
    const i64 len = c1 - c0;
    float* sca = nullptr;
    float* scb = nullptr;
    if (dt == DType::F32 && (ia != 0 && ia != 4)) sca = tl_buf(TL_TMP).get(static_cast<std::size_t>(len));
    if (dt == DType::F32 && (ib != 0 && ib != 4)) scb = tl_buf(TL_MISC).get(static_cast<std::size_t>(len));
    for_rows(it, rt * rows_per_task, std::min<i64>(rows, (rt + 1) * rows_per_task), [&](i64 oo, i64 oa, i64 ob) {
      const char* pa = a + oa + c0 * ia;
      const char* pb = b + ob + c0 * ib;
      char* py = out + oo + c0 * es;
      switch (dt) {
        case DType::F32: float_row(kr, op, pa, ia, pb, ib, reinterpret_cast<float*>(py), len, sca, scb); break;
        case DType::I32: int_row<std::int32_t>(op, pa, ia, pb, ib, reinterpret_cast<std::int32_t*>(py), len); break;
        case DType::I64: int_row<std::int64_t>(op, pa, ia, pb, ib, reinterpret_cast<std::int64_t*>(py), len); break;
      }
    });
  }, static_cast<double>(total) >= kWakeElementWork);
}

void unary_nd(const Kernels& kr, int op, const char* x, const i64* sx, float* out, int ndim, const i64* shape,
              float alpha, float beta) {
  i64 total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  if (total == 0) return;
  const double work = static_cast<double>(total) * 4;  // transcendental ops cost ~4 adds
  const int T = threads_for(work, 65536);
  bool contiguous = true;
  {
    i64 s = 4;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && sx[d] != s) contiguous = false;
      s *= shape[d];
    }
  }
  const float* src = reinterpret_cast<const float*>(x);
  if (!contiguous) {
    // Gather into out first (out is contiguous and the op is elementwise), then run in place.
    copy_strided(x, ndim, shape, sx, reinterpret_cast<char*>(out), 4, T);
    src = out;
  }
  const i64 ntasks = (total + kChunk - 1) / kChunk;
  parallel_for(ntasks, T, [&](i64 t) {
    const i64 i0 = t * kChunk, n = std::min<i64>(kChunk, total - i0);
    kr.unary(op, src + i0, out + i0, n, alpha, beta);
  }, work >= kWakeElementWork);
}

void rows_nd(const Kernels& kr, RowOp rop, const char* x, i64 rows, i64 n, i64 row_stride, i64 col_stride,
             float* out, const float* scale, const float* bias, float eps, float* mean_out, float* invstd_out,
             bool log, const float* addend, float* sum_out) {
  if (rows == 0) return;
  const double work = static_cast<double>(rows) * n * 4;
  const int T = threads_for(work, 32768);
  const i64 rpt = std::max<i64>(1, 16384 / std::max<i64>(n, 1));
  const i64 ntasks = (rows + rpt - 1) / rpt;
  parallel_for(ntasks, T, [&](i64 t) {
    float* tmp = col_stride == 4 && (addend == nullptr || sum_out != nullptr)
                     ? nullptr : tl_buf(TL_TMP).get(static_cast<std::size_t>(n));
    for (i64 r = t * rpt; r < std::min<i64>(rows, (t + 1) * rpt); ++r) {
      const float* xr = reinterpret_cast<const float*>(x + r * row_stride);
      if (col_stride != 4) {
        for (i64 j = 0; j < n; ++j) std::memcpy(tmp + j, x + r * row_stride + j * col_stride, 4);
        xr = tmp;
      }
      if (addend != nullptr) {
        // the Add's own vector add (binary_nd's): the sum's bits, without writing the sum out and reading it back;
        // with sum_out (a pre-norm block's residual, read again later) the row goes there, still in L1 for the norm
        float* sum = sum_out != nullptr ? sum_out + r * n : tmp;
        kr.binary(B_ADD, BM_VV, xr, addend + r * n, sum, n);
        xr = sum;
      }
      float* yr = out + r * n;
      switch (rop) {
        case RowOp::Softmax: kr.softmax_row(xr, yr, n, log); break;
        case RowOp::LayerNorm:
          kr.layernorm_row(xr, scale, bias, yr, n, eps, mean_out ? mean_out + r : nullptr,
                           invstd_out ? invstd_out + r : nullptr);
          break;
        case RowOp::RmsNorm: kr.rmsnorm_row(xr, scale, yr, n, eps); break;
      }
    }
  }, work >= kWakeElementWork);
}

}  // namespace hetero
