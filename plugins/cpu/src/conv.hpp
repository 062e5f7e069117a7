// Convolution and pooling entry points (conv.cpp). All tensors NCHW float32, contiguous.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "common.hpp"

namespace hetero {

// A kernel rule's override from the environment (read once by its caller into a static): -1 unset (the rule decides),
// 1 set to anything but "0", 0 for "0".
inline int env_override(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? -1 : (std::strcmp(v, "0") != 0 ? 1 : 0);
}

struct ConvGeom {
  i64 N, C, H, W;       // input
  i64 Cout, kh, kw;     // weights (Cout, C/group, kh, kw)
  i64 Ho, Wo;           // output
  i64 sh, sw, pt, pl, pb, pr, dh, dw;
  i64 group;
};

// Weights packed once: per group, the (Cout/g) x (C/g*kh*kw) matrix in the micro-kernel's A-panel layout, or
// (depthwise) the raw weights.
struct PackedConv {
  const Kernels* kr = nullptr;
  i64 cout = 0, cin_g = 0, kh = 0, kw = 0, group = 1;
  bool depthwise = false;
  i64 group_stride = 0;  // floats between the packed groups
  AlignedBuf buf;
  // non-depthwise: the (Cout, C/group*kh*kw) weights as given, each row zero-padded to raw_ld (a multiple of 16) for
  // the small-M tail path and the dot-product path of small outputs
  AlignedBuf raw;
  i64 raw_ld = 0;
  // 3x3, one group: the Winograd F(4x4, 3x3) weights G g G^T, one packed A matrix (Cout x Cin) per each of the 36
  // positions, wino_stride floats apart; made from `raw` on the first call that takes that path (conv_winograd.cpp).
  // 1x3 (or 3x1), one group: the F(4, 3) weights G g, 6 such matrices; 1x5 (or 5x1): F(4, 5)'s, 8 (conv_winograd1d.cpp).
  mutable std::once_flag wino_once;
  mutable AlignedBuf wino;
  mutable i64 wino_stride = 0;
  // per group W^T (K x Cout/group) as packed B panels, for conv_transposed (small maps); made from `raw` on the
  // first call that takes that path, wt_stride floats a group
  mutable std::once_flag wt_once;
  mutable AlignedBuf wt;
  mutable i64 wt_stride = 0;
  // conv_cblk's weights (ExtraKernels::conv_cblk): per block of cblk_width output channels, K x cblk_width (zero past
  // the last channel), made from `raw` on the first call that takes that path.
  mutable std::once_flag cblk_once;
  mutable AlignedBuf cblk;
  // precision "normal" on AMX-BF16 (gemm_bf16x3.hpp): per group the transposed weights W^T (K x Cout/group, K in
  // (ky, kx, c) order: conv_bf16x3's channels-last im2col rows) as packed bf16x3 B, hi then lo, bf_stride uint16
  // values a group; empty (bf16x3 false) otherwise
  AlignedBuf bf;
  i64 bf_stride = 0;
  float bf_max = 0.f;
  bool bf16x3 = false;
  // precision "normal" asked and the CPU has AMX-BF16 (whatever the shape)
  bool normal = false;
  // conv_bf16x3_pw's weights (1x1 convs, the weights as bf16x3's A side): per group the Cout/group rows as hi / lo
  // bf16 rows of bf16x3_kp(K), zero rows up to a multiple of 32, hi then lo, bfa_stride uint16 values a group, each
  // 16-row tile's k blocks as 1 KB tiles (bf16x3_block32_ta; rows with HETERO_CPU_BF16X3_TILED_A=0); made from `raw`
  // on the first call that takes that path (bfa_ok false: a weight the split does not take)
  mutable std::once_flag bfa_once;
  mutable AlignedBuf bfa;
  mutable i64 bfa_stride = 0;
  mutable float bfa_max = 0.f;
  mutable bool bfa_ok = false;
};

// n units of equal cost (column panels, output rows) split into nb blocks whose sizes differ by at most one, the
// larger first, for tasks that T threads claim in turn: where images x nb is not a multiple of T, the tasks of the
// last round leave threads idle (five blocks of three panels on two threads ran as 3 + 2 blocks: 60 % of the work
// on one thread, where 8 + 7 panels is 53 %).
struct Blocks {
  i64 n = 0, nb = 1;
  i64 begin(i64 b) const { return b * (n / nb) + std::min<i64>(b, n % nb); }
  i64 size(i64 b) const { return n / nb + (b < n % nb ? 1 : 0); }
};
// At least ceil(n / max_per_block) blocks; at 2+ threads at least min_per_thread tasks a thread (over `images`
// images), and the task count a multiple of T where n allows.
Blocks balanced_blocks(i64 n, i64 max_per_block, i64 images, int T, i64 min_per_thread);

// bf16x3: also pack the bf16x3 form (precision "normal"), where the CPU has AMX-BF16 and the shape could take it.
std::unique_ptr<PackedConv> prepack_conv(const Kernels& kr, const float* w, i64 cout, i64 cin_g, i64 kh, i64 kw,
                                         i64 group, bool bf16x3 = false);

// residual (optional, laid out as out): out = act(conv + bias + residual), the sum before the activation (a
// ResNet block's shortcut Add and Relu; act none or Relu). The 1x1 paths (pointwise tiles, the GEMM) add it to each
// block they just wrote, still in cache; the other paths run the conv, then one pass over the output.
// input_shift (hetero.ConvInputShift): the conv of x + input_shift, the zero padding not shifted (a scalar Add before
// a padded conv, which cannot fold into its bias).
void conv2d_packed(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act, const float* residual = nullptr, float input_shift = 0.f);

// A depthwise conv (geometry gd) and a 1x1 stride-1 conv on its output in one call (conv.cpp): in one pass over
// bands of rows where dw_pointwise_fits, else the two convs in turn (out: [N, pw.cout, gd.Ho, gd.Wo]).
bool dw_pointwise_fits(const PackedConv& dw, const ConvGeom& gd, const PackedConv& pw, const Epilogue& dw_act,
                       const Epilogue& pw_act);
void dw_pointwise(const PackedConv& dw, const ConvGeom& gd, const float* x, const float* dw_bias,
                  const Epilogue& dw_act, const PackedConv& pw, const float* pw_bias, const Epilogue& pw_act,
                  float* out);

// Which kernel conv2d_packed runs for this shape (chosen by rule, per call): exposed so tests can check that a shape
// meant for a path takes it.
enum class ConvAlgo { depthwise, dot, winograd, direct, gemm, bf16x3, transposed, cblk, pointwise, bf16x3_pw,
                      bf16x3_rows, winograd1d };
ConvAlgo conv_algorithm(const PackedConv& pc, const ConvGeom& g);
const char* conv_algorithm_name(ConvAlgo a);

// Winograd F(4x4, 3x3) (conv_winograd.cpp): whether it is the faster choice for this shape, and the convolution
// (false, nothing written, when the input holds an inf or NaN: the caller runs another kernel).
// whole_panels: the rule as it was before the products' one-vector part panels (the columns of whole nr panels)
bool winograd_fits(const PackedConv& pc, const ConvGeom& g, bool whole_panels = false);
bool conv_winograd(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act);

// Winograd F(4, 3) / F(4, 5) for 1-D three- / five-tap convs (conv_winograd1d.cpp; g as along_w makes it: one row):
// whether it is the faster choice, and the convolution (false, the output partly written, when an output is not
// finite, e.g. from an inf or NaN input: the caller runs another kernel).
bool winograd1d_fits(const PackedConv& pc, const ConvGeom& g);
bool conv_winograd1d(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                     const Epilogue& act);

void max_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 dh, i64 dw);
void avg_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 pb, i64 pr, bool count_include_pad);
void global_avg_pool(const float* x, float* out, i64 NC, i64 HW);

}  // namespace hetero
