// Drivers and bindings of the extra ONNX kernels: reductions over any axes, ArgMax/ArgMin, TopK, comparisons,
// logical ops, Where, PRelu, softmax over any axis, instance/group normalisation, Pad and 2-D Resize. The float
// arithmetic runs in the ISA table of onnx_extra.hpp; conv_transpose.cpp and rnn.cpp add their own bindings.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include "nd.hpp"
#include "onnx_extra.hpp"
#include "onnx_py.hpp"
#include "step.hpp"

namespace hetero {

int unary_op_id(const std::string& op, const char* fn);  // module.cpp

namespace {

using namespace pyx;

// ---------------------------------------------------------------------------------------------- N-operand iteration

// Up to NOPS operands over one shape (byte strides); size-1 dims dropped and contiguous neighbours merged.
template <int NOPS>
struct NdN {
  int nd = 0;
  i64 shape[kMaxDims];
  i64 st[NOPS][kMaxDims];
  NdN(int ndim, const i64* shp, const i64* const* strides) {
    if (ndim > kMaxDims) throw std::invalid_argument("at most 16 dimensions supported");
    for (int d = 0; d < ndim; ++d) {
      if (shp[d] == 1) continue;
      shape[nd] = shp[d];
      for (int o = 0; o < NOPS; ++o) st[o][nd] = strides[o][d];
      ++nd;
    }
    int w = 0;
    for (int d = 0; d < nd; ++d) {
      if (w > 0) {
        bool merge = true;
        for (int o = 0; o < NOPS; ++o) merge = merge && st[o][w - 1] == st[o][d] * shape[d];
        if (merge) {
          shape[w - 1] *= shape[d];
          for (int o = 0; o < NOPS; ++o) st[o][w - 1] = st[o][d];
          continue;
        }
      }
      shape[w] = shape[d];
      for (int o = 0; o < NOPS; ++o) st[o][w] = st[o][d];
      ++w;
    }
    nd = w;
    if (nd == 0) {
      nd = 1;
      shape[0] = 1;
      for (int o = 0; o < NOPS; ++o) st[o][0] = 0;
    }
  }
  i64 inner() const { return shape[nd - 1]; }
  i64 outer() const {
    i64 n = 1;
    for (int d = 0; d < nd - 1; ++d) n *= shape[d];
    return n;
  }
};

// Calls row(off, inner_strides, n) over pieces of rows, threaded; off[o] = byte offset of operand o.
template <int NOPS, class Row>
void run_rows(const NdN<NOPS>& it, double cost_per_elem, Row row) {
  const i64 n = it.inner(), rows = it.outer();
  if (n == 0 || rows == 0) return;
  constexpr i64 kChunk = 16384;
  const i64 rpt = std::max<i64>(1, kChunk / std::max<i64>(n, 1));
  const i64 pieces = n > kChunk ? ceil_div(n, kChunk) : 1;
  const i64 rtasks = ceil_div(rows, rpt);
  i64 is[NOPS];
  for (int o = 0; o < NOPS; ++o) is[o] = it.st[o][it.nd - 1];
  const int T = threads_for(static_cast<double>(n) * rows * cost_per_elem, 32768);
  parallel_for(rtasks * pieces, T, [&](i64 t) {
    const i64 rt = t / pieces, pc = t % pieces;
    const i64 c0 = pc * kChunk, c1 = std::min<i64>(n, c0 + (pieces > 1 ? kChunk : n));
    const i64 r0 = rt * rpt, r1 = std::min<i64>(rows, r0 + rpt);
    i64 idx[kMaxDims] = {};
    i64 off[NOPS] = {};
    i64 r = r0;
    for (int d = it.nd - 2; d >= 0; --d) {
      idx[d] = r % it.shape[d];
      r /= it.shape[d];
      for (int o = 0; o < NOPS; ++o) off[o] += idx[d] * it.st[o][d];
    }
    for (i64 q = r0; q < r1; ++q) {
      i64 o2[NOPS];
      for (int o = 0; o < NOPS; ++o) o2[o] = off[o] + c0 * is[o];
      row(o2, is, c1 - c0);
      for (int d = it.nd - 2; d >= 0; --d) {
        ++idx[d];
        for (int o = 0; o < NOPS; ++o) off[o] += it.st[o][d];
        if (idx[d] < it.shape[d]) break;
        for (int o = 0; o < NOPS; ++o) off[o] -= idx[d] * it.st[o][d];
        idx[d] = 0;
      }
    }
  });
}

template <class T>
inline T ld(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// ------------------------------------------------------------------------------------------------- reductions

int reduce_id(const std::string& op) {
  static const std::pair<const char*, int> ops[] = {{"sum", R_SUM},   {"mean", R_SUM}, {"sumsq", R_SUMSQ},
                                                    {"l2", R_SUMSQ},  {"l1", R_L1},    {"max", R_MAX},
                                                    {"min", R_MIN},   {"prod", R_PROD}, {"logsum", R_SUM}};
  for (const auto& kv : ops)
    if (op == kv.first) return kv.second;
  if (op == "logsumexp") return R_MAX;
  fail("reduce: unknown op '" + op + "' (sum, mean, sumsq, l1, l2, max, min, prod, logsum, logsumexp)");
}

float identity(int op) {
  switch (op) {
    case R_PROD: return 1.f;
    case R_MAX: return -std::numeric_limits<float>::infinity();
    case R_MIN: return std::numeric_limits<float>::infinity();
    default: return 0.f;
  }
}

inline float combine(int op, float a, float b) {
  switch (op) {
    case R_MAX: return (b > a || b != b) ? b : a;
    case R_MIN: return (b < a || b != b) ? b : a;
    case R_PROD: return a * b;
    default: return a + b;
  }
}

// Input x contiguous with merged dims (shape, reduced flags). Writes out (contiguous over kept dims).
// shift != nullptr: sum of exp(x - shift[o]) instead of `op`.
void reduce_core(const ExtraKernels& xk, int op, const float* x, const std::vector<i64>& shape,
                 const std::vector<char>& red, float* out, const float* shift) {
  const int nd = static_cast<int>(shape.size());
  std::vector<i64> st(static_cast<std::size_t>(nd));
  {
    i64 s = 1;
    for (int d = nd - 1; d >= 0; --d) {
      st[static_cast<std::size_t>(d)] = s;
      s *= shape[static_cast<std::size_t>(d)];
    }
  }
  std::vector<i64> kdim, rdim;  // kept / reduced dims, outermost first
  for (int d = 0; d < nd; ++d) (red[static_cast<std::size_t>(d)] ? rdim : kdim).push_back(d);
  const bool last_red = red[static_cast<std::size_t>(nd - 1)] != 0;
  const i64 L = shape[static_cast<std::size_t>(nd - 1)];
  // The reduced index space, without the last dim when it is the (contiguous) row.
  std::vector<i64> rloop(rdim.begin(), rdim.end() - (last_red ? 1 : 0));
  i64 rcount = 1;
  for (i64 d : rloop) rcount *= shape[static_cast<std::size_t>(d)];
  std::vector<i64> kloop(kdim.begin(), kdim.end() - (last_red ? 0 : 1));
  i64 kcount = 1;
  for (i64 d : kloop) kcount *= shape[static_cast<std::size_t>(d)];
  i64 total = 1;
  for (i64 v : shape) total *= v;
  auto offset_of = [&](const std::vector<i64>& dims, i64 idx) {
    i64 off = 0;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      const i64 n = shape[static_cast<std::size_t>(*it)];
      off += (idx % n) * st[static_cast<std::size_t>(*it)];
      idx /= n;
    }
    return off;
  };
  // Offsets of every reduced combination (rcount is the number of rows/blocks one output accumulates).
  std::vector<i64> roff(static_cast<std::size_t>(rcount));
  for (i64 r = 0; r < rcount; ++r) roff[static_cast<std::size_t>(r)] = offset_of(rloop, r);
  const int T = threads_for(static_cast<double>(total) * (shift ? 4 : 1), 32768);
  if (last_red) {
    // One output element per kept combination: reduce rcount rows of length L.
    const i64 chunk = std::max<i64>(1, kcount / std::max(1, T * 4));
    parallel_for(ceil_div(kcount, chunk), T, [&](i64 t) {
      for (i64 o = t * chunk; o < std::min(kcount, (t + 1) * chunk); ++o) {
        const float* base = x + offset_of(kloop, o);
        float acc = shift ? 0.f : identity(op);
        for (i64 r = 0; r < rcount; ++r) {
          const float* row = base + roff[static_cast<std::size_t>(r)];
          acc = shift ? acc + xk.sumexp_row(row, L, shift[o]) : combine(op, acc, xk.reduce_row(op, row, L));
        }
        out[o] = acc;
      }
    });
    return;
  }
  // The last dim is kept: each output row (length L) accumulates rcount input rows; rows split into column chunks
  // when there are fewer output rows than threads.
  const i64 cchunk = kcount >= T ? L : std::max<i64>(256, ceil_div(L, T));
  const i64 ncc = ceil_div(L, cchunk);
  parallel_for(kcount * ncc, T, [&](i64 t) {
    const i64 o = t / ncc, c0 = (t % ncc) * cchunk, n = std::min(L, c0 + cchunk) - c0;
    const float* base = x + offset_of(kloop, o) + c0;
    float* y = out + o * L + c0;
    const float* sh = shift ? shift + o * L + c0 : nullptr;
    std::fill(y, y + n, shift ? 0.f : identity(op));
    for (i64 r = 0; r < rcount; ++r) {
      if (sh)
        xk.sumexp_acc(y, base + roff[static_cast<std::size_t>(r)], sh, n);
      else
        xk.reduce_acc(op, y, base + roff[static_cast<std::size_t>(r)], n);
    }
  });
}

// x's dims as a reduction over `axes` sees them (checked against out's size): neighbouring dims of one kind merged,
// size-1 dims dropped; rf[d] = 1 where dim d is reduced. Shared by the float and the integer reductions.
struct ReduceDims {
  std::vector<i64> shape;
  std::vector<char> rf;
  i64 kept = 1, rsize = 1;  // elements kept (out's size) / reduced into each
};

ReduceDims reduce_dims(const py::array& x, const std::vector<i64>& axes, const py::array& out, const char* fn) {
  const int nd = static_cast<int>(x.ndim());
  std::vector<char> red(static_cast<std::size_t>(std::max(nd, 1)), 0);
  for (i64 a : axes) {
    if (a < -nd || a >= nd)
      fail(std::string(fn) + ": axis " + std::to_string(a) + " out of range for rank " + std::to_string(nd));
    red[static_cast<std::size_t>(a < 0 ? a + nd : a)] = 1;
  }
  ReduceDims dims;
  for (int d = 0; d < nd; ++d) (red[static_cast<std::size_t>(d)] ? dims.rsize : dims.kept) *= x.shape(d);
  if (out.size() != dims.kept)
    fail(std::string(fn) + ": out has " + std::to_string(out.size()) + " elements, expected " +
         std::to_string(dims.kept));
  if (dims.rsize == 0) fail(std::string(fn) + ": empty reduction");
  for (int d = 0; d < nd; ++d) {
    const i64 n = x.shape(d);
    if (n == 1) continue;
    const char r = red[static_cast<std::size_t>(d)];
    if (!dims.shape.empty() && dims.rf.back() == r) {
      dims.shape.back() *= n;
    } else {
      dims.shape.push_back(n);
      dims.rf.push_back(r);
    }
  }
  if (dims.shape.empty()) {
    dims.shape.push_back(1);
    dims.rf.push_back(1);
  }
  return dims;
}

Op prep_reduce(const std::string& opname, const py::array& x, const std::vector<i64>& axes, const py::array& out) {
  const char* fn = "reduce";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  const int op = reduce_id(opname);
  ReduceDims dims = reduce_dims(x, axes, out, fn);
  std::vector<i64> shape = std::move(dims.shape);
  std::vector<char> rf = std::move(dims.rf);
  const i64 kept = dims.kept, rsize = dims.rsize;
  const float* px = cptr<float>(x);
  float* po = mptr<float>(out);
  const ExtraKernels& xk = extra_active();
  const i64 xsize = x.size();
  // the work after the reduction, decided now (a prepared op runs again and again)
  const int post = opname == "logsumexp" ? 1 : opname == "mean" ? 2 : opname == "l2" ? 3 : opname == "logsum" ? 4 : 0;
  return [&xk, op, px, po, shape, rf, kept, rsize, xsize, post] {
    if (xsize == 0) return;
    reduce_core(xk, op, px, shape, rf, po, nullptr);
    if (post == 1) {
      std::vector<float> m(po, po + kept);
      for (float& v : m)
        if (!std::isfinite(v)) v = 0.f;  // +-inf / NaN max: exp(x - 0) gives the right inf / NaN / 0 sum
      reduce_core(xk, R_SUM, px, shape, rf, po, m.data());
      for (i64 i = 0; i < kept; ++i) po[i] = m[static_cast<std::size_t>(i)] + std::log(po[i]);
    } else if (post == 2) {
      const float inv = 1.f / static_cast<float>(rsize);
      for (i64 i = 0; i < kept; ++i) po[i] *= inv;
    } else if (post == 3) {
      for (i64 i = 0; i < kept; ++i) po[i] = std::sqrt(po[i]);
    } else if (post == 4) {
      for (i64 i = 0; i < kept; ++i) po[i] = std::log(po[i]);
    }
  };
}

void py_reduce(const std::string& opname, const py::array& x, const std::vector<i64>& axes, const py::array& out) {
  run_now(prep_reduce, opname, x, axes, out);
}

// Per-row min and max of x seen as lo.size() contiguous rows (a GlobalMaxPool's (N, C) rows of spatial values): one
// read of x for both, where a max pool of a unimodal activation (hetero.GeluGlobalMaxPool) needs the two ends.
void py_global_min_max(const py::array& x, const py::array& lo, const py::array& hi) {
  const char* fn = "global_min_max";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(lo, fn, "lo");
  need_out(lo, fn, "lo");
  need_f32(hi, fn, "hi");
  need_out(hi, fn, "hi");
  const i64 rows = lo.size();
  if (hi.size() != rows || rows == 0 || x.size() == 0 || x.size() % rows != 0)
    fail("global_min_max: x of " + std::to_string(x.size()) + " values is not " + std::to_string(rows) +
         " non-empty rows (lo " + std::to_string(lo.size()) + ", hi " + std::to_string(hi.size()) + ")");
  const i64 n = x.size() / rows;
  const float* px = cptr<float>(x);
  float* plo = mptr<float>(lo);
  float* phi = mptr<float>(hi);
  const ExtraKernels& xk = extra_active();
  py::gil_scoped_release nogil;
  const int T = threads_for(static_cast<double>(rows) * n, 32768);
  const i64 chunk = std::max<i64>(1, ceil_div(rows, T));
  parallel_for(ceil_div(rows, chunk), T, [&](i64 t) {
    for (i64 r = t * chunk; r < std::min(rows, (t + 1) * chunk); ++r) xk.minmax_row(px + r * n, n, plo + r, phi + r);
  });
}

// hetero::ScaledMaskedSoftmax: out = Softmax(x / divisor + mask) over rows of n (the last axis), row r's mask values
// at mask + mask_rows[r] (n of them with mask_vec, else one for the row): scores_softmax_rows from x into out (out
// may be x) over each run of rows whose mask rows are evenly spaced (an attention's heads and query rows share their
// batch's mask: one run a batch): the Div, Add and Softmax kernels' bits, two rows at a time in registers.
void py_scaled_masked_softmax(const py::array& x, float divisor, const py::array& mask, const py::array& mask_rows,
                              bool mask_vec, const py::array& out) {
  const char* fn = "scaled_masked_softmax";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(mask, fn, "mask");
  need_contig(mask, fn, "mask");
  need_f32(out, fn, "out");
  need_out(out, fn, "out");
  if (x.ndim() < 1 || out.size() != x.size()) fail("scaled_masked_softmax: out must have x's size");
  const i64 n = x.shape(x.ndim() - 1);
  if (n == 0 || x.size() == 0) return;
  const i64 rows = x.size() / n;
  if (pyx::dkey(mask_rows) != "i8" || mask_rows.ndim() != 1 || mask_rows.shape(0) != rows || !pyx::c_contig(mask_rows))
    fail("scaled_masked_softmax: mask_rows must be " + std::to_string(rows) + " contiguous int64 offsets");
  const i64* off = cptr<i64>(mask_rows);
  const i64 width = mask_vec ? n : 1;
  for (i64 r = 0; r < rows; ++r)
    if (off[r] < 0 || off[r] + width > static_cast<i64>(mask.size()))
      fail("scaled_masked_softmax: mask row offset " + std::to_string(off[r]) + " out of range");
  const float* px = cptr<float>(x);
  const float* pm = cptr<float>(mask);
  float* po = mptr<float>(out);
  const ExtraKernels& xk = extra_active();
  py::gil_scoped_release nogil;
  const double work = static_cast<double>(rows) * static_cast<double>(n) * 8;
  const int T = threads_for(work, 32768);
  const i64 chunk = std::max<i64>(1, ceil_div(rows, T));
  parallel_for(ceil_div(rows, chunk), T, [&](i64 t) {
    const i64 r_end = std::min(rows, (t + 1) * chunk);
    i64 r0 = t * chunk;
    while (r0 < r_end) {
      const i64 stride = r0 + 1 < r_end ? off[r0 + 1] - off[r0] : 0;
      i64 r1 = r0 + 1;
      while (r1 < r_end && off[r1] - off[r1 - 1] == stride) ++r1;
      xk.scores_softmax_rows(px + r0 * n, po + r0 * n, r1 - r0, n, n, divisor, pm + off[r0], stride, mask_vec);
      r0 = r1;
    }
  }, work >= kWakeElementWork);
}

// --------------------------------------------------------------------------------------------- ArgMax / TopK

template <class T>
inline bool better(T v, T best, bool is_max, bool last) {
  if (v != v) return !(best != best) || last;  // NaN counts as the extreme (numpy); first one wins unless `last`
  if (best != best) return false;
  if (is_max) return last ? v >= best : v > best;
  return last ? v <= best : v < best;
}

template <class T>
void argreduce_t(const T* x, i64 outer, i64 n, i64 inner, std::int64_t* out, bool is_max, bool last) {
  const int T_ = threads_for(static_cast<double>(outer) * n * inner, 32768);
  parallel_for(outer, T_, [&](i64 o) {
    const T* base = x + o * n * inner;
    std::int64_t* y = out + o * inner;
    if (inner == 1) {
      T best = base[0];
      std::int64_t bi = 0;
      for (i64 r = 1; r < n; ++r)
        if (better(base[r], best, is_max, last)) {
          best = base[r];
          bi = r;
        }
      y[0] = bi;
      return;
    }
    thread_local std::vector<T> bestv;
    bestv.assign(base, base + inner);
    std::fill(y, y + inner, 0);
    for (i64 r = 1; r < n; ++r) {
      const T* row = base + r * inner;
      for (i64 j = 0; j < inner; ++j)
        if (better(row[j], bestv[static_cast<std::size_t>(j)], is_max, last)) {
          bestv[static_cast<std::size_t>(j)] = row[j];
          y[j] = r;
        }
    }
  });
}

Op prep_argreduce(const py::array& x, i64 axis, const py::array& out, bool is_max, bool select_last) {
  const char* fn = "argreduce";
  need_contig(x, fn, "x");
  need_out(out, fn);
  if (dkey(out) != "i8") fail("argreduce: out must be int64");
  const int nd = static_cast<int>(x.ndim());
  if (nd == 0 || axis < 0 || axis >= nd) fail("argreduce: axis out of range");
  i64 outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape(d);
  for (int d = static_cast<int>(axis) + 1; d < nd; ++d) inner *= x.shape(d);
  const i64 n = x.shape(static_cast<int>(axis));
  if (n == 0) fail("argreduce: empty axis");
  if (out.size() != outer * inner) fail("argreduce: out has the wrong size");
  const std::string k = dkey(x);
  if (k != "f4" && k != "f8" && k != "i4" && k != "i8")
    fail("argreduce: unsupported dtype " + k + " (float32, float64, int32, int64)");
  auto* po = mptr<std::int64_t>(out);
  const void* px = x.data();
  const char kind = k == "f4" ? 'f' : k == "f8" ? 'd' : k == "i4" ? 'i' : 'l';
  return [kind, px, outer, n, inner, po, is_max, select_last] {
    if (kind == 'f') argreduce_t(static_cast<const float*>(px), outer, n, inner, po, is_max, select_last);
    else if (kind == 'd') argreduce_t(static_cast<const double*>(px), outer, n, inner, po, is_max, select_last);
    else if (kind == 'i') argreduce_t(static_cast<const std::int32_t*>(px), outer, n, inner, po, is_max, select_last);
    else argreduce_t(static_cast<const std::int64_t*>(px), outer, n, inner, po, is_max, select_last);
  };
}

void py_argreduce(const py::array& x, i64 axis, const py::array& out, bool is_max, bool select_last) {
  run_now(prep_argreduce, x, axis, out, is_max, select_last);
}

template <class T>
void topk_t(const T* x, i64 outer, i64 n, i64 inner, i64 k, bool largest, T* vals, std::int64_t* idx) {
  const int T_ = threads_for(static_cast<double>(outer) * inner * n * 4, 32768);
  parallel_for(outer * inner, T_, [&](i64 t) {
    const i64 o = t / inner, j = t % inner;
    thread_local std::vector<std::pair<T, std::int64_t>> buf;
    buf.resize(static_cast<std::size_t>(n));
    const T* base = x + o * n * inner + j;
    for (i64 r = 0; r < n; ++r) buf[static_cast<std::size_t>(r)] = {base[r * inner], r};
    // Ties: the lower index first (ONNX). NaN sorts as the largest value.
    auto cmp = [largest](const std::pair<T, std::int64_t>& a, const std::pair<T, std::int64_t>& b) {
      const bool an = a.first != a.first, bn = b.first != b.first;
      if (an || bn) {
        if (an && bn) return a.second < b.second;
        return largest ? an : bn;
      }
      if (a.first != b.first) return largest ? a.first > b.first : a.first < b.first;
      return a.second < b.second;
    };
    std::partial_sort(buf.begin(), buf.begin() + k, buf.end(), cmp);
    for (i64 r = 0; r < k; ++r) {
      vals[(o * k + r) * inner + j] = buf[static_cast<std::size_t>(r)].first;
      idx[(o * k + r) * inner + j] = buf[static_cast<std::size_t>(r)].second;
    }
  });
}

void py_topk(const py::array& x, i64 axis, i64 k, bool largest, const py::array& values, const py::array& indices) {
  const char* fn = "topk";
  need_contig(x, fn, "x");
  need_out(values, fn, "values");
  need_out(indices, fn, "indices");
  if (dkey(indices) != "i8") fail("topk: indices must be int64");
  if (dkey(values) != dkey(x)) fail("topk: values must have x's dtype");
  const int nd = static_cast<int>(x.ndim());
  if (nd == 0 || axis < 0 || axis >= nd) fail("topk: axis out of range");
  const i64 n = x.shape(static_cast<int>(axis));
  if (k < 0 || k > n) fail("topk: k=" + std::to_string(k) + " out of range for an axis of " + std::to_string(n));
  i64 outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape(d);
  for (int d = static_cast<int>(axis) + 1; d < nd; ++d) inner *= x.shape(d);
  if (values.size() != outer * k * inner || indices.size() != outer * k * inner) fail("topk: outputs have the wrong size");
  const std::string key = dkey(x);
  if (key != "f4" && key != "f8" && key != "i4" && key != "i8") fail("topk: unsupported dtype " + key);
  const void* px = x.data();
  void* pv = mptr<void>(values);
  auto* pi = mptr<std::int64_t>(indices);
  py::gil_scoped_release nogil;
  if (k == 0 || outer * inner == 0) return;
  if (key == "f4") topk_t(static_cast<const float*>(px), outer, n, inner, k, largest, static_cast<float*>(pv), pi);
  else if (key == "f8") topk_t(static_cast<const double*>(px), outer, n, inner, k, largest, static_cast<double*>(pv), pi);
  else if (key == "i4")
    topk_t(static_cast<const std::int32_t*>(px), outer, n, inner, k, largest, static_cast<std::int32_t*>(pv), pi);
  else
    topk_t(static_cast<const std::int64_t*>(px), outer, n, inner, k, largest, static_cast<std::int64_t*>(pv), pi);
}

// -------------------------------------------------------------------------------- comparisons, logic, Where, PRelu

int cmp_id(const std::string& op) {
  static const std::pair<const char*, int> ops[] = {{"eq", C_EQ}, {"lt", C_LT}, {"le", C_LE}, {"gt", C_GT}, {"ge", C_GE}};
  for (const auto& kv : ops)
    if (op == kv.first) return kv.second;
  fail("compare: unknown op '" + op + "' (eq, lt, le, gt, ge)");
}

template <class T>
inline std::uint8_t cmp_s(int op, T a, T b) {
  switch (op) {
    case C_EQ: return a == b;
    case C_LT: return a < b;
    case C_LE: return a <= b;
    case C_GT: return a > b;
    default: return a >= b;
  }
}

template <class T>
void cmp_rows(int op, const char* a, const char* b, std::uint8_t* y, const NdN<3>& it) {
  run_rows<3>(it, 1.0, [&](const i64* off, const i64* is, i64 n) {
    const char* pa = a + off[1];
    const char* pb = b + off[2];
    std::uint8_t* py_ = y + off[0];
    for (i64 i = 0; i < n; ++i) py_[i] = cmp_s<T>(op, ld<T>(pa + i * is[1]), ld<T>(pb + i * is[2]));
  });
}

// compare's work on prepared operands (prep_compare): out = a op b, every operand broadcast to out's shape.
void run_compare(int op, const std::string& key, const std::vector<i64>& shp, const std::vector<i64>& so,
                 const std::vector<i64>& sa, const std::vector<i64>& sb, const char* pa, const char* pb,
                 std::uint8_t* po) {
  const i64* st[3] = {so.data(), sa.data(), sb.data()};
  NdN<3> it(static_cast<int>(shp.size()), shp.data(), st);
  const ExtraKernels& xk = extra_active();
  if (key == "f4") {
    run_rows<3>(it, 1.0, [&](const i64* off, const i64* is, i64 n) {
      const int ma = is[1] == 0 ? 0 : (is[1] == 4 ? 1 : 2), mb = is[2] == 0 ? 0 : (is[2] == 4 ? 1 : 2);
      const float* fa = reinterpret_cast<const float*>(pa + off[1]);
      const float* fb = reinterpret_cast<const float*>(pb + off[2]);
      std::uint8_t* y = po + off[0];
      if (ma == 1 && mb == 1) xk.cmp_f32(op, BM_VV, fa, fb, y, n);
      else if (ma == 1 && mb == 0) xk.cmp_f32(op, BM_VS, fa, fb, y, n);
      else if (ma == 0 && mb == 1) xk.cmp_f32(op, BM_SV, fa, fb, y, n);
      else
        for (i64 i = 0; i < n; ++i)
          y[i] = cmp_s<float>(op, ld<float>(pa + off[1] + i * is[1]), ld<float>(pb + off[2] + i * is[2]));
    });
  } else if (key == "f8") cmp_rows<double>(op, pa, pb, po, it);
  else if (key == "i8") cmp_rows<std::int64_t>(op, pa, pb, po, it);
  else if (key == "i4") cmp_rows<std::int32_t>(op, pa, pb, po, it);
  else if (key == "i2") cmp_rows<std::int16_t>(op, pa, pb, po, it);
  else if (key == "i1") cmp_rows<std::int8_t>(op, pa, pb, po, it);
  else if (key == "u8") cmp_rows<std::uint64_t>(op, pa, pb, po, it);
  else if (key == "u4") cmp_rows<std::uint32_t>(op, pa, pb, po, it);
  else if (key == "u2") cmp_rows<std::uint16_t>(op, pa, pb, po, it);
  else cmp_rows<std::uint8_t>(op, pa, pb, po, it);
}

Op prep_compare(const std::string& opname, const py::array& a, const py::array& b, const py::array& out) {
  const char* fn = "compare";
  const int op = cmp_id(opname);
  need_out(out, fn);
  if (dkey(out) != "b1" && dkey(out) != "u1") fail("compare: out must be bool");
  const std::string key = dkey(a);
  if (dkey(b) != key) fail("compare: a and b must share one dtype");
  const std::vector<i64> shp = shape_of(out);
  if (shape_of(a) != shp || shape_of(b) != shp) fail("compare: operands must be broadcast to out's shape");
  const std::vector<i64> so = strides_of(out), sa = strides_of(a), sb = strides_of(b);
  const char* pa = cptr<char>(a);
  const char* pb = cptr<char>(b);
  auto* po = mptr<std::uint8_t>(out);
  static const char* const kCmpTypes[] = {"f4", "f8", "i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1", "b1"};
  if (std::find(std::begin(kCmpTypes), std::end(kCmpTypes), key) == std::end(kCmpTypes))
    fail("compare: unsupported dtype " + key);
  return [op, key, shp, so, sa, sb, pa, pb, po] { run_compare(op, key, shp, so, sa, sb, pa, pb, po); };
}

void py_compare(const std::string& opname, const py::array& a, const py::array& b, const py::array& out) {
  run_now(prep_compare, opname, a, b, out);
}

void py_logical(const std::string& op, const py::array& a, const py::array& b, const py::array& out) {
  const char* fn = "logical";
  need_out(out, fn);
  if (dkey(out) != "b1" || dkey(a) != "b1" || dkey(b) != "b1") fail("logical: operands and out must be bool");
  const int id = op == "and" ? 0 : op == "or" ? 1 : op == "xor" ? 2 : -1;
  if (id < 0) fail("logical: unknown op '" + op + "' (and, or, xor)");
  const std::vector<i64> shp = shape_of(out);
  if (shape_of(a) != shp || shape_of(b) != shp) fail("logical: operands must be broadcast to out's shape");
  const std::vector<i64> so = strides_of(out), sa = strides_of(a), sb = strides_of(b);
  const i64* st[3] = {so.data(), sa.data(), sb.data()};
  NdN<3> it(static_cast<int>(shp.size()), shp.data(), st);
  const auto* pa = cptr<std::uint8_t>(a);
  const auto* pb = cptr<std::uint8_t>(b);
  auto* po = mptr<std::uint8_t>(out);
  py::gil_scoped_release nogil;
  run_rows<3>(it, 0.5, [&](const i64* off, const i64* is, i64 n) {
    const std::uint8_t* x = pa + off[1];
    const std::uint8_t* y = pb + off[2];
    std::uint8_t* o = po + off[0];
    const i64 sx = is[1], sy = is[2];
    if (sx == 1 && sy == 1) {
      if (id == 0) for (i64 i = 0; i < n; ++i) o[i] = (x[i] != 0) & (y[i] != 0);
      else if (id == 1) for (i64 i = 0; i < n; ++i) o[i] = (x[i] != 0) | (y[i] != 0);
      else for (i64 i = 0; i < n; ++i) o[i] = (x[i] != 0) ^ (y[i] != 0);
      return;
    }
    for (i64 i = 0; i < n; ++i) {
      const bool u = x[i * sx] != 0, v = y[i * sy] != 0;
      o[i] = id == 0 ? (u && v) : id == 1 ? (u || v) : (u != v);
    }
  });
}

void py_logical_not(const py::array& x, const py::array& out) {
  need_out(out, "logical_not");
  if (dkey(out) != "b1" || dkey(x) != "b1") fail("logical_not: x and out must be bool");
  const std::vector<i64> shp = shape_of(out);
  if (shape_of(x) != shp) fail("logical_not: x must have out's shape");
  const std::vector<i64> so = strides_of(out), sx = strides_of(x);
  const i64* st[2] = {so.data(), sx.data()};
  NdN<2> it(static_cast<int>(shp.size()), shp.data(), st);
  const auto* px = cptr<std::uint8_t>(x);
  auto* po = mptr<std::uint8_t>(out);
  py::gil_scoped_release nogil;
  run_rows<2>(it, 0.5, [&](const i64* off, const i64* is, i64 n) {
    for (i64 i = 0; i < n; ++i) po[off[0] + i] = px[off[1] + i * is[1]] == 0;
  });
}

template <class T>
void where_t(const std::uint8_t* c, const char* a, const char* b, char* o, const NdN<4>& it) {
  run_rows<4>(it, 1.0, [&](const i64* off, const i64* is, i64 n) {
    const std::uint8_t* pc = c + off[1];
    const char* pa = a + off[2];
    const char* pb = b + off[3];
    T* po = reinterpret_cast<T*>(o + off[0]);
    if (is[1] == 1 && is[2] == static_cast<i64>(sizeof(T)) && is[3] == static_cast<i64>(sizeof(T))) {
      const T* ta = reinterpret_cast<const T*>(pa);
      const T* tb = reinterpret_cast<const T*>(pb);
      for (i64 i = 0; i < n; ++i) po[i] = pc[i] ? ta[i] : tb[i];
      return;
    }
    for (i64 i = 0; i < n; ++i) po[i] = pc[i * is[1]] ? ld<T>(pa + i * is[2]) : ld<T>(pb + i * is[3]);
  });
}

Op prep_where(const py::array& cond, const py::array& a, const py::array& b, const py::array& out) {
  const char* fn = "where";
  need_out(out, fn);
  if (dkey(cond) != "b1") fail("where: cond must be bool");
  if (dkey(a) != dkey(out) || dkey(b) != dkey(out)) fail("where: x, y and out must share one dtype");
  const std::vector<i64> shp = shape_of(out);
  if (shape_of(cond) != shp || shape_of(a) != shp || shape_of(b) != shp)
    fail("where: operands must be broadcast to out's shape");
  const std::vector<i64> so = strides_of(out), sc = strides_of(cond), sa = strides_of(a), sb = strides_of(b);
  const i64* st[4] = {so.data(), sc.data(), sa.data(), sb.data()};
  const NdN<4> it(static_cast<int>(shp.size()), shp.data(), st);
  const i64 es = out.itemsize();
  const auto* pc = cptr<std::uint8_t>(cond);
  const char* pa = cptr<char>(a);
  const char* pb = cptr<char>(b);
  char* po = mptr<char>(out);
  if (es != 1 && es != 2 && es != 4 && es != 8) fail("where: unsupported item size");
  return [it, es, pc, pa, pb, po] {
    switch (es) {
      case 1: where_t<std::uint8_t>(pc, pa, pb, po, it); break;
      case 2: where_t<std::uint16_t>(pc, pa, pb, po, it); break;
      case 4: where_t<std::uint32_t>(pc, pa, pb, po, it); break;
      default: where_t<std::uint64_t>(pc, pa, pb, po, it); break;
    }
  };
}

void py_where(const py::array& cond, const py::array& a, const py::array& b, const py::array& out) {
  run_now(prep_where, cond, a, b, out);
}

void py_prelu(const py::array& x, const py::array& slope, const py::array& out) {
  const char* fn = "prelu";
  need_f32(x, fn, "x");
  need_f32(slope, fn, "slope");
  need_f32(out, fn, "out");
  need_out(out, fn);
  const std::vector<i64> shp = shape_of(out);
  if (shape_of(x) != shp || shape_of(slope) != shp) fail("prelu: operands must be broadcast to out's shape");
  const std::vector<i64> so = strides_of(out), sx = strides_of(x), ss = strides_of(slope);
  const i64* st[3] = {so.data(), sx.data(), ss.data()};
  NdN<3> it(static_cast<int>(shp.size()), shp.data(), st);
  const char* px = cptr<char>(x);
  const char* ps = cptr<char>(slope);
  char* po = mptr<char>(out);
  const ExtraKernels& xk = extra_active();
  py::gil_scoped_release nogil;
  run_rows<3>(it, 1.0, [&](const i64* off, const i64* is, i64 n) {
    float* y = reinterpret_cast<float*>(po + off[0]);
    if (is[1] == 4 && (is[2] == 4 || is[2] == 0)) {
      xk.prelu_row(reinterpret_cast<const float*>(px + off[1]), reinterpret_cast<const float*>(ps + off[2]), is[2] == 4,
                   y, n);
      return;
    }
    for (i64 i = 0; i < n; ++i) {
      const float v = ld<float>(px + off[1] + i * is[1]), s = ld<float>(ps + off[2] + i * is[2]);
      y[i] = v < 0.f ? v * s : v;
    }
  });
}

// --------------------------------------------------------------------------------- softmax over a middle axis

// Columns a softmax_axis task takes: all of them when the outer dimension gives every thread a task, else blocks of a
// multiple of 64 columns (YOLOv8's DFL softmax is one outer block of 16 x 33600). Block starts stay multiples of every
// ISA's vector width, so each column goes through the same vector or scalar code as unsplit: the same bits.
i64 softmax_column_block(i64 outer, i64 inner, int threads) {
  if (threads <= 1 || outer >= threads) return std::max<i64>(inner, 1);
  const i64 per_outer = (threads + outer - 1) / outer;
  const i64 blk = ((inner + per_outer - 1) / per_outer + 63) / 64 * 64;
  return std::max<i64>(std::min(blk, inner), 1);
}

void py_softmax_axis(const py::array& x, const py::array& out, bool log) {
  // x: contiguous (outer, n, inner); softmax over n for every (outer, inner).
  const char* fn = "softmax_axis";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  if (x.ndim() != 3) fail("softmax_axis: x must be 3-D (outer, axis, inner)");
  need_shape(out, shape_of(x), fn, "out");
  const i64 outer = x.shape(0), n = x.shape(1), inner = x.shape(2);
  const float* px = cptr<float>(x);
  float* po = mptr<float>(out);
  const ExtraKernels& xk = extra_active();
  py::gil_scoped_release nogil;
  if (x.size() == 0) return;
  const int T = threads_for(static_cast<double>(outer) * n * inner * 6, 32768);
  const i64 blk = softmax_column_block(outer, inner, T);
  const i64 nblk = (inner + blk - 1) / blk;
  parallel_for(outer * nblk, T, [&](i64 t) {
    const i64 o = t / nblk, j0 = (t % nblk) * blk, w = std::min(blk, inner - j0);
    float* scratch = tl_buf(TL_MISC).get(static_cast<std::size_t>(2 * w));
    const i64 at = o * n * inner + j0;
    xk.softmax_cols(px + at, po + at, n, w, inner, log, scratch);
  });
}

// ------------------------------------------------------------------------------------- instance / group norm

void py_group_norm(const py::array& x, const py::array& scale, const py::array& bias, const py::array& out,
                   i64 groups, float eps, const std::string& activation) {
  // x contiguous (N, C, S...) ; scale, bias per channel (C,). groups == C: InstanceNormalization. activation: a
  // unary op ("none", "silu", ...) applied to each channel's row while it is in L1 (hetero::GroupNorm: a diffusion
  // U-Net's GroupNorm + SiLU, which ran as four more passes over the tensor).
  const char* fn = "group_norm";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  need_shape(out, shape_of(x), fn, "out");
  if (x.ndim() < 2) fail("group_norm: x must have at least 2 dims");
  const i64 N = x.shape(0), C = x.shape(1);
  if (groups < 1 || C % groups != 0) fail("group_norm: channels not divisible by groups");
  need_f32(scale, fn, "scale");
  need_f32(bias, fn, "bias");
  need_contig(scale, fn, "scale");
  need_contig(bias, fn, "bias");
  if (scale.size() != C || bias.size() != C) fail("group_norm: scale and bias must have C elements");
  const i64 S = C == 0 || N == 0 ? 0 : x.size() / (N * C);
  const float* px = cptr<float>(x);
  const float* ps = cptr<float>(scale);
  const float* pb = cptr<float>(bias);
  float* po = mptr<float>(out);
  const int act = activation == "none" ? -1 : unary_op_id(activation, fn);
  const Kernels& kr = active();
  const ExtraKernels& xk = extra_for(kr);
  py::gil_scoped_release nogil;
  if (x.size() == 0) return;
  const i64 cg = C / groups, len = cg * S;
  const int T = threads_for(static_cast<double>(x.size()) * 3, 32768);
  parallel_for(N * groups, T, [&](i64 q) {
    const i64 g = q % groups;
    const float* xi = px + q * len;
    float* yo = po + q * len;
    float mean, var;
    xk.mean_var_row(xi, len, &mean, &var);
    const float inv = 1.f / std::sqrt(var + eps);
    for (i64 c = 0; c < cg; ++c) {
      const i64 ch = g * cg + c;
      xk.affine_row(xi + c * S, yo + c * S, S, mean, inv * ps[ch], pb[ch]);
      if (act >= 0) kr.unary(act, yo + c * S, yo + c * S, S, 0.f, 0.f);
    }
  });
}

Op prep_channel_affine(const py::array& x, const py::array& mul, const py::array& add, const py::array& out) {
  // out[n, c, s...] = x[n, c, s...] * mul[c] + add[c]: inference BatchNormalization in one pass (it was a Mul and an
  // Add over the whole tensor, each a pass).
  const char* fn = "channel_affine";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  need_shape(out, shape_of(x), fn, "out");
  if (x.ndim() < 2) fail("channel_affine: x must have at least 2 dims");
  const i64 N = x.shape(0), C = x.shape(1);
  need_f32(mul, fn, "mul");
  need_f32(add, fn, "add");
  need_contig(mul, fn, "mul");
  need_contig(add, fn, "add");
  if (mul.size() != C || add.size() != C) fail("channel_affine: mul and add must have C elements");
  const i64 S = C == 0 || N == 0 ? 0 : x.size() / (N * C);
  const float* px = cptr<float>(x);
  const float* pm = cptr<float>(mul);
  const float* pa = cptr<float>(add);
  float* po = mptr<float>(out);
  const i64 size = x.size();
  return [px, pm, pa, po, N, C, S, size] {
    if (size == 0) return;
    const ExtraKernels& xk = extra_active();
    const int T = threads_for(static_cast<double>(size), 65536);
    parallel_for(N * C, T, [&](i64 q) {
      const i64 c = q % C;
      xk.affine_row(px + q * S, po + q * S, S, 0.f, pm[c], pa[c]);
    });
  };
}

void py_channel_affine(const py::array& x, const py::array& mul, const py::array& add, const py::array& out) {
  run_now(prep_channel_affine, x, mul, add, out);
}

// ------------------------------------------------------------------------------------------------------ Pad

inline i64 pad_map(i64 s, i64 n, int mode) {
  if (s >= 0 && s < n) return s;
  switch (mode) {
    case 1: {  // reflect (no edge repeat); periodic beyond one reflection, like numpy
      if (n == 1) return 0;
      const i64 p = 2 * (n - 1);
      s %= p;
      if (s < 0) s += p;
      return s < n ? s : p - s;
    }
    case 2: return s < 0 ? 0 : n - 1;  // edge
    case 3: {                           // wrap
      s %= n;
      return s < 0 ? s + n : s;
    }
    default: return -1;
  }
}

// pad's work on prepared operands (prep_pad).
void run_pad(const char* px, char* po, const char* pval, i64 item, i64 out_size, int nd_in,
             const std::vector<i64>& begins, const std::vector<i64>& is, const std::vector<i64>& os, int m) {
  if (out_size == 0) return;
  // Trailing axes without padding travel as one wider element (openWakeWord pads axis 2 of [N, 76, 32, 1]: rows of
  // one value each otherwise), the pad value repeated across it.
  int nd = nd_in;
  i64 es = item;
  while (nd > 1 && begins[static_cast<std::size_t>(nd - 1)] == 0 &&
         is[static_cast<std::size_t>(nd - 1)] == os[static_cast<std::size_t>(nd - 1)]) {
    es *= is[static_cast<std::size_t>(--nd)];
  }
  std::vector<char> pattern(static_cast<std::size_t>(es));
  for (i64 i = 0; i < es; i += item) std::memcpy(pattern.data() + i, pval, static_cast<std::size_t>(item));
  const char* pv = pattern.data();
  std::vector<i64> ist(static_cast<std::size_t>(nd));
  {
    i64 s = es;
    for (int d = nd - 1; d >= 0; --d) {
      ist[static_cast<std::size_t>(d)] = s;
      s *= is[static_cast<std::size_t>(d)];
    }
  }
  const std::size_t last = static_cast<std::size_t>(std::max(nd - 1, 0));
  const i64 Wo = nd ? os[last] : 1, Wi = nd ? is[last] : 1, bl = nd ? begins[last] : 0;
  i64 rows = 1;
  for (int d = 0; d + 1 < nd; ++d) rows *= os[static_cast<std::size_t>(d)];
  auto fill = [&](char* d, i64 n) {
    if (es == 4) {
      std::uint32_t v;
      std::memcpy(&v, pv, 4);
      std::fill(reinterpret_cast<std::uint32_t*>(d), reinterpret_cast<std::uint32_t*>(d) + n, v);
    } else {
      for (i64 i = 0; i < n; ++i) std::memcpy(d + i * es, pv, static_cast<std::size_t>(es));
    }
  };
  // Valid run of the last dim: output columns [va, vb) copy input columns [va - bl, vb - bl).
  const i64 va = std::max<i64>(0, std::min<i64>(Wo, bl)), vb = std::max<i64>(va, std::min<i64>(Wo, bl + Wi));
  const int T = threads_for(static_cast<double>(out_size), 65536);
  const i64 chunk = std::max<i64>(1, rows / std::max(1, 4 * T));
  parallel_for(ceil_div(rows, chunk), T, [&](i64 t) {
    for (i64 r = t * chunk; r < std::min(rows, (t + 1) * chunk); ++r) {
      char* orow = po + r * Wo * es;
      i64 off = 0, rr = r;
      bool inside = true;
      for (int d = nd - 2; d >= 0; --d) {
        const i64 n = os[static_cast<std::size_t>(d)];
        const i64 o = rr % n;
        rr /= n;
        const i64 s = pad_map(o - begins[static_cast<std::size_t>(d)], is[static_cast<std::size_t>(d)], m);
        if (s < 0) {
          inside = false;
          break;
        }
        off += s * ist[static_cast<std::size_t>(d)];
      }
      if (!inside) {
        fill(orow, Wo);
        continue;
      }
      const char* irow = px + off;
      if (vb > va) std::memcpy(orow + va * es, irow + (va - bl) * es, static_cast<std::size_t>((vb - va) * es));
      for (i64 o = 0; o < Wo; ++o) {
        if (o == va) o = vb;
        if (o >= Wo) break;
        const i64 s = pad_map(o - bl, Wi, m);
        if (s < 0)
          std::memcpy(orow + o * es, pv, static_cast<std::size_t>(es));
        else
          std::memcpy(orow + o * es, irow + s * es, static_cast<std::size_t>(es));
      }
    }
  });
}

// The value is read when the op runs (a prepared op: Pad's constant_value may be computed).
Op prep_pad(const py::array& x, const std::vector<i64>& begins, const std::string& mode, const py::array& value,
            const py::array& out) {
  const char* fn = "pad";
  need_contig(x, fn, "x");
  need_out(out, fn);
  if (dkey(x) != dkey(out)) fail("pad: x and out must share one dtype");
  const int nd_in = static_cast<int>(x.ndim());
  if (static_cast<int>(begins.size()) != nd_in || out.ndim() != nd_in) fail("pad: rank mismatch");
  const int m = mode == "constant" ? 0 : mode == "reflect" ? 1 : mode == "edge" ? 2 : mode == "wrap" ? 3 : -1;
  if (m < 0) fail("pad: unknown mode '" + mode + "'");
  if (value.itemsize() != x.itemsize() || value.size() != 1) fail("pad: value must be one element of x's dtype");
  const std::vector<i64> is = shape_of(x), os = shape_of(out);
  for (int d = 0; d < nd_in; ++d) {
    const i64 b = begins[static_cast<std::size_t>(d)];
    // Every output index must map into the input (or be a constant fill).
    if (m != 0 && is[static_cast<std::size_t>(d)] == 0 && os[static_cast<std::size_t>(d)] > 0)
      fail("pad: cannot " + mode + "-pad an empty axis");
    if (b > os[static_cast<std::size_t>(d)] + is[static_cast<std::size_t>(d)] + (1LL << 40)) fail("pad: pads too large");
  }
  const char* px = cptr<char>(x);
  char* po = mptr<char>(out);
  const char* pval = cptr<char>(value);
  const i64 item = x.itemsize(), out_size = out.size();
  return [px, po, pval, item, out_size, nd_in, begins, is, os, m] {
    run_pad(px, po, pval, item, out_size, nd_in, begins, is, os, m);
  };
}

void py_pad(const py::array& x, const std::vector<i64>& begins, const std::string& mode, const py::array& value,
            const py::array& out) {
  run_now(prep_pad, x, begins, mode, value, out);
}

// ------------------------------------------------------------------------------------------------- Resize 2-D

void py_resize2d(const py::array& x, const py::array& out, const py::array& y0, const py::array& y1,
                 const py::array& wy, const py::array& x0, const py::array& x1, const py::array& wx) {
  // x (NC, H, W) contiguous float32 -> out (NC, Ho, Wo). Linear: rows y0/y1 blended by wy, then columns x0/x1 by
  // wx. Nearest: pass wy = wx = 0 (only y0 / x0 are read).
  const char* fn = "resize2d";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  if (x.ndim() != 3 || out.ndim() != 3 || out.shape(0) != x.shape(0)) fail("resize2d: x and out must be (NC, H, W)");
  const i64 NC = x.shape(0), H = x.shape(1), W = x.shape(2), Ho = out.shape(1), Wo = out.shape(2);
  for (const py::array* a : {&y0, &y1, &x0, &x1}) {
    if (dkey(*a) != "i8" || !c_contig(*a)) fail("resize2d: index tables must be contiguous int64");
  }
  for (const py::array* a : {&wy, &wx}) need_f32(*a, fn, "weights");
  if (y0.size() != Ho || y1.size() != Ho || wy.size() != Ho || x0.size() != Wo || x1.size() != Wo || wx.size() != Wo)
    fail("resize2d: table sizes must match the output");
  const auto* py0 = cptr<std::int64_t>(y0);
  const auto* py1 = cptr<std::int64_t>(y1);
  const auto* px0 = cptr<std::int64_t>(x0);
  const auto* px1 = cptr<std::int64_t>(x1);
  for (i64 i = 0; i < Ho; ++i)
    if (py0[i] < 0 || py0[i] >= H || py1[i] < 0 || py1[i] >= H) fail("resize2d: row index out of range");
  for (i64 i = 0; i < Wo; ++i)
    if (px0[i] < 0 || px0[i] >= W || px1[i] < 0 || px1[i] >= W) fail("resize2d: column index out of range");
  const float* pwy = cptr<float>(wy);
  const float* pwx = cptr<float>(wx);
  const float* px = cptr<float>(x);
  float* po = mptr<float>(out);
  py::gil_scoped_release nogil;
  if (out.size() == 0) return;
  bool nearest = true;
  for (i64 i = 0; i < Ho && nearest; ++i) nearest = pwy[i] == 0.f;
  for (i64 i = 0; i < Wo && nearest; ++i) nearest = pwx[i] == 0.f;
  // Nearest by an integer factor f along W (column ox reads ox / f: YOLO's 2x upsampling) writes each input value
  // f times without the index table; an output row that reads the same input row as the one before it is a copy.
  i64 fw = Wo % W == 0 ? Wo / W : 0;
  for (i64 i = 0; i < Wo && fw > 0; ++i)
    if (px0[i] != i / fw) fw = 0;
  const int T = threads_for(static_cast<double>(NC) * Ho * Wo * (nearest ? 1 : 6), 32768);
  parallel_for(NC, T, [&](i64 q) {
    const float* in = px + q * H * W;
    float* o = po + q * Ho * Wo;
    float* tmp = tl_buf(TL_MISC).get(static_cast<std::size_t>(W));
    for (i64 oy = 0; oy < Ho; ++oy) {
      float* orow = o + oy * Wo;
      const float* r0 = in + py0[oy] * W;
      if (nearest) {
        if (oy > 0 && py0[oy] == py0[oy - 1])
          std::memcpy(orow, orow - Wo, static_cast<std::size_t>(Wo) * sizeof(float));
        else if (fw == 2)
          for (i64 i = 0; i < W; ++i) orow[2 * i] = orow[2 * i + 1] = r0[i];
        else if (fw > 0)
          for (i64 i = 0; i < W; ++i) std::fill(orow + i * fw, orow + (i + 1) * fw, r0[i]);
        else
          for (i64 ox = 0; ox < Wo; ++ox) orow[ox] = r0[px0[ox]];
        continue;
      }
      const float* row = r0;
      const float b = pwy[oy];
      if (b != 0.f) {
        const float* r1 = in + py1[oy] * W;
        const float a = 1.f - b;
        for (i64 i = 0; i < W; ++i) tmp[i] = a * r0[i] + b * r1[i];
        row = tmp;
      }
      for (i64 ox = 0; ox < Wo; ++ox) {
        const float w1 = pwx[ox];
        orow[ox] = (1.f - w1) * row[px0[ox]] + w1 * row[px1[ox]];
      }
    }
  });
}

}  // namespace

// --------------------------------------------------------------------------------- integer reductions, OneHot
// Small integer tensors (phoneme counts, one-hot masks of a duration model): scalar loops, one call per op, which
// a replay's LlmStep can take (a numpy ufunc reduce over a short last axis cost ~20 us for 3.7k elements).

// y[...] = f(y, x) over the merged dims from d on; yst[d] == 0 on a reduced dim.
template <class T, class F>
void int_reduce_dims(const T* x, T* y, const std::vector<i64>& shape, const std::vector<i64>& xst,
                     const std::vector<i64>& yst, std::size_t d, F f) {
  const i64 n = shape[d];
  if (d + 1 == shape.size()) {
    if (yst[d] == 0) {
      T acc = *y;
      for (i64 i = 0; i < n; ++i) acc = f(acc, x[i]);
      *y = acc;
    } else {
      for (i64 i = 0; i < n; ++i) y[i] = f(y[i], x[i]);
    }
    return;
  }
  for (i64 i = 0; i < n; ++i) int_reduce_dims(x + i * xst[d], y + i * yst[d], shape, xst, yst, d + 1, f);
}

template <class T>
void int_reduce_t(int op, const T* x, T* y, i64 kept, const std::vector<i64>& shape, const std::vector<i64>& xst,
                  const std::vector<i64>& yst) {
  using U = std::make_unsigned_t<T>;  // sums and products wrap, as numpy's (no signed overflow)
  const T init = op == R_MAX ? std::numeric_limits<T>::lowest() : op == R_MIN ? std::numeric_limits<T>::max()
                 : op == R_PROD ? T(1) : T(0);
  std::fill(y, y + kept, init);
  switch (op) {
    case R_MAX: int_reduce_dims(x, y, shape, xst, yst, 0, [](T a, T b) { return b > a ? b : a; }); break;
    case R_MIN: int_reduce_dims(x, y, shape, xst, yst, 0, [](T a, T b) { return b < a ? b : a; }); break;
    case R_PROD:
      int_reduce_dims(x, y, shape, xst, yst, 0, [](T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); });
      break;
    default:
      int_reduce_dims(x, y, shape, xst, yst, 0, [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
  }
}

// int32 / int64 x reduced over `axes` into out (its kept elements, any shape of that size): op max, min, sum, prod.
Op prep_int_reduce(const std::string& opname, const py::array& x, const std::vector<i64>& axes, const py::array& out) {
  const char* fn = "int_reduce";
  need_contig(x, fn, "x");
  need_out(out, fn);
  const std::string key = dkey(x);
  if ((key != "i4" && key != "i8") || dkey(out) != key) fail("int_reduce: x and out must be int32 or int64, alike");
  if (opname != "max" && opname != "min" && opname != "sum" && opname != "prod")
    fail("int_reduce: op must be max, min, sum or prod");
  const int op = reduce_id(opname);
  if (x.size() == 0) fail(std::string(fn) + ": empty reduction");
  ReduceDims dims = reduce_dims(x, axes, out, fn);
  std::vector<i64> shape = std::move(dims.shape);
  std::vector<char> rf = std::move(dims.rf);
  const i64 kept = dims.kept;
  const std::size_t m = shape.size();
  std::vector<i64> xst(m), yst(m);
  i64 xs = 1, ys = 1;
  for (std::size_t d = m; d-- > 0;) {
    xst[d] = xs;
    xs *= shape[d];
    yst[d] = rf[d] ? 0 : ys;
    if (!rf[d]) ys *= shape[d];
  }
  const void* px = x.data();
  void* po = mptr<void>(out);
  if (key == "i4")
    return [op, px, po, kept, shape, xst, yst] {
      int_reduce_t(op, static_cast<const std::int32_t*>(px), static_cast<std::int32_t*>(po), kept, shape, xst, yst);
    };
  return [op, px, po, kept, shape, xst, yst] {
    int_reduce_t(op, static_cast<const std::int64_t*>(px), static_cast<std::int64_t*>(po), kept, shape, xst, yst);
  };
}

void py_int_reduce(const std::string& opname, const py::array& x, const std::vector<i64>& axes, const py::array& out) {
  run_now(prep_int_reduce, opname, x, axes, out);
}

template <class I>
void one_hot_run(const I* idx, const char* values, char* out, i64 item, i64 before, i64 depth, i64 after) {
  const i64 total = before * depth * after;
  for (i64 i = 0; i < total; ++i) std::memcpy(out + i * item, values, static_cast<std::size_t>(item));
  for (i64 b = 0; b < before; ++b)
    for (i64 a = 0; a < after; ++a) {
      i64 k = static_cast<i64>(idx[b * after + a]);
      if (k < 0) k += depth;  // negative indices count from depth; out of range ones match nothing
      if (k >= 0 && k < depth) std::memcpy(out + ((b * depth + k) * after + a) * item, values + item, static_cast<std::size_t>(item));
    }
}

// OneHot: out (before, depth, after) = values[0], values[1] where the index (before, after) picks; the indices and
// values are read when the op runs.
Op prep_one_hot(const py::array& indices, const py::array& values, const py::array& out, i64 before, i64 depth,
                i64 after) {
  const char* fn = "one_hot";
  need_contig(indices, fn, "indices");
  need_contig(values, fn, "values");
  need_out(out, fn);
  const std::string key = dkey(indices);
  if (key != "i4" && key != "i8") fail("one_hot: indices must be int32 or int64");
  if (dkey(values) != dkey(out) || values.size() < 2) fail("one_hot: values must be two elements of out's dtype");
  if (before < 0 || depth < 0 || after < 0 || indices.size() != before * after || out.size() != before * depth * after)
    fail("one_hot: indices of " + shape_str(indices) + " and out of " + shape_str(out) + " do not fit (" +
         std::to_string(before) + ", " + std::to_string(depth) + ", " + std::to_string(after) + ")");
  const void* pi = indices.data();
  const char* pv = cptr<char>(values);
  char* po = mptr<char>(out);
  const i64 item = out.itemsize();
  if (key == "i4")
    return [pi, pv, po, item, before, depth, after] {
      one_hot_run(static_cast<const std::int32_t*>(pi), pv, po, item, before, depth, after);
    };
  return [pi, pv, po, item, before, depth, after] {
    one_hot_run(static_cast<const std::int64_t*>(pi), pv, po, item, before, depth, after);
  };
}

void py_one_hot(const py::array& indices, const py::array& values, const py::array& out, i64 before, i64 depth,
                i64 after) {
  run_now(prep_one_hot, indices, values, out, before, depth, after);
}

// ----------------------------------------------------------------------------------- LabelEncoder (ai.onnx.ml)
// out[i] = table.get(x[i], default) for an object array x (strings) into int64 / float32 out: the dict's lookups
// (a str's hash is cached) without the interpreter's loop and list; under the GIL (it reads Python objects).
void py_label_encode(const py::dict& table, const py::object& fallback, const py::array& x, const py::array& out) {
  const char* fn = "label_encode";
  need_contig(x, fn, "x");
  need_out(out, fn);
  if (x.dtype().kind() != 'O') fail("label_encode: x must be an object array");
  if (out.size() != x.size()) fail("label_encode: x and out must have the same size");
  const std::string key = dkey(out);
  if (key != "i8" && key != "f4") fail("label_encode: out must be int64 or float32");
  PyObject* const* px = static_cast<PyObject* const*>(x.data());
  const i64 n = x.size();
  PyObject* dict = table.ptr();
  auto lookup = [&](i64 i) -> PyObject* {
    PyObject* v = px[i] == nullptr ? nullptr : PyDict_GetItemWithError(dict, px[i]);  // borrowed
    if (v == nullptr && PyErr_Occurred()) throw py::error_already_set();
    return v;
  };
  if (key == "i8") {
    const std::int64_t dflt = fallback.cast<std::int64_t>();
    std::int64_t* po = mptr<std::int64_t>(out);
    for (i64 i = 0; i < n; ++i) {
      PyObject* v = lookup(i);
      if (v == nullptr) {
        po[i] = dflt;
        continue;
      }
      const long long got = PyLong_AsLongLong(v);
      if (got == -1 && PyErr_Occurred()) throw py::error_already_set();
      po[i] = got;
    }
    return;
  }
  const float dflt = fallback.cast<float>();
  float* po = mptr<float>(out);
  for (i64 i = 0; i < n; ++i) {
    PyObject* v = lookup(i);
    if (v == nullptr) {
      po[i] = dflt;
      continue;
    }
    const double got = PyFloat_AsDouble(v);
    if (got == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    po[i] = static_cast<float>(got);
  }
}

void bind_conv_transpose(py::module_& m);
void bind_rnn(py::module_& m);

void bind_onnx_extra(py::module_& m) {
  register_step_op("compare", [](const py::tuple& a) {
    step_arity(a, 4, 4, "compare");
    return prep_compare(a[0].cast<std::string>(), step_array(a, 1, "compare"), step_array(a, 2, "compare"),
                        step_array(a, 3, "compare"));
  });
  register_step_op("where", [](const py::tuple& a) {
    step_arity(a, 4, 4, "where");
    return prep_where(step_array(a, 0, "where"), step_array(a, 1, "where"), step_array(a, 2, "where"),
                      step_array(a, 3, "where"));
  });
  register_step_op("pad", [](const py::tuple& a) {
    step_arity(a, 5, 5, "pad");
    return prep_pad(step_array(a, 0, "pad"), a[1].cast<std::vector<i64>>(), a[2].cast<std::string>(),
                    step_array(a, 3, "pad"), step_array(a, 4, "pad"));
  });
  register_step_op("channel_affine", [](const py::tuple& a) {
    step_arity(a, 4, 4, "channel_affine");
    return prep_channel_affine(step_array(a, 0, "channel_affine"), step_array(a, 1, "channel_affine"),
                               step_array(a, 2, "channel_affine"), step_array(a, 3, "channel_affine"));
  });
  register_step_op("argreduce", [](const py::tuple& a) {
    step_arity(a, 5, 5, "argreduce");
    return prep_argreduce(step_array(a, 0, "argreduce"), a[1].cast<i64>(), step_array(a, 2, "argreduce"),
                          a[3].cast<bool>(), a[4].cast<bool>());
  });
  register_step_op("reduce", [](const py::tuple& a) {
    step_arity(a, 4, 4, "reduce");
    return prep_reduce(a[0].cast<std::string>(), step_array(a, 1, "reduce"), a[2].cast<std::vector<i64>>(),
                       step_array(a, 3, "reduce"));
  });
  register_step_op("int_reduce", [](const py::tuple& a) {
    step_arity(a, 4, 4, "int_reduce");
    return prep_int_reduce(a[0].cast<std::string>(), step_array(a, 1, "int_reduce"), a[2].cast<std::vector<i64>>(),
                           step_array(a, 3, "int_reduce"));
  });
  register_step_op("one_hot", [](const py::tuple& a) {
    step_arity(a, 6, 6, "one_hot");
    return prep_one_hot(step_array(a, 0, "one_hot"), step_array(a, 1, "one_hot"), step_array(a, 2, "one_hot"),
                        a[3].cast<i64>(), a[4].cast<i64>(), a[5].cast<i64>());
  });
  m.def("label_encode", &py_label_encode, py::arg("table"), py::arg("default"), py::arg("x"), py::arg("out"),
        "out[i] = table.get(x[i], default): an object array x (strings) through a dict into int64 / float32 out (the "
        "dict's values Python ints / floats).");
  m.def("int_reduce", &py_int_reduce, py::arg("op"), py::arg("x"), py::arg("axes"), py::arg("out"),
        "Reduce contiguous int32 / int64 x over `axes` into out (its kept elements; the same dtype). op: max, min, "
        "sum, prod (sums and products wrap).");
  m.def("one_hot", &py_one_hot, py::arg("indices"), py::arg("values"), py::arg("out"), py::arg("before"),
        py::arg("depth"), py::arg("after"),
        "OneHot: out viewed as (before, depth, after) = values[0], values[1] at each int32 / int64 index of "
        "(before, after) (negative ones count from depth, those out of range match nothing).");
  m.def("reduce", &py_reduce, py::arg("op"), py::arg("x"), py::arg("axes"), py::arg("out"),
        "Reduce contiguous float32 x over `axes` into out (kept dims, any shape of that size). op: sum, mean, "
        "sumsq, l1, l2, max, min, prod, logsum, logsumexp.");
  m.def("scaled_masked_softmax", &py_scaled_masked_softmax, py::arg("x"), py::arg("divisor"), py::arg("mask"),
        py::arg("mask_rows"), py::arg("mask_vec"), py::arg("out"),
        "hetero::ScaledMaskedSoftmax: out = Softmax(x / divisor + mask) over the last axis, row r's mask at "
        "mask[mask_rows[r]:] (n values with mask_vec, else one).");
  m.def("global_min_max", &py_global_min_max, py::arg("x"), py::arg("lo"), py::arg("hi"),
        "lo[r], hi[r] = the min and max of row r of contiguous float32 x seen as lo.size rows (NaN propagates).");
  m.def("argreduce", &py_argreduce, py::arg("x"), py::arg("axis"), py::arg("out"), py::arg("is_max") = true,
        py::arg("select_last_index") = false);
  m.def("topk", &py_topk, py::arg("x"), py::arg("axis"), py::arg("k"), py::arg("largest"), py::arg("values"),
        py::arg("indices"));
  m.def("compare", &py_compare, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out"));
  m.def("logical", &py_logical, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out"));
  m.def("logical_not", &py_logical_not, py::arg("x"), py::arg("out"));
  m.def("where", &py_where, py::arg("cond"), py::arg("x"), py::arg("y"), py::arg("out"));
  m.def("prelu", &py_prelu, py::arg("x"), py::arg("slope"), py::arg("out"));
  m.def("softmax_axis", &py_softmax_axis, py::arg("x"), py::arg("out"), py::arg("log") = false);
  m.def("group_norm", &py_group_norm, py::arg("x"), py::arg("scale"), py::arg("bias"), py::arg("out"),
        py::arg("groups"), py::arg("epsilon") = 1e-5f, py::arg("activation") = "none");
  m.def("channel_affine", &py_channel_affine, py::arg("x"), py::arg("mul"), py::arg("add"), py::arg("out"));
  m.def("pad", &py_pad, py::arg("x"), py::arg("begins"), py::arg("mode"), py::arg("value"), py::arg("out"));
  m.def("resize2d", &py_resize2d, py::arg("x"), py::arg("out"), py::arg("y0"), py::arg("y1"), py::arg("wy"),
        py::arg("x0"), py::arg("x1"), py::arg("wx"));
  bind_conv_transpose(m);
  bind_rnn(m);
}

}  // namespace hetero
