// Winograd F(4, 3) for 1-D three-tap convolutions, any dilation d (a WaveNet-style stack: eeg_spindles' 128 -> 128
// convs with d = 16 .. 2048 on 7500 positions). Outputs s, s + d, s + 2d, s + 3d (a "tile") come from the six inputs
// s + k d (k < 6) as A^T [(G g) . (B^T x)], so the products are 6 GEMMs of (Cout x Cin) x (Cin x tiles) with 6
// multiplications per tile and channel pair instead of 12: about 2x fewer flops than the direct kernels. Tiles are
// numbered q d + r (q: a run of 4d outputs, r < d), so the tiles r = 0 .. d - 1 of one run start at consecutive
// positions (below d = 16 the input is split into phases first: kPhasedBelow): the transforms (ExtraKernels
// wino1d_in / wino1d_out, the ISA's vectors; a run's last part below) read and write runs of consecutive floats,
// and the GEMMs are the packed micro-kernel's (gemm_prepacked_b).
// Five-tap kernels (slovorez's Conv1D 256 -> 192 and 192 -> 192, k = 5, on 64 positions) take F(4, 5) the same way:
// 8 inputs s + k d (k < 8) a tile and 8 GEMMs, 8 multiplications per tile and channel pair instead of 20.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "conv.hpp"
#include "onnx_extra.hpp"

namespace hetero {
namespace {

constexpr i64 kTile = 4;   // outputs per tile (m)
constexpr i64 kMaxAlpha = 8;  // transformed points per tile (m + taps - 1): 6 for three taps, 8 for five
i64 alpha_of(i64 taps) { return kTile + taps - 1; }
// Floats of a block's transformed inputs and products (alpha x (Cin + Cout) x columns): 512 KB, half of Zen 4's L2
// (the alpha packed Cout x Cin weight matrices take most of the rest at 128 channels).
constexpr i64 kBlockFloats = 128 * 1024;

// HETERO_CPU_WINOGRAD1D=0 turns the path off (to compare it with the direct kernels).
bool winograd1d_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("HETERO_CPU_WINOGRAD1D");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// U[xi] = (G g)[xi] for every (cout, cin), computed in double, packed as A panels (one Cout x Cin matrix per xi) into
// pc.wino (a 1x3 or 1x5 kernel never takes the 3x3 Winograd path that fills it otherwise).
void transform_weights(const PackedConv& pc, i64 taps) {
  static const double G3[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                  {-1.0 / 6, 1.0 / 6, -1.0 / 6}, {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                  {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
  // F(4, 5): row i is p_i^k / prod_{l != i} (p_i - p_l) over the finite points 0, 1, -1, 2, -2, 1/2, -1/2 (the first
  // negated to match wino5_in_1d's B^T), then infinity's row.
  static const double G5[8][5] = {{1, 0, 0, 0, 0},
                                  {-2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9},
                                  {-2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9},
                                  {1.0 / 90, 1.0 / 45, 2.0 / 45, 4.0 / 45, 8.0 / 45},
                                  {1.0 / 90, -1.0 / 45, 2.0 / 45, -4.0 / 45, 8.0 / 45},
                                  {32.0 / 45, 16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45},
                                  {32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45},
                                  {0, 0, 0, 0, 1}};
  const Kernels& kr = *pc.kr;
  const i64 alpha = alpha_of(taps);
  const i64 cout = pc.cout, cin = pc.cin_g * pc.kh * pc.kw / taps;  // (channel, row) pairs of a full-height kernel
  std::vector<float> u(static_cast<std::size_t>(alpha * cout * cin));
  for (i64 o = 0; o < cout; ++o)
    for (i64 c = 0; c < cin; ++c) {
      const float* g = pc.raw.p + o * pc.raw_ld + c * taps;
      for (i64 xi = 0; xi < alpha; ++xi) {
        double sum = 0.0;
        for (i64 t = 0; t < taps; ++t) sum += (taps == 3 ? G3[xi][t] : G5[xi][t]) * g[t];
        u[static_cast<std::size_t>((xi * cout + o) * cin + c)] = static_cast<float>(sum);
      }
    }
  pc.wino_stride = ceil_div(cout, kr.mr) * kr.mr * cin;
  float* d = pc.wino.get(static_cast<std::size_t>(alpha * pc.wino_stride));
  for (i64 xi = 0; xi < alpha; ++xi)
    pack_a_panels(kr, MatView{u.data() + xi * cout * cin, cout, cin, cin, 1}, d + xi * pc.wino_stride);
}

// Tiles of one image: Q runs of 4d outputs, d tiles each (the last run may reach past Wo).
i64 runs_of_4d(const ConvGeom& g) { return ceil_div(g.Wo, kTile * g.dw); }
i64 image_tiles(const ConvGeom& g) { return runs_of_4d(g) * g.dw; }

// Below this dilation the tiles r = 0 .. d - 1 of a run are too few for the vectors: the input is first split into
// phases, z[r][e][q] = padded input (4q + e) d + r for each channel (q < Q + 1), and tiles are numbered r Q + q, so
// that tap k of consecutive tiles (r, q) is z[r][k % 4][q + k / 4]: runs of Q tiles; outputs are written 4d apart.
constexpr i64 kPhasedBelow = 16;

// One channel's phase split (above) of the input xc (W floats, pl zeros before it): d x 4 rows of qz floats.
void split_phases(const float* xc, i64 W, i64 pl, i64 d, i64 qz, float* z) {
  for (i64 q = 0; q < qz; ++q)
    for (i64 e = 0; e < kTile; ++e)
      for (i64 r = 0; r < d; ++r) {
        const i64 p = (q * kTile + e) * d + r - pl;
        z[(r * kTile + e) * qz + q] = p >= 0 && p < W ? xc[p] : 0.f;
      }
}

// Tap k of `len` consecutive tiles of one channel of the input xc, the first tile at output s (dilated runs: tile i
// at s + i): input s + i + k d - pl, zero outside [0, W); taps that reach into the padding are copied into tmp
// (alpha x len floats).
void dilated_taps(const float* xc, i64 W, i64 pl, i64 s, i64 d, i64 len, i64 alpha, float* tmp, const float** tap) {
  for (i64 k = 0; k < alpha; ++k) {
    const i64 p0 = s + k * d - pl;
    if (p0 >= 0 && p0 + len <= W) {
      tap[k] = xc + p0;
      continue;
    }
    float* t = tmp + k * len;
    for (i64 i = 0; i < len; ++i) t[i] = p0 + i >= 0 && p0 + i < W ? xc[p0 + i] : 0.f;
    tap[k] = t;
  }
}

// F(4, 5)'s B^T x (transform_in's, the rows of onnx_impl.hpp's wino5_in_1d).
void transform_in5(const ExtraKernels& xk, const float* const* tap, i64 len, float* __restrict v, i64 vstride) {
  for (i64 i = xk.wino1d5_in(tap, len, v, vstride); i < len; ++i) {
    float d[8];
    for (int k = 0; k < 8; ++k) d[k] = tap[k][i];
    float* t = v + i;
    t[0] = 5.25f * (d[4] - d[2]) + (d[0] - d[6]);
    t[7 * vstride] = 5.25f * (d[3] - d[5]) + (d[7] - d[1]);
    float a = (d[2] + d[6]) - 4.25f * d[4], b = (d[1] + d[5]) - 4.25f * d[3];
    t[vstride] = a + b;
    t[2 * vstride] = a - b;
    a = (0.25f * d[2] + d[6]) - 1.25f * d[4];
    b = 2.f * d[5] + (0.5f * d[1] - 2.5f * d[3]);
    t[3 * vstride] = a + b;
    t[4 * vstride] = a - b;
    a = (4.f * d[2] + d[6]) - 5.f * d[4];
    b = 0.5f * d[5] + (2.f * d[1] - 2.5f * d[3]);
    t[5 * vstride] = a + b;
    t[6 * vstride] = a - b;
  }
}

// B^T x of `len` tiles whose tap k lies at tap[k][i], written to v[xi * vstride + i].
void transform_in(const ExtraKernels& xk, const float* const* tap, i64 len, float* __restrict v, i64 vstride) {
  const i64 done = xk.wino1d_in(tap, len, v, vstride);
  const float *__restrict x0 = tap[0], *__restrict x1 = tap[1], *__restrict x2 = tap[2], *__restrict x3 = tap[3],
                         *__restrict x4 = tap[4], *__restrict x5 = tap[5];
  float *__restrict v0 = v, *__restrict v1 = v + vstride, *__restrict v2 = v + 2 * vstride,
                   *__restrict v3 = v + 3 * vstride, *__restrict v4 = v + 4 * vstride, *__restrict v5 = v + 5 * vstride;
  for (i64 i = done; i < len; ++i) {
    const float a = x1[i], b = x2[i], c = x3[i], e = x4[i];
    v0[i] = 4.f * x0[i] - 5.f * b + e;
    v1[i] = (e + c) - 4.f * (a + b);
    v2[i] = (e - c) + 4.f * (a - b);
    v3[i] = (e - b) + 2.f * (c - a);
    v4[i] = (e - b) - 2.f * (c - a);
    v5[i] = 4.f * a - 5.f * c + x5[i];
  }
}

// A^T m + bias of `len` consecutive tiles of one output channel into y (4 rows of len). Returns sum(y * 0): NaN where
// an output is not finite (an inf or NaN input, which the transforms would smear over outputs whose windows hold
// finite values only).
float transform_out(const ExtraKernels& xk, const float* __restrict m, i64 mstride, float bias, i64 len,
                    float* __restrict y) {
  const float *__restrict m0 = m, *__restrict m1 = m + mstride, *__restrict m2 = m + 2 * mstride,
                         *__restrict m3 = m + 3 * mstride, *__restrict m4 = m + 4 * mstride,
                         *__restrict m5 = m + 5 * mstride;
  float probe = 0.f;
  for (i64 i = xk.wino1d_out(m, mstride, bias, len, y, len, &probe); i < len; ++i) {
    const float p = m1[i] + m2[i], q = m1[i] - m2[i], r = m3[i] + m4[i], t = m3[i] - m4[i];
    const float y0 = m0[i] + p + r + bias, y1 = q + 2.f * t + bias, y2 = p + 4.f * r + bias,
                y3 = q + 8.f * t + m5[i] + bias;
    y[i] = y0, y[len + i] = y1, y[2 * len + i] = y2, y[3 * len + i] = y3;
    probe += (y0 + y1 + y2 + y3) * 0.f;
  }
  return probe;
}

// F(4, 5)'s A^T m + bias (transform_out's, onnx_impl.hpp's wino5_out_1d).
float transform_out5(const ExtraKernels& xk, const float* __restrict m, i64 mstride, float bias, i64 len,
                     float* __restrict y) {
  float probe = 0.f;
  for (i64 i = xk.wino1d5_out(m, mstride, bias, len, y, len, &probe); i < len; ++i) {
    float c[8];
    for (int k = 0; k < 8; ++k) c[k] = m[k * mstride + i];
    const float s12 = c[1] + c[2], d12 = c[1] - c[2], s34 = c[3] + c[4], d34 = c[3] - c[4], s56 = c[5] + c[6],
                d56 = c[5] - c[6];
    const float y0 = (c[0] + s12) + (s34 + s56) + bias, y1 = 0.5f * d56 + (2.f * d34 + d12) + bias,
                y2 = 0.25f * s56 + (4.f * s34 + s12) + bias, y3 = (0.125f * d56 + (8.f * d34 + d12)) + c[7] + bias;
    y[i] = y0, y[len + i] = y1, y[2 * len + i] = y2, y[3 * len + i] = y3;
    probe += (y0 + y1 + y2 + y3) * 0.f;
  }
  return probe;
}

}  // namespace

// One group, a 1 x 3 kernel (after along_w) at stride 1, dilation d >= 4 (measured on 4 and 8; undilated 1-D convs
// keep the kernels they were tuned on) or a full-height kernel over >= 256 (channel, row) pairs (any dilation; 8 x 5
// and 16 x 4 ran slower than conv_direct), enough channels for the GEMMs to run near the micro-kernel's speed, and at most
// 5/8 of the direct kernels' multiplications counting the tiles that reach past the last output (d = 4096 on 7500
// outputs: one run of 16384, none saved).
// A kh x 3 kernel as tall as its unpadded input onto one output row (eeg_seizure's 20 -> 200 96 x 3 conv over a
// spectrogram's 96 bins) is the same product as a 1 x 3 conv over C x kh channels of one row each (channel c's row y
// at (c kh + y) W, weight (c, y, t) at (c kh + y) 3 + t): it runs as one, at any dilation.
bool full_height(const ConvGeom& g) { return g.H > 1 && g.kh == g.H && g.Ho == 1 && g.pt == 0 && g.pb == 0; }

// Five taps (F(4, 5)): one row (kh = 1), any dilation, >= 64 channels in and out. 2.5x fewer multiplications leave
// room for the transforms even undilated: slovorez's 256 / 192 -> 192 convs on 64 positions and magika's 256 -> 512
// over 512 ran at 0.52-0.54x conv_cblk's time; atspm_funcnet's 32 -> 32 (d = 1 .. 64) at 1.1-2.5x (GEMMs of 32 rows).
bool winograd1d_fits(const PackedConv& pc, const ConvGeom& g) {
  if (!winograd1d_enabled() || pc.depthwise || g.group != 1 || g.sw != 1) return false;
  if (g.kw == 3) {
    if (!((g.kh == 1 && g.H == 1 && g.dw >= 4) || (full_height(g) && g.C * g.kh >= 256))) return false;
  } else if (g.kw != 5 || g.kh != 1 || g.H != 1 || g.C < 64 || g.Cout < 64) {
    return false;
  }
  const double direct = static_cast<double>(g.kw * g.Wo), wino = static_cast<double>(alpha_of(g.kw) * image_tiles(g));
  return g.C * g.kh >= 32 && g.Cout >= 32 && wino * 8 <= direct * 5;
}

bool conv_winograd1d(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                     const Epilogue& act) {
  const i64 alpha = alpha_of(g.kw);
  std::call_once(pc.wino_once, [&] { transform_weights(pc, g.kw); });
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 nr = kr.nr, cin = g.C * g.kh, cout = g.Cout, d = g.dw, Q = runs_of_4d(g), tiles = Q * d, all_tiles = g.N * tiles;
  const bool phased = d < kPhasedBelow;
  const i64 qz = Q + 1, zchan = d * kTile * qz;
  float* z = nullptr;
  if (phased) {
    z = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(g.N * cin * zchan));
    parallel_for(g.N * cin, threads_for(static_cast<double>(g.N * cin * zchan), 6e4),
                 [&](i64 q) { split_phases(x + q * g.W, g.W, g.pl, d, qz, z + q * zchan); });
  }
  // Weights larger than the block budget (eeg_seizure's 6 x 200 x 1920: 9 MB) are read once a block from L3 or
  // memory: the widest blocks then (32 columns a block ran at the weights' bandwidth). Five taps' weights (slovorez's
  // 8 x 192 x 256: 1.5 MB, magika's 8 x 512 x 256: 4 MB) come from L3 fast enough that one panel a block, its
  // transformed inputs and products in L2, won: 0.92x the 8-panel blocks' time on both at 1 thread, a tie at 2.
  const bool big_weights = alpha * cin * cout > kBlockFloats;
  const i64 bc = big_weights ? (alpha == 8 ? nr : 8 * nr)
                             : std::max<i64>(nr, std::min<i64>(8 * nr, kBlockFloats / (alpha * (cin + cout)) / nr * nr));
  const i64 nblk = ceil_div(all_tiles, bc);
  const int T = threads_for(2.0 * alpha * cout * cin * all_tiles, 6e4 * 4);  // conv.cpp's grain for products
  std::vector<float> probes(static_cast<std::size_t>(nblk), 0.f);
  // Runs of a block: consecutive tiles (r, q) .. of one image within one nr-column panel; the first at output
  // s = 4 q d + r, the next at s + 1 (dilated numbering) or s + 4d (phased).
  const auto for_runs = [&](i64 t0, i64 ncols, auto&& f) {
    for (i64 col = 0; col < ncols;) {
      const i64 tile = t0 + col, n = tile / tiles, rem = tile % tiles;
      const i64 q = phased ? rem % Q : rem / d, r = phased ? rem / Q : rem % d;
      const i64 len = std::min({phased ? Q - q : d - r, nr - col % nr, ncols - col});
      f(col, n, r, q, len);
      col += len;
    }
  };
  parallel_for(nblk, T, [&](i64 blk) {
    const i64 t0 = blk * bc, ncols = std::min<i64>(bc, all_tiles - t0), ncp = ceil_div(ncols, nr) * nr;
    const i64 vstride = ncp * cin, mstride = ncp * cout;
    float* v = tl_buf(TL_PACK_B).get(static_cast<std::size_t>(alpha * vstride));
    float* m = tl_buf(TL_MISC).get(static_cast<std::size_t>(alpha * mstride + (alpha + kTile) * nr));
    float* tmp = m + alpha * mstride;
    // B in the packed-B layout of each point's GEMM: column col of channel c at (col / nr) cin nr + c nr + col % nr;
    // the padding columns of the last panel zero (computed, never written out)
    for (i64 col = ncols; col < ncp; ++col)
      for (i64 xi = 0; xi < alpha; ++xi)
        for (i64 c = 0; c < cin; ++c) v[xi * vstride + (col / nr) * cin * nr + c * nr + col % nr] = 0.f;
    for_runs(t0, ncols, [&](i64 col, i64 n, i64 r, i64 q, i64 len) {
      float* vc = v + (col / nr) * cin * nr + col % nr;
      const float* tap[kMaxAlpha];
      for (i64 c = 0; c < cin; ++c) {
        if (phased) {
          const float* zr = z + (n * cin + c) * zchan + r * kTile * qz + q;
          for (i64 k = 0; k < alpha; ++k) tap[k] = zr + (k % kTile) * qz + k / kTile;
        } else {
          dilated_taps(x + (n * cin + c) * g.W, g.W, g.pl, q * kTile * d + r, d, len, alpha, tmp, tap);
        }
        if (alpha == 8)
          transform_in5(xk, tap, len, vc + c * nr, vstride);
        else
          transform_in(xk, tap, len, vc + c * nr, vstride);
      }
    });
    const Epilogue none;
    for (i64 xi = 0; xi < alpha; ++xi)
      gemm_prepacked_b(kr, cout, ncp, cin, nullptr, pc.wino.p + xi * pc.wino_stride, v + xi * vstride,
                       m + xi * mstride, ncp, 1.f, 0.f, none, 1);
    float probe = 0.f;
    for_runs(t0, ncols, [&](i64 col, i64 n, i64 r, i64 q, i64 len) {
      float* y = tmp;  // 4 rows of len
      const i64 s = q * kTile * d + r;
      for (i64 co = 0; co < cout; ++co) {
        const float b = bias ? bias[co] : 0.f;
        probe += alpha == 8 ? transform_out5(xk, m + co * ncp + col, mstride, b, len, y)
                            : transform_out(xk, m + co * ncp + col, mstride, b, len, y);
        float* o = out + (n * cout + co) * g.Wo;
        for (i64 i = 0; i < kTile; ++i) {
          const i64 p0 = s + i * d;
          if (p0 >= g.Wo) break;
          const i64 cnt = std::min<i64>(len, phased ? ceil_div(g.Wo - p0, kTile * d) : g.Wo - p0);
          const float* yi = y + i * len;
          if (act.act >= 0) kr.unary(act.act, yi, y + i * len, cnt, act.act_alpha, act.act_beta);
          if (!phased) {
            std::memcpy(o + p0, yi, static_cast<std::size_t>(cnt) * sizeof(float));
            continue;
          }
          for (i64 j = 0; j < cnt; ++j) o[p0 + j * kTile * d] = yi[j];
        }
      }
    });
    probes[static_cast<std::size_t>(blk)] = probe;
  });
  for (float p : probes)
    if (p != 0.f) return false;  // NaN compares unequal
  return true;
}

}  // namespace hetero
