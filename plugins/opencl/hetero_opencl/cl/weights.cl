// Kernels that read LLM weights, built once per weight format: WFMT 0 f32, 1 f16, 2 bf16, 3 q8 symmetric,
// 4 q8 asymmetric, 5 q4 symmetric, 6 q4 asymmetric (block layout in hetero.contract.quant); WBLOCK is the block size,
// WBB the bytes of a block, WHDR its header bytes. Rows are read 16 elements at a time (a 16-element chunk never
// straddles a block), dequantized exactly as the numpy reference does, then multiplied in float32.

#ifndef WFMT
#define WFMT 0
#endif
#ifndef WBLOCK
#define WBLOCK 32
#endif
#define QMT 4  // tokens per work-group in the matrix-vector kernel

inline float16 load16(__global const uchar* row, int k0) {
#if WFMT == 0
  return vload16(0, (__global const float*)row + k0);
#elif WFMT == 1
  return HALF_LOAD16(0, (__global const half*)row + k0);
#elif WFMT == 2
  return as_float16(convert_uint16(vload16(0, (__global const ushort*)row + k0)) << 16);
#else
  __global const uchar* blk = row + (k0 / WBLOCK) * WBB;
  const int j0 = k0 % WBLOCK;
  const float d = HALF_LOAD(0, (__global const half*)blk);
#if WFMT == 3
  return convert_float16(vload16(0, (__global const char*)(blk + WHDR) + j0)) * d;
#elif WFMT == 4
  return convert_float16(vload16(0, blk + WHDR + j0)) * d + HALF_LOAD(1, (__global const half*)blk);
#else
  const uchar16 b = vload16(0, blk + WHDR + j0 % (WBLOCK / 2));
  const float16 q = convert_float16(j0 >= WBLOCK / 2 ? (b >> (uchar16)(4)) : (b & (uchar16)(15)));
#if WFMT == 5
  return (q - 8.0f) * d;
#else
  return q * d + HALF_LOAD(1, (__global const half*)blk);
#endif
#endif
#endif
}

inline float load1(__global const uchar* row, int k) {
#if WFMT == 0
  return ((__global const float*)row)[k];
#elif WFMT == 1
  return HALF_LOAD(k, (__global const half*)row);
#elif WFMT == 2
  return as_float((uint)(((__global const ushort*)row)[k]) << 16);
#else
  __global const uchar* blk = row + (k / WBLOCK) * WBB;
  const int j = k % WBLOCK;
  const float d = HALF_LOAD(0, (__global const half*)blk);
#if WFMT == 3
  return (float)((__global const char*)(blk + WHDR))[j] * d;
#elif WFMT == 4
  return (float)blk[WHDR + j] * d + HALF_LOAD(1, (__global const half*)blk);
#else
  const uchar b = blk[WHDR + j % (WBLOCK / 2)];
  const float q = (float)(j >= WBLOCK / 2 ? (b >> 4) : (b & 15));
#if WFMT == 5
  return (q - 8.0f) * d;
#else
  return q * d + HALF_LOAD(1, (__global const half*)blk);
#endif
#endif
#endif
}

inline float dot16(float16 a, float16 b) {
  return dot(a.s0123, b.s0123) + dot(a.s4567, b.s4567) + dot(a.s89ab, b.s89ab) + dot(a.scdef, b.scdef);
}

// This work-item's share of row . x (chunks lid, lid + size, ...; the tail past the last full chunk by lid 0).
inline float row_dot(__global const uchar* row, __global const float* x, int K, int lid, int size) {
  const int full = K / 16;
  float acc = 0.0f;
  for (int c = lid; c < full; c += size) acc += dot16(load16(row, c * 16), vload16(c, x));
  if (lid == 0)
    for (int k = full * 16; k < K; ++k) acc += load1(row, k) * x[k];
  return acc;
}

// y[m, n] = x[m] . W[n] (+ bias[n]), split-K: one work-group per (row n, QMT tokens), the work-items share the
// row's 16-element chunks and reduce once at the end (all QMT sums in one tree). Weights read once per QMT tokens.
// Suits GPUs: neighbouring work-items read neighbouring bytes of a row.
__kernel void qmatvec(__global const float* x, __global const uchar* W, __global const float* bias,
                      __global float* y, int M, int N, int K, int row_bytes, int has_bias, __local float* red) {
  const int lid = get_local_id(0), size = get_local_size(0);
  const int n = get_group_id(1), m0 = get_group_id(2) * QMT;
  __global const uchar* row = W + (long)n * row_bytes;
  float acc[QMT];
  for (int t = 0; t < QMT; ++t) acc[t] = 0.0f;
  const int mt = min(QMT, M - m0);
  const int full = K / 16;
  for (int c = lid; c < full; c += size) {
    const float16 w = load16(row, c * 16);
    for (int t = 0; t < QMT; ++t)
      if (t < mt) acc[t] += dot16(w, vload16(c, x + (long)(m0 + t) * K));
  }
  if (lid == 0) {
    for (int k = full * 16; k < K; ++k) {
      const float w = load1(row, k);
      for (int t = 0; t < mt; ++t) acc[t] += w * x[(long)(m0 + t) * K + k];
    }
  }
#ifdef HAS_SUBGROUPS
  // Each subgroup reduces its QMT sums in registers; work-item t then adds token t's subgroup partials.
  const int sg = (int)get_sub_group_id(), groups = (int)get_num_sub_groups();
  for (int t = 0; t < QMT; ++t) {
    const float v = sub_group_reduce_add(acc[t]);
    if (get_sub_group_local_id() == 0) red[t * size + sg] = v;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < mt) {
    float v = 0.0f;
    for (int i = 0; i < groups; ++i) v += red[lid * size + i];
    y[(long)(m0 + lid) * N + n] = v + (has_bias ? bias[n] : 0.0f);
  }
#else
  for (int t = 0; t < QMT; ++t) red[t * size + lid] = acc[t];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = size >> 1; s > 0; s >>= 1) {
    if (lid < s)
      for (int t = 0; t < QMT; ++t) red[t * size + lid] += red[t * size + lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid < mt) y[(long)(m0 + lid) * N + n] = red[lid * size] + (has_bias ? bias[n] : 0.0f);
#endif
}

// The same product, one work-item per (row n, QMT tokens) walking the whole row: no local memory, no barriers.
// Suits CPU devices (PoCL), where a work-group runs as a loop and barriers cost more than they share.
__kernel void qmatvec_rows(__global const float* x, __global const uchar* W, __global const float* bias,
                           __global float* y, int M, int N, int K, int row_bytes, int has_bias) {
  const int n = get_global_id(0), m0 = get_global_id(1) * QMT;
  if (n >= N || m0 >= M) return;
  __global const uchar* row = W + (long)n * row_bytes;
  float acc[QMT];
  for (int t = 0; t < QMT; ++t) acc[t] = 0.0f;
  const int mt = min(QMT, M - m0);
  const int full = K / 16;
  for (int c = 0; c < full; ++c) {
    const float16 w = load16(row, c * 16);
    for (int t = 0; t < QMT; ++t)
      if (t < mt) acc[t] += dot16(w, vload16(c, x + (long)(m0 + t) * K));
  }
  for (int k = full * 16; k < K; ++k) {
    const float w = load1(row, k);
    for (int t = 0; t < mt; ++t) acc[t] += w * x[(long)(m0 + t) * K + k];
  }
  for (int t = 0; t < mt; ++t) y[(long)(m0 + t) * N + n] = acc[t] + (has_bias ? bias[n] : 0.0f);
}

// out[n, k] = W[n, k] as float32 (for the matrix-matrix path: dequantize into scratch, then the tiled GEMM).
__kernel void dequant(__global const uchar* W, __global float* out, int N, int K, int row_bytes) {
  const int c = get_global_id(0), n = get_global_id(1);
  if (n >= N) return;
  __global const uchar* row = W + (long)n * row_bytes;
  __global float* o = out + (long)n * K;
  const int k0 = c * 16;
  if (k0 + 16 <= K) {
    vstore16(load16(row, k0), 0, o + k0);
  } else {
    for (int k = k0; k < K; ++k) o[k] = load1(row, k);
  }
}

#define EMBEDDING(I)                                                                                         \
  __kernel void embedding_##I(__global const I* ids, __global const uchar* W, __global float* out, int dim,  \
                              int row_bytes, int vocab) {                                                    \
    const int c = get_global_id(0), t = get_global_id(1);                                                    \
    long id = ids[t];                                                                                        \
    id = clamp(id, (long)0, (long)(vocab - 1));                                                              \
    __global const uchar* row = W + id * row_bytes;                                                          \
    __global float* o = out + (long)t * dim;                                                                 \
    const int k0 = c * 16;                                                                                   \
    if (k0 + 16 <= dim) {                                                                                    \
      vstore16(load16(row, k0), 0, o + k0);                                                                  \
    } else {                                                                                                 \
      for (int k = k0; k < dim; ++k) o[k] = load1(row, k);                                                   \
    }                                                                                                        \
  }
EMBEDDING(long)
EMBEDDING(int)

// MoE expert MLP, first half: h[tk, i] = silu(gate_e[i] . x[t]) * (up_e[i] . x[t]) for tk = t * top_k + slot,
// e = chosen[tk]; one work-group per (i, tk).
__kernel void moe_gate_up(__global const float* x, __global const int* chosen, __global const uchar* gate,
                          __global const uchar* up, __global float* h, int top_k, int I, int H, int row_bytes,
                          __local float* red) {
  const int lid = get_local_id(0), size = get_local_size(0);
  const int i = get_group_id(1), tk = get_group_id(2);
  const int t = tk / top_k, e = chosen[tk];
  const long off = ((long)e * I + i) * row_bytes;
  __global const float* xp = x + (long)t * H;
  const float g = group_sum(row_dot(gate + off, xp, H, lid, size), red, lid, size);
  const float u = group_sum(row_dot(up + off, xp, H, lid, size), red, lid, size);
  if (lid == 0) h[(long)tk * I + i] = g / (1.0f + exp(-g)) * u;
}

// Second half: part[tk, j] = down_e[j] . h[tk].
__kernel void moe_down(__global const float* h, __global const int* chosen, __global const uchar* down,
                       __global float* part, int top_k, int H, int I, int row_bytes, __local float* red) {
  const int lid = get_local_id(0), size = get_local_size(0);
  const int j = get_group_id(1), tk = get_group_id(2);
  const int e = chosen[tk];
  const float s = group_sum(row_dot(down + ((long)e * H + j) * row_bytes, h + (long)tk * I, I, lid, size), red,
                            lid, size);
  if (lid == 0) part[(long)tk * H + j] = s;
}
