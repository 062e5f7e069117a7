// A broadcasting binary op, a unary op and a product by a narrow constant right side, row by row without writing
// the broadcast tensor (hetero::BroadcastUnaryMatMul, made by hetero.ir.passes.fuse_broadcast_unary_matmul):
//
//   x[r] = unary(a[ra[r]] (op) b[rb[r]])    rows of D values (an operand row of one value broadcasts along D)
//   float:      y[r] = x[r] @ W (+ bias)             (W given as its N columns of D values, W^T)
//   quantized:  (q, s, z) = DynamicQuantizeLinear(x over every row)
//               y[r] = float32((q[r] - z) @ (W - zw)) * (s * w_scale) (+ bias)     W 8-bit, packed by qpack_b
//
// The Bahdanau attention of text2tashkeel's bilstm (tanh(W q[:, None] + U k[None, :]) . v, v of one column)
// materialised a [T, T, 512] tensor three times (Add, Tanh, DynamicQuantizeLinear). Here a row lives in L1 and a
// block of quantized rows in L2, and every value is the one the unfused kernels compute: the same binary / unary
// table entries, the same quantize8 and output stage, the integer sums exact, so the result is bit for bit theirs.
//
// DynamicQuantizeLinear needs the range of x before the first row is quantized. Where every (a row, b row) pair
// occurs (the caller says so: no leading axis where both operands have more than one row), op is Add or Sub and
// unary is non-decreasing, min / max of x is unary of the extreme sums, and those follow from the column minima and
// maxima of a and b (rounding is monotone): one pass over x instead of two. The pass checks that prediction against
// the range it sees and runs again with the seen range if they differ (a non-monotone ulp of a vector tanh, NaN),
// so the result never depends on the prediction.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "onnx_py.hpp"
#include "qlinear.hpp"

namespace hetero {

int unary_op_id(const std::string& op, const char* fn);  // module.cpp
int binary_op_id(const std::string& op);

namespace {

using namespace pyx;

constexpr i64 kBlock = 32;  // rows a task quantizes and multiplies at once (an AMX block)

struct Range {
  float lo, hi;
};

// min / max of a row with DynamicQuantizeLinear's semantics over the whole tensor (its minmax: NaN is skipped,
// except a NaN first value, which the caller handles): the ISA's minmax, which returns NaN only for a NaN row[0],
// then such a row scanned skipping NaN. +inf / -inf (lo > hi) when every value is NaN.
Range row_range(const qlin::QKernels& qk, const float* x, i64 n) {
  float lo = 0.f, hi = 0.f;
  qk.minmax(x, n, &lo, &hi);
  if (lo == lo) return {lo, hi};
  lo = std::numeric_limits<float>::infinity();
  hi = -lo;
  for (i64 i = 0; i < n; ++i) {
    if (x[i] != x[i]) continue;
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  return {lo, hi};
}

inline void merge(Range& acc, const Range& r) {  // NaN in r never enters; a NaN acc (a NaN first value) stays
  acc.lo = r.lo < acc.lo ? r.lo : acc.lo;
  acc.hi = r.hi > acc.hi ? r.hi : acc.hi;
}

struct Chain {
  int bop, uop;
  float alpha, beta;
  i64 D, R;
  const float *a, *b;
  bool a_row, b_row;  // whether an operand row has D values (else one, broadcast)
  const i64 *ra, *rb;  // element offsets of each output row's operand rows

  // x[r] into buf (D floats)
  void row(const Kernels& kr, i64 r, float* buf) const {
    const float* pa = a + ra[r];
    const float* pb = b + rb[r];
    const int mode = a_row && b_row ? BM_VV : (a_row ? BM_VS : BM_SV);
    if (!a_row && !b_row) {
      kr.binary(bop, BM_VV, pa, pb, buf, 1);
      std::fill(buf + 1, buf + D, buf[0]);
    } else {
      kr.binary(bop, mode, pa, pb, buf, D);
    }
    if (uop >= 0) kr.unary(uop, buf, buf, D, alpha, beta);
  }
};

// Column minima and maxima of `rows` rows of `width` values (width 1: one value a row).
void column_range(const Kernels& kr, const float* x, i64 rows, i64 width, std::vector<float>& lo, std::vector<float>& hi) {
  lo.assign(x, x + width);
  hi.assign(x, x + width);
  for (i64 r = 1; r < rows; ++r) {
    kr.binary(B_MIN, BM_VV, lo.data(), x + r * width, lo.data(), width);  // NaN propagates: the caller checks
    kr.binary(B_MAX, BM_VV, hi.data(), x + r * width, hi.data(), width);
  }
}

// The predicted range of x (see the top); false when it cannot be made (NaN in an operand, an op it does not know).
bool predict_range(const Kernels& kr, const Chain& c, i64 rows_a, i64 rows_b, Range& out) {
  if (c.bop != B_ADD && c.bop != B_SUB) return false;
  const i64 wa = c.a_row ? c.D : 1, wb = c.b_row ? c.D : 1;
  std::vector<float> alo, ahi, blo, bhi;
  column_range(kr, c.a, rows_a, wa, alo, ahi);
  column_range(kr, c.b, rows_b, wb, blo, bhi);
  const i64 w = std::max(wa, wb);
  auto widen = [w](std::vector<float>& v) { if (static_cast<i64>(v.size()) < w) v.assign(static_cast<std::size_t>(w), v[0]); };
  for (auto* v : {&alo, &ahi, &blo, &bhi}) widen(*v);
  std::vector<float> slo(static_cast<std::size_t>(w)), shi(static_cast<std::size_t>(w));
  // Add: a + b is smallest at both minima; Sub: a - b at a's minimum and b's maximum
  kr.binary(c.bop, BM_VV, alo.data(), c.bop == B_ADD ? blo.data() : bhi.data(), slo.data(), w);
  kr.binary(c.bop, BM_VV, ahi.data(), c.bop == B_ADD ? bhi.data() : blo.data(), shi.data(), w);
  float ends[2] = {slo[0], shi[0]};
  for (i64 i = 0; i < w; ++i) {
    if (slo[i] != slo[i] || shi[i] != shi[i]) return false;
    ends[0] = std::min(ends[0], slo[i]);
    ends[1] = std::max(ends[1], shi[i]);
  }
  if (c.uop >= 0) kr.unary(c.uop, ends, ends, 2, c.alpha, c.beta);
  if (ends[0] != ends[0] || ends[1] != ends[1]) return false;
  out = {ends[0], ends[1]};
  return true;
}

int threads_for_rows(const Chain& c) {
  return threads_for(4.0 * static_cast<double>(c.R) * static_cast<double>(c.D), 2 * kWakeElementWork);
}

// The exact range of x: every row computed once, nothing stored.
Range scan_range(const Kernels& kr, const qlin::QKernels& qk, const Chain& c, float first) {
  const i64 tasks = ceil_div(c.R, kBlock);
  std::vector<Range> part(static_cast<std::size_t>(tasks));
  parallel_for(tasks, threads_for_rows(c), [&](i64 t) {
    std::vector<float> buf(static_cast<std::size_t>(c.D));
    Range acc{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
    for (i64 r = t * kBlock; r < std::min(c.R, (t + 1) * kBlock); ++r) {
      c.row(kr, r, buf.data());
      merge(acc, row_range(qk, buf.data(), c.D));
    }
    part[static_cast<std::size_t>(t)] = acc;
  });
  Range all{first, first};
  for (const Range& p : part) merge(all, p);
  return all;
}

struct QuantOut {
  const qlin::QPacked* packed;
  float* out;
  const float* scale;  // w_scale: 1 or N values
  i64 nscale;
  const float* bias;  // N or null
};

// One pass: rows computed, quantized with (lo, hi)'s scale and zero point into a block, the block through the int8
// GEMM's F32 stage. Returns the range the rows had (for the caller's check of a predicted range).
Range quantized_pass(const Kernels& kr, const qlin::QKernels& qk, const Chain& c, const QuantOut& q, Range range,
                     float first) {
  float lo = std::min(range.lo, 0.f), hi = std::max(range.hi, 0.f);
  float s = 0.f;
  int z = 0;
  qlin::dynamic_quant_params(lo, hi, &s, &z);
  std::vector<float> scales;
  qlin::column_scales(&s, 1, q.scale, q.nscale, q.packed->n, scales);
  const i64 lda = q.packed->k4 * 4;
  const std::int32_t za = z;
  // tanh(a + b) of two D-wide rows (the Bahdanau attention's): the row's four passes in one (the same bytes and range)
  const bool fused = c.bop == B_ADD && c.uop == U_TANH && c.a_row && c.b_row;
  const i64 tasks = ceil_div(c.R, kBlock);
  std::vector<Range> part(static_cast<std::size_t>(tasks));
  parallel_for(tasks, threads_for_rows(c), [&](i64 t) {
    std::vector<float> buf(static_cast<std::size_t>(c.D));
    std::vector<std::uint8_t> blk(static_cast<std::size_t>(kBlock * lda), 0);  // zero past D: qgemm's padding
    Range acc{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
    const i64 r0 = t * kBlock, rows = std::min(c.R, r0 + kBlock) - r0;
    for (i64 i = 0; i < rows; ++i) {
      if (fused && s != 0.f) {
        Range seen{};
        kr.add_tanh_quantize_row(c.a + c.ra[r0 + i], c.b + c.rb[r0 + i], c.D, s, z, blk.data() + i * lda, &seen.lo,
                                 &seen.hi);
        merge(acc, seen);
        continue;
      }
      c.row(kr, r0 + i, buf.data());
      merge(acc, row_range(qk, buf.data(), c.D));
      if (s != 0.f) qk.quantize8(buf.data(), c.D, s, z, 0, 255, blk.data() + i * lda);  // s == 0: x is all 0
    }
    part[static_cast<std::size_t>(t)] = acc;
    qlin::OutStage st;
    st.kind = qlin::OutStage::F32;
    st.out = q.out + r0 * q.packed->n;
    st.rs = q.packed->n;
    st.cs = 1;
    st.scale = scales.data();
    st.fbias = q.bias;
    qlin::qgemm(*q.packed, qlin::AOperand{blk.data(), lda, &za, 1}, rows, st);  // serial inside a pool task
  });
  Range seen{first, first};
  for (const Range& p : part) merge(seen, p);
  return seen;
}

// The caller's array, read in place (it outlives the call).
const i64* offsets(const py::array& rows, i64 R, const char* name) {
  if (dkey(rows) != "i8" || rows.ndim() != 1 || rows.shape(0) != R || !c_contig(rows))
    fail(std::string("broadcast_unary_matmul: ") + name + " must be " + std::to_string(R) + " contiguous int64 row offsets");
  return cptr<i64>(rows);
}

// a, b: float32, C-contiguous, last axis D or 1; a_rows / b_rows: each output row's element offsets into them.
// weights: float32 [N, D] (W^T) for the float chain, or a QPacked (qpack_b of W [D, N]) for the quantized one.
void py_broadcast_unary_matmul(const std::string& op, const std::string& unary, float alpha, float beta,
                               const py::array& a, const py::array& b, const py::array& a_rows,
                               const py::array& b_rows, i64 D, const py::object& weights, const py::object& w_scale,
                               const py::object& bias, bool predict, const py::array& out) {
  const char* fn = "broadcast_unary_matmul";
  Chain c{};
  c.bop = binary_op_id(op);
  c.uop = unary.empty() ? -1 : unary_op_id(unary, fn);
  c.alpha = alpha;
  c.beta = beta;
  c.D = D;
  need_f32(a, fn, "a");
  need_f32(b, fn, "b");
  need_contig(a, fn, "a");
  need_contig(b, fn, "b");
  need_f32(out, fn, "out");
  need_out(out, fn);
  if (c.bop == B_POW) fail("broadcast_unary_matmul: pow is not fused");
  const i64 wa = a.ndim() ? a.shape(a.ndim() - 1) : 1, wb = b.ndim() ? b.shape(b.ndim() - 1) : 1;
  if ((wa != D && wa != 1) || (wb != D && wb != 1) || D <= 0)
    fail("broadcast_unary_matmul: the operands' last axes must be D = " + std::to_string(D) + " or 1");
  c.a_row = wa == D && D > 1;
  c.b_row = wb == D && D > 1;
  if (D == 1) c.a_row = c.b_row = false;
  const i64 N = out.ndim() ? out.shape(out.ndim() - 1) : 1;
  c.R = N ? static_cast<i64>(out.size()) / N : 0;
  const i64 *ra = offsets(a_rows, c.R, "a_rows"), *rb = offsets(b_rows, c.R, "b_rows");
  const i64 na = static_cast<i64>(a.size()), nb = static_cast<i64>(b.size());
  for (i64 r = 0; r < c.R; ++r)
    if (ra[r] < 0 || ra[r] + (c.a_row ? D : 1) > na || rb[r] < 0 || rb[r] + (c.b_row ? D : 1) > nb)
      fail("broadcast_unary_matmul: a row offset points outside its operand");
  c.a = cptr<float>(a);
  c.b = cptr<float>(b);
  c.ra = ra;
  c.rb = rb;
  float* po = mptr<float>(out);
  const Kernels& kr = active();

  const bool quantized = py::isinstance<qlin::QPacked>(weights);
  if (!quantized) {
    const py::array wt = py::array::ensure(weights);
    need_f32(wt, fn, "weights");
    need_contig(wt, fn, "weights");
    if (wt.ndim() != 2 || wt.shape(0) != N || wt.shape(1) != D)
      fail("broadcast_unary_matmul: float weights must be W^T of shape (N, D) = (" + std::to_string(N) + ", " +
           std::to_string(D) + ")");
    if (!w_scale.is_none()) fail("broadcast_unary_matmul: the float chain takes no scale");
    py::array bi;
    const float* pb = nullptr;
    if (!bias.is_none()) {
      bi = py::array::ensure(bias);
      need_f32(bi, fn, "bias");
      need_contig(bi, fn, "bias");
      if (static_cast<i64>(bi.size()) != N) fail("broadcast_unary_matmul: bias must have N values");
      pb = cptr<float>(bi);
    }
    const float* w = cptr<float>(wt);
    py::gil_scoped_release nogil;
    if (c.R == 0 || N == 0) return;
    parallel_for(ceil_div(c.R, kBlock), threads_for_rows(c), [&](i64 t) {
      std::vector<float> buf(static_cast<std::size_t>(D));
      for (i64 r = t * kBlock; r < std::min(c.R, (t + 1) * kBlock); ++r) {
        c.row(kr, r, buf.data());
        float* y = po + r * N;
        kr.gemv_dot(D, buf.data(), w, D, N, y);
        if (pb)
          for (i64 j = 0; j < N; ++j) y[j] += pb[j];  // FusedMatMul's bias, added after the product
      }
    });
    return;
  }

  const qlin::QPacked& p = weights.cast<const qlin::QPacked&>();
  if (p.k != D || p.n != N) fail("broadcast_unary_matmul: packed weights must be (D, N)");
  QuantOut q{&p, po, nullptr, 0, nullptr};
  py::array sc, bi;
  if (!w_scale.is_none()) {
    sc = py::array::ensure(w_scale);
    need_f32(sc, fn, "w_scale");
    need_contig(sc, fn, "w_scale");
    if (sc.size() != 1 && static_cast<i64>(sc.size()) != N) fail("broadcast_unary_matmul: w_scale must have 1 or N values");
    q.scale = cptr<float>(sc);
    q.nscale = static_cast<i64>(sc.size());
  }
  if (!bias.is_none()) {
    bi = py::array::ensure(bias);
    need_f32(bi, fn, "bias");
    need_contig(bi, fn, "bias");
    if (static_cast<i64>(bi.size()) != N) fail("broadcast_unary_matmul: bias must have N values");
    q.bias = cptr<float>(bi);
  }
  const i64 rows_a = c.a_row ? na / D : na, rows_b = c.b_row ? nb / D : nb;
  py::gil_scoped_release nogil;
  if (c.R == 0 || N == 0) return;
  const qlin::QKernels& qk = qlin::qk();
  std::vector<float> first(static_cast<std::size_t>(D));
  c.row(kr, 0, first.data());  // x's first value: its NaN makes the range NaN (DynamicQuantizeLinear's minmax)
  Range range{};
  if (predict && predict_range(kr, c, rows_a, rows_b, range)) {
    const Range seen = quantized_pass(kr, qk, c, q, range, first[0]);
    const bool same = std::min(seen.lo, 0.f) == std::min(range.lo, 0.f) && std::max(seen.hi, 0.f) == std::max(range.hi, 0.f);
    if (same) return;
    range = seen;  // the prediction missed: the rows' own range, as the unfused DynamicQuantizeLinear takes it
  } else {
    range = scan_range(kr, qk, c, first[0]);
  }
  quantized_pass(kr, qk, c, q, range, first[0]);
}

}  // namespace

void bind_chain_dot(py::module_& m) {
  m.def("broadcast_unary_matmul", &py_broadcast_unary_matmul, py::arg("op"), py::arg("unary"), py::arg("alpha"),
        py::arg("beta"), py::arg("a"), py::arg("b"), py::arg("a_rows"), py::arg("b_rows"), py::arg("D"),
        py::arg("weights"), py::arg("w_scale"), py::arg("bias"), py::arg("predict"), py::arg("out"),
        "hetero::BroadcastUnaryMatMul: unary(a (op) b) @ W per output row, the broadcast tensor never written "
        "(src/chain_dot.cpp).");
}

}  // namespace hetero
