// N-d strided iteration helpers shared by the elementwise and data-movement drivers.
#pragma once
#include <stdexcept>
#include <string>

#include "common.hpp"

namespace hetero {

constexpr int kMaxDims = 16;

// Up to 3 operands over one shape; strides in bytes. Operand 0 is the output.
struct NdIter {
  int nd = 0;
  int nops = 0;
  i64 shape[kMaxDims];
  i64 st[3][kMaxDims];

  NdIter(int ndim, const i64* shp, int nops_, const i64* const* strides) : nops(nops_) {
    if (ndim > kMaxDims) throw std::invalid_argument("at most " + std::to_string(kMaxDims) + " dimensions supported");
    // Drop size-1 dimensions, then merge neighbours that are contiguous for every operand.
    for (int d = 0; d < ndim; ++d) {
      if (shp[d] == 1) continue;
      shape[nd] = shp[d];
      for (int o = 0; o < nops; ++o) st[o][nd] = strides[o][d];
      ++nd;
    }
    int w = 0;
    for (int d = 0; d < nd; ++d) {
      if (w > 0) {
        bool merge = true;
        for (int o = 0; o < nops; ++o) merge = merge && st[o][w - 1] == st[o][d] * shape[d];
        if (merge) {
          shape[w - 1] *= shape[d];
          for (int o = 0; o < nops; ++o) st[o][w - 1] = st[o][d];
          continue;
        }
      }
      shape[w] = shape[d];
      for (int o = 0; o < nops; ++o) st[o][w] = st[o][d];
      ++w;
    }
    nd = w;
    if (nd == 0) {  // a scalar: one element
      nd = 1;
      shape[0] = 1;
      for (int o = 0; o < nops; ++o) st[o][0] = 0;
    }
  }

  i64 inner() const { return shape[nd - 1]; }
  i64 outer() const {
    i64 n = 1;
    for (int d = 0; d < nd - 1; ++d) n *= shape[d];
    return n;
  }
  // Byte offsets of operand o for outer row index r.
  void offsets(i64 r, i64* off) const {
    for (int o = 0; o < nops; ++o) off[o] = 0;
    for (int d = nd - 2; d >= 0; --d) {
      i64 idx = r % shape[d];
      r /= shape[d];
      for (int o = 0; o < nops; ++o) off[o] += idx * st[o][d];
    }
  }
};

// Walks rows [r0, r1) of `it`, calling f(off0, off1, off2) with byte offsets per operand. The N-d index is
// advanced incrementally (no divisions per row).
template <class F>
void for_rows(const NdIter& it, i64 r0, i64 r1, F f) {
  if (r0 >= r1) return;
  i64 idx[kMaxDims] = {};
  i64 off[3] = {0, 0, 0};
  {
    i64 r = r0;
    for (int d = it.nd - 2; d >= 0; --d) {
      idx[d] = r % it.shape[d];
      r /= it.shape[d];
      for (int o = 0; o < it.nops; ++o) off[o] += idx[d] * it.st[o][d];
    }
  }
  for (i64 r = r0; r < r1; ++r) {
    f(off[0], off[1], off[2]);
    for (int d = it.nd - 2; d >= 0; --d) {
      ++idx[d];
      for (int o = 0; o < it.nops; ++o) off[o] += it.st[o][d];
      if (idx[d] < it.shape[d]) break;
      for (int o = 0; o < it.nops; ++o) off[o] -= idx[d] * it.st[o][d];
      idx[d] = 0;
    }
  }
}

// Strided (src) -> contiguous (dst) copy of an arbitrary array; elem = item size in bytes.
void copy_strided(const char* src, int ndim, const i64* shape, const i64* src_strides, char* dst, i64 elem,
                  int nthreads);

// Strided (src) -> strided (dst) copy: a Concat's part written into its window of the output. Dimensions contiguous
// on both sides are merged first, so a window whose rows are several axes long (basic-pitch's [1, 172, 36, 2] parts
// of a [1, 172, 324, 2] output: rows of 72 values, not 6192 rows of 2) is copied a whole row at a time.
void copy_strided_to(const char* src, int ndim, const i64* shape, const i64* src_strides, char* dst,
                     const i64* dst_strides, i64 elem, int nthreads);

}  // namespace hetero
