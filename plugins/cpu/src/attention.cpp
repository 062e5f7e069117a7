// FusedAttention (hetero.ops.fused): softmax((Q q_scale) (K k_scale) * scale / divisor + mask) V per (batch, head),
// with Q, K, V, the mask and the output read / written through their strides (the transposes of the exported graph
// never copied), and each head's scores kept in a per-thread buffer instead of four passes over a [B, H, S, T]
// tensor. The steps are the unfused kernels' (the GEMM's tiles, with its FMA chain per value; the vector binary ops;
// the softmax row kernel), so the result rounds as the written-out MatMul / Mul / Div / Add / Softmax / MatMul did on
// this backend.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <functional>
#include <string>

#include "onnx_extra.hpp"
#include "onnx_py.hpp"
#include "step.hpp"

namespace py = pybind11;

namespace hetero {
namespace {

using pyx::fail;

struct View4 {  // a float32 tensor of four dims through element strides (0 for a broadcast dim)
  float* p = nullptr;
  i64 dim[4] = {0, 0, 0, 0}, st[4] = {0, 0, 0, 0};
};

View4 view4(const py::array& a, const char* name) {
  const char* fn = "fused_attention";
  pyx::need_f32(a, fn, name);
  if (a.ndim() != 4) fail(std::string(fn) + ": " + name + " must have 4 dims, got shape " + pyx::shape_str(a));
  View4 v;
  v.p = pyx::mptr<float>(a);
  for (int d = 0; d < 4; ++d) {
    v.dim[d] = a.shape(d);
    const i64 bytes = a.strides(d);
    if (bytes < 0 || bytes % 4 != 0) fail(std::string(fn) + ": " + name + " has a negative or unaligned stride");
    v.st[d] = bytes / 4;
  }
  return v;
}

std::string dims_str(i64 d0, i64 d1, i64 d2, i64 d3) {
  return "[" + std::to_string(d0) + ", " + std::to_string(d1) + ", " + std::to_string(d2) + ", " + std::to_string(d3) +
         "]";
}

void need_dims(const View4& v, i64 d0, i64 d1, i64 d2, i64 d3, const char* name) {
  if (v.dim[0] != d0 || v.dim[1] != d1 || v.dim[2] != d2 || v.dim[3] != d3)
    fail(std::string("fused_attention: ") + name + " is " + dims_str(v.dim[0], v.dim[1], v.dim[2], v.dim[3]) +
         ", expected " + dims_str(d0, d1, d2, d3));
}

// Scalars Q and K were multiplied by before the product (PyTorch's exported attention scales each by d^-1/4):
// applied to this kernel's own copies of them (K^T's rows, Q's packed panels), each value rounded as the graph's Mul
// rounded it.
struct OperandScales {
  float q = 1.f, k = 1.f;
};

// C (m x n, row stride ldc) = A @ B with A in full-K row panels (pack_a_panels) and row k of B read in place at
// base + off[k], on the direct-convolution tiles (onnx_impl.hpp x_conv_tile): nr-wide tiles, then one-vector ones for
// the last columns (70 of T5's = 32 + 32 + 16, not 3 x 32); a tile reads whole vectors, so B's rows must be readable
// up to n rounded up to the lanes. Each value is the micro-kernel's FMA chain over k from zero, as in the packed
// GEMM: the same bits, without packing B or the GEMM's per-call set-up. False (nothing written) where this ISA has
// no such tile. padded: c has whole panels of rows and n is a multiple of the lanes (every tile stored whole, no
// partial copies). used (padded only): the columns read afterwards; the last few of them past the nr-wide tiles
// are computed a column a vector (col_tile: the same bits), the padding columns after them left unwritten.
bool tile_gemm(const Kernels& kr, const ExtraKernels& xk, i64 m, i64 n, i64 k, const float* ap, const float* base,
               const i64* off, float* c, i64 ldc, bool padded, i64 used = -1) {
  const int mr = kr.mr, nr = kr.nr, w = xk.lanes;
  for (i64 i = 0; i < m; i += mr) {
    // padded: the last panel's rows rounded up to the 4- / 6- / 8-row tile variants (x_conv_tile_rows), not to mr
    const i64 left = m - i;
    const int rows = static_cast<int>(
        std::min<i64>(mr, padded ? (left <= 4 ? 4 : left <= 6 ? 6 : left <= 8 ? 8 : mr) : left));
    const float* a = ap + (i / mr) * k * mr;
    for (i64 j = 0; j < n;) {
      // a few columns left of a one-vector tile's w (a ViT's 1 of 257, T5's 6 of 70): K FMAs a column instead of K x
      // rows, where that is fewer (up to 2 columns, or 4 fewer than the tile's rows: 8 of a 12-row panel)
      if (padded && used >= 0 && n - j < nr && (used - j <= 2 || used - j <= rows - 4) &&
          xk.col_tile(mr, k, a, base + j, off, c + i * ldc + j, ldc, rows, static_cast<int>(used - j)))
        break;
      const int width = n - j >= nr ? nr : w, cols = padded ? width : static_cast<int>(std::min<i64>(width, n - j));
      if (!xk.conv_tile(mr, width, k, a, base + j, off, c + i * ldc + j, ldc, rows, cols)) return false;
      j += cols;
    }
  }
  return true;
}

// tile_gemm with A's rows read in place (row i at a + i * lda: the softmax's probabilities, not packed) for the
// whole panels of mr rows; the rows past them packed into ap (one panel) and run on the packed tiles: the same bits
// either way. False where this ISA has no such tile (checked on the first; nothing written then).
bool rows_gemm(const Kernels& kr, const ExtraKernels& xk, i64 m, i64 n, i64 k, const float* a, i64 lda,
               const float* base, const i64* off, float* c, i64 ldc, float* ap) {
  const int mr = kr.mr, nr = kr.nr, w = xk.lanes;
  const i64 whole = m / mr * mr;
  for (i64 i = 0; i < whole; i += mr)
    for (i64 j = 0; j < n;) {
      const int width = n - j >= nr ? nr : w, cols = static_cast<int>(std::min<i64>(width, n - j));
      if (!xk.rows_tile(mr, width, k, a + i * lda, lda, base + j, off, c + i * ldc + j, ldc, mr, cols)) return false;
      j += cols;
    }
  if (whole == m) return true;
  pack_a_panels(kr, MatView{a + whole * lda, m - whole, k, lda, 1}, ap);
  return tile_gemm(kr, xk, m - whole, n, k, ap, base, off, c + whole * ldc, ldc, false);
}

// One head on the tiles: Q panels, K^T copied once into rows of T (zero-padded to the lanes), V read in place (or
// padded rows when dv is not a multiple of the lanes), the probabilities read as rows in place where the ISA has
// such tiles (else packed as Q was). False where the tiles are missing (the caller runs the GEMMs).
bool head_on_tiles(const Kernels& kr, const ExtraKernels& xk, const MatView& q, const MatView& kt, const MatView& v,
                   float* o, i64 ldo, const OperandScales& by,
                   const std::function<void(float*, i64, i64, i64)>& rows_softmax) {
  const i64 S = q.rows, D = q.cols, T = kt.cols, DV = v.cols, mr = kr.mr, w = xk.lanes;
  const i64 tp = ceil_div(T, w) * w, dvp = ceil_div(DV, w) * w, ap_n = ceil_div(S, mr) * mr;
  // V in place only where its rows lie one after another: a ViT's V is every third [H * d] row of the qkv product
  // (257 rows 4.6 KB apart: 16 of L1's 64 sets), and the PV tiles stalled on its loads
  const bool v_in_place = v.cs == 1 && DV % w == 0 && v.rs == DV;
  // This thread's heads: panels, K^T, one row panel's scores, (V), the last short panel of probabilities packed, the
  // row offsets of K^T and of V, each 64-byte aligned; no allocation per head.
  const i64 line = 16, n_qp = ceil_div(ap_n * D, line) * line, n_kp = D * tp, n_sc = mr * tp,
            n_vp = ceil_div(v_in_place ? 0 : T * dvp, line) * line, n_pp = ceil_div(mr * T, line) * line;
  static thread_local AlignedBuf buf;
  float* qp = buf.get(static_cast<std::size_t>(n_qp + n_kp + n_sc + n_vp + n_pp + 2 * (D + T)));
  float* kp = qp + n_qp;
  float* scores = kp + n_kp;  // mr x tp: whole tiles stored (the padding columns are 0 x q, never read)
  float* vp = scores + n_sc;
  float* pp = vp + n_vp;
  i64* koff = reinterpret_cast<i64*>(pp + n_pp);
  i64* voff = koff + D;
  for (i64 d = 0; d < D; ++d) {
    float* row = kp + d * tp;
    for (i64 t = T; t < tp; ++t) row[t] = 0.f;
    koff[d] = d * tp;
  }
  if (kt.cs == 1) {  // K^T itself in memory (a graph that transposed K before the product): row by row
    xk.copy_rows(kt.p, kt.rs, kp, tp, D, T);
  } else if (kt.rs == 1) {  // K's rows contiguous (an exported graph's K^T is a view of K): transposed in blocks
    xk.transpose_into(kt.p, kt.cs, T, D, kp, tp);
  } else {
    for (i64 t = 0; t < T; ++t)
      for (i64 d = 0; d < D; ++d) kp[d * tp + t] = kt.p[d * kt.rs + t * kt.cs];
  }
  // whole buffers, one call each: the padding (K^T's columns past T, Q's rows past S) is never read
  if (by.k != 1.f) kr.binary(B_MUL, BM_VS, kp, &by.k, kp, D * tp);
  pack_a_panels(kr, q, qp);
  if (by.q != 1.f) kr.binary(B_MUL, BM_VS, qp, &by.q, qp, ap_n * D);
  const float* vbase = v.p;
  if (v_in_place) {
    for (i64 t = 0; t < T; ++t) voff[t] = t * v.rs;
  } else {
    if (v.cs == 1) xk.copy_rows(v.p, v.rs, vp, dvp, T, DV);  // whole vectors (a loop of scalars was 3 % of a head)
    for (i64 t = 0; t < T; ++t) {
      float* row = vp + t * dvp;
      if (v.cs != 1)
        for (i64 j = 0; j < DV; ++j) row[j] = v.p[t * v.rs + j * v.cs];
      for (i64 j = DV; j < dvp; ++j) row[j] = 0.f;
      voff[t] = t * dvp;
    }
    vbase = vp;
  }
  // One row panel at a time: its scores, their softmax and its PV tiles while the panel's mr x T scores are in L1
  // (the whole S x T scores of a 257-token head, 280 KB, went through L2 three times: written by the QK^T tiles,
  // read and written by the softmax, read by the PV tiles). Every value is computed as before: the same tiles on
  // the same panels, the softmax row by row.
  for (i64 i = 0; i < S; i += mr) {
    const i64 rows = std::min(mr, S - i);
    if (!tile_gemm(kr, xk, rows, tp, D, qp + (i / mr) * D * mr, kp, koff, scores, tp, true, T)) return false;
    rows_softmax(scores, tp, i, rows);
    if (rows == mr && rows_gemm(kr, xk, rows, DV, T, scores, tp, vbase, voff, o + i * ldo, ldo, pp)) continue;
    // a short last panel (or no in-place tile): the probabilities packed, as Q was
    pack_a_panels(kr, MatView{scores, rows, T, tp, 1}, pp);
    if (!tile_gemm(kr, xk, rows, DV, T, pp, vbase, voff, o + i * ldo, ldo, false)) return false;
  }
  return true;
}

// a (read through its strides) times s into dst, contiguous: the fallback's scaled operands
MatView scaled_copy(const MatView& a, float s, float* dst) {
  for (i64 i = 0; i < a.rows; ++i)
    for (i64 j = 0; j < a.cols; ++j) dst[i * a.cols + j] = a.p[i * a.rs + j * a.cs] * s;
  return MatView{dst, a.rows, a.cols, a.cols, 1};
}

// q [B, H, S, d], k [B, H, d, T], v [B, H, T, dv], mask [B, H, S, T] (a broadcast view) or None, out [B, H, S, dv]
// (a view of the output buffer whose last dim is contiguous).
Op prep_fused_attention(const py::array& q, const py::array& k, const py::array& v, const py::object& mask,
                        const py::array& out, float scale, float divisor, bool nan_to_zero, float q_scale,
                        float k_scale) {
  const View4 Q = view4(q, "q"), K = view4(k, "k"), V = view4(v, "v"), O = view4(out, "out");
  const i64 B = Q.dim[0], H = Q.dim[1], S = Q.dim[2], D = Q.dim[3], T = K.dim[3], DV = V.dim[3];
  need_dims(K, B, H, D, T, "k");
  need_dims(V, B, H, T, DV, "v");
  need_dims(O, B, H, S, DV, "out");
  if (!out.writeable()) fail("fused_attention: out must be writable");
  if (O.st[3] != 1 && DV > 1) fail("fused_attention: out's last dim must be contiguous");
  View4 M;
  const bool masked = !mask.is_none();
  if (masked) {
    // an array the caller keeps (a prepared op points into it), not one converted for this call
    if (!py::isinstance<py::array>(mask)) fail("fused_attention: mask must be an array or None");
    M = view4(py::reinterpret_borrow<py::array>(mask), "mask");
    need_dims(M, B, H, S, T, "mask");
    if (M.st[3] > 1) fail("fused_attention: mask's last dim must be contiguous or broadcast");
  }
  const Kernels* krp = &active();
  const ExtraKernels* xkp = &extra_for(*krp);
  const Kernels& kr = *krp;
  const ExtraKernels& xk = *xkp;
  bool tiles;  // this ISA has the GEMM's tile shapes as direct tiles (checked once: a tile of nothing)
  {
    alignas(64) float probe[64] = {};
    const i64 zero = 0;
    tiles = xk.conv_tile(kr.mr, kr.nr, 0, probe, probe, &zero, probe, kr.nr, 0, 0) &&
            xk.conv_tile(kr.mr, xk.lanes, 0, probe, probe, &zero, probe, kr.nr, 0, 0);
  }
  return [=] {
    const Kernels& kr = *krp;
    const ExtraKernels& xk = *xkp;
    if (B * H * S * DV == 0) return;
    const double flops = 2.0 * static_cast<double>(B * H * S) * static_cast<double>(T) * static_cast<double>(D + DV);
    parallel_for(
        B * H, threads_for(flops, 1e6),
        [&](i64 task) {
          const i64 b = task / H, h = task % H;
          float* o = O.p + b * O.st[0] + h * O.st[1];
          if (T == 0) {  // softmax over nothing: no weights, an empty sum
            for (i64 i = 0; i < S; ++i)
              for (i64 j = 0; j < DV; ++j) o[i * O.st[2] + j] = 0.f;
            return;
          }
          const MatView qa{Q.p + b * Q.st[0] + h * Q.st[1], S, D, Q.st[2], Q.st[3]};
          const MatView kb{K.p + b * K.st[0] + h * K.st[1], D, T, K.st[2], K.st[3]};
          const MatView vb{V.p + b * V.st[0] + h * V.st[1], T, DV, V.st[2], V.st[3]};
          // rows i0 .. i0 + rows of the scores, at sc
          const auto rows_softmax = [&](float* sc, i64 ld, i64 i0, i64 rows) {
            // the scale apart: its product and the mask's sum in one loop could be contracted into an FMA
            if (scale != 1.f)
              for (i64 i = 0; i < rows; ++i) kr.binary(B_MUL, BM_VS, sc + i * ld, &scale, sc + i * ld, T);
            const float* m = masked ? M.p + b * M.st[0] + h * M.st[1] + i0 * M.st[2] : nullptr;
            xk.scores_softmax_rows(sc, sc, rows, ld, T, divisor, m, M.st[2], M.st[3] == 1);
            if (nan_to_zero)
              for (i64 i = 0; i < rows; ++i)
                for (i64 j = 0; j < T; ++j) sc[i * ld + j] = sc[i * ld + j] != sc[i * ld + j] ? 0.f : sc[i * ld + j];
          };
          const OperandScales by{q_scale, k_scale};
          if (tiles && head_on_tiles(kr, xk, qa, kb, vb, o, O.st[2], by, rows_softmax)) return;
          static thread_local AlignedBuf scratch;
          float* scores = scratch.get(static_cast<std::size_t>(S * T + (by.q != 1.f ? S * D : 0) +
                                                               (by.k != 1.f ? D * T : 0)));
          float* spare = scores + S * T;
          const MatView qs = by.q != 1.f ? scaled_copy(qa, by.q, spare) : qa;
          const MatView ks = by.k != 1.f ? scaled_copy(kb, by.k, spare + (by.q != 1.f ? S * D : 0)) : kb;
          gemm_views(kr, qs, ks, scores, T, 1.f, 0.f, Epilogue{}, 1);
          rows_softmax(scores, T, 0, S);
          gemm_views(kr, MatView{scores, S, T, T, 1}, vb, o, O.st[2], 1.f, 0.f, Epilogue{}, 1);
        },
        flops >= 4e6);
  };
}

void py_fused_attention(const py::array& q, const py::array& k, const py::array& v, const py::object& mask,
                        const py::array& out, float scale, float divisor, bool nan_to_zero, float q_scale,
                        float k_scale) {
  run_now(prep_fused_attention, q, k, v, mask, out, scale, divisor, nan_to_zero, q_scale, k_scale);
}

}  // namespace

void bind_attention(py::module_& m) {
  register_step_op("fused_attention", [](const py::tuple& a) {
    step_arity(a, 5, 10, "fused_attention");
    return prep_fused_attention(step_array(a, 0, "fused_attention"), step_array(a, 1, "fused_attention"),
                                step_array(a, 2, "fused_attention"), a[3], step_array(a, 4, "fused_attention"),
                                a.size() > 5 ? a[5].cast<float>() : 1.f, a.size() > 6 ? a[6].cast<float>() : 1.f,
                                a.size() > 7 && a[7].cast<bool>(), a.size() > 8 ? a[8].cast<float>() : 1.f,
                                a.size() > 9 ? a[9].cast<float>() : 1.f);
  });
  m.def("fused_attention", &py_fused_attention, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"),
        py::arg("out"), py::arg("scale") = 1.0f, py::arg("divisor") = 1.0f, py::arg("nan_to_zero") = false,
        py::arg("q_scale") = 1.0f, py::arg("k_scale") = 1.0f,
        "softmax((q * q_scale) @ (k * k_scale) * scale / divisor + mask) @ v per (batch, head) into out; q [B, H, S, "
        "d], k [B, H, d, T], v [B, H, T, dv], mask [B, H, S, T] (broadcast view) or None, out [B, H, S, dv]: any "
        "strides (the last dim of out contiguous); nan_to_zero: NaN probabilities (a fully masked row) become 0.");
}

}  // namespace hetero
