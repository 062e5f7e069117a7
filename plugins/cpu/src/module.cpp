// pybind11 bindings of hetero_cpu._native: argument validation (std::invalid_argument -> ValueError), GIL
// release, and the translation from numpy arrays to raw pointers + strides for the drivers.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.hpp"
#include "conv.hpp"
#include "data.hpp"
#include "elementwise.hpp"
#include "gemm_bf16x3.hpp"
#include "nd.hpp"
#include "onnx_extra.hpp"
#include "step.hpp"
#include "threadpool_stats.hpp"

namespace py = pybind11;
using namespace hetero;

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

std::string shape_str(const py::array& a) {
  std::ostringstream s;
  s << "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s << (d ? ", " : "") << a.shape(d);
  s << (a.ndim() == 1 ? ",)" : ")");
  return s.str();
}

// Compare type numbers, not dtype objects: an array unpickled or made by another library carries its own (equal)
// dtype instance. Non-native byte order is refused.
template <typename T>
bool has_type(const py::array& a) {
  const py::dtype d = a.dtype();
  const char native = py::dtype::of<T>().byteorder();
  const char order = d.byteorder();
  return d.normalized_num() == py::dtype::of<T>().normalized_num() && (order == native || order == '=' || order == '|');
}
// Same element type (by type number and size, not dtype object identity; see has_type).
bool same_dtype(const py::array& a, const py::array& b) {
  const py::dtype da = a.dtype(), db = b.dtype();
  return da.normalized_num() == db.normalized_num() && da.itemsize() == db.itemsize() && da.kind() == db.kind() &&
         da.byteorder() != '>' && db.byteorder() != '>';
}
bool is_f32(const py::array& a) { return has_type<float>(a); }
bool is_i32(const py::array& a) { return has_type<std::int32_t>(a); }
bool is_i64(const py::array& a) { return has_type<std::int64_t>(a); }

void need_f32(const py::array& a, const char* fn, const char* name) {
  if (!is_f32(a))
    fail(std::string(fn) + ": " + name + " must be float32, got " + std::string(py::str(a.dtype())));
}

void need_ndim(const py::array& a, int nd, const char* fn, const char* name) {
  if (a.ndim() != nd)
    fail(std::string(fn) + ": " + name + " must be " + std::to_string(nd) + "-D, got shape " + shape_str(a));
}

bool c_contiguous(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }

// Output arrays: C-contiguous and writable.
void need_out(const py::array& a, const char* fn, const char* name = "out") {
  if (!c_contiguous(a)) fail(std::string(fn) + ": " + name + " must be C-contiguous");
  if (!a.writeable()) fail(std::string(fn) + ": " + name + " must be writable");
}

std::vector<i64> shape_of(const py::array& a) {
  std::vector<i64> s(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s[static_cast<std::size_t>(d)] = a.shape(d);
  return s;
}
std::vector<i64> strides_of(const py::array& a) {
  std::vector<i64> s(static_cast<std::size_t>(a.ndim()));
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s[static_cast<std::size_t>(d)] = a.strides(d);
  return s;
}

// Strides in elements; the byte strides of a float view must be whole elements.
i64 elem_stride(const py::array& a, int d, const char* fn) {
  const i64 s = a.strides(d), it = a.itemsize();
  if (s % it != 0) fail(std::string(fn) + ": strides that are not a multiple of the item size are not supported");
  return s / it;
}

MatView mat_view(const py::array& a, bool trans, const char* fn) {
  MatView v{static_cast<const float*>(a.data()), a.shape(0), a.shape(1), elem_stride(a, 0, fn), elem_stride(a, 1, fn)};
  if (trans) {
    std::swap(v.rows, v.cols);
    std::swap(v.rs, v.cs);
  }
  return v;
}

const std::unordered_map<std::string, int>& unary_ops() {
  static const std::unordered_map<std::string, int> m = {
      {"relu", U_RELU}, {"leaky_relu", U_LEAKY_RELU}, {"elu", U_ELU}, {"selu", U_SELU}, {"celu", U_CELU},
      {"sigmoid", U_SIGMOID}, {"hard_sigmoid", U_HARD_SIGMOID}, {"hard_swish", U_HARD_SWISH}, {"silu", U_SILU},
      {"gelu", U_GELU}, {"gelu_tanh", U_GELU_TANH}, {"tanh", U_TANH}, {"softplus", U_SOFTPLUS},
      {"softsign", U_SOFTSIGN}, {"exp", U_EXP}, {"log", U_LOG}, {"sqrt", U_SQRT}, {"rsqrt", U_RSQRT},
      {"neg", U_NEG}, {"abs", U_ABS}, {"reciprocal", U_RECIPROCAL}, {"erf", U_ERF}, {"floor", U_FLOOR},
      {"ceil", U_CEIL}, {"round", U_ROUND}, {"sin", U_SIN}, {"cos", U_COS}, {"clip", U_CLIP}, {"mish", U_MISH},
      {"leaky_relu_min", U_LEAKY_RELU_MIN},
  };
  return m;
}

int unary_id(const std::string& op, const char* fn) {
  auto it = unary_ops().find(op);
  if (it == unary_ops().end()) fail(std::string(fn) + ": unknown op '" + op + "'");
  return it->second;
}

int binary_id(const std::string& op) {
  static const std::unordered_map<std::string, int> m = {{"add", B_ADD}, {"sub", B_SUB}, {"mul", B_MUL},
                                                         {"div", B_DIV}, {"max", B_MAX}, {"min", B_MIN},
                                                         {"pow", B_POW}, {"gelu_mul", B_GELU_MUL},
                                                         {"gelu_tanh_mul", B_GELU_TANH_MUL},
                                                         {"add_relu", B_ADD_RELU}};
  auto it = m.find(op);
  if (it == m.end())
    fail("binary: unknown op '" + op + "' (add, sub, mul, div, max, min, pow, gelu_mul, gelu_tanh_mul, add_relu)");
  return it->second;
}

// Fused activation for conv / gemm epilogues.
Epilogue activation(const std::string& name, float alpha, float beta, const char* fn) {
  Epilogue ep;
  if (name == "none" || name.empty()) return ep;
  if (name == "relu6") {
    ep.act = U_CLIP;
    ep.act_alpha = 0.f;
    ep.act_beta = 6.f;
    return ep;
  }
  ep.act = unary_id(name, fn);
  ep.act_alpha = alpha;
  ep.act_beta = beta;
  return ep;
}

// Bias broadcastable to (M, N) -> element (i, j) at p[i*rs + j*cs] with cs in {0, 1}; `keep` owns a
// contiguous copy when the view needs one.
void bias_view(const py::object& bias_obj, i64 M, i64 N, Epilogue& ep, std::vector<float>& keep, const char* fn) {
  if (bias_obj.is_none()) return;
  if (!py::isinstance<py::array>(bias_obj)) fail(std::string(fn) + ": bias must be a numpy array or None");
  py::array b = py::reinterpret_borrow<py::array>(bias_obj);
  need_f32(b, fn, "bias");
  i64 r = 1, c = 1, rs = 0, cs = 0;
  if (b.ndim() == 0) {
  } else if (b.ndim() == 1) {
    c = b.shape(0);
    cs = elem_stride(b, 0, fn);
  } else if (b.ndim() == 2) {
    r = b.shape(0);
    c = b.shape(1);
    rs = elem_stride(b, 0, fn);
    cs = elem_stride(b, 1, fn);
  } else {
    fail(std::string(fn) + ": bias must have at most 2 dimensions, got shape " + shape_str(b));
  }
  if ((r != 1 && r != M) || (c != 1 && c != N))
    fail(std::string(fn) + ": bias of shape " + shape_str(b) + " is not broadcastable to (" + std::to_string(M) +
         ", " + std::to_string(N) + ")");
  if (r == 1) rs = 0;
  if (c == 1) cs = 0;
  const float* p = static_cast<const float*>(b.data());
  if (cs != 0 && cs != 1) {
    keep.resize(static_cast<std::size_t>(r * c));
    for (i64 i = 0; i < r; ++i)
      for (i64 j = 0; j < c; ++j) keep[static_cast<std::size_t>(i * c + j)] = p[i * rs + j * cs];
    p = keep.data();
    rs = r == 1 ? 0 : c;
    cs = 1;
  }
  ep.bias = p;
  ep.bias_rs = rs;
  ep.bias_cs = cs;
}

// Opaque pre-packed B (weights): float panels, or int8 panels + column scales (S8Panels in common.hpp) when the
// weights are exactly int8 x a per-column scale.
// Rows from which a product of int8 weights that also keep float panels (float_panels_too, below) runs those.
constexpr i64 kFloatPanelMinRows = 12;

struct PackedB {
  const Kernels* kr;
  i64 k, n;
  AlignedBuf buf;   // the float panels (empty when int8, unless float_panels_too)
  AlignedBuf qbuf;  // int8: the panels' bytes (in a float-sized buffer) and, after them, the scales
  bool int8 = false;
  // whether a product of `rows` rows runs the int8 panels (else the float ones: the same bits)
  bool int8_for(i64 rows) const { return int8 && (buf.p == nullptr || rows < kFloatPanelMinRows); }
  // precision "normal" on a CPU with AMX-BF16: B also as bf16 hi / lo tiles (gemm_bf16x3.hpp), empty otherwise
  AlignedBuf bf;
  float bf_max = 0.f;
  bool bf16x3 = false;
  AlignedBuf narrow;  // N <= kNarrowMaxN: B's columns as whole vectors (gemm_narrow), empty otherwise
  // N > nr with at most a quarter vector of columns past the last whole panel: those columns as whole vectors too
  // (gemm_narrow's dot products; the one-vector ragged tile would multiply 4x the columns), empty otherwise. On Zen 4
  // deepcut's 630 x 384 x 100 (4 columns): 0.559 -> 0.508 ms; 8 columns (N = 200) gained nothing, so not taken.
  // Also the columns past the last whole vector where the last panel is one vector and a few columns more (N = 150
  // with 32-column panels: 128 + 16 + 6): the 16 on the one-vector ragged tile, the 6 as dots, where the panel
  // tile would multiply 32 columns for 22.
  AlignedBuf tail;
  i64 tail_n = 0;  // the columns in `tail` (the last ones of B)
  i64 tail_cols() const { return tail.p != nullptr ? tail_n : 0; }
  Bf16x3B bf16x3_b() const {
    const auto* hi = reinterpret_cast<const std::uint16_t*>(bf.p);
    return Bf16x3B{hi, hi + bf16x3_b_values(k, n), k, n, bf_max};
  }
  i64 panel_values() const { return ceil_div(n, kr->nr) * kr->nr * k; }  // whole panels of k x nr
  i64 scales_at() const { return (panel_values() + 3) / 4; }  // in qbuf's floats: after the int8 panels
  S8Panels s8() const { return S8Panels{reinterpret_cast<const std::int8_t*>(qbuf.p), qbuf.p + scales_at()}; }
};

// Weights below this many floats stay float: an L2-resident B gains nothing from fewer bytes, and the int8 form
// costs one conversion per panel value per GEMM call.
constexpr i64 kS8MinWeights = 16384;
// Deep, modest int8 weights also keep float panels, which products of kFloatPanelMinRows rows or more run: the int8
// panels are made floats again at every call, K x nr values a panel (two vectors of conversions against 2 x M FMAs
// at each k), while a float panel of K >= 1024 rows is one long stream the prefetchers follow. On Zen 4 (1 thread)
// 1536 x 384 ran 3-6 % faster as floats at M = 64 / 128 and 14 % at 16; at M <= 8 (a few rows against the weights'
// stream) and on short panels (384 x 1536: 2-5 %) the int8 form stays ahead, and past 4 MiB of floats (3072 x 768)
// their 4x bytes spill L3. Both forms give the same bits (int8 is taken only where exact).
constexpr i64 kS8FloatMinDepth = 1024;
constexpr i64 kS8FloatMaxBytes = i64{4} << 20;

// HETERO_CPU_INT8_FLOAT_PANELS forces the choice for every int8 weight: "1" float panels too (any depth and size:
// 4x the weight bytes more, for measuring), "0" none (the int8 panels alone); unset or anything else: the rule.
bool float_panels_too(i64 K, i64 N) {
  const char* force = std::getenv("HETERO_CPU_INT8_FLOAT_PANELS");
  if (force != nullptr && std::string(force) == "1") return true;
  if (force != nullptr && std::string(force) == "0") return false;
  return K >= kS8FloatMinDepth && K * N * static_cast<i64>(sizeof(float)) <= kS8FloatMaxBytes;
}

// The precision of the float GEMMs on packed weights: "high" (the fp32 kernels: fp32 products and sums) or "normal"
// (bf16x3 where the CPU has AMX-BF16 and the product is large enough: gemm_bf16x3.hpp). A process default (the
// HETERO_CPU_PRECISION environment variable, else "normal"; set_precision), and per pack_b call.
enum class Precision { High, Normal };

Precision parse_precision(const std::string& v, const char* what) {
  if (v == "high") return Precision::High;
  if (v == "normal") return Precision::Normal;
  fail(std::string(what) + "=" + v + ": expected \"high\" or \"normal\"");
}

std::atomic<int> g_precision{-1};  // -1: not read from the environment yet

Precision default_precision() {
  int p = g_precision.load();
  if (p < 0) {
    const char* env = std::getenv("HETERO_CPU_PRECISION");
    const bool set = env != nullptr && *env != 0;
    p = static_cast<int>(set ? parse_precision(env, "HETERO_CPU_PRECISION") : Precision::Normal);
    g_precision.store(p);
  }
  return static_cast<Precision>(p);
}

const char* precision_name(Precision p) { return p == Precision::High ? "high" : "normal"; }

// K, in vectors, from which half a vector of columns past one whole vector runs as dots: on Zen 4, 6 columns past
// 128 + 16 at K = 16 / 32 / 64 / 128 / 288-352 ran 1.10 / 1.02 / 0.98 / 0.97 / 0.94-0.96x the 32-column tile.
constexpr i64 kNarrowTailMinK = 4;

// The last columns of a K x N weight that run_packed computes as dot products (gemm_narrow), 0 for none: those past
// the last whole panel when they are at most a quarter vector (the one-vector ragged tile would multiply 4x the
// columns), or those past the last whole vector when the last panel holds one vector and at most half a vector more
// and K is deep enough to spread the dots' horizontal sums (the rest then takes the one-vector ragged tile).
i64 narrow_tail_cols(const Kernels& kr, i64 K, i64 N) {
  const i64 lanes = extra_for(kr).lanes, past_panel = N % kr.nr, past_vector = N % lanes;
  if (N <= kr.nr) return 0;
  if (past_panel * 4 <= lanes) return gemm_narrow_fits(kr, K, past_panel) ? past_panel : 0;
  // measured on the AVX-512 tile only (two 16-float vectors a panel); AVX2's three-vector panel keeps its tile
  const bool two_vector_panel = kr.nr == 2 * lanes && lanes >= 16;
  const bool one_vector_more = two_vector_panel && past_panel - past_vector == lanes && past_vector * 2 <= lanes;
  return one_vector_more && K >= kNarrowTailMinK * lanes && gemm_narrow_fits(kr, K, past_vector) ? past_vector : 0;
}

// `int8`: use the int8 form where it is exact (HETERO_CPU_INT8_WEIGHTS=0 turns that off). `precision` normal: also
// the bf16x3 form, where the CPU has AMX-BF16 (the int8 or float form stays: the fp32 kernels run the calls
// bf16x3 does not take).
std::unique_ptr<PackedB> make_packed(const MatView& b, bool int8 = true, Precision precision = Precision::High) {
  auto pb = std::make_unique<PackedB>();
  pb->kr = &active();
  pb->k = b.rows;
  pb->n = b.cols;
  if (precision == Precision::Normal && pb->kr == kernels_avx512() && bf16x3_available() &&
      bf16x3_worth(kBf16x3MinRows, b.cols, b.rows)) {
    const i64 part = bf16x3_b_values(b.rows, b.cols);  // uint16 values of hi, then of lo: `part` floats in all
    auto* hi = reinterpret_cast<std::uint16_t*>(pb->bf.get(static_cast<std::size_t>(part)));
    pb->bf16x3 = bf16x3_pack_b(b, hi, hi + part, &pb->bf_max);
    if (!pb->bf16x3) pb->bf.reset();
  }
  const char* narrow = std::getenv("HETERO_CPU_NARROW");
  if (gemm_narrow_fits(*pb->kr, b.rows, b.cols) && !(narrow != nullptr && std::string(narrow) == "0")) {
    const i64 values = gemm_narrow_values(*pb->kr, b.rows, b.cols);
    gemm_narrow_pack(*pb->kr, b, pb->narrow.get(static_cast<std::size_t>(values)));
  }
  const i64 tail = narrow_tail_cols(*pb->kr, b.rows, b.cols);
  if (tail > 0 && !(narrow != nullptr && std::string(narrow) == "0")) {
    const MatView cols{b.p + (b.cols - tail) * b.cs, b.rows, tail, b.rs, b.cs};
    gemm_narrow_pack(*pb->kr, cols, pb->tail.get(static_cast<std::size_t>(gemm_narrow_values(*pb->kr, b.rows, tail))));
    pb->tail_n = tail;
  }
  const i64 values = pb->panel_values();
  const char* env = std::getenv("HETERO_CPU_INT8_WEIGHTS");
  if (int8 && b.rows * b.cols >= kS8MinWeights && !(env != nullptr && std::string(env) == "0")) {
    float* q = pb->qbuf.get(static_cast<std::size_t>(pb->scales_at() + ceil_div(b.cols, pb->kr->nr) * pb->kr->nr));
    if (pack_b_panels_s8(*pb->kr, b, reinterpret_cast<std::int8_t*>(q), q + pb->scales_at())) {
      pb->int8 = true;
      if (float_panels_too(b.rows, b.cols)) {
        pb->buf.get(static_cast<std::size_t>(std::max<i64>(1, values)));
        pack_b_panels(*pb->kr, b, pb->buf.p, num_threads());
      }
      return pb;
    }
    pb->qbuf.reset();
  }
  pb->buf.get(static_cast<std::size_t>(std::max<i64>(1, values)));
  pack_b_panels(*pb->kr, b, pb->buf.p, num_threads());
  return pb;
}

// A grouped view's rows copied into one contiguous matrix (`keep` owns it): for the paths that read A other than
// through pack_a_block.
MatView flat_rows(const MatView& a, std::vector<float>& keep) {
  keep.resize(static_cast<std::size_t>(a.rows * a.cols));
  for (i64 i = 0; i < a.rows; ++i) {
    const float* src = a.row(i);
    float* dst = keep.data() + i * a.cols;
    for (i64 k = 0; k < a.cols; ++k) dst[k] = src[k * a.cs];
  }
  return MatView{keep.data(), a.rows, a.cols, a.cols, 1};
}

void run_packed(const PackedB& pb, const MatView& a, float* c, i64 ldc, float alpha, float beta, const Epilogue& ep);

// A in groups of rows (MatView::group_rows): the panels' product packs A's rows from the groups in place (the copy
// the packing makes anyway); the dot-product tail runs group by group (each a plain strided view). Anything else
// (bf16x3, a narrow B, a few rows, a strided row, a per-row bias with the tail) on a contiguous copy, as before.
void run_packed_grouped(const PackedB& pb, const MatView& a, float* c, i64 ldc, float alpha, float beta,
                        const Epilogue& ep) {
  const i64 tail = pb.tail_cols(), body = pb.n - tail;
  const bool tail_in_groups = tail == 0 || (alpha == 1.f && beta == 0.f && ep.bias_rs == 0);
  if (pb.bf16x3 || pb.narrow.p != nullptr || a.rows <= 4 || a.cs != 1 || !tail_in_groups) {
    std::vector<float> keep;
    run_packed(pb, flat_rows(a, keep), c, ldc, alpha, beta, ep);
    return;
  }
  const int T = num_threads();
  if (tail > 0) {
    Epilogue tail_ep = ep;
    if (ep.bias != nullptr) tail_ep.bias = ep.bias + body * ep.bias_cs;
    for (i64 g = 0; g * a.group_rows < a.rows; ++g) {
      const MatView rows{a.p + g * a.gs, std::min(a.group_rows, a.rows - g * a.group_rows), a.cols, a.rs, 1};
      gemm_narrow(*pb.kr, rows, pb.tail.p, tail, c + g * a.group_rows * ldc + body, ldc, alpha, beta, tail_ep, T);
    }
  }
  const S8Panels s8 = pb.s8();
  gemm_prepacked_b(*pb.kr, a.rows, body, pb.k, &a, nullptr, pb.buf.p, c, ldc, alpha, beta, ep, T,
                   pb.int8_for(a.rows) ? &s8 : nullptr);
}

void run_packed(const PackedB& pb, const MatView& a, float* c, i64 ldc, float alpha, float beta, const Epilogue& ep) {
  if (a.group_rows > 0) {
    run_packed_grouped(pb, a, c, ldc, alpha, beta, ep);
    return;
  }
  const int T = num_threads();
  const S8Panels s8 = pb.s8();
  const S8Panels* q = pb.int8_for(a.rows) ? &s8 : nullptr;
  if (pb.bf16x3 && bf16x3_worth(a.rows, pb.n, pb.k) &&
      bf16x3_gemm(*pb.kr, pb.bf16x3_b(), a, c, ldc, alpha, beta, ep, T))
    return;
  if (pb.narrow.p != nullptr && gemm_narrow(*pb.kr, a, pb.narrow.p, pb.n, c, ldc, alpha, beta, ep, T)) return;
  if (a.rows <= 4) {
    gemm_small_m_packed(*pb.kr, a, pb.buf.p, pb.n, c, ldc, alpha, beta, ep, T, q);
    return;
  }
  // int8 panels too: the tail columns are the same float values (int8 is taken only where exact), so the two forms
  // keep giving the same bits
  const i64 tail = pb.tail_cols(), body = pb.n - tail;
  if (tail > 0) {
    // the columns past the last whole panel as dot products (gemm_narrow: false, nothing written, where it does not
    // take the call), the whole panels as before
    Epilogue tail_ep = ep;
    if (ep.bias != nullptr) tail_ep.bias = ep.bias + body * ep.bias_cs;
    if (gemm_narrow(*pb.kr, a, pb.tail.p, tail, c + body, ldc, alpha, beta, tail_ep, T)) {
      gemm_prepacked_b(*pb.kr, a.rows, body, pb.k, &a, nullptr, pb.buf.p, c, ldc, alpha, beta, ep, T, q);
      return;
    }
  }
  gemm_prepacked_b(*pb.kr, a.rows, pb.n, pb.k, &a, nullptr, pb.buf.p, c, ldc, alpha, beta, ep, T, q);
}

void check_out_shape(const py::array& out, const std::vector<i64>& want, const char* fn) {
  bool ok = out.ndim() == static_cast<py::ssize_t>(want.size());
  for (std::size_t d = 0; ok && d < want.size(); ++d) ok = out.shape(static_cast<py::ssize_t>(d)) == want[d];
  if (!ok) {
    std::ostringstream s;
    s << fn << ": out has shape " << shape_str(out) << ", expected (";
    for (std::size_t d = 0; d < want.size(); ++d) s << (d ? ", " : "") << want[d];
    s << (want.size() == 1 ? ",)" : ")");
    fail(s.str());
  }
}

// ---------------------------------------------------------------------------------------------------------- gemm

void py_gemm(const py::array& a, const py::array& b, const py::array& out, bool trans_a, bool trans_b, float alpha,
             float beta, const py::object& bias) {
  const char* fn = "gemm";
  need_f32(a, fn, "a");
  need_f32(b, fn, "b");
  need_f32(out, fn, "out");
  need_ndim(a, 2, fn, "a");
  need_ndim(b, 2, fn, "b");
  need_out(out, fn);
  MatView av = mat_view(a, trans_a, fn), bv = mat_view(b, trans_b, fn);
  if (av.cols != bv.rows)
    fail("gemm: inner dimensions differ: op(a) is " + std::to_string(av.rows) + "x" + std::to_string(av.cols) +
         ", op(b) is " + std::to_string(bv.rows) + "x" + std::to_string(bv.cols));
  check_out_shape(out, {av.rows, bv.cols}, fn);
  Epilogue ep;
  std::vector<float> keep;
  bias_view(bias, av.rows, bv.cols, ep, keep, fn);
  float* c = static_cast<float*>(const_cast<void*>(out.data()));
  py::gil_scoped_release nogil;
  gemm_views(active(), av, bv, c, bv.cols, alpha, beta, ep, num_threads());
}

std::unique_ptr<PackedB> py_pack_b(const py::array& b, bool trans_b, bool int8, const py::object& precision) {
  need_f32(b, "pack_b", "b");
  need_ndim(b, 2, "pack_b", "b");
  MatView bv = mat_view(b, trans_b, "pack_b");
  const Precision p =
      precision.is_none() ? default_precision() : parse_precision(py::str(precision), "pack_b: precision");
  py::gil_scoped_release nogil;
  return make_packed(bv, int8, p);
}

// A prepared op (step.hpp) refuses an operand its call would copy once: the copy would not follow later values.
void no_copy(bool once, bool copied, const char* fn) {
  if (copied && !once) fail(std::string(fn) + ": a strided operand is copied at each call; it cannot be prepared");
}

// `once`: the op runs at once (the py_* entry points), so an operand may be copied into it.
Op prep_gemm_packed(const py::array& a, const PackedB& pb, const py::array& out, float alpha, float beta,
                    const py::object& bias, const std::string& act, float act_alpha, float act_beta, bool once) {
  const char* fn = "gemm_packed";
  need_f32(a, fn, "a");
  need_f32(out, fn, "out");
  if (a.ndim() != 2 && a.ndim() != 3) fail("gemm_packed: a must be 2-D, or 3-D (groups of rows), got " + shape_str(a));
  need_out(out, fn);
  const int kd = static_cast<int>(a.ndim()) - 1;  // a's k axis
  if (a.shape(kd) != pb.k)
    fail("gemm_packed: a has " + std::to_string(a.shape(kd)) + " columns but the packed B has k=" +
         std::to_string(pb.k));
  // 3-D a: [groups, rows, k], the product of its groups' rows in order (out: [groups * rows, n]), read in place
  const i64 groups = kd == 2 ? a.shape(0) : 1, group_rows = a.shape(kd - 1), M = groups * group_rows;
  check_out_shape(out, {M, pb.n}, fn);
  // the activation in the epilogue: applied to each block of C while it is still in cache, not as a pass of its own
  Epilogue ep = activation(act, act_alpha, act_beta, fn);
  auto keep = std::make_shared<std::vector<float>>();
  bias_view(bias, M, pb.n, ep, *keep, fn);
  no_copy(once, !keep->empty(), fn);
  MatView av = kd == 2 ? MatView{static_cast<const float*>(a.data()), M, pb.k, elem_stride(a, 1, fn),
                                 elem_stride(a, 2, fn), group_rows, elem_stride(a, 0, fn)}
                       : mat_view(a, false, fn);
  float* c = static_cast<float*>(const_cast<void*>(out.data()));
  const PackedB* p = &pb;
  return [p, av, c, alpha, beta, ep, keep] { run_packed(*p, av, c, p->n, alpha, beta, ep); };
}

void py_gemm_packed(const py::array& a, const PackedB& pb, const py::array& out, float alpha, float beta,
                    const py::object& bias, const std::string& act, float act_alpha, float act_beta) {
  run_now(prep_gemm_packed, a, pb, out, alpha, beta, bias, act, act_alpha, act_beta, true);
}

Op prep_matmul(const py::array& a, const py::array& b, const py::array& out) {
  const char* fn = "matmul";
  need_f32(a, fn, "a");
  need_f32(b, fn, "b");
  need_f32(out, fn, "out");
  need_ndim(a, 3, fn, "a");
  need_ndim(b, 3, fn, "b");
  need_ndim(out, 3, fn, "out");
  need_out(out, fn);
  const i64 Ba = a.shape(0), M = a.shape(1), K = a.shape(2), Bb = b.shape(0), N = b.shape(2);
  if (b.shape(1) != K)
    fail("matmul: a is " + shape_str(a) + " but b is " + shape_str(b) + " (inner dimensions differ)");
  const i64 B = out.shape(0);
  if ((Ba != 1 && Ba != B) || (Bb != 1 && Bb != B))
    fail("matmul: batch sizes of a " + shape_str(a) + " and b " + shape_str(b) + " do not match out " +
         shape_str(out));
  check_out_shape(out, {B, M, N}, fn);
  const i64 sa0 = elem_stride(a, 0, fn), sa1 = elem_stride(a, 1, fn), sa2 = elem_stride(a, 2, fn);
  const i64 sb0 = elem_stride(b, 0, fn), sb1 = elem_stride(b, 1, fn), sb2 = elem_stride(b, 2, fn);
  const float* pa = static_cast<const float*>(a.data());
  const float* pb = static_cast<const float*>(b.data());
  float* c = static_cast<float*>(const_cast<void*>(out.data()));
  return [=] {
    const Kernels& kr = active();
    const int T = num_threads();
    Epilogue none;
    if (B == 0 || M == 0 || N == 0) return;
    if (Bb == 1) {
      // One B for every batch: as a single (B*M) x K GEMM when a's batches are evenly spaced rows.
      if (Ba == 1 || B == 1 || sa0 == M * sa1) {
        MatView av{pa, (Ba == 1 ? 1 : B) * M, K, sa1, sa2};
        MatView bv{pb, K, N, sb1, sb2};
        gemm_views(kr, av, bv, c, N, 1.f, 0.f, none, T);
        if (Ba == 1)  // a broadcast over the batch: every output batch is the same
          for (i64 i = 1; i < B; ++i) std::memcpy(c + i * M * N, c, static_cast<std::size_t>(M * N) * sizeof(float));
        return;
      }
      auto packed = make_packed(MatView{pb, K, N, sb1, sb2});
      for (i64 i = 0; i < B; ++i)
        run_packed(*packed, MatView{pa + i * sa0, M, K, sa1, sa2}, c + i * M * N, N, 1.f, 0.f, none);
      return;
    }
    const double flops = 2.0 * M * N * K;
    auto one = [&](i64 i, int threads) {
      MatView av{pa + (Ba == 1 ? 0 : i * sa0), M, K, sa1, sa2};
      MatView bv{pb + i * sb0, K, N, sb1, sb2};
      gemm_views(kr, av, bv, c + i * M * N, N, 1.f, 0.f, none, threads);
    };
    if (flops < 8e6 && B > 1) {
      // Many small products (attention heads): one per task, each single-threaded.
      parallel_for(B, threads_for(flops * B, 1e6), [&](i64 i) { one(i, 1); });
    } else {
      for (i64 i = 0; i < B; ++i) one(i, T);
    }
  };
}

void py_matmul(const py::array& a, const py::array& b, const py::array& out) {
  run_now(prep_matmul, a, b, out);
}

void py_matmul_packed(const py::array& a, const PackedB& pk, const py::array& out) {
  const char* fn = "matmul_packed";
  need_f32(a, fn, "a");
  need_f32(out, fn, "out");
  need_ndim(a, 3, fn, "a");
  need_out(out, fn);
  const i64 B = a.shape(0), M = a.shape(1), K = a.shape(2);
  if (K != pk.k) fail("matmul_packed: a is " + shape_str(a) + " but the packed B has k=" + std::to_string(pk.k));
  check_out_shape(out, {B, M, pk.n}, fn);
  const i64 sa0 = elem_stride(a, 0, fn), sa1 = elem_stride(a, 1, fn), sa2 = elem_stride(a, 2, fn);
  const float* pa = static_cast<const float*>(a.data());
  float* c = static_cast<float*>(const_cast<void*>(out.data()));
  py::gil_scoped_release nogil;
  Epilogue none;
  if (B == 0 || M == 0) return;
  if (B == 1 || sa0 == M * sa1) {
    run_packed(pk, MatView{pa, B * M, K, sa1, sa2}, c, pk.n, 1.f, 0.f, none);
  } else {
    for (i64 i = 0; i < B; ++i) run_packed(pk, MatView{pa + i * sa0, M, K, sa1, sa2}, c + i * M * pk.n, pk.n, 1.f, 0.f, none);
  }
}

// --------------------------------------------------------------------------------------------------- elementwise

Op prep_binary(const std::string& op, const py::array& a, const py::array& b, const py::array& out) {
  const char* fn = "binary";
  const int id = binary_id(op);
  need_out(out, fn);
  DType dt;
  if (is_f32(out)) {
    dt = DType::F32;
  } else if (is_i32(out)) {
    dt = DType::I32;
  } else if (is_i64(out)) {
    dt = DType::I64;
  } else {
    fail("binary: unsupported dtype " + std::string(py::str(out.dtype())) + " (float32, int32, int64)");
  }
  if (!same_dtype(a, out) || !same_dtype(b, out))
    fail("binary: a, b and out must share one dtype, got " + std::string(py::str(a.dtype())) + ", " +
         std::string(py::str(b.dtype())) + ", " + std::string(py::str(out.dtype())));
  if (dt != DType::F32 && (id == B_POW || id == B_GELU_MUL || id == B_GELU_TANH_MUL || id == B_ADD_RELU))
    fail("binary: " + op + " is only supported for float32");
  const std::vector<i64> shp = shape_of(out);
  for (const py::array* x : {&a, &b}) {
    if (shape_of(*x) != shp)
      fail("binary: operands must already be broadcast to out's shape " + shape_str(out) + ", got " + shape_str(*x));
  }
  const std::vector<i64> sa = strides_of(a), sb = strides_of(b);
  const char* pa = static_cast<const char*>(a.data());
  const char* pb = static_cast<const char*>(b.data());
  char* po = static_cast<char*>(const_cast<void*>(out.data()));
  return [id, dt, pa, sa, pb, sb, po, shp] {
    binary_nd(active(), id, dt, pa, sa.data(), pb, sb.data(), po, static_cast<int>(shp.size()), shp.data());
  };
}

void py_binary(const std::string& op, const py::array& a, const py::array& b, const py::array& out) {
  run_now(prep_binary, op, a, b, out);
}

Op prep_unary(const std::string& op, const py::array& x, const py::array& out, float alpha, float beta) {
  const char* fn = "unary";
  const int id = unary_id(op, fn);
  need_f32(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  const std::vector<i64> shp = shape_of(x);
  check_out_shape(out, shp, fn);
  const std::vector<i64> sx = strides_of(x);
  const char* px = static_cast<const char*>(x.data());
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  return [id, px, sx, po, shp, alpha, beta] {
    unary_nd(active(), id, px, sx.data(), po, static_cast<int>(shp.size()), shp.data(), alpha, beta);
  };
}

void py_unary(const std::string& op, const py::array& x, const py::array& out, float alpha, float beta) {
  run_now(prep_unary, op, x, out, alpha, beta);
}

// Row-wise ops: x is a 2-D (rows, n) float32 view, out a contiguous (rows, n).
void rows_common(const char* fn, const py::array& x, const py::array& out) {
  need_f32(x, fn, "x");
  need_f32(out, fn, "out");
  need_ndim(x, 2, fn, "x");
  need_out(out, fn);
  check_out_shape(out, {x.shape(0), x.shape(1)}, fn);
}

// A 1-D float32 parameter of length n, as a contiguous pointer (copied into `keep` if strided).
const float* vec_param(const py::array& v, i64 n, std::vector<float>& keep, const char* fn, const char* name) {
  need_f32(v, fn, name);
  if (v.ndim() != 1 || v.shape(0) != n)
    fail(std::string(fn) + ": " + name + " must have shape (" + std::to_string(n) + ",), got " + shape_str(v));
  const i64 s = v.strides(0);
  const char* p = static_cast<const char*>(v.data());
  if (s == 4 || n <= 1) return reinterpret_cast<const float*>(p);
  keep.resize(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) std::memcpy(&keep[static_cast<std::size_t>(i)], p + i * s, 4);
  return keep.data();
}

float* stat_out(const py::object& o, i64 rows, const char* fn, const char* name) {
  if (o.is_none()) return nullptr;
  if (!py::isinstance<py::array>(o)) fail(std::string(fn) + ": " + name + " must be a numpy array or None");
  py::array a = py::reinterpret_borrow<py::array>(o);
  need_f32(a, fn, name);
  need_out(a, fn, name);
  if (a.size() != rows)
    fail(std::string(fn) + ": " + name + " must have " + std::to_string(rows) + " elements, got shape " +
         shape_str(a));
  return static_cast<float*>(const_cast<void*>(a.data()));
}

Op prep_softmax(const py::array& x, const py::array& out, bool log) {
  rows_common("softmax", x, out);
  const char* px = static_cast<const char*>(x.data());
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  const i64 rows = x.shape(0), n = x.shape(1), rs = x.strides(0), cs = x.strides(1);
  return [px, rows, n, rs, cs, po, log] {
    rows_nd(active(), RowOp::Softmax, px, rows, n, rs, cs, po, nullptr, nullptr, 0.f, nullptr, nullptr, log);
  };
}

void py_softmax(const py::array& x, const py::array& out, bool log) { run_now(prep_softmax, x, out, log); }

// `skip` (an array of x's shape, or None): the rows normalised are x + skip (hetero.AddLayerNorm: the Add's sum
// made row by row in L1 instead of a tensor written and read again).
Op prep_layer_norm(const py::array& x, const py::array& scale, const py::object& bias, const py::array& out,
                   float eps, const py::object& mean_out, const py::object& invstd_out, const py::object& skip,
                   const py::object& sum_out, bool once) {
  const char* fn = "layer_norm";
  rows_common(fn, x, out);
  const i64 rows = x.shape(0), n = x.shape(1);
  const float* padd = nullptr;
  if (!skip.is_none()) {
    if (!py::isinstance<py::array>(skip)) fail("layer_norm: skip must be a numpy array or None");
    const auto sk = py::reinterpret_borrow<py::array>(skip);
    need_f32(sk, fn, "skip");
    if (sk.ndim() != 2 || sk.shape(0) != rows || sk.shape(1) != n)
      fail(std::string(fn) + ": skip must have x's shape, got " + shape_str(sk));
    if (sk.strides(1) != 4 || sk.strides(0) != 4 * n) fail(std::string(fn) + ": skip must be C-contiguous");
    padd = static_cast<const float*>(sk.data());
  }
  // `sum_out` (x's shape, C-contiguous, with skip alone): the rows of x + skip written there as well
  float* psum = nullptr;
  if (!sum_out.is_none()) {
    if (padd == nullptr) fail("layer_norm: sum_out needs skip");
    if (!py::isinstance<py::array>(sum_out)) fail("layer_norm: sum_out must be a numpy array or None");
    const auto so = py::reinterpret_borrow<py::array>(sum_out);
    need_f32(so, fn, "sum_out");
    need_out(so, fn, "sum_out");
    if (so.ndim() != 2 || so.shape(0) != rows || so.shape(1) != n)
      fail(std::string(fn) + ": sum_out must have x's shape, got " + shape_str(so));
    if (so.strides(1) != 4 || so.strides(0) != 4 * n) fail(std::string(fn) + ": sum_out must be C-contiguous");
    psum = static_cast<float*>(const_cast<void*>(so.data()));
  }
  auto ks = std::make_shared<std::vector<float>>(), kb = std::make_shared<std::vector<float>>();
  const float* ps = vec_param(scale, n, *ks, fn, "scale");
  const float* pb = nullptr;
  if (!bias.is_none()) {
    if (!py::isinstance<py::array>(bias)) fail("layer_norm: bias must be a numpy array or None");
    pb = vec_param(py::reinterpret_borrow<py::array>(bias), n, *kb, fn, "bias");
  }
  no_copy(once, !ks->empty() || !kb->empty(), fn);
  float* pm = stat_out(mean_out, rows, fn, "mean_out");
  float* pi = stat_out(invstd_out, rows, fn, "invstd_out");
  const char* px = static_cast<const char*>(x.data());
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  const i64 rs = x.strides(0), cs = x.strides(1);
  return [px, rows, n, rs, cs, po, ps, pb, eps, pm, pi, ks, kb, padd, psum] {
    rows_nd(active(), RowOp::LayerNorm, px, rows, n, rs, cs, po, ps, pb, eps, pm, pi, false, padd, psum);
  };
}

void py_layer_norm(const py::array& x, const py::array& scale, const py::object& bias, const py::array& out,
                   float eps, const py::object& mean_out, const py::object& invstd_out, const py::object& skip,
                   const py::object& sum_out) {
  run_now(prep_layer_norm, x, scale, bias, out, eps, mean_out, invstd_out, skip, sum_out, true);
}

void py_rms_norm(const py::array& x, const py::array& scale, const py::array& out, float eps) {
  const char* fn = "rms_norm";
  rows_common(fn, x, out);
  const i64 rows = x.shape(0), n = x.shape(1);
  std::vector<float> ks;
  const float* ps = vec_param(scale, n, ks, fn, "scale");
  const char* px = static_cast<const char*>(x.data());
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  const i64 rs = x.strides(0), cs = x.strides(1);
  py::gil_scoped_release nogil;
  rows_nd(active(), RowOp::RmsNorm, px, rows, n, rs, cs, po, ps, nullptr, eps, nullptr, nullptr, false);
}

// -------------------------------------------------------------------------------------------------------- data

void need_plain_dtype(const py::array& a, const char* fn) {
  if (a.dtype().kind() == 'O') fail(std::string(fn) + ": object arrays are not supported");
}

Op prep_copy(const py::array& src, const py::array& out) {
  const char* fn = "copy";
  need_plain_dtype(src, fn);
  if (!out.writeable()) fail("copy: out must be writable");
  if (!same_dtype(src, out))
    fail("copy: src and out dtypes differ: " + std::string(py::str(src.dtype())) + " vs " +
         std::string(py::str(out.dtype())));
  const std::vector<i64> shp = shape_of(src), ss = strides_of(src);
  check_out_shape(out, shp, fn);
  const char* ps = static_cast<const char*>(src.data());
  char* po = static_cast<char*>(const_cast<void*>(out.data()));
  const i64 elem = src.itemsize();
  if (c_contiguous(out))
    return [ps, shp, ss, po, elem] {
      copy_strided(ps, static_cast<int>(shp.size()), shp.data(), ss.data(), po, elem, num_threads());
    };
  // A window of a larger array (a Concat's part along an inner axis): rows of the last axis, which must be
  // contiguous in out, each copied from wherever src holds it.
  const std::vector<i64> so = strides_of(out);
  const int nd = static_cast<int>(shp.size());
  if (nd == 0 || so[static_cast<std::size_t>(nd - 1)] != elem)
    fail("copy: out " + shape_str(out) + " must be contiguous, or a window whose last axis is");
  return [ps, shp, ss, so, po, elem, nd] {
    copy_strided_to(ps, nd, shp.data(), ss.data(), po, so.data(), elem, num_threads());
  };
}

void py_copy(const py::array& src, const py::array& out) {
  run_now(prep_copy, src, out);
}

// `once`: the op runs at once (py_gather), so strided data or indices may be copied into it. The indices are
// checked at each run, before any write: a replay's indices may come from the data.
Op prep_gather(const py::array& data, const py::array& indices, i64 axis, const py::array& out, bool once) {
  const char* fn = "gather";
  need_plain_dtype(data, fn);
  need_out(out, fn);
  // int32 indices (TF exports'): widened at each run into the op's own buffer
  const bool i32 = indices.dtype().kind() == 'i' && indices.itemsize() == 4;
  if (!is_i64(indices) && !i32)
    fail("gather: indices must be int64 or int32, got " + std::string(py::str(indices.dtype())));
  if (!same_dtype(data, out)) fail("gather: out dtype must equal data dtype");
  const i64 nd = data.ndim();
  if (nd == 0) fail("gather: data must have at least 1 dimension");
  if (axis < -nd || axis >= nd)
    fail("gather: axis " + std::to_string(axis) + " out of range for data of shape " + shape_str(data));
  if (axis < 0) axis += nd;
  const std::vector<i64> dshape = shape_of(data), ishape = shape_of(indices);
  std::vector<i64> want(dshape.begin(), dshape.begin() + axis);
  want.insert(want.end(), ishape.begin(), ishape.end());
  want.insert(want.end(), dshape.begin() + axis + 1, dshape.end());
  check_out_shape(out, want, fn);
  const i64 axis_len = dshape[static_cast<std::size_t>(axis)];
  i64 outer = 1, inner = 1;
  for (i64 d = 0; d < axis; ++d) outer *= dshape[static_cast<std::size_t>(d)];
  for (i64 d = axis + 1; d < nd; ++d) inner *= dshape[static_cast<std::size_t>(d)];
  const i64 elem = data.itemsize();
  const i64 nidx = indices.size();
  no_copy(once, !c_contiguous(indices) || !c_contiguous(data), fn);
  // Indices: contiguous int64 (copied if strided; int32 ones widened into idx_keep when the op runs)
  auto idx_keep = std::make_shared<std::vector<std::int64_t>>();
  const std::int64_t* idx = static_cast<const std::int64_t*>(indices.data());
  const std::int32_t* idx32 = nullptr;
  if (i32) {
    if (!c_contiguous(indices)) fail("gather: int32 indices must be contiguous");
    idx32 = static_cast<const std::int32_t*>(indices.data());
    idx_keep->resize(static_cast<std::size_t>(nidx));
    idx = idx_keep->data();
  } else if (!c_contiguous(indices)) {
    idx_keep->resize(static_cast<std::size_t>(nidx));
    const std::vector<i64> is = strides_of(indices);
    copy_strided(static_cast<const char*>(indices.data()), static_cast<int>(ishape.size()), ishape.data(), is.data(),
                 reinterpret_cast<char*>(idx_keep->data()), 8, 1);
    idx = idx_keep->data();
  }
  const char* pd = static_cast<const char*>(data.data());
  auto data_keep = std::make_shared<std::vector<char>>();
  if (!c_contiguous(data)) {
    data_keep->resize(static_cast<std::size_t>(data.size() * elem));
    const std::vector<i64> ds = strides_of(data);
    copy_strided(pd, static_cast<int>(nd), dshape.data(), ds.data(), data_keep->data(), elem, num_threads());
    pd = data_keep->data();
  }
  char* po = static_cast<char*>(const_cast<void*>(out.data()));
  return [pd, outer, axis, axis_len, inner, elem, idx, idx32, nidx, po, idx_keep, data_keep] {
    if (idx32 != nullptr) std::copy(idx32, idx32 + nidx, idx_keep->begin());
    for (i64 i = 0; i < nidx; ++i)
      if (idx[i] < -axis_len || idx[i] >= axis_len)
        fail("gather: index " + std::to_string(idx[i]) + " is out of range for axis " + std::to_string(axis) +
             " of size " + std::to_string(axis_len));
    gather_rows(pd, outer, axis_len, inner * elem, idx, nidx, po, num_threads());
  };
}

void py_gather(const py::array& data, const py::array& indices, i64 axis, const py::array& out) {
  run_now(prep_gather, data, indices, axis, out, true);
}

ScatterReduce scatter_reduce_of(const std::string& name) {
  if (name == "none") return ScatterReduce::none;
  if (name == "add") return ScatterReduce::add;
  if (name == "mul") return ScatterReduce::mul;
  if (name == "max") return ScatterReduce::max;
  if (name == "min") return ScatterReduce::min;
  fail("scatter_elements: unknown reduction " + name);
}

// ScatterElements on float32: out = data, then the updates combined in at the indices. All operands C-contiguous
// (the kernel hands over no views); the indices are checked at each run, before any write, as gather's are.
Op prep_scatter_elements(const py::array& data, const py::array& indices, const py::array& updates, i64 axis,
                         const std::string& reduction, const py::array& out) {
  const char* fn = "scatter_elements";
  need_f32(data, fn, "data");
  need_f32(updates, fn, "updates");
  need_out(out, fn);
  if (!is_i64(indices)) fail("scatter_elements: indices must be int64, got " + std::string(py::str(indices.dtype())));
  if (!c_contiguous(data) || !c_contiguous(indices) || !c_contiguous(updates))
    fail("scatter_elements: data, indices and updates must be C-contiguous");
  const std::vector<i64> dshape = shape_of(data), ishape = shape_of(indices);
  const int nd = static_cast<int>(dshape.size());
  check_out_shape(out, dshape, fn);
  if (shape_of(updates) != ishape) fail("scatter_elements: updates " + shape_str(updates) + " must match indices");
  if (nd == 0 || static_cast<int>(ishape.size()) != nd)
    fail("scatter_elements: indices " + shape_str(indices) + " must have the rank of data " + shape_str(data));
  if (axis < -nd || axis >= nd) fail("scatter_elements: axis " + std::to_string(axis) + " out of range");
  if (axis < 0) axis += nd;
  for (int d = 0; d < nd; ++d)
    if (d != axis && ishape[d] > dshape[d])
      fail("scatter_elements: indices " + shape_str(indices) + " exceed data " + shape_str(data));
  const ScatterReduce reduce = scatter_reduce_of(reduction);
  const float* pd = static_cast<const float*>(data.data());
  const std::int64_t* idx = static_cast<const std::int64_t*>(indices.data());
  const float* pu = static_cast<const float*>(updates.data());
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  const i64 n = data.size(), nidx = indices.size(), axis_len = dshape[static_cast<std::size_t>(axis)];
  const int ax = static_cast<int>(axis);
  return [pd, po, n, dshape, ishape, nd, idx, nidx, pu, ax, axis_len, reduce] {
    for (i64 i = 0; i < nidx; ++i)
      if (idx[i] < -axis_len || idx[i] >= axis_len)
        fail("scatter_elements: index " + std::to_string(idx[i]) + " is out of range for axis " +
             std::to_string(ax) + " of size " + std::to_string(axis_len));
    if (pd != po) std::memcpy(po, pd, static_cast<std::size_t>(n) * sizeof(float));
    scatter_elements_f32(po, dshape.data(), nd, idx, pu, ishape.data(), ax, reduce);
  };
}

void py_scatter_elements(const py::array& data, const py::array& indices, const py::array& updates, i64 axis,
                         const std::string& reduction, const py::array& out) {
  run_now(prep_scatter_elements, data, indices, updates, axis, reduction, out);
}

// --------------------------------------------------------------------------------------------------------- cnn

// NCHW float32 input as a contiguous pointer (copied into `keep` if it is a strided view).
const float* nchw_input(const py::array& x, std::vector<float>& keep, const char* fn) {
  need_f32(x, fn, "x");
  need_ndim(x, 4, fn, "x");
  if (c_contiguous(x)) return static_cast<const float*>(x.data());
  keep.resize(static_cast<std::size_t>(x.size()));
  const std::vector<i64> s = shape_of(x), st = strides_of(x);
  copy_strided(static_cast<const char*>(x.data()), 4, s.data(), st.data(), reinterpret_cast<char*>(keep.data()), 4,
               num_threads());
  return keep.data();
}

template <class T>
std::vector<i64> int_list(const T& v, std::size_t n, const char* fn, const char* name) {
  if (v.size() != n) fail(std::string(fn) + ": " + name + " must have " + std::to_string(n) + " values");
  return std::vector<i64>(v.begin(), v.end());
}

struct PyPackedConv {
  std::unique_ptr<PackedConv> pc;
};

PyPackedConv py_prepack_conv(const py::array& w, i64 group, const py::object& precision) {
  const char* fn = "prepack_conv";
  need_f32(w, fn, "w");
  need_ndim(w, 4, fn, "w");
  if (group < 1) fail("prepack_conv: group must be >= 1");
  const i64 cout = w.shape(0);
  if (cout % group != 0)
    fail("prepack_conv: output channels " + std::to_string(cout) + " not divisible by group " + std::to_string(group));
  std::vector<float> keep;
  const float* pw = static_cast<const float*>(w.data());
  if (!c_contiguous(w)) {
    keep.resize(static_cast<std::size_t>(w.size()));
    const std::vector<i64> s = shape_of(w), st = strides_of(w);
    copy_strided(static_cast<const char*>(w.data()), 4, s.data(), st.data(), reinterpret_cast<char*>(keep.data()), 4, 1);
    pw = keep.data();
  }
  const i64 cin_g = w.shape(1), kh = w.shape(2), kw = w.shape(3);
  const Precision p =
      precision.is_none() ? default_precision() : parse_precision(py::str(precision), "prepack_conv: precision");
  py::gil_scoped_release nogil;
  return PyPackedConv{prepack_conv(active(), pw, cout, cin_g, kh, kw, group, p == Precision::Normal)};
}

// The convolution geometry of input shape `xs` (NCHW) for packed weights, checked.
ConvGeom conv_geom(const PackedConv& pc, const std::vector<i64>& xs, const std::vector<i64>& st,
                   const std::vector<i64>& pd, const std::vector<i64>& dl) {
  ConvGeom g{};
  g.N = xs[0];
  g.C = xs[1];
  g.H = xs[2];
  g.W = xs[3];
  g.Cout = pc.cout;
  g.kh = pc.kh;
  g.kw = pc.kw;
  g.sh = st[0];
  g.sw = st[1];
  g.pt = pd[0];
  g.pl = pd[1];
  g.pb = pd[2];
  g.pr = pd[3];
  g.dh = dl[0];
  g.dw = dl[1];
  g.group = pc.group;
  if (g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1) fail("conv2d: strides and dilations must be >= 1");
  if (g.pt < 0 || g.pl < 0 || g.pb < 0 || g.pr < 0) fail("conv2d: pads must be >= 0");
  if (g.C != pc.cin_g * pc.group)
    fail("conv2d: x has " + std::to_string(g.C) + " channels but the weights expect " +
         std::to_string(pc.cin_g * pc.group) + " (C/group=" + std::to_string(pc.cin_g) + ", group=" +
         std::to_string(pc.group) + ")");
  const i64 eh = g.H + g.pt + g.pb - g.dh * (g.kh - 1) - 1, ew = g.W + g.pl + g.pr - g.dw * (g.kw - 1) - 1;
  if (eh < 0 || ew < 0) fail("conv2d: kernel larger than the padded input");
  g.Ho = eh / g.sh + 1;
  g.Wo = ew / g.sw + 1;
  return g;
}

Op prep_conv2d_packed(const py::array& x, const PyPackedConv& pk, const py::object& bias, const py::array& out,
                      const std::vector<i64>& strides_in, const std::vector<i64>& pads_in,
                      const std::vector<i64>& dil_in, const std::string& act, float act_alpha, float act_beta,
                      bool once, const py::object& residual = py::none(), float input_shift = 0.f) {
  const char* fn = "conv2d";
  const PackedConv& pc = *pk.pc;
  auto xkeep = std::make_shared<std::vector<float>>(), bkeep = std::make_shared<std::vector<float>>();
  const float* px = nchw_input(x, *xkeep, fn);
  need_f32(out, fn, "out");
  need_out(out, fn);
  auto st = int_list(strides_in, 2, fn, "strides");
  auto pd = int_list(pads_in, 4, fn, "pads");
  auto dl = int_list(dil_in, 2, fn, "dilations");
  const ConvGeom g = conv_geom(pc, shape_of(x), st, pd, dl);
  check_out_shape(out, {g.N, g.Cout, g.Ho, g.Wo}, fn);
  Epilogue ep = activation(act, act_alpha, act_beta, fn);
  const float* pb = nullptr;
  if (!bias.is_none()) {
    if (!py::isinstance<py::array>(bias)) fail("conv2d: bias must be a numpy array or None");
    pb = vec_param(py::reinterpret_borrow<py::array>(bias), g.Cout, *bkeep, fn, "bias");
  }
  // residual: added before the activation (none or Relu), the output's shape (hetero.ConvResidual)
  auto rkeep = std::make_shared<std::vector<float>>();
  const float* pr = nullptr;
  if (!residual.is_none()) {
    if (!py::isinstance<py::array>(residual)) fail("conv2d: residual must be a numpy array or None");
    const auto r = py::reinterpret_borrow<py::array>(residual);
    pr = nchw_input(r, *rkeep, fn);
    if (shape_of(r) != std::vector<i64>{g.N, g.Cout, g.Ho, g.Wo})
      fail("conv2d: residual " + shape_str(r) + " must have the output's shape");
    if (ep.act >= 0 && ep.act != U_RELU) fail("conv2d: a residual takes no activation or relu");
  }
  no_copy(once, !xkeep->empty() || !bkeep->empty() || !rkeep->empty(), fn);
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  const PackedConv* p = &pc;
  return [p, g, px, pb, po, ep, pr, xkeep, bkeep, rkeep, input_shift] {
    conv2d_packed(*p, g, px, pb, po, ep, pr, input_shift);
  };
}

// A depthwise conv and the 1x1 conv on its output in one call (dw_pointwise; out: the 1x1's output).
Op prep_dw_pointwise(const py::array& x, const PyPackedConv& dk, const py::object& dbias, const PyPackedConv& pk,
                     const py::object& pbias, const py::array& out,
                     const std::vector<i64>& strides_in, const std::vector<i64>& pads_in,
                     const std::vector<i64>& dil_in, const std::string& act, float act_alpha, float act_beta,
                     const std::string& act2, float act2_alpha, float act2_beta, bool once) {
  const char* fn = "dw_pointwise";
  const PackedConv& dw = *dk.pc;
  const PackedConv& pw = *pk.pc;
  if (!dw.depthwise) fail("dw_pointwise: the first weights are not depthwise");
  auto xkeep = std::make_shared<std::vector<float>>(), bkeep = std::make_shared<std::vector<float>>(),
       b2keep = std::make_shared<std::vector<float>>();
  const float* px = nchw_input(x, *xkeep, fn);
  need_f32(out, fn, "out");
  need_out(out, fn);
  const ConvGeom gd = conv_geom(dw, shape_of(x), int_list(strides_in, 2, fn, "strides"),
                                int_list(pads_in, 4, fn, "pads"), int_list(dil_in, 2, fn, "dilations"));
  const ConvGeom gp = conv_geom(pw, {gd.N, gd.Cout, gd.Ho, gd.Wo}, {1, 1}, {0, 0, 0, 0}, {1, 1});
  if (pw.kh != 1 || pw.kw != 1) fail("dw_pointwise: the second weights are not 1x1");
  check_out_shape(out, {gp.N, gp.Cout, gp.Ho, gp.Wo}, fn);
  const Epilogue e1 = activation(act, act_alpha, act_beta, fn), e2 = activation(act2, act2_alpha, act2_beta, fn);
  const auto bias_of = [&](const py::object& b, i64 n, std::vector<float>& keep) -> const float* {
    if (b.is_none()) return nullptr;
    if (!py::isinstance<py::array>(b)) fail("dw_pointwise: a bias must be a numpy array or None");
    return vec_param(py::reinterpret_borrow<py::array>(b), n, keep, fn, "bias");
  };
  const float* pb1 = bias_of(dbias, gd.Cout, *bkeep);
  const float* pb2 = bias_of(pbias, gp.Cout, *b2keep);
  no_copy(once, !xkeep->empty() || !bkeep->empty() || !b2keep->empty(), fn);
  float* po = static_cast<float*>(const_cast<void*>(out.data()));
  const PackedConv *d = &dw, *p = &pw;
  return [d, p, gd, px, pb1, pb2, po, e1, e2, xkeep, bkeep, b2keep] {
    dw_pointwise(*d, gd, px, pb1, e1, *p, pb2, e2, po);
  };
}

void py_dw_pointwise(const py::array& x, const PyPackedConv& dk, const py::object& dbias, const PyPackedConv& pk,
                     const py::object& pbias, const py::array& out,
                     const std::vector<i64>& strides, const std::vector<i64>& pads, const std::vector<i64>& dil,
                     const std::string& act, float act_alpha, float act_beta, const std::string& act2,
                     float act2_alpha, float act2_beta) {
  run_now(prep_dw_pointwise, x, dk, dbias, pk, pbias, out, strides, pads, dil, act, act_alpha, act_beta, act2,
          act2_alpha, act2_beta, true);
}

void py_conv2d_packed(const py::array& x, const PyPackedConv& pk, const py::object& bias, const py::array& out,
                      const std::vector<i64>& strides_in, const std::vector<i64>& pads_in,
                      const std::vector<i64>& dil_in, const std::string& act, float act_alpha, float act_beta,
                      const py::object& residual, float input_shift) {
  run_now(prep_conv2d_packed, x, pk, bias, out, strides_in, pads_in, dil_in, act, act_alpha, act_beta, true,
          residual, input_shift);
}

void py_conv2d(const py::array& x, const py::array& w, const py::object& bias, const py::array& out,
               const std::vector<i64>& strides, const std::vector<i64>& pads, const std::vector<i64>& dil, i64 group,
               const std::string& act, float act_alpha, float act_beta) {
  PyPackedConv pk = py_prepack_conv(w, group, py::none());
  py_conv2d_packed(x, pk, bias, out, strides, pads, dil, act, act_alpha, act_beta, py::none(), 0.f);
}

struct PoolGeom {
  i64 NC, H, W, Ho, Wo;
  const float* x;
  float* out;
};

PoolGeom pool_common(const py::array& x, const py::array& out, std::vector<float>& keep, const char* fn) {
  const float* px = nchw_input(x, keep, fn);
  need_f32(out, fn, "out");
  need_ndim(out, 4, fn, "out");
  need_out(out, fn);
  if (out.shape(0) != x.shape(0) || out.shape(1) != x.shape(1))
    fail(std::string(fn) + ": out " + shape_str(out) + " must keep N and C of x " + shape_str(x));
  return PoolGeom{x.shape(0) * x.shape(1), x.shape(2), x.shape(3), out.shape(2), out.shape(3), px,
                  static_cast<float*>(const_cast<void*>(out.data()))};
}

void check_pool_out(const PoolGeom& p, i64 kh, i64 kw, i64 sh, i64 sw, const std::vector<i64>& pd, i64 dh, i64 dw,
                    const char* fn) {
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1)
    fail(std::string(fn) + ": kernel, strides and dilations must be >= 1");
  for (i64 v : pd)
    if (v < 0) fail(std::string(fn) + ": pads must be >= 0");
  // Accept floor and ceil mode output sizes; every window must start inside the padded input.
  const i64 eh = p.H + pd[0] + pd[2] - dh * (kh - 1) - 1, ew = p.W + pd[1] + pd[3] - dw * (kw - 1) - 1;
  if (eh < 0 || ew < 0) fail(std::string(fn) + ": kernel larger than the padded input");
  const i64 hf = eh / sh + 1, wf = ew / sw + 1, hc = (eh + sh - 1) / sh + 1, wc = (ew + sw - 1) / sw + 1;
  if ((p.Ho != hf && p.Ho != hc) || (p.Wo != wf && p.Wo != wc))
    fail(std::string(fn) + ": output spatial size (" + std::to_string(p.Ho) + ", " + std::to_string(p.Wo) +
         ") does not match the input, kernel, strides and pads (expected (" + std::to_string(hf) + ", " +
         std::to_string(wf) + "), or (" + std::to_string(hc) + ", " + std::to_string(wc) + ") with ceil_mode)");
}

Op prep_max_pool2d(const py::array& x, const py::array& out, const std::vector<i64>& kernel,
                   const std::vector<i64>& strides, const std::vector<i64>& pads, const std::vector<i64>& dil,
                   bool once) {
  const char* fn = "max_pool2d";
  auto keep = std::make_shared<std::vector<float>>();
  PoolGeom p = pool_common(x, out, *keep, fn);
  no_copy(once, !keep->empty(), fn);
  auto k = int_list(kernel, 2, fn, "kernel");
  auto s = int_list(strides, 2, fn, "strides");
  auto pd = int_list(pads, 4, fn, "pads");
  auto d = int_list(dil, 2, fn, "dilations");
  check_pool_out(p, k[0], k[1], s[0], s[1], pd, d[0], d[1], fn);
  return [p, k, s, pd, d, keep] {
    max_pool2d(p.x, p.out, p.NC, p.H, p.W, p.Ho, p.Wo, k[0], k[1], s[0], s[1], pd[0], pd[1], d[0], d[1]);
  };
}

void py_max_pool2d(const py::array& x, const py::array& out, const std::vector<i64>& kernel,
                   const std::vector<i64>& strides, const std::vector<i64>& pads, const std::vector<i64>& dil) {
  run_now(prep_max_pool2d, x, out, kernel, strides, pads, dil, true);
}

void py_avg_pool2d(const py::array& x, const py::array& out, const std::vector<i64>& kernel,
                   const std::vector<i64>& strides, const std::vector<i64>& pads, bool count_include_pad) {
  const char* fn = "avg_pool2d";
  std::vector<float> keep;
  PoolGeom p = pool_common(x, out, keep, fn);
  auto k = int_list(kernel, 2, fn, "kernel");
  auto s = int_list(strides, 2, fn, "strides");
  auto pd = int_list(pads, 4, fn, "pads");
  check_pool_out(p, k[0], k[1], s[0], s[1], pd, 1, 1, fn);
  py::gil_scoped_release nogil;
  avg_pool2d(p.x, p.out, p.NC, p.H, p.W, p.Ho, p.Wo, k[0], k[1], s[0], s[1], pd[0], pd[1], pd[2], pd[3],
             count_include_pad);
}

Op prep_global_avg_pool(const py::array& x, const py::array& out, bool once) {
  const char* fn = "global_avg_pool";
  auto keep = std::make_shared<std::vector<float>>();
  PoolGeom p = pool_common(x, out, *keep, fn);
  if (p.Ho != 1 || p.Wo != 1) fail("global_avg_pool: out must have shape (N, C, 1, 1), got " + shape_str(out));
  no_copy(once, !keep->empty(), fn);
  return [p, keep] { global_avg_pool(p.x, p.out, p.NC, p.H * p.W); };
}

void py_global_avg_pool(const py::array& x, const py::array& out) { run_now(prep_global_avg_pool, x, out, true); }

// ------------------------------------------------------------------------------------------------ step preparers
// A bound call's positional arguments as the entry point takes them (trailing defaults may be left out).

py::object step_obj(const py::tuple& a, std::size_t i) { return i < a.size() ? py::object(a[i]) : py::object(py::none()); }

template <class T>
T step_val(const py::tuple& a, std::size_t i, T dflt) {
  return i < a.size() ? a[i].cast<T>() : dflt;
}

}  // namespace

namespace hetero {

void step_arity(const py::tuple& a, std::size_t lo, std::size_t hi, const char* fn) {
  if (a.size() < lo || a.size() > hi)
    fail(std::string(fn) + ": " + std::to_string(a.size()) + " arguments, expected " + std::to_string(lo) + " to " +
         std::to_string(hi));
}

py::array step_array(const py::tuple& a, std::size_t i, const char* fn) {
  if (i >= a.size() || !py::isinstance<py::array>(a[i]))
    fail(std::string(fn) + ": argument " + std::to_string(i) + " must be a numpy array");
  return py::reinterpret_borrow<py::array>(a[i]);
}

namespace {
std::unordered_map<std::string, StepPreparer>& step_preparers() {
  static std::unordered_map<std::string, StepPreparer> m;
  return m;
}
}  // namespace

void register_step_op(const char* name, StepPreparer prep) { step_preparers()[name] = prep; }

Op prepare_step_op(const std::string& name, const py::tuple& args) {
  const auto it = step_preparers().find(name);
  if (it == step_preparers().end()) fail("LlmStep.add_call: " + name + " cannot be prepared");
  try {
    return it->second(args);
  } catch (const py::cast_error& e) {
    fail(name + ": " + e.what());
  }
}

std::vector<std::string> step_op_names() {
  std::vector<std::string> v;
  for (const auto& [name, prep] : step_preparers()) v.push_back(name);
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace hetero

namespace {

void register_step_ops() {
  static const std::vector<i64> one2{1, 1}, zero4{0, 0, 0, 0};
  register_step_op("gemm_packed", [](const py::tuple& a) {
    step_arity(a, 3, 9, "gemm_packed");
    return prep_gemm_packed(step_array(a, 0, "gemm_packed"), a[1].cast<const PackedB&>(),
                            step_array(a, 2, "gemm_packed"), step_val(a, 3, 1.f), step_val(a, 4, 0.f),
                            step_obj(a, 5), a.size() > 6 ? a[6].cast<std::string>() : std::string("none"),
                            step_val(a, 7, 0.f), step_val(a, 8, 0.f), false);
  });
  register_step_op("binary", [](const py::tuple& a) {
    step_arity(a, 4, 4, "binary");
    return prep_binary(a[0].cast<std::string>(), step_array(a, 1, "binary"), step_array(a, 2, "binary"),
                       step_array(a, 3, "binary"));
  });
  register_step_op("unary", [](const py::tuple& a) {
    step_arity(a, 3, 5, "unary");
    return prep_unary(a[0].cast<std::string>(), step_array(a, 1, "unary"), step_array(a, 2, "unary"),
                      step_val(a, 3, 0.f), step_val(a, 4, 0.f));
  });
  register_step_op("layer_norm", [](const py::tuple& a) {
    step_arity(a, 4, 9, "layer_norm");
    return prep_layer_norm(step_array(a, 0, "layer_norm"), step_array(a, 1, "layer_norm"), a[2],
                           step_array(a, 3, "layer_norm"), step_val(a, 4, 1e-5f), step_obj(a, 5), step_obj(a, 6),
                           step_obj(a, 7), step_obj(a, 8), false);
  });
  register_step_op("gather", [](const py::tuple& a) {
    step_arity(a, 4, 4, "gather");
    return prep_gather(step_array(a, 0, "gather"), step_array(a, 1, "gather"), a[2].cast<i64>(),
                       step_array(a, 3, "gather"), false);
  });
  register_step_op("scatter_elements", [](const py::tuple& a) {
    step_arity(a, 6, 6, "scatter_elements");
    return prep_scatter_elements(step_array(a, 0, "scatter_elements"), step_array(a, 1, "scatter_elements"),
                                 step_array(a, 2, "scatter_elements"), a[3].cast<i64>(), a[4].cast<std::string>(),
                                 step_array(a, 5, "scatter_elements"));
  });
  register_step_op("matmul", [](const py::tuple& a) {
    step_arity(a, 3, 3, "matmul");
    return prep_matmul(step_array(a, 0, "matmul"), step_array(a, 1, "matmul"), step_array(a, 2, "matmul"));
  });
  register_step_op("softmax", [](const py::tuple& a) {
    step_arity(a, 2, 3, "softmax");
    return prep_softmax(step_array(a, 0, "softmax"), step_array(a, 1, "softmax"), step_val(a, 2, false));
  });
  register_step_op("copy", [](const py::tuple& a) {
    step_arity(a, 2, 2, "copy");
    return prep_copy(step_array(a, 0, "copy"), step_array(a, 1, "copy"));
  });
  register_step_op("conv2d_packed", [](const py::tuple& a) {
    step_arity(a, 4, 12, "conv2d_packed");
    return prep_conv2d_packed(step_array(a, 0, "conv2d"), a[1].cast<const PyPackedConv&>(), a[2],
                              step_array(a, 3, "conv2d"), step_val(a, 4, one2), step_val(a, 5, zero4),
                              step_val(a, 6, one2), step_val(a, 7, std::string("none")), step_val(a, 8, 0.f),
                              step_val(a, 9, 0.f), false, step_obj(a, 10), step_val(a, 11, 0.f));
  });
  register_step_op("dw_pointwise", [](const py::tuple& a) {
    step_arity(a, 6, 15, "dw_pointwise");
    return prep_dw_pointwise(step_array(a, 0, "dw_pointwise"), a[1].cast<const PyPackedConv&>(), a[2],
                             a[3].cast<const PyPackedConv&>(), a[4], step_array(a, 5, "dw_pointwise"),
                             step_val(a, 6, one2), step_val(a, 7, zero4), step_val(a, 8, one2),
                             step_val(a, 9, std::string("none")), step_val(a, 10, 0.f), step_val(a, 11, 0.f),
                             step_val(a, 12, std::string("none")), step_val(a, 13, 0.f), step_val(a, 14, 0.f), false);
  });
  // a squeeze-excitation block's pool (PP-LCNet's two, its head's): without it each one split a replay's step in two
  register_step_op("global_avg_pool", [](const py::tuple& a) {
    step_arity(a, 2, 2, "global_avg_pool");
    return prep_global_avg_pool(step_array(a, 0, "global_avg_pool"), step_array(a, 1, "global_avg_pool"), false);
  });
  register_step_op("max_pool2d", [](const py::tuple& a) {
    step_arity(a, 3, 6, "max_pool2d");
    return prep_max_pool2d(step_array(a, 0, "max_pool2d"), step_array(a, 1, "max_pool2d"),
                           a[2].cast<std::vector<i64>>(), step_val(a, 3, one2), step_val(a, 4, zero4),
                           step_val(a, 5, one2), false);
  });
}

}  // namespace

void bind_llm(pybind11::module_&);

namespace hetero {
pybind11::dict pool_stats_dict(const PoolStats& s) {
  pybind11::dict d;
  d["calls"] = s.calls;
  d["tasks"] = s.tasks;
  d["joins"] = s.joins;
  d["sleeps"] = s.sleeps;
  d["late"] = s.late;
  d["serial_calls"] = s.serial_calls;
  d["wall_s"] = s.wall_s;
  d["busy_s"] = s.busy_s;
  d["wake_s"] = s.wake_s;
  d["tail_s"] = s.tail_s;
  d["serial_s"] = s.serial_s;
  d["idle_s"] = s.idle_s;
  return d;
}
}  // namespace hetero
void bind_gated_delta(pybind11::module_& m);
namespace hetero {
// The op ids of the names unary / binary take, for the other binding files (chain_dot.cpp).
int unary_op_id(const std::string& op, const char* fn) { return unary_id(op, fn); }
int binary_op_id(const std::string& op) { return binary_id(op); }
void bind_chain_dot(pybind11::module_& m);
void bind_trees(pybind11::module_& m);
void bind_onnx_extra(pybind11::module_& m);
void bind_qlinear(pybind11::module_& m);
void bind_half(pybind11::module_& m);
void bind_attention(pybind11::module_& m);
}

PYBIND11_MODULE(_native, m) {
  m.doc() = "hetero CPU kernels: packed GEMM, elementwise, normalisation, data movement and CNN ops";
  register_step_ops();
  m.def("step_ops", &step_op_names, "The native functions an LlmStep takes as prepared ops (LlmStep.add_call).");

  m.def("isa", &isa_name, "The active instruction-set path: avx512, avx2, neon or generic.");
  m.def("available_isas", &available_isas, "ISA paths this CPU can run, best first.");
  m.def("set_isa", &set_isa, py::arg("name"), "Select an ISA path (tests/benchmarks); ValueError if unavailable.");
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, py::arg("n"));
  m.def("pool_spin_us", &pool_spin_us, "Microseconds a pool worker spins for the next call before it sleeps.");
  m.def("set_pool_spin_us", &set_pool_spin_us, py::arg("us"));
  m.def("pool_linger", &pool_linger,
        "Idle pool workers keep spinning pool_linger_us from now (sleeping ones are woken to): the end of a replay.");
  m.def("pool_linger_us", &pool_linger_us, "Microseconds pool_linger keeps idle workers spinning (0: off).");
  m.def("set_pool_linger_us", &set_pool_linger_us, py::arg("us"));
  m.def("pool_cpu_ns", &pool_cpu_ns,
        "CPU time (ns) of the calling thread, then of each pool worker (-1: not readable); see threadpool_stats.hpp.");
  m.def("pool_stats_enable", &pool_stats_enable, py::arg("on"),
        "Record the thread pool's statistics (pool_stats); off by default (a few clock reads per call and task).");
  m.def("pool_stats", [](bool reset) { return pool_stats_dict(pool_stats(reset)); }, py::arg("reset") = false,
        "The pool's statistics since the last reset (see threadpool_stats.hpp).");
  m.def("_pool_cover", [](i64 ntasks, int max_threads, int reps, i64 throw_at) {
    // Test hook: reps parallel_for calls of ntasks tasks; counts how often each task ran (each call must run every
    // task exactly once); task throw_at (if >= 0) throws in the last call, which must reach the caller.
    std::vector<std::atomic<i64>> count(static_cast<std::size_t>(ntasks));
    {
      py::gil_scoped_release nogil;
      for (int r = 0; r < reps; ++r)
        parallel_for(ntasks, max_threads, [&](i64 t) {
          count[static_cast<std::size_t>(t)].fetch_add(1, std::memory_order_relaxed);
          if (t == throw_at && r == reps - 1) throw std::runtime_error("task " + std::to_string(t) + " failed");
        });
    }
    py::array_t<i64> out(ntasks);
    for (i64 t = 0; t < ntasks; ++t) out.mutable_at(t) = count[static_cast<std::size_t>(t)].load();
    return out;
  }, py::arg("ntasks"), py::arg("max_threads"), py::arg("reps"), py::arg("throw_at") = -1);

  py::class_<PackedB>(m, "PackedB", "B pre-packed in the micro-kernel's panel layout (weights).")
      .def_property_readonly("k", [](const PackedB& p) { return p.k; })
      .def_property_readonly("n", [](const PackedB& p) { return p.n; })
      .def_property_readonly("isa", [](const PackedB& p) { return std::string(p.kr->name); })
      .def_property_readonly(
          "nbytes",
          [](const PackedB& p) { return static_cast<i64>((p.buf.cap + p.qbuf.cap + p.bf.cap) * sizeof(float)); })
      .def_property_readonly("int8", [](const PackedB& p) { return p.int8; })
      .def_property_readonly("bf16x3", [](const PackedB& p) { return p.bf16x3; },
                             "Whether large enough products run bf16x3 on AMX-BF16 (precision normal).")
      .def("__repr__", [](const PackedB& p) {
        return "<PackedB k=" + std::to_string(p.k) + " n=" + std::to_string(p.n) + " isa=" + p.kr->name + ">";
      });

  m.def("gemm", &py_gemm, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("trans_a") = false,
        py::arg("trans_b") = false, py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("bias") = py::none(),
        "out = alpha * op(a) @ op(b) + beta * out + bias (bias broadcastable to (M, N)).");
  m.def("pack_b", &py_pack_b, py::arg("b"), py::arg("trans_b") = false, py::arg("int8") = true,
        py::arg("precision") = py::none(),
        "precision: \"high\" (fp32 kernels) or \"normal\" (bf16x3 on AMX-BF16 where it gains); None: precision().");
  m.def("precision", [] { return std::string(precision_name(default_precision())); },
        "The process default of pack_b's precision: HETERO_CPU_PRECISION, else \"normal\", or set_precision's.");
  m.def(
      "set_precision",
      [](const std::string& v) { g_precision.store(static_cast<int>(parse_precision(v, "precision"))); },
      py::arg("precision"));
  m.def("bf16x3_available", &bf16x3_available, "Whether this CPU and process can run the bf16x3 GEMM (AMX-BF16).");
  m.def("gemm_packed", &py_gemm_packed, py::arg("a"), py::arg("packed"), py::arg("out"), py::arg("alpha") = 1.0f,
        py::arg("beta") = 0.0f, py::arg("bias") = py::none(), py::arg("activation") = "none",
        py::arg("act_alpha") = 0.0f, py::arg("act_beta") = 0.0f);
  m.def("matmul", &py_matmul, py::arg("a"), py::arg("b"), py::arg("out"),
        "Batched: a (Ba, M, K) @ b (Bb, K, N) -> out (B, M, N), Ba and Bb in {1, B}.");
  m.def("matmul_packed", &py_matmul_packed, py::arg("a"), py::arg("packed"), py::arg("out"));

  m.def("binary", &py_binary, py::arg("op"), py::arg("a"), py::arg("b"), py::arg("out"));
  m.def("unary", &py_unary, py::arg("op"), py::arg("x"), py::arg("out"), py::arg("alpha") = 0.0f,
        py::arg("beta") = 0.0f);
  m.def("unary_ops", [] {
    std::vector<std::string> v;
    for (const auto& kv : unary_ops()) v.push_back(kv.first);
    return v;
  });
  m.def("softmax", &py_softmax, py::arg("x"), py::arg("out"), py::arg("log") = false);
  m.def("layer_norm", &py_layer_norm, py::arg("x"), py::arg("scale"), py::arg("bias"), py::arg("out"),
        py::arg("epsilon") = 1e-5f, py::arg("mean_out") = py::none(), py::arg("invstd_out") = py::none(),
        py::arg("skip") = py::none(), py::arg("sum_out") = py::none(),
        "skip (x's shape, C-contiguous): normalise the rows of x + skip; sum_out (the same): also write x + skip.");
  m.def("rms_norm", &py_rms_norm, py::arg("x"), py::arg("scale"), py::arg("out"), py::arg("epsilon") = 1e-6f);

  m.def("copy", &py_copy, py::arg("src"), py::arg("out"));
  m.def("gather", &py_gather, py::arg("data"), py::arg("indices"), py::arg("axis"), py::arg("out"));
  m.def("scatter_elements", &py_scatter_elements, py::arg("data"), py::arg("indices"), py::arg("updates"),
        py::arg("axis"), py::arg("reduction"), py::arg("out"));

  py::class_<PyPackedConv>(m, "PackedConv", "Convolution weights packed once for conv2d_packed.")
      .def_property_readonly("out_channels", [](const PyPackedConv& p) { return p.pc->cout; })
      .def_property_readonly("in_channels", [](const PyPackedConv& p) { return p.pc->cin_g * p.pc->group; })
      .def_property_readonly("kernel", [](const PyPackedConv& p) { return py::make_tuple(p.pc->kh, p.pc->kw); })
      .def_property_readonly("group", [](const PyPackedConv& p) { return p.pc->group; })
      .def_property_readonly("depthwise", [](const PyPackedConv& p) { return p.pc->depthwise; })
      .def_property_readonly("bf16x3", [](const PyPackedConv& p) { return p.pc->bf16x3; },
                             "Whether the weights also have the bf16x3 form (precision normal, AMX-BF16).")
      .def(
          "algorithm",
          [](const PyPackedConv& p, const std::vector<i64>& x_shape, const std::vector<i64>& strides,
             const std::vector<i64>& pads, const std::vector<i64>& dilations) {
            const char* fn = "PackedConv.algorithm";
            const ConvGeom g = conv_geom(*p.pc, int_list(x_shape, 4, fn, "x_shape"), int_list(strides, 2, fn, "strides"),
                                         int_list(pads, 4, fn, "pads"), int_list(dilations, 2, fn, "dilations"));
            return std::string(conv_algorithm_name(conv_algorithm(*p.pc, g)));
          },
          py::arg("x_shape"), py::arg("strides") = std::vector<i64>{1, 1},
          py::arg("pads") = std::vector<i64>{0, 0, 0, 0}, py::arg("dilations") = std::vector<i64>{1, 1},
          "The kernel conv2d_packed runs for this input shape: depthwise, dot, winograd, direct, gemm or bf16x3.");
  m.def("prepack_conv", &py_prepack_conv, py::arg("w"), py::arg("group") = 1, py::arg("precision") = py::none(),
        "precision: \"high\" (fp32 kernels) or \"normal\" (bf16x3 on AMX-BF16 where it gains); None: precision().");
  const std::vector<i64> one2{1, 1}, zero4{0, 0, 0, 0};
  m.def("conv2d", &py_conv2d, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("out"),
        py::arg("strides") = one2, py::arg("pads") = zero4, py::arg("dilations") = one2, py::arg("group") = 1,
        py::arg("activation") = "none", py::arg("activation_alpha") = 0.0f, py::arg("activation_beta") = 0.0f);
  m.def("conv2d_packed", &py_conv2d_packed, py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("out"),
        py::arg("strides") = one2, py::arg("pads") = zero4, py::arg("dilations") = one2,
        py::arg("activation") = "none", py::arg("activation_alpha") = 0.0f, py::arg("activation_beta") = 0.0f,
        py::arg("residual") = py::none(), py::arg("input_shift") = 0.0f);
  m.def("dw_pointwise", &py_dw_pointwise, py::arg("x"), py::arg("dw_packed"), py::arg("dw_bias"),
        py::arg("pw_packed"), py::arg("pw_bias"), py::arg("out"), py::arg("strides") = one2,
        py::arg("pads") = zero4, py::arg("dilations") = one2, py::arg("activation") = "none",
        py::arg("activation_alpha") = 0.0f, py::arg("activation_beta") = 0.0f, py::arg("activation2") = "none",
        py::arg("activation2_alpha") = 0.0f, py::arg("activation2_beta") = 0.0f,
        "A depthwise conv (+ activation) and the 1x1 conv on its output (+ activation2) in one pass over bands of "
        "rows (hetero.DwPointwiseConv; the two convs in turn where dw_pointwise_fits says the pair does not gain).");
  m.def("max_pool2d", &py_max_pool2d, py::arg("x"), py::arg("out"), py::arg("kernel"), py::arg("strides") = one2,
        py::arg("pads") = zero4, py::arg("dilations") = one2);
  m.def("avg_pool2d", &py_avg_pool2d, py::arg("x"), py::arg("out"), py::arg("kernel"), py::arg("strides") = one2,
        py::arg("pads") = zero4, py::arg("count_include_pad") = false);
  m.def("global_avg_pool", &py_global_avg_pool, py::arg("x"), py::arg("out"));
  bind_llm(m);
  bind_gated_delta(m);
  hetero::bind_onnx_extra(m);
  hetero::bind_qlinear(m);
  hetero::bind_half(m);
  hetero::bind_chain_dot(m);
  hetero::bind_trees(m);
  hetero::bind_attention(m);
}
