// Winograd F(4x4, 3x3) convolution (Lavin & Gray): each 4 x 4 block of outputs ("tile") comes from a 6 x 6 input
// patch as A^T [(G g G^T) . (B^T d B)] A, so the products are 36 GEMMs of (Cout x Cin) x (Cin x tiles) with 36
// multiplications per tile and channel pair instead of 144: 4x fewer flops than im2col or the direct tile for
// stride-1 3x3 convolutions (YOLOv8n's blocks, PP-OCRv4 det's 3x3 layers). The transforms are ISA kernels
// (onnx_impl.hpp: wino_in / wino_out over SIMD lanes of tiles); the GEMMs are the packed micro-kernel's.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "conv.hpp"
#include "onnx_extra.hpp"

namespace hetero {
namespace {

inline i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// HETERO_CPU_WINOGRAD=0 turns the path off (to compare it with the others, or to rule it out).
bool winograd_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("HETERO_CPU_WINOGRAD");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// U[xi] = (G g G^T)[xi] for every (cout, cin), computed in double, packed as A panels (one Cout x Cin matrix per xi).
void transform_weights(const PackedConv& pc) {
  static const double G[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                 {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
  const Kernels& kr = *pc.kr;
  const i64 cout = pc.cout, cin = pc.cin_g;
  std::vector<float> u(static_cast<std::size_t>(36 * cout * cin));
  for (i64 o = 0; o < cout; ++o)
    for (i64 c = 0; c < cin; ++c) {
      const float* g = pc.raw.p + o * pc.raw_ld + c * 9;
      double t[6][3];  // G g
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 3; ++j) t[i][j] = G[i][0] * g[j] + G[i][1] * g[3 + j] + G[i][2] * g[6 + j];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j)
          u[static_cast<std::size_t>(((i * 6 + j) * cout + o) * cin + c)] =
              static_cast<float>(t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2]);
    }
  pc.wino_stride = ceil_div(cout, kr.mr) * kr.mr * cin;
  float* d = pc.wino.get(static_cast<std::size_t>(36 * pc.wino_stride));
  for (int xi = 0; xi < 36; ++xi)
    pack_a_panels(kr, MatView{u.data() + xi * cout * cin, cout, cin, cin, 1}, d + xi * pc.wino_stride);
}

// Tiles per block: the block's transformed inputs and products (36 x (Cin + Cout) x columns) sized to stay in L2.
i64 block_columns(const Kernels& kr, i64 cin, i64 cout, i64 tiles, int threads, i64 images) {
  const i64 nr = kr.nr;
  i64 cols = std::max<i64>(nr, (96 * 1024 / (36 * (cin + cout))) / nr * nr);
  cols = std::min<i64>(cols, 8 * nr);
  cols = std::min<i64>(cols, ceil_div(tiles, nr) * nr);
  while (threads > 1 && cols > nr && images * ceil_div(tiles, cols) < 2 * threads) cols -= nr;
  return cols;
}

}  // namespace

// Stride 1, no dilation, one group, 3x3; enough channels for the GEMMs to run near the micro-kernel's speed, and
// enough tiles that the 36 GEMMs' column panels are not mostly padding. Measured per shape against conv_direct
// and the im2col GEMM (docs/onnx-models.md): the rule below keeps the shapes where it won.
bool winograd_fits(const PackedConv& pc, const ConvGeom& g) {
  if (!winograd_enabled() || pc.depthwise || g.group != 1 || g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 ||
      g.dh != 1 || g.dw != 1)
    return false;
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  if (xk.wino_in == nullptr || kr.nr % xk.lanes != 0) return false;
  const i64 tiles = ceil_div(g.Ho, 4) * ceil_div(g.Wo, 4);
  // flops against the direct 3x3: 144 * tiles (useful, 16 outputs x 9 taps) over 36 * padded tiles
  const double gain = 4.0 * static_cast<double>(g.Ho * g.Wo) / 16.0 / static_cast<double>(ceil_div(tiles, kr.nr) * kr.nr);
  return g.C >= 8 && g.Cout >= 8 && gain >= 2.0;
}

void conv_winograd(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act) {
  std::call_once(pc.wino_once, [&] { transform_weights(pc); });
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const int L = xk.lanes, nr = kr.nr;
  const i64 cin = g.C, cout = g.Cout, HWo = g.Ho * g.Wo;
  const i64 th = ceil_div(g.Ho, 4), tw = ceil_div(g.Wo, 4), tiles = th * tw;
  // Zero-padded input: rows [-pt, -pt + 4 th + 2), columns [-pl, -pl + 4 tw + 2) of each channel.
  const i64 Hp = 4 * th + 2, Wp = 4 * tw + 2, plane = Hp * Wp, per_image = cin * plane;
  float* padded = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(g.N * per_image));
  const int Tp = threads_for(static_cast<double>(g.N * per_image), 6e4);
  parallel_for(g.N * cin, Tp, [&](i64 q) {
    const float* src = x + q * g.H * g.W;
    float* dst = padded + q * plane;
    std::fill(dst, dst + plane, 0.f);
    const i64 x0 = std::max<i64>(0, -g.pl), x1 = std::min<i64>(g.W, Wp - g.pl);  // input columns that land inside
    for (i64 y = 0; y < g.H; ++y) {
      const i64 py = y + g.pt;
      if (py < 0 || py >= Hp || x1 <= x0) continue;
      std::memcpy(dst + py * Wp + x0 + g.pl, src + y * g.W + x0, static_cast<std::size_t>(x1 - x0) * sizeof(float));
    }
  });
  const int T = threads_for(2.0 * 36 * cout * cin * tiles, 6e4 * 4);
  const i64 bc = block_columns(kr, cin, cout, tiles, T, g.N);
  const i64 nblk = ceil_div(tiles, bc);
  parallel_for(g.N * nblk, T, [&](i64 task) {
    const i64 n = task / nblk, t0 = (task % nblk) * bc, ncols = std::min<i64>(bc, tiles - t0);
    const i64 ncp = ceil_div(ncols, nr) * nr;  // padded to whole panels
    const i64 vstride = ncp * cin, mstride = ncp * cout;
    float* v = tl_buf(TL_PACK_B).get(static_cast<std::size_t>(36 * vstride));
    float* m = tl_buf(TL_MISC).get(static_cast<std::size_t>(36 * mstride + 16 * L + 2 * ncp));
    float* y = m + 36 * mstride;  // 16 x L
    // Per tile of the block: where its patch starts in a padded channel, where its outputs start. The padding lanes
    // repeat the block's first tile: their GEMM columns are computed and never written out.
    auto* in_off = reinterpret_cast<std::int32_t*>(y + 16 * L);
    auto* out_off = in_off + ncp;
    for (i64 t = 0; t < ncp; ++t) {
      const i64 tile = t0 + (t < ncols ? t : 0), ty = tile / tw, tx = tile % tw;
      in_off[t] = static_cast<std::int32_t>(ty * 4 * Wp + tx * 4);
      out_off[t] = static_cast<std::int32_t>(ty * 4 * g.Wo + tx * 4);
    }
    const float* img = padded + n * per_image;
    // Input transform into the packed-B layout of each position's GEMM: panel p (nr columns) holds rows c, each nr
    // floats; lanes of tiles [t, t + L) go to panel t / nr, column t % nr.
    for (i64 c = 0; c < cin; ++c)
      for (i64 t = 0; t < ncp; t += L)
        xk.wino_in(img + c * plane, in_off + t, Wp, v + (t / nr) * cin * nr + c * nr + t % nr, vstride);
    const Epilogue none;
    for (int xi = 0; xi < 36; ++xi)
      gemm_prepacked_b(kr, cout, ncp, cin, nullptr, pc.wino.p + xi * pc.wino_stride, v + xi * vstride,
                       m + xi * mstride, ncp, 1.f, 0.f, none, 1);
    // Output transform, bias, activation on L tiles at a time, then the 4 x 4 blocks written (clipped at the edges).
    float* o = out + n * cout * HWo;
    for (i64 co = 0; co < cout; ++co) {
      const float b = bias ? bias[co] : 0.f;
      float* plane_o = o + co * HWo;
      for (i64 t = 0; t < ncols; t += L) {
        xk.wino_out(m + co * ncp + t, mstride, b, y);
        if (act.act >= 0) kr.unary(act.act, y, y, 16 * L, act.act_alpha, act.act_beta);
        const int lanes = static_cast<int>(std::min<i64>(L, ncols - t));
        for (int l = 0; l < lanes; ++l) {
          const i64 at = out_off[t + l], oy = at / g.Wo, ox = at % g.Wo;
          float* dst = plane_o + at;
          const float* src = y + l;
          if (oy + 4 <= g.Ho && ox + 4 <= g.Wo) {
            for (int i = 0; i < 4; ++i)
              for (int j = 0; j < 4; ++j) dst[i * g.Wo + j] = src[(i * 4 + j) * L];
            continue;
          }
          const i64 rows = std::min<i64>(4, g.Ho - oy), cols = std::min<i64>(4, g.Wo - ox);
          for (i64 i = 0; i < rows; ++i)
            for (i64 j = 0; j < cols; ++j) dst[i * g.Wo + j] = src[(i * 4 + j) * L];
        }
      }
    }
  });
}

}  // namespace hetero
