// Convolution and pooling entry points (conv.cpp). All tensors NCHW float32, contiguous.
#pragma once
#include <memory>

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
};

std::unique_ptr<PackedConv> prepack_conv(const Kernels& kr, const float* w, i64 cout, i64 cin_g, i64 kh, i64 kw,
                                         i64 group);

void conv2d_packed(const PackedConv& pc, const ConvGeom& g, const float* x, const float* bias, float* out,
                   const Epilogue& act);

void max_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 dh, i64 dw);
void avg_pool2d(const float* x, float* out, i64 NC, i64 H, i64 W, i64 Ho, i64 Wo, i64 kh, i64 kw, i64 sh, i64 sw,
                i64 pt, i64 pl, i64 pb, i64 pr, bool count_include_pad);
void global_avg_pool(const float* x, float* out, i64 NC, i64 HW);

}  // namespace hetero
