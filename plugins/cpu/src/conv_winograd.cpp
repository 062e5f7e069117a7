// Winograd F(4x4, 3x3) convolution (Lavin & Gray): each 4 x 4 block of outputs ("tile") comes from a 6 x 6 input
// patch as A^T [(G g G^T) . (B^T d B)] A, so the products are 36 GEMMs of (Cout x Cin) x (Cin x tiles) with 36
// multiplications per tile and channel pair instead of 144: 4x fewer flops than im2col or the direct tile for
// stride-1 3x3 convolutions (YOLOv8n's blocks, PP-OCRv4 det's 3x3 layers). The transforms are ISA kernels
// (onnx_impl.hpp: wino_in / wino_out over SIMD lanes of tiles); the GEMMs are the packed micro-kernel's.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "conv.hpp"
#include "onnx_extra.hpp"

namespace hetero {
namespace {

// src[4 i + r] -> d[r][i] for i < groups: one row of the input into the four column phases. The restrict pointers
// let GCC vectorise it (shuffles); the strided scalar copy it replaces was 2-3 % of YOLOv8n.
void deinterleave4(const float* __restrict src, i64 groups, float* __restrict d0, float* __restrict d1,
                   float* __restrict d2, float* __restrict d3) {
  for (i64 i = 0; i < groups; ++i) {
    d0[i] = src[4 * i];
    d1[i] = src[4 * i + 1];
    d2[i] = src[4 * i + 2];
    d3[i] = src[4 * i + 3];
  }
}

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

// Columns the 36 products compute for n tiles: whole nr panels, except that a last panel of at most one vector
// runs the GEMM's one-vector tile (gemm_prepacked_b's ragged panel) where the ISA has one, so that 16 tiles (a
// 14 x 14 map) cost 16 columns, not 32. Without that tile the GEMM computes (and reads) the whole panel.
i64 computed_columns(const Kernels& kr, const ExtraKernels& xk, i64 n) {
  const i64 whole = ceil_div(n, kr.nr) * kr.nr, rem = n % kr.nr;
  if (rem == 0 || rem > xk.lanes || xk.conv_tile == nullptr) return whole;
  const i64 zero = 0;
  float dummy = 0.f;  // K = 0, no rows: a probe that computes nothing
  if (!xk.conv_tile(kr.mr, xk.lanes, 0, &dummy, &dummy, &zero, &dummy, xk.lanes, 0, 0)) return whole;
  return n - rem + xk.lanes;
}

}  // namespace

// Stride 1, no dilation, one group, 3x3; enough channels for the GEMMs to run near the micro-kernel's speed, and
// enough tiles that the 36 GEMMs' column panels are not mostly padding. Measured per shape against conv_direct
// and the im2col GEMM (docs/onnx-models.md): the rule below keeps the shapes where it won.
bool winograd_fits(const PackedConv& pc, const ConvGeom& g, bool whole_panels) {
  if (!winograd_enabled() || pc.depthwise || g.group != 1 || g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 ||
      g.dh != 1 || g.dw != 1)
    return false;
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  if (xk.wino_in == nullptr || kr.nr % xk.lanes != 0) return false;
  // The blocks of tiles run across the images of a batch (conv_winograd), so the column panels pad all of them once.
  const i64 tiles = g.N * ceil_div(g.Ho, 4) * ceil_div(g.Wo, 4);
  // flops against the direct 3x3: 144 * tiles (useful, 16 outputs x 9 taps) over 36 * padded tiles
  const double gain =
      4.0 * static_cast<double>(g.N * g.Ho * g.Wo) / 16.0 /
      static_cast<double>(whole_panels ? ceil_div(tiles, kr.nr) * kr.nr : computed_columns(kr, xk, tiles));
  // Few channels (C x Cout < 512: YOLOv8n's 16 -> 16 on 80 x 80) leave the 36 GEMMs too small to pay for the
  // transforms: the direct tile won there (1 thread: 8 -> 16 on 80 x 80 164 -> 136 us, 16 -> 16 237 -> 226 alone,
  // 290 -> 235 inside the model; 16 -> 32 ties, 32 -> 16 and 16 -> 64 stay faster on Winograd).
  // the tiles' int32 offsets into the padded batch and the output
  const double span = static_cast<double>(g.N) * std::max<double>(static_cast<double>(g.C) * (g.Ho + 6) * (g.Wo + 7),
                                                                  static_cast<double>(g.Cout) * g.Ho * g.Wo);
  return g.C >= 8 && g.Cout >= 8 && g.C * g.Cout >= 512 && gain >= 2.0 && span < 2e9;
}

bool conv_winograd(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act) {
  std::call_once(pc.wino_once, [&] { transform_weights(pc); });
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const int L = xk.lanes, nr = kr.nr;
  const i64 cin = g.C, cout = g.Cout, HWo = g.Ho * g.Wo;
  // Tiles are numbered across the batch (image n's tile t is n * tiles + t), so that a block of tiles may span
  // images: MTCNN O-Net's 32 -> 64 on 4 x 23 x 23 is 4 x 36 tiles, 160 columns where each image alone pads to 64.
  const i64 th = ceil_div(g.Ho, 4), tw = ceil_div(g.Wo, 4), tiles = th * tw, all_tiles = g.N * tiles;
  // Zero-padded input, rows [-pt, -pt + 4 th + 2) and columns [-pl, -pl + 4 tw + 2) of each channel, split into four
  // column phases (padded column px in plane px % 4 at px / 4): the patches of consecutive tiles of one tile row then
  // start at consecutive floats, so 16 tiles' values at one patch position are one vector load, not a gather.
  const i64 Hp = 4 * th + 2, Wq = tw + 1, qplane = Hp * Wq, plane = 4 * qplane, per_image = cin * plane;
  float* padded = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(g.N * per_image));
  const int Tp = threads_for(static_cast<double>(g.N * per_image), 6e4);
  std::atomic<bool> nonfinite{false};
  parallel_for(g.N * cin, Tp, [&](i64 q) {
    const float* src = x + q * g.H * g.W;
    float* dst = padded + q * plane;
    // sum |x| of the whole plane, one call (a call per row of 20-80 floats was 3 % of YOLOv8n): inf or NaN once an
    // inf or NaN is in it, or, harmlessly, when finite values overflow; or in columns / rows the tiles never read,
    // which only sends the conv to the direct kernel too
    if (!std::isfinite(xk.reduce_row(R_L1, src, g.H * g.W))) nonfinite.store(true, std::memory_order_relaxed);
    std::fill(dst, dst + plane, 0.f);
    const i64 x0 = std::max<i64>(0, -g.pl), x1 = std::min<i64>(g.W, 4 * Wq - g.pl);  // columns that land inside
    for (i64 y = 0; y < g.H; ++y) {
      const i64 py = y + g.pt;
      if (py < 0 || py >= Hp) continue;
      float* row = dst + py * Wq;
      const float* s_row = src + y * g.W;
      // input column xx -> padded column px = xx + pl -> phase px % 4, column px / 4: whole groups of four from
      // the first px % 4 == 0 on, the columns before and after one at a time
      const auto put = [&](i64 xx) { row[((xx + g.pl) & 3) * qplane + ((xx + g.pl) >> 2)] = s_row[xx]; };
      i64 xx = x0;
      for (; xx < x1 && ((xx + g.pl) & 3) != 0; ++xx) put(xx);
      const i64 groups = (x1 - xx) / 4, c = (xx + g.pl) >> 2;
      deinterleave4(s_row + xx, groups, row + c, row + qplane + c, row + 2 * qplane + c, row + 3 * qplane + c);
      for (xx += 4 * groups; xx < x1; ++xx) put(xx);
    }
  });
  // The transforms mix every value of a 6 x 6 patch into all 16 outputs of its tile: an inf would turn outputs whose
  // own windows hold only finite values into NaN. Such inputs take the direct kernels instead (the caller's).
  if (nonfinite.load()) return false;
  i64 eoff[36];  // patch position (i, j) of a tile relative to its start
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) eoff[i * 6 + j] = (j & 3) * qplane + i * Wq + (j >> 2);
  const int T = threads_for(2.0 * 36 * cout * cin * tiles, 6e4 * 4);
  const i64 bc = block_columns(kr, cin, cout, all_tiles, T, 1);
  const i64 nblk = ceil_div(all_tiles, bc);
  // One block of tiles [t0, t0 + ncols) of the batch: its three phases, each over a range of its work items.
  struct Block {
    i64 t0, ncols, ncp, ncc, vstride, mstride;  // ncp: columns stored (whole panels); ncc: computed
    float *v, *m;
    std::int32_t *in_off, *out_off, *extent;
  };
  auto setup = [&](Block& b, i64 t0, float* v, float* m, std::int32_t* offs) {
    b.t0 = t0, b.ncols = std::min<i64>(bc, all_tiles - t0), b.ncp = ceil_div(b.ncols, nr) * nr;
    b.ncc = computed_columns(kr, xk, b.ncols);
    b.vstride = b.ncp * cin, b.mstride = b.ncp * cout, b.v = v, b.m = m, b.in_off = offs, b.out_off = offs + b.ncp;
    b.extent = offs + 2 * b.ncp;
    // Per tile of the block: where its patch starts in channel 0 of the padded batch, where its outputs start in
    // output channel 0 (image n's plane: n * cout * HWo). The padding lanes repeat the block's first tile: their
    // GEMM columns are computed and never written out. extent: the tile's rows x 8 + columns inside the output (36 for
    // a whole tile), so that the output transform divides nothing per tile and channel.
    for (i64 t = 0; t < b.ncp; ++t) {
      const i64 tile = t0 + (t < b.ncols ? t : 0), n = tile / tiles, ty = tile % tiles / tw, tx = tile % tw;
      b.in_off[t] = static_cast<std::int32_t>(n * per_image + ty * 4 * Wq + tx);
      b.out_off[t] = static_cast<std::int32_t>(n * cout * HWo + ty * 4 * g.Wo + tx * 4);
      b.extent[t] = static_cast<std::int32_t>(std::min<i64>(4, g.Ho - 4 * ty) * 8 + std::min<i64>(4, g.Wo - 4 * tx));
    }
  };
  // Input transform of channels [c0, c1) into the packed-B layout of each position's GEMM: panel p (nr columns)
  // holds rows c, each nr floats; lanes of tiles [t, t + L) go to panel t / nr, column t % nr.
  auto transform_in = [&](const Block& b, i64 c0, i64 c1) {
    for (i64 t = 0; t < b.ncc; t += L) {
      const bool in_row = b.in_off[t + L - 1] - b.in_off[t] == L - 1;  // one tile row: plain loads
      for (i64 c = c0; c < c1; ++c)
        xk.wino_in(padded + c * plane, b.in_off + t, eoff, in_row, b.v + (t / nr) * cin * nr + c * nr + t % nr,
                   b.vstride);
    }
  };
  auto products = [&](const Block& b, i64 x0, i64 x1) {
    const Epilogue none;
    for (i64 xi = x0; xi < x1; ++xi)
      gemm_prepacked_b(kr, cout, b.ncc, cin, nullptr, pc.wino.p + xi * pc.wino_stride, b.v + xi * b.vstride,
                       b.m + xi * b.mstride, b.ncp, 1.f, 0.f, none, 1);
  };
  // Output transform, bias, activation on L tiles at a time, then the 4 x 4 blocks written (clipped at the edges).
  // The tiles' stores by rows of four after an in-register transpose, the activation in registers (wino_store), where
  // the ISA has one (AVX2, AVX-512); HETERO_CPU_WINO_STORE=0 keeps the scalar stores (to compare).
  static const bool store_off = [] {
    const char* v = std::getenv("HETERO_CPU_WINO_STORE");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  auto transform_out = [&](const Block& b, i64 co0, i64 co1, float* y) {
    for (i64 co = co0; co < co1; ++co) {
      const float bv = bias ? bias[co] : 0.f;
      float* plane_o = out + co * HWo;
      for (i64 t = 0; t < b.ncols; t += L) {
        const int lanes = static_cast<int>(std::min<i64>(L, b.ncols - t));
        if (!store_off && xk.wino_store(b.m + co * b.ncp + t, b.mstride, bv, act.act, act.act_alpha,
                                               act.act_beta, b.out_off + t, b.extent + t, lanes, plane_o, g.Wo, y))
          continue;
        xk.wino_out(b.m + co * b.ncp + t, b.mstride, bv, y);
        // SiLU by the tiles' own function (vsilu_act, as wino_store applies it): the same bits either way
        if (act.act >= 0 && !(act.act == U_SILU && xk.bias_act_row(y, 16 * L, 0.f, act.act, 0.f, 0.f)))
          kr.unary(act.act, y, y, 16 * L, act.act_alpha, act.act_beta);
        for (int l = 0; l < lanes; ++l) {
          const i64 extent = b.extent[t + l];
          float* dst = plane_o + b.out_off[t + l];
          const float* src = y + l;
          if (extent == 36) {
            for (int i = 0; i < 4; ++i)
              for (int j = 0; j < 4; ++j) dst[i * g.Wo + j] = src[(i * 4 + j) * L];
            continue;
          }
          const i64 rows = extent >> 3, cols = extent & 7;
          for (i64 i = 0; i < rows; ++i)
            for (i64 j = 0; j < cols; ++j) dst[i * g.Wo + j] = src[(i * 4 + j) * L];
        }
      }
    }
  };
  auto scratch = [&](i64 ncp, int slot_v, int slot_m, float*& v, float*& m, float*& y, std::int32_t*& offs) {
    v = tl_buf(slot_v).get(static_cast<std::size_t>(36 * ncp * cin));
    m = tl_buf(slot_m).get(static_cast<std::size_t>(36 * ncp * cout + 16 * L + 3 * ncp));
    y = m + 36 * ncp * cout;
    offs = reinterpret_cast<std::int32_t*>(y + 16 * L);
  };
  if (T > 1 && nblk < 2 * T) {
    // Too few blocks to share out (a 20 x 20 map is 25 tiles, one block): each block's three phases run on every
    // thread in turn, split over channels, positions and output channels.
    for (i64 t0 = 0; t0 < all_tiles; t0 += bc) {
      float *v, *m, *y;
      std::int32_t* offs;
      scratch(ceil_div(std::min<i64>(bc, all_tiles - t0), nr) * nr, TL_PACK_B, TL_MISC, v, m, y, offs);
      Block b;
      setup(b, t0, v, m, offs);
      parallel_for(T, T, [&](i64 t) { transform_in(b, cin * t / T, cin * (t + 1) / T); });
      parallel_for(T, T, [&](i64 t) { products(b, 36 * t / T, 36 * (t + 1) / T); });
      parallel_for(T, T, [&](i64 t) {
        float* yt = tl_buf(TL_TMP).get(static_cast<std::size_t>(16 * L));
        transform_out(b, cout * t / T, cout * (t + 1) / T, yt);
      });
    }
    return true;
  }
  parallel_for(nblk, T, [&](i64 task) {
    float *v, *m, *y;
    std::int32_t* offs;
    const i64 t0 = task * bc;
    scratch(ceil_div(std::min<i64>(bc, all_tiles - t0), nr) * nr, TL_PACK_B, TL_MISC, v, m, y, offs);
    Block b;
    setup(b, t0, v, m, offs);
    transform_in(b, 0, cin);
    products(b, 0, 36);
    transform_out(b, 0, cout, y);
  });
  return true;
}

}  // namespace hetero
