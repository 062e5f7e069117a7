// ConvTranspose 2-D: per image and group, one GEMM (W_g^T (Cout_g*kh*kw x C_g) times the input (C_g x H*W),
// the weights packed once as A panels) into a column matrix, then col2im scatters each (co, ky, kx) row into the
// strided, dilated output window (threaded over output channels, which never overlap).
#include <algorithm>
#include <cstring>
#include <memory>

#include "onnx_py.hpp"

namespace hetero {
namespace {

using namespace pyx;

inline i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }
inline i64 floor_div(i64 a, i64 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

struct PackedConvT {
  const Kernels* kr = nullptr;
  i64 C = 0, cout_g = 0, kh = 0, kw = 0, group = 1, Mg = 0, group_stride = 0;
  AlignedBuf buf;
};

std::shared_ptr<PackedConvT> py_prepack(const py::array& w, i64 group) {
  const char* fn = "prepack_conv_transpose";
  need_f32(w, fn, "w");
  need_contig(w, fn, "w");
  if (w.ndim() != 4) fail("prepack_conv_transpose: w must be (C, Cout/group, kh, kw)");
  if (group < 1 || w.shape(0) % group != 0) fail("prepack_conv_transpose: C not divisible by group");
  auto p = std::make_shared<PackedConvT>();
  p->kr = &active();
  p->C = w.shape(0);
  p->cout_g = w.shape(1);
  p->kh = w.shape(2);
  p->kw = w.shape(3);
  p->group = group;
  p->Mg = p->cout_g * p->kh * p->kw;
  const i64 cg = p->C / group;
  p->group_stride = ceil_div(p->Mg, p->kr->mr) * p->kr->mr * cg;
  float* d = p->buf.get(static_cast<std::size_t>(std::max<i64>(1, p->group_stride * group)));
  const float* pw = cptr<float>(w);
  py::gil_scoped_release nogil;
  for (i64 g = 0; g < group; ++g)  // A = W_g^T: element (m, c) at W_g[c * Mg + m]
    pack_a_panels(*p->kr, MatView{pw + g * cg * p->Mg, p->Mg, cg, 1, p->Mg}, d + g * p->group_stride);
  return p;
}

void py_conv_transpose(const py::array& x, const PackedConvT& p, const py::object& bias, const py::array& out,
                       const std::vector<i64>& strides, const std::vector<i64>& pads_begin,
                       const std::vector<i64>& dil) {
  const char* fn = "conv_transpose2d";
  need_f32(x, fn, "x");
  need_contig(x, fn, "x");
  need_f32(out, fn, "out");
  need_out(out, fn);
  if (x.ndim() != 4 || out.ndim() != 4) fail("conv_transpose2d: x and out must be NCHW");
  if (strides.size() != 2 || pads_begin.size() != 2 || dil.size() != 2)
    fail("conv_transpose2d: strides, pads_begin and dilations take 2 values");
  const i64 N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
  if (C != p.C) fail("conv_transpose2d: x has " + std::to_string(C) + " channels, the weights " + std::to_string(p.C));
  const i64 Cout = p.cout_g * p.group, Ho = out.shape(2), Wo = out.shape(3);
  if (out.shape(0) != N || out.shape(1) != Cout) fail("conv_transpose2d: out has the wrong batch or channels");
  const i64 sh = strides[0], sw = strides[1], pt = pads_begin[0], pl = pads_begin[1], dh = dil[0], dw = dil[1];
  if (sh < 1 || sw < 1 || dh < 1 || dw < 1) fail("conv_transpose2d: strides and dilations must be >= 1");
  const float* pb = nullptr;
  if (!bias.is_none()) {
    py::array b = py::reinterpret_borrow<py::array>(bias);
    need_f32(b, fn, "bias");
    need_contig(b, fn, "bias");
    if (b.size() != Cout) fail("conv_transpose2d: bias must have Cout elements");
    pb = cptr<float>(b);
  }
  const float* px = cptr<float>(x);
  float* po = mptr<float>(out);
  py::gil_scoped_release nogil;
  if (out.size() == 0) return;
  const Kernels& kr = *p.kr;
  const i64 cg = p.C / p.group, HW = H * W, HWo = Ho * Wo, Mg = p.Mg;
  const int T = num_threads();
  AlignedBuf bbuf, cols;
  float* bp = bbuf.get(static_cast<std::size_t>(std::max<i64>(1, ceil_div(HW, kr.nr) * kr.nr * cg)));
  float* cm = cols.get(static_cast<std::size_t>(std::max<i64>(1, Mg * HW)));
  for (i64 n = 0; n < N; ++n)
    for (i64 g = 0; g < p.group; ++g) {
      float* oimg = po + (n * Cout + g * p.cout_g) * HWo;
      if (HW == 0 || cg == 0) {
        for (i64 co = 0; co < p.cout_g; ++co)
          std::fill(oimg + co * HWo, oimg + (co + 1) * HWo, pb ? pb[g * p.cout_g + co] : 0.f);
        continue;
      }
      const int Tg = threads_for(2.0 * Mg * HW * cg, 2e5);
      pack_b_panels(kr, MatView{px + (n * C + g * cg) * HW, cg, HW, HW, 1}, bp, std::min(T, Tg));
      gemm_prepacked_b(kr, Mg, HW, cg, nullptr, p.buf.p + g * p.group_stride, bp, cm, HW, 1.f, 0.f, Epilogue{},
                       std::min(T, Tg));
      const int Tc = threads_for(static_cast<double>(Mg) * HW + p.cout_g * HWo, 65536);
      parallel_for(p.cout_g, Tc, [&](i64 co) {
        float* o = oimg + co * HWo;
        std::fill(o, o + HWo, pb ? pb[g * p.cout_g + co] : 0.f);
        for (i64 ky = 0; ky < p.kh; ++ky)
          for (i64 kx = 0; kx < p.kw; ++kx) {
            const float* src = cm + ((co * p.kh + ky) * p.kw + kx) * HW;
            const i64 offx = kx * dw - pl;  // ox = ix*sw + offx
            const i64 ixa = std::max<i64>(0, ceil_div(std::max<i64>(0, -offx), sw));
            const i64 ixb = std::min<i64>(W, Wo - 1 - offx < 0 ? 0 : floor_div(Wo - 1 - offx, sw) + 1);
            if (ixb <= ixa) continue;
            for (i64 iy = 0; iy < H; ++iy) {
              const i64 oy = iy * sh - pt + ky * dh;
              if (oy < 0 || oy >= Ho) continue;
              const float* s = src + iy * W;
              float* orow = o + oy * Wo;
              if (sw == 1) {
                float* d = orow + (ixa + offx);
                const float* sp = s + ixa;
                for (i64 i = 0; i < ixb - ixa; ++i) d[i] += sp[i];
              } else {
                for (i64 ix = ixa; ix < ixb; ++ix) orow[ix * sw + offx] += s[ix];
              }
            }
          }
      });
    }
}

}  // namespace

void bind_conv_transpose(py::module_& m) {
  py::class_<PackedConvT, std::shared_ptr<PackedConvT>>(m, "PackedConvTranspose",
                                                         "ConvTranspose weights packed once (A panels of W^T).");
  m.def("prepack_conv_transpose", &py_prepack, py::arg("w"), py::arg("group") = 1);
  m.def("conv_transpose2d", &py_conv_transpose, py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("out"),
        py::arg("strides"), py::arg("pads_begin"), py::arg("dilations"),
        "out (N, Cout, Ho, Wo) given: its size carries output_padding / output_shape; pads_begin crops the start.");
}

}  // namespace hetero
