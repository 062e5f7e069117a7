// Data movement: strided -> contiguous copy (Transpose / Slice / Expand / Concat arrive here as numpy views) and
// Gather.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "data.hpp"
#include "nd.hpp"
#include "onnx_extra.hpp"

namespace hetero {
namespace {

template <class T>
void copy_row_t(const char* s, i64 ss, char* d, i64 n) {
  T* dd = reinterpret_cast<T*>(d);
  for (i64 i = 0; i < n; ++i) std::memcpy(dd + i, s + i * ss, sizeof(T));
}

void copy_row(const char* s, i64 ss, char* d, i64 n, i64 elem) {
  if (ss == elem) {
    std::memcpy(d, s, static_cast<std::size_t>(n * elem));
    return;
  }
  switch (elem) {
    case 1: copy_row_t<std::uint8_t>(s, ss, d, n); break;
    case 2: copy_row_t<std::uint16_t>(s, ss, d, n); break;
    case 4: copy_row_t<std::uint32_t>(s, ss, d, n); break;
    case 8: copy_row_t<std::uint64_t>(s, ss, d, n); break;
    default:
      for (i64 i = 0; i < n; ++i) std::memcpy(d + i * elem, s + i * ss, static_cast<std::size_t>(elem));
  }
}

constexpr i64 kDirectTransposeBytes = 16 * 1024;

// dst (R x C, contiguous) <- src where src(r, c) = s + r*elem + c*sc: a transpose of a contiguous C x R matrix
// (with any row pitch sc). 32 x 32 tiles keep both sides in L1.
template <class T>
void transpose_block(const char* s, i64 sc, char* d, i64 R, i64 C, i64 r0, i64 r1) {
  constexpr i64 B = 32;
  if ((r1 - r0) * C * static_cast<i64>(sizeof(T)) <= kDirectTransposeBytes) {
    // A few source rows' block stays in L1 as it is read: each destination row straight from it. Staged, each
    // source row's run of R < 32 values was a memcpy call of its own (deepcut's [63, 200, 14] -> [63, 14, 200]:
    // 2.5x onnxruntime's time).
    for (i64 r = r0; r < r1; ++r) {
      T* dp = reinterpret_cast<T*>(d) + r * C;
      const char* sp = s + r * static_cast<i64>(sizeof(T));
      for (i64 c = 0; c < C; ++c) std::memcpy(dp + c, sp + c * sc, sizeof(T));
    }
    return;
  }
  for (i64 rb = r0; rb < r1; rb += B) {
    const i64 re = std::min(r1, rb + B);
    for (i64 cb = 0; cb < C; cb += B) {
      const i64 ce = std::min(C, cb + B);
      // Through a B x B buffer, so that each destination row's B values are written at once: writing one value
      // of each of B rows per source row needs B destination lines to stay in L1, and with a power-of-two row
      // pitch (magika's 512) they fall into two cache sets (a 512 x 256 transpose took 270 us, numpy's 110).
      alignas(64) T tmp[B * B];
      for (i64 c = cb; c < ce; ++c)
        std::memcpy(tmp + (c - cb) * B, s + c * sc + rb * static_cast<i64>(sizeof(T)),
                    static_cast<std::size_t>(re - rb) * sizeof(T));
      for (i64 r = rb; r < re; ++r) {
        T* dp = reinterpret_cast<T*>(d) + r * C;
        for (i64 c = cb; c < ce; ++c) dp[c] = tmp[(c - cb) * B + (r - rb)];
      }
    }
  }
}

}  // namespace

void copy_strided(const char* src, int ndim, const i64* shape, const i64* src_strides, char* dst, i64 elem,
                  int nthreads) {
  if (ndim > kMaxDims) throw std::invalid_argument("copy: at most 16 dimensions supported");
  i64 total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  if (total == 0) return;
  i64 sd[kMaxDims];
  {
    i64 s = elem;
    for (int d = ndim - 1; d >= 0; --d) {
      sd[d] = s;
      s *= shape[d];
    }
  }
  const i64* strides[2] = {sd, src_strides};
  NdIter it(ndim, shape, 2, strides);
  const i64 n = it.inner(), rows = it.outer();
  const i64 ss = it.st[1][it.nd - 1];
  const int T = std::min(nthreads, threads_for(static_cast<double>(total * elem), 1 << 18));

  // Transpose: the source's unit-stride dimension is the second innermost one.
  const bool aligned_elem = elem == 4 || elem == 8 || elem == 2 || elem == 1;
  if (it.nd >= 2 && ss != elem && it.st[1][it.nd - 2] == elem && aligned_elem && it.shape[it.nd - 2] >= 8) {
    const i64 R = it.shape[it.nd - 2], C = n;
    i64 outer = 1;
    for (int d = 0; d < it.nd - 2; ++d) outer *= it.shape[d];
    const i64 rblocks = (R + 31) / 32;
    // Source offset of outer index o (the dimensions before the last two).
    auto outer_offset = [&](i64 o) {
      i64 off = 0;
      for (int d = it.nd - 3; d >= 0; --d) {
        off += (o % it.shape[d]) * it.st[1][d];
        o /= it.shape[d];
      }
      return off;
    };
    auto scalar_block = [&](i64 o, i64 r0, i64 r1) {
      const char* s = src + outer_offset(o);
      char* d = dst + o * R * C * elem;
      switch (elem) {
        case 1: transpose_block<std::uint8_t>(s, ss, d, R, C, r0, r1); break;
        case 2: transpose_block<std::uint16_t>(s, ss, d, R, C, r0, r1); break;
        case 4: transpose_block<std::uint32_t>(s, ss, d, R, C, r0, r1); break;
        default: transpose_block<std::uint64_t>(s, ss, d, R, C, r0, r1); break;
      }
    };
    const ExtraKernels& xk = extra_active();
    bool in_registers = elem == 4 && xk.transposes_in_registers && C >= xk.lanes && R >= xk.lanes &&
                        reinterpret_cast<std::uintptr_t>(src) % 4 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 4 == 0;
    for (int d = 0; d < it.nd; ++d) in_registers = in_registers && it.st[1][d] % 4 == 0;  // whole floats apart
    if (!in_registers) {
      parallel_for(outer * rblocks, T, [&](i64 t) {
        const i64 r0 = t % rblocks * 32;
        scalar_block(t / rblocks, r0, std::min(R, r0 + 32));
      });
      return;
    }
    // The source's C rows of each block of <= 32 output rows in W x W register blocks, each written as W whole
    // destination rows (the edges one value at a time), where the scalar tiles move one value an instruction; a
    // last block narrower than a vector keeps the tiles.
    parallel_for(outer * rblocks, T, [&](i64 t) {
      const i64 o = t / rblocks, r0 = t % rblocks * 32, r1 = std::min(R, r0 + 32);
      if (r1 - r0 < xk.lanes) return scalar_block(o, r0, r1);
      const float* s = reinterpret_cast<const float*>(src + outer_offset(o)) + r0;
      xk.transpose_into(s, ss / 4, C, r1 - r0, reinterpret_cast<float*>(dst + o * R * C * elem) + r0 * C, C);
    });
    return;
  }

  // Rows (or pieces of one long row) per task.
  const i64 piece = std::max<i64>(1, (1 << 18) / elem);
  const i64 pieces = n > piece ? (n + piece - 1) / piece : 1;
  const i64 rpt = std::max<i64>(1, piece / std::max<i64>(n, 1));
  const i64 row_tasks = (rows + rpt - 1) / rpt;
  parallel_for(row_tasks * pieces, T, [&](i64 t) {
    const i64 rt = t / pieces, pc = t % pieces;
    const i64 c0 = pc * piece, c1 = pieces > 1 ? std::min(n, c0 + piece) : n;
    for_rows(it, rt * rpt, std::min(rows, (rt + 1) * rpt), [&](i64 od, i64 os, i64) {
      copy_row(src + os + c0 * ss, ss, dst + od + c0 * elem, c1 - c0, elem);
    });
  });
}

namespace {

template <class T>
void copy_pairs_t(const char* s, i64 ss, char* d, i64 ds, i64 n) {
  for (i64 i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, sizeof(T));
}

// n values from s (stride ss bytes) to d (stride ds bytes)
void copy_row_to(const char* s, i64 ss, char* d, i64 ds, i64 n, i64 elem) {
  if (ds == elem) {
    copy_row(s, ss, d, n, elem);
    return;
  }
  switch (elem) {
    case 1: copy_pairs_t<std::uint8_t>(s, ss, d, ds, n); break;
    case 2: copy_pairs_t<std::uint16_t>(s, ss, d, ds, n); break;
    case 4: copy_pairs_t<std::uint32_t>(s, ss, d, ds, n); break;
    case 8: copy_pairs_t<std::uint64_t>(s, ss, d, ds, n); break;
    default:
      for (i64 i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, static_cast<std::size_t>(elem));
  }
}

}  // namespace

void copy_strided_to(const char* src, int ndim, const i64* shape, const i64* src_strides, char* dst,
                     const i64* dst_strides, i64 elem, int nthreads) {
  if (ndim > kMaxDims) throw std::invalid_argument("copy: at most 16 dimensions supported");
  i64 total = 1;
  for (int d = 0; d < ndim; ++d) total *= shape[d];
  if (total == 0) return;
  const i64* strides[2] = {dst_strides, src_strides};
  NdIter it(ndim, shape, 2, strides);
  const i64 n = it.inner(), rows = it.outer();
  const i64 ds = it.st[0][it.nd - 1], ss = it.st[1][it.nd - 1];
  const int T = std::min(nthreads, threads_for(static_cast<double>(total * elem), 1 << 18));
  const i64 rpt = std::max<i64>(1, ((1 << 18) / elem) / std::max<i64>(n, 1));  // rows per task
  parallel_for((rows + rpt - 1) / rpt, T, [&](i64 t) {
    for_rows(it, t * rpt, std::min(rows, (t + 1) * rpt),
             [&](i64 od, i64 os, i64) { copy_row_to(src + os, ss, dst + od, ds, n, elem); });
  });
}

void gather_rows(const char* data, i64 outer, i64 axis_len, i64 inner_bytes, const std::int64_t* idx, i64 nidx,
                 char* out, int nthreads) {
  const i64 total = outer * nidx;
  if (total == 0 || inner_bytes == 0) return;
  const int T = std::min(nthreads, threads_for(static_cast<double>(total * inner_bytes), 1 << 18));
  const i64 per = std::max<i64>(1, (1 << 16) / inner_bytes);
  const i64 ntasks = (total + per - 1) / per;
  parallel_for(ntasks, T, [&](i64 t) {
    for (i64 q = t * per; q < std::min(total, (t + 1) * per); ++q) {
      const i64 o = q / nidx, i = q % nidx;
      i64 k = idx[i];
      if (k < 0) k += axis_len;
      std::memcpy(out + q * inner_bytes, data + (o * axis_len + k) * inner_bytes, static_cast<std::size_t>(inner_bytes));
    }
  });
}

namespace {

template <ScatterReduce R>
inline void scatter_one(float& dst, float v) {
  if constexpr (R == ScatterReduce::none) dst = v;
  if constexpr (R == ScatterReduce::add) dst += v;
  if constexpr (R == ScatterReduce::mul) dst *= v;
  // NaN wins either way, as numpy's maximum / minimum (the reference) propagate it
  if constexpr (R == ScatterReduce::max) dst = dst != dst || !(v != v || v > dst) ? dst : v;
  if constexpr (R == ScatterReduce::min) dst = dst != dst || !(v != v || v < dst) ? dst : v;
}

// The index rows (all axes but the last) one after another; within a row the last axis is contiguous in the
// indices and updates, and in out unless it is the scatter axis.
template <ScatterReduce R>
void scatter_rows(float* out, const i64* dshape, int nd, const std::int64_t* idx, const float* upd, const i64* ishape,
                  int axis) {
  std::vector<i64> dstride(static_cast<std::size_t>(nd), 1);
  for (int d = nd - 2; d >= 0; --d) dstride[d] = dstride[d + 1] * dshape[d + 1];
  const i64 last = ishape[nd - 1], axis_len = dshape[axis], axis_stride = dstride[axis];
  i64 rows = 1;
  for (int d = 0; d + 1 < nd; ++d) rows *= ishape[d];
  std::vector<i64> coord(static_cast<std::size_t>(nd), 0);
  for (i64 r = 0; r < rows; ++r) {
    i64 base = 0;  // out's offset of the row, the scatter axis left out
    for (int d = 0; d + 1 < nd; ++d)
      if (d != axis) base += coord[d] * dstride[d];
    const std::int64_t* ir = idx + r * last;
    const float* ur = upd + r * last;
    for (i64 j = 0; j < last; ++j) {
      const i64 k = ir[j] < 0 ? ir[j] + axis_len : ir[j];
      const i64 at = axis == nd - 1 ? base + k : base + k * axis_stride + j;
      scatter_one<R>(out[at], ur[j]);
    }
    for (int d = nd - 2; d >= 0; --d) {  // the next row's coordinates
      if (++coord[d] < ishape[d]) break;
      coord[d] = 0;
    }
  }
}

}  // namespace

void scatter_elements_f32(float* out, const i64* dshape, int nd, const std::int64_t* idx, const float* updates,
                          const i64* ishape, int axis, ScatterReduce reduce) {
  for (int d = 0; d < nd; ++d)
    if (ishape[d] == 0) return;
  switch (reduce) {
    case ScatterReduce::none: return scatter_rows<ScatterReduce::none>(out, dshape, nd, idx, updates, ishape, axis);
    case ScatterReduce::add: return scatter_rows<ScatterReduce::add>(out, dshape, nd, idx, updates, ishape, axis);
    case ScatterReduce::mul: return scatter_rows<ScatterReduce::mul>(out, dshape, nd, idx, updates, ishape, axis);
    case ScatterReduce::max: return scatter_rows<ScatterReduce::max>(out, dshape, nd, idx, updates, ishape, axis);
    case ScatterReduce::min: return scatter_rows<ScatterReduce::min>(out, dshape, nd, idx, updates, ishape, axis);
  }
}

}  // namespace hetero
