// Elementwise: unary/activation (one kernel, op chosen by an argument so the program builds once), broadcasting
// binary arithmetic, SwiGLU. float4 paths where lengths allow.

__kernel void unary4(__global const float4* x, __global float4* y, int n4, int op, float a, float b) {
  const int i = get_global_id(0);
  if (i >= n4) return;
  const float4 v = x[i];
  y[i] = (float4)(activate(v.x, op, a, b), activate(v.y, op, a, b), activate(v.z, op, a, b), activate(v.w, op, a, b));
}

__kernel void unary1(__global const float* x, __global float* y, int n, int op, float a, float b) {
  const int i = get_global_id(0);
  if (i < n) y[i] = activate(x[i], op, a, b);
}

// Binary codes: keep in sync with hetero_opencl.kernels.elementwise.BINARY.
#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_POW 4
#define B_MAX 5
#define B_MIN 6
#define B_PRELU 7

inline float binop(float a, float b, int op) {
  switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_POW: return pow(a, b);
    case B_MAX: return fmax(a, b);
    case B_MIN: return fmin(a, b);
    case B_PRELU: return a < 0.0f ? a * b : a;
    default: return a;
  }
}

inline float4 binop4(float4 a, float4 b, int op) {
  switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    default:
      return (float4)(binop(a.x, b.x, op), binop(a.y, b.y, op), binop(a.z, b.z, op), binop(a.w, b.w, op));
  }
}

// Same shapes (or a scalar b: bstep 0), float4 at a time; act applies a fused activation afterwards.
__kernel void binary4(__global const float4* a, __global const float* b, __global float4* y, int n4, int op,
                      int bscalar) {
  const int i = get_global_id(0);
  if (i >= n4) return;
  const float4 bv = bscalar ? (float4)(b[0]) : vload4(i, b);
  y[i] = binop4(a[i], bv, op);
}

// General broadcasting: meta = [dims(rank), astrides(rank), bstrides(rank)] over the output shape.
__kernel void binary_nd(__global const float* a, __global const float* b, __global float* y,
                        __global const int* meta, int n, int rank, int op) {
  const int i = get_global_id(0);
  if (i >= n) return;
  long ia = 0, ib = 0, r = i;
  for (int d = rank - 1; d >= 0; --d) {
    const int k = (int)(r % meta[d]);
    r /= meta[d];
    ia += (long)k * meta[rank + d];
    ib += (long)k * meta[2 * rank + d];
  }
  y[i] = binop(a[ia], b[ib], op);
}

// silu(gate) * up
__kernel void swiglu4(__global const float4* g, __global const float4* u, __global float4* y, int n4) {
  const int i = get_global_id(0);
  if (i >= n4) return;
  const float4 x = g[i];
  y[i] = x / (1.0f + exp(-x)) * u[i];
}

__kernel void swiglu1(__global const float* g, __global const float* u, __global float* y, int n) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const float x = g[i];
  y[i] = x / (1.0f + exp(-x)) * u[i];
}

// Integer Add Sub Mul Div Max Min with broadcasting (shape arithmetic, index math); Div truncates toward zero as
// ONNX says, and gives 0 for a zero divisor instead of trapping (the reference leaves that case undefined).
#define INT_BINARY(T)                                                                                            \
  __kernel void binary_nd_##T(__global const T* a, __global const T* b, __global T* y, __global const int* meta, \
                              int n, int rank, int op) {                                                         \
    const int i = get_global_id(0);                                                                              \
    if (i >= n) return;                                                                                          \
    long ia = 0, ib = 0, r = i;                                                                                  \
    for (int d = rank - 1; d >= 0; --d) {                                                                        \
      const int k = (int)(r % meta[d]);                                                                          \
      r /= meta[d];                                                                                              \
      ia += (long)k * meta[rank + d];                                                                            \
      ib += (long)k * meta[2 * rank + d];                                                                        \
    }                                                                                                            \
    const T x = a[ia], z = b[ib];                                                                                \
    T v;                                                                                                         \
    switch (op) {                                                                                                \
      case B_ADD: v = x + z; break;                                                                              \
      case B_SUB: v = x - z; break;                                                                              \
      case B_MUL: v = x * z; break;                                                                              \
      case B_DIV: v = z == 0 ? 0 : x / z; break;                                                                 \
      case B_MAX: v = max(x, z); break;                                                                          \
      default: v = min(x, z); break;                                                                             \
    }                                                                                                            \
    y[i] = v;                                                                                                    \
  }
INT_BINARY(int)
INT_BINARY(long)
