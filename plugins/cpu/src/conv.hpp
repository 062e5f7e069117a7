// Convolution and pooling entry points (conv.cpp). All tensors NCHW float32, contiguous.
#pragma once
#include <memory>
#include <mutex>

#include "common.hpp"

namespace hetero {

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
  mutable std::once_flag wino_once;
  mutable AlignedBuf wino;
  mutable i64 wino_stride = 0;
};

std::unique_ptr<PackedConv> prepack_conv(const Kernels& kr, const float* w, i64 cout, i64 cin_g, i64 kh, i64 kw,
                                         i64 group);

void conv2d_packed(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act);

// Which kernel conv2d_packed runs for this shape (chosen by rule, per call): exposed so tests can check that a shape
// meant for a path takes it.
enum class ConvAlgo { depthwise, dot, winograd, direct, gemm };
ConvAlgo conv_algorithm(const PackedConv& pc, const ConvGeom& g);
const char* conv_algorithm_name(ConvAlgo a);

// Winograd F(4x4, 3x3) (conv_winograd.cpp): whether it is the faster choice for this shape, and the convolution
// (false, nothing written, when the input holds an inf or NaN: the caller runs another kernel).
bool winograd_fits(const PackedConv& pc, const ConvGeom& g);
bool conv_winograd(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act);

void max_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 dh, i64 dw);
void avg_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 pb, i64 pr, bool count_include_pad);
void global_avg_pool(const float* x, float* out, i64 NC, i64 HW);

}  // namespace hetero
