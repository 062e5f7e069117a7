// CNN kernels around the tiled GEMM of gemm.cl: im2col / col2im (Conv, ConvTranspose), depthwise conv, pooling,
// BatchNormalization, Softmax, LayerNormalization, Resize.

// col[g, (c * KH + ky) * KW + kx, oy * OW + ox] for one image (2-D conv; 1-D convs come as H = 1).
__kernel void im2col(__global const float* x, __global float* col, int x_off, int C, int H, int W, int KH, int KW,
                     int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw) {
  const int p = get_global_id(0);  // output pixel
  const int r = get_global_id(1);  // row of col: (c, ky, kx) over all channels
  if (p >= OH * OW || r >= C * KH * KW) return;
  const int kx = r % KW, ky = (r / KW) % KH, c = r / (KW * KH);
  const int oy = p / OW, ox = p % OW;
  const int iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
  float v = 0.0f;
  if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = x[x_off + ((long)c * H + iy) * W + ix];
  col[(long)r * OH * OW + p] = v;
}

// Depthwise (groups == input channels, `mult` outputs per channel), one output element per work-item.
__kernel void depthwise(__global const float* x, __global const float* w, __global const float* bias,
                        __global float* y, int has_bias, int N, int C, int H, int W, int mult, int KH, int KW,
                        int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw, int act, float act_a,
                        float act_b) {
  const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
  if (ox >= OW || oy >= OH || nc >= N * C * mult) return;
  const int co = nc % (C * mult), n = nc / (C * mult), ci = co / mult;
  __global const float* xp = x + ((long)n * C + ci) * H * W;
  __global const float* wp = w + (long)co * KH * KW;
  float acc = has_bias ? bias[co] : 0.0f;
  for (int ky = 0; ky < KH; ++ky) {
    const int iy = oy * sh - ph + ky * dh;
    if (iy < 0 || iy >= H) continue;
    for (int kx = 0; kx < KW; ++kx) {
      const int ix = ox * sw - pw + kx * dw;
      if (ix >= 0 && ix < W) acc += xp[iy * W + ix] * wp[ky * KW + kx];
    }
  }
  y[((long)nc * OH + oy) * OW + ox] = activate(acc, act, act_a, act_b);
}

// Per-channel bias + activation over [N, C, P] (conv epilogue when the GEMM runs per image without bias).
__kernel void channel_bias_act(__global float* y, __global const float* bias, int has_bias, int C, int P, int n,
                               int act, float act_a, float act_b) {
  const int i = get_global_id(0);
  if (i >= n) return;
  float v = y[i];
  if (has_bias) v += bias[(i / P) % C];
  y[i] = activate(v, act, act_a, act_b);
}

// 2-D max / average pooling (mode 0 max, 1 average excluding pads, 2 average including pads).
__kernel void pool2d(__global const float* x, __global float* y, int NC, int H, int W, int OH, int OW, int KH, int KW,
                     int sh, int sw, int ph, int pw, int ph1, int pw1, int dh, int dw, int mode) {
  const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
  if (ox >= OW || oy >= OH || nc >= NC) return;
  __global const float* xp = x + (long)nc * H * W;
  float acc = mode == 0 ? -INFINITY : 0.0f;
  int count = 0;
  for (int ky = 0; ky < KH; ++ky) {
    const int iy = oy * sh - ph + ky * dh;
    for (int kx = 0; kx < KW; ++kx) {
      const int ix = ox * sw - pw + kx * dw;
      const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;
      if (mode == 2) {
        // count_include_pad counts pads inside the padded input, not past it (ceil_mode windows)
        if (iy < H + ph1 && ix < W + pw1) ++count;
      }
      if (!inside) continue;
      const float v = xp[iy * W + ix];
      if (mode == 0) {
        acc = fmax(acc, v);
      } else {
        acc += v;
        if (mode == 1) ++count;
      }
    }
  }
  y[((long)nc * OH + oy) * OW + ox] = mode == 0 ? acc : acc / (float)max(count, 1);
}

// Global average (mode 1) or max (mode 0) over P spatial elements, one work-group per (n, c).
__kernel void global_pool(__global const float* x, __global float* y, int P, int mode, __local float* scratch) {
  const int lid = get_local_id(0), size = get_local_size(0), row = get_group_id(0);
  __global const float* xp = x + (long)row * P;
  float acc = mode == 0 ? -INFINITY : 0.0f;
  for (int i = lid; i < P; i += size) acc = mode == 0 ? fmax(acc, xp[i]) : acc + xp[i];
  acc = mode == 0 ? group_max(acc, scratch, lid, size) : group_sum(acc, scratch, lid, size);
  if (lid == 0) y[row] = mode == 0 ? acc : acc / (float)P;
}

// Softmax (log_mode 0), LogSoftmax (1) or Hardmax (2) over rows of length L (contiguous), one work-group per row.
__kernel void softmax_rows(__global const float* x, __global float* y, int L, int log_mode, __local float* scratch) {
  const int lid = get_local_id(0), size = get_local_size(0), row = get_group_id(0);
  __global const float* xp = x + (long)row * L;
  __global float* yp = y + (long)row * L;
  float m = -INFINITY;
  for (int i = lid; i < L; i += size) m = fmax(m, xp[i]);
  m = group_max(m, scratch, lid, size);
  float s = 0.0f;
  for (int i = lid; i < L; i += size) s += exp(xp[i] - m);
  s = group_sum(s, scratch, lid, size);
  if (log_mode == 1) {
    const float ls = log(s);
    for (int i = lid; i < L; i += size) yp[i] = xp[i] - m - ls;
  } else {
    const float inv = 1.0f / s;
    for (int i = lid; i < L; i += size) yp[i] = exp(xp[i] - m) * inv;
  }
}

// Softmax over the middle axis of [outer, L, inner], one work-item per (outer, inner) pair.
__kernel void softmax_strided(__global const float* x, __global float* y, int outer, int L, int inner, int log_mode) {
  const int i = get_global_id(0);
  if (i >= outer * inner) return;
  const long base = (long)(i / inner) * L * inner + i % inner;
  float m = -INFINITY;
  for (int a = 0; a < L; ++a) m = fmax(m, x[base + (long)a * inner]);
  float s = 0.0f;
  for (int a = 0; a < L; ++a) s += exp(x[base + (long)a * inner] - m);
  const float ls = log(s), inv = 1.0f / s;
  for (int a = 0; a < L; ++a) {
    const float v = x[base + (long)a * inner] - m;
    y[base + (long)a * inner] = log_mode == 1 ? v - ls : exp(v) * inv;
  }
}

// LayerNormalization over rows of length D: y = (x - mean) / sqrt(var + eps) * scale + bias (scale/bias [D]).
__kernel void layernorm(__global const float* x, __global const float* scale, __global const float* bias,
                        __global float* y, int D, float eps, int has_bias, __local float* scratch) {
  const int lid = get_local_id(0), size = get_local_size(0), row = get_group_id(0);
  __global const float* xp = x + (long)row * D;
  __global float* yp = y + (long)row * D;
  float s = 0.0f;
  for (int i = lid; i < D; i += size) s += xp[i];
  const float mean = group_sum(s, scratch, lid, size) / (float)D;
  float v = 0.0f;
  for (int i = lid; i < D; i += size) {
    const float d = xp[i] - mean;
    v += d * d;
  }
  const float inv = rsqrt(group_sum(v, scratch, lid, size) / (float)D + eps);
  for (int i = lid; i < D; i += size) {
    float o = (xp[i] - mean) * inv * scale[i];
    if (has_bias) o += bias[i];
    yp[i] = o;
  }
}

// Resize of the last two axes of [NC, H, W] (len_*: the resized length align_corners divides by). coord: 0 half_pixel, 1 asymmetric, 2 align_corners,
// 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn. mode 0 nearest: the source row / column of each output row / column
// come from the host (rows, cols: computed in float64 there, since a float32 division here may be off by an ulp,
// and a coordinate that should be a tie, 0.5, then rounds the other way), 1 linear (continuous in the coordinate).
inline float resize_coord(int o, float scale, int in_len, int out_len, float length, int coord) {
  switch (coord) {
    case 0: return ((float)o + 0.5f) / scale - 0.5f;
    case 1: return (float)o / scale;
    case 2: return out_len == 1 ? 0.0f : (float)o * (float)(in_len - 1) / (length - 1.0f);
    case 3: return out_len > 1 ? ((float)o + 0.5f) / scale - 0.5f : 0.0f;
    default: return ((float)o + 0.5f) / scale;
  }
}

__kernel void resize2d(__global const float* x, __global float* y, __global const int* rows,
                       __global const int* cols, int NC, int H, int W, int OH, int OW, float scale_h, float scale_w,
                       float len_h, float len_w, int mode, int coord) {
  const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
  if (ox >= OW || oy >= OH || nc >= NC) return;
  __global const float* xp = x + (long)nc * H * W;
  float v;
  if (mode == 0) {
    v = xp[rows[oy] * W + cols[ox]];
  } else {
    const float cy = resize_coord(oy, scale_h, H, OH, len_h, coord);
    const float cx = resize_coord(ox, scale_w, W, OW, len_w, coord);
    const float fy = clamp(cy, 0.0f, (float)(H - 1)), fx = clamp(cx, 0.0f, (float)(W - 1));
    const int y0 = (int)floor(fy), x0 = (int)floor(fx);
    const int y1 = min(y0 + 1, H - 1), x1 = min(x0 + 1, W - 1);
    const float wy = fy - (float)y0, wx = fx - (float)x0;
    const float top = xp[y0 * W + x0] * (1.0f - wx) + xp[y0 * W + x1] * wx;
    const float bot = xp[y1 * W + x0] * (1.0f - wx) + xp[y1 * W + x1] * wx;
    v = top * (1.0f - wy) + bot * wy;
  }
  y[((long)nc * OH + oy) * OW + ox] = v;
}

// ConvTranspose, second half: the GEMM has written col[g, (co * KH + ky) * KW + kx, iy * W + ix] = sum over the
// group's input channels of w * x for one image; each output pixel gathers the taps that land on it.
__kernel void col2im(__global const float* col, __global const float* bias, __global float* y, int has_bias,
                     int y_off, int G, int MG, int H, int W, int KH, int KW, int OH, int OW, int sh, int sw, int ph,
                     int pw, int dh, int dw) {
  const int ox = get_global_id(0), oy = get_global_id(1), c = get_global_id(2);
  if (ox >= OW || oy >= OH || c >= G * MG) return;
  const int g = c / MG, co = c % MG;
  const long P = (long)H * W;
  __global const float* cp = col + ((long)g * MG + co) * KH * KW * P;
  float acc = has_bias ? bias[c] : 0.0f;
  for (int ky = 0; ky < KH; ++ky) {
    const int ty = oy + ph - ky * dh;
    if (ty < 0 || ty % sh) continue;
    const int iy = ty / sh;
    if (iy >= H) continue;
    for (int kx = 0; kx < KW; ++kx) {
      const int tx = ox + pw - kx * dw;
      if (tx < 0 || tx % sw) continue;
      const int ix = tx / sw;
      if (ix < W) acc += cp[(ky * KW + kx) * P + iy * W + ix];
    }
  }
  y[y_off + ((long)c * OH + oy) * OW + ox] = acc;
}

// BatchNormalization (inference) over [N, C, inner]: y = (x - mean) / sqrt(var + eps) * scale + b per channel.
__kernel void batchnorm(__global const float* x, __global const float* scale, __global const float* b,
                        __global const float* mean, __global const float* var, __global float* y, int C, int inner,
                        int n, float eps) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int c = (i / inner) % C;
  y[i] = (x[i] - mean[c]) * rsqrt(var[c] + eps) * scale[c] + b[c];
}
