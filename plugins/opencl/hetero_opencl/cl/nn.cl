// Dense and CNN kernels: tiled GEMM (MatMul, Gemm, FusedMatMul, Conv through im2col), depthwise conv, pooling,
// Softmax, LayerNormalization, Resize.

#define TM 32
#define TN 32
#define TK 16

// C[b] = act(alpha * A[b] @ B[b] + beta * bias) for b = get_global_id(2). Element (m, k) of A[b] is
// A[offs[2b] + m * sam + k * sak] (strides express transposes), (k, n) of B[b] is B[offs[2b+1] + k * sbk + n * sbn];
// C is contiguous [M, N] per batch at c_off + b * M * N; bias (m, n) at bias[b * sbb + m * scm + n * scn].
// Work-group 8x8, each work-item computes a 4x4 block of a 32x32 tile; K is walked 16 at a time through local
// memory, B rows read as float4.
__kernel __attribute__((reqd_work_group_size(8, 8, 1)))
void gemm(__global const float* A, __global const float* B, __global float* C, __global const float* bias,
          __global const int* offs, int M, int N, int K, int sam, int sak, int sbk, int sbn, int c_off,
          float alpha, float beta, int has_bias, int sbb, int scm, int scn, int act, float act_a, float act_b) {
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int lid = ty * 8 + tx;
  const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
  const int batch = get_global_id(2);
  A += offs[2 * batch];
  B += offs[2 * batch + 1];
  C += c_off + (long)batch * M * N;
  __local float As[TK][TM];
  __local float Bs[TK][TN];
  float4 acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int i = lid; i < TK * TM; i += 64) {
      const int m = i / TK, k = i % TK, gm = m0 + m, gk = k0 + k;
      As[k][m] = (gm < M && gk < K) ? A[(long)gm * sam + (long)gk * sak] : 0.0f;
    }
    for (int i = lid; i < TK * TN; i += 64) {
      const int k = i / TN, n = i % TN, gk = k0 + k, gn = n0 + n;
      Bs[k][n] = (gk < K && gn < N) ? B[(long)gk * sbk + (long)gn * sbn] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < TK; ++k) {
      const float4 b = vload4(tx, Bs[k]);
      const float4 a = vload4(ty, As[k]);
      acc0 += a.x * b;
      acc1 += a.y * b;
      acc2 += a.z * b;
      acc3 += a.w * b;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float4 acc[4] = {acc0, acc1, acc2, acc3};
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty * 4 + i;
    if (m >= M) break;
    const float vals[4] = {acc[i].x, acc[i].y, acc[i].z, acc[i].w};
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tx * 4 + j;
      if (n >= N) break;
      float v = alpha * vals[j];
      if (has_bias) v += beta * bias[(long)batch * sbb + (long)m * scm + (long)n * scn];
      C[(long)m * N + n] = activate(v, act, act_a, act_b);
    }
  }
}

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
// 3 pytorch_half_pixel, 4 tf_half_pixel_for_nn. mode 0 nearest (nearest: 0 round_prefer_floor, 1 round_prefer_ceil,
// 2 floor, 3 ceil), 1 linear.
inline float resize_coord(int o, float scale, int in_len, int out_len, float length, int coord) {
  switch (coord) {
    case 0: return ((float)o + 0.5f) / scale - 0.5f;
    case 1: return (float)o / scale;
    case 2: return out_len == 1 ? 0.0f : (float)o * (float)(in_len - 1) / (length - 1.0f);
    case 3: return out_len > 1 ? ((float)o + 0.5f) / scale - 0.5f : 0.0f;
    default: return ((float)o + 0.5f) / scale;
  }
}

inline int nearest_index(float c, int nearest, int len) {
  int i;
  switch (nearest) {
    case 0: i = (c == floor(c) + 0.5f) ? (int)floor(c) : (int)round(c); break;
    case 1: i = (c == floor(c) + 0.5f) ? (int)ceil(c) : (int)round(c); break;
    case 2: i = (int)floor(c); break;
    default: i = (int)ceil(c); break;
  }
  return clamp(i, 0, len - 1);
}

__kernel void resize2d(__global const float* x, __global float* y, int NC, int H, int W, int OH, int OW,
                       float scale_h, float scale_w, float len_h, float len_w, int mode, int coord, int nearest) {
  const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
  if (ox >= OW || oy >= OH || nc >= NC) return;
  __global const float* xp = x + (long)nc * H * W;
  const float cy = resize_coord(oy, scale_h, H, OH, len_h, coord), cx = resize_coord(ox, scale_w, W, OW, len_w, coord);
  float v;
  if (mode == 0) {
    v = xp[nearest_index(cy, nearest, H) * W + nearest_index(cx, nearest, W)];
  } else {
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
