// Convolution: im2col written straight into the GEMM's packed-B panel layout (no intermediate im2col matrix),
// times weights pre-packed as A panels; 1x1/stride-1 convs pack the input plane directly; depthwise convs use a
// direct row-accumulate kernel. Bias and activation run in the GEMM epilogue while the block is in cache.
#include "conv.hpp"

#include <algorithm>
#include <cstring>
#include <limits>

namespace hetero {
namespace {

inline i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }
// floor division for possibly negative a (b > 0)
inline i64 floor_div(i64 a, i64 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Packed-B panels of the im2col matrix of one image/group: rows k = (c, ky, kx), columns j = (oy, ox).
void im2col_pack(const ConvGeom& g, const float* x, i64 cin_g, int nr, float* dst, int nthreads) {
  const i64 ncols = g.Ho * g.Wo;
  const i64 K = cin_g * g.kh * g.kw;
  const i64 np = ceil_div(ncols, nr);
  const int T = static_cast<int>(std::min<i64>(np, nthreads));
  parallel_for(T, T, [&](i64 t) {
    i64 oy0[64], ox0[64];  // input origin of each column of the panel (nr <= 64)
    for (i64 p = t * np / T; p < (t + 1) * np / T; ++p) {
      float* d = dst + p * K * nr;
      const i64 j0 = p * nr, cols = std::min<i64>(nr, ncols - j0);
      for (i64 jj = 0; jj < cols; ++jj) {
        const i64 j = j0 + jj;
        oy0[jj] = (j / g.Wo) * g.sh - g.pt;
        ox0[jj] = (j % g.Wo) * g.sw - g.pl;
      }
      i64 k = 0;
      for (i64 c = 0; c < cin_g; ++c) {
        const float* plane = x + c * g.H * g.W;
        for (i64 ky = 0; ky < g.kh; ++ky)
          for (i64 kx = 0; kx < g.kw; ++kx, ++k) {
            float* row = d + k * nr;
            const i64 dy = ky * g.dh, dx = kx * g.dw;
            for (i64 jj = 0; jj < cols; ++jj) {
              const i64 iy = oy0[jj] + dy, ix = ox0[jj] + dx;
              row[jj] = (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W) ? plane[iy * g.W + ix] : 0.f;
            }
            for (i64 jj = cols; jj < nr; ++jj) row[jj] = 0.f;
          }
      }
    }
  });
}

void depthwise(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
               const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const float* w = pc.buf.p;
  const i64 planes = g.N * g.C, HWo = g.Ho * g.Wo;
  const int T = threads_for(static_cast<double>(planes) * HWo * g.kh * g.kw * 2, 2e5);
  parallel_for(planes, T, [&](i64 q) {
    const i64 c = q % g.C;
    const float* in = x + q * g.H * g.W;
    float* o = out + q * HWo;
    std::fill(o, o + HWo, bias ? bias[c] : 0.f);
    for (i64 ky = 0; ky < g.kh; ++ky)
      for (i64 kx = 0; kx < g.kw; ++kx) {
        const float wv = w[(c * g.kh + ky) * g.kw + kx];
        const i64 offx = kx * g.dw - g.pl;
        // Output columns whose input column ox*sw + offx lies inside [0, W).
        const i64 ox0 = std::max<i64>(0, ceil_div(std::max<i64>(0, -offx), g.sw));
        const i64 ox1 = std::min<i64>(g.Wo, floor_div(g.W - 1 - offx, g.sw) + 1);
        if (ox1 <= ox0) continue;
        for (i64 oy = 0; oy < g.Ho; ++oy) {
          const i64 iy = oy * g.sh - g.pt + ky * g.dh;
          if (iy < 0 || iy >= g.H) continue;
          const float* irow = in + iy * g.W;
          float* orow = o + oy * g.Wo;
          if (g.sw == 1) {
            kr.dw_row_accum(irow + ox0 + offx, orow + ox0, ox1 - ox0, wv);
          } else {
            for (i64 ox = ox0; ox < ox1; ++ox) orow[ox] += wv * irow[ox * g.sw + offx];
          }
        }
      }
    if (act.act >= 0) kr.unary(act.act, o, o, HWo, act.act_alpha, act.act_beta);
  });
}

}  // namespace

std::unique_ptr<PackedConv> prepack_conv(const Kernels& kr, const float* w, i64 cout, i64 cin_g, i64 kh, i64 kw,
                                         i64 group) {
  auto pc = std::make_unique<PackedConv>();
  pc->kr = &kr;
  pc->cout = cout;
  pc->cin_g = cin_g;
  pc->kh = kh;
  pc->kw = kw;
  pc->group = group;
  pc->depthwise = group > 1 && cin_g == 1 && cout == group;
  if (pc->depthwise) {
    float* d = pc->buf.get(static_cast<std::size_t>(cout * kh * kw));
    std::memcpy(d, w, static_cast<std::size_t>(cout * kh * kw) * sizeof(float));
    return pc;
  }
  const i64 cout_g = cout / group, K = cin_g * kh * kw;
  pc->group_stride = ceil_div(cout_g, kr.mr) * kr.mr * K;
  float* d = pc->buf.get(static_cast<std::size_t>(std::max<i64>(1, pc->group_stride * group)));
  for (i64 gi = 0; gi < group; ++gi) {
    MatView a{w + gi * cout_g * K, cout_g, K, K, 1};
    pack_a_panels(kr, a, d + gi * pc->group_stride);
  }
  return pc;
}

void conv2d_packed(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act) {
  if (g.N == 0 || g.Cout == 0 || g.Ho == 0 || g.Wo == 0) return;
  if (pc.depthwise) {
    depthwise(pc, g, x, bias, out, act);
    return;
  }
  const Kernels& kr = *pc.kr;
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g;
  const i64 K = cin_g * g.kh * g.kw, HWo = g.Ho * g.Wo;
  const int T = num_threads();
  const bool pointwise = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 &&
                         g.pb == 0 && g.pr == 0 && g.Ho == g.H && g.Wo == g.W;
  float* bp = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(std::max<i64>(1, ceil_div(HWo, kr.nr) * kr.nr * K)));
  for (i64 n = 0; n < g.N; ++n)
    for (i64 gi = 0; gi < g.group; ++gi) {
      const float* xin = x + (n * g.C + gi * cin_g) * g.H * g.W;
      if (pointwise) {
        pack_b_panels(kr, MatView{xin, K, HWo, HWo, 1}, bp, threads_for(static_cast<double>(K * HWo), 65536));
      } else {
        im2col_pack(g, xin, cin_g, kr.nr, bp, threads_for(static_cast<double>(K * HWo), 65536));
      }
      Epilogue ep = act;
      ep.bias = bias ? bias + gi * cout_g : nullptr;
      ep.bias_rs = 1;
      ep.bias_cs = 0;
      gemm_prepacked_b(kr, cout_g, HWo, K, nullptr, pc.buf.p + gi * pc.group_stride, bp,
                       out + (n * g.Cout + gi * cout_g) * HWo, HWo, 1.f, 0.f, ep, T);
    }
}

void max_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 dh, i64 dw) {
  const int T = threads_for(static_cast<double>(NC) * Ho * Wo * kh * kw, 1e5);
  parallel_for(NC, T, [&](i64 q) {
    const float* in = x + q * H * W;
    float* o = out + q * Ho * Wo;
    for (i64 oy = 0; oy < Ho; ++oy)
      for (i64 ox = 0; ox < Wo; ++ox) {
        float m = -std::numeric_limits<float>::infinity();
        bool nan = false;
        for (i64 ky = 0; ky < kh; ++ky) {
          const i64 iy = oy * sh - pt + ky * dh;
          if (iy < 0 || iy >= H) continue;
          for (i64 kx = 0; kx < kw; ++kx) {
            const i64 ix = ox * sw - pl + kx * dw;
            if (ix < 0 || ix >= W) continue;
            const float v = in[iy * W + ix];
            nan = nan || v != v;
            m = v > m ? v : m;
          }
        }
        o[oy * Wo + ox] = nan ? std::numeric_limits<float>::quiet_NaN() : m;
      }
  });
}

void avg_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 pb, i64 pr, bool count_include_pad) {
  const int T = threads_for(static_cast<double>(NC) * Ho * Wo * kh * kw, 1e5);
  parallel_for(NC, T, [&](i64 q) {
    const float* in = x + q * H * W;
    float* o = out + q * Ho * Wo;
    for (i64 oy = 0; oy < Ho; ++oy)
      for (i64 ox = 0; ox < Wo; ++ox) {
        const i64 y0 = oy * sh - pt, x0 = ox * sw - pl;
        float s = 0.f;
        i64 cnt = 0;
        for (i64 iy = std::max<i64>(y0, 0); iy < std::min<i64>(y0 + kh, H); ++iy)
          for (i64 ix = std::max<i64>(x0, 0); ix < std::min<i64>(x0 + kw, W); ++ix) {
            s += in[iy * W + ix];
            ++cnt;
          }
        if (count_include_pad) {
          // Window positions inside the padded input (not beyond it, e.g. with ceil_mode).
          const i64 ny = std::min<i64>(y0 + kh, H + pb) - std::max<i64>(y0, -pt);
          const i64 nx = std::min<i64>(x0 + kw, W + pr) - std::max<i64>(x0, -pl);
          cnt = std::max<i64>(ny, 0) * std::max<i64>(nx, 0);
        }
        o[oy * Wo + ox] = cnt > 0 ? s / static_cast<float>(cnt) : 0.f;
      }
  });
}

void global_avg_pool(const float* x, float* out, i64 NC, i64 HW) {
  const int T = threads_for(static_cast<double>(NC) * HW, 65536);
  parallel_for(NC, T, [&](i64 q) {
    const float* in = x + q * HW;
    // Four partial sums: vectorisable and a little more accurate than one running sum.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    i64 i = 0;
    for (; i + 4 <= HW; i += 4)
      for (int j = 0; j < 4; ++j) s[j] += in[i + j];
    for (; i < HW; ++i) s[0] += in[i];
    out[q] = HW > 0 ? ((s[0] + s[1]) + (s[2] + s[3])) / static_cast<float>(HW) : 0.f;
  });
}

}  // namespace hetero
