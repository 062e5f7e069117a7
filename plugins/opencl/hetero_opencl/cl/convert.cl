// Dtype conversion and comparisons: Cast between float / half / integer / bool tensors, Equal / Less / Greater /
// LessOrEqual / GreaterOrEqual (bool out, broadcasting), Not, and Where (float32 values, broadcasting).
// half tensors are read and written with vload_half / vstore_half, which need no cl_khr_fp16.

// cast_<src>_<dst>: y = (dst)x (float -> int truncates toward zero, as C and onnxruntime do).
#define CAST(S, D)                                                                                               \
  __kernel void cast_##S##_##D(__global const S* x, __global D* y, int n) {                                      \
    const int i = get_global_id(0);                                                                              \
    if (i < n) y[i] = (D)x[i];                                                                                   \
  }
#define CAST_FROM_HALF(D)                                                                                        \
  __kernel void cast_half_##D(__global const half* x, __global D* y, int n) {                                    \
    const int i = get_global_id(0);                                                                              \
    if (i < n) y[i] = (D)vload_half(i, x);                                                                       \
  }
#define CAST_TO_HALF(S)                                                                                          \
  __kernel void cast_##S##_half(__global const S* x, __global half* y, int n) {                                  \
    const int i = get_global_id(0);                                                                              \
    if (i < n) vstore_half((float)x[i], i, y);                                                                   \
  }
// bool out: 1 where x != 0 (NaN counts as true, as in numpy).
#define CAST_TO_BOOL(S)                                                                                          \
  __kernel void cast_##S##_bool(__global const S* x, __global uchar* y, int n) {                                 \
    const int i = get_global_id(0);                                                                              \
    if (i < n) y[i] = x[i] != (S)0;                                                                              \
  }
#define CAST_ALL_TO(D) CAST(float, D) CAST(int, D) CAST(long, D) CAST(uchar, D) CAST(char, D) CAST_FROM_HALF(D)

CAST_ALL_TO(float)
CAST_ALL_TO(int)
CAST_ALL_TO(long)
CAST_ALL_TO(uchar)
CAST_ALL_TO(char)
CAST_TO_HALF(float)
CAST_TO_HALF(int)
CAST_TO_HALF(long)
CAST_TO_HALF(uchar)
CAST_TO_HALF(char)
CAST_TO_BOOL(float)
CAST_TO_BOOL(int)
CAST_TO_BOOL(long)
CAST_TO_BOOL(uchar)
CAST_TO_BOOL(char)

__kernel void cast_half_bool(__global const half* x, __global uchar* y, int n) {
  const int i = get_global_id(0);
  if (i < n) y[i] = vload_half(i, x) != 0.0f;
}

// Offsets of output element i in two broadcast inputs: meta = [dims(rank), astrides(rank), bstrides(rank)].
inline void offsets2(long i, __global const int* meta, int rank, long* ia, long* ib) {
  long a = 0, b = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int k = (int)(i % meta[d]);
    i /= meta[d];
    a += (long)k * meta[rank + d];
    b += (long)k * meta[2 * rank + d];
  }
  *ia = a;
  *ib = b;
}

// Comparison codes: keep in sync with hetero_opencl.kernels.convert.COMPARE.
#define C_EQ 0
#define C_LT 1
#define C_GT 2
#define C_LE 3
#define C_GE 4

#define COMPARE(T)                                                                                               \
  __kernel void compare_##T(__global const T* a, __global const T* b, __global uchar* y, __global const int* meta, \
                            int n, int rank, int op) {                                                           \
    const int i = get_global_id(0);                                                                              \
    if (i >= n) return;                                                                                          \
    long ia, ib;                                                                                                 \
    offsets2(i, meta, rank, &ia, &ib);                                                                           \
    const T x = a[ia], z = b[ib];                                                                                \
    bool r;                                                                                                      \
    switch (op) {                                                                                                \
      case C_EQ: r = x == z; break;                                                                              \
      case C_LT: r = x < z; break;                                                                               \
      case C_GT: r = x > z; break;                                                                               \
      case C_LE: r = x <= z; break;                                                                              \
      default: r = x >= z; break;                                                                                \
    }                                                                                                            \
    y[i] = r;                                                                                                    \
  }

COMPARE(float)
COMPARE(int)
COMPARE(long)
COMPARE(uchar)

__kernel void logical_not(__global const uchar* x, __global uchar* y, int n) {
  const int i = get_global_id(0);
  if (i < n) y[i] = !x[i];
}

// Where(cond, a, b) with broadcasting: meta = [dims(rank), cstrides, astrides, bstrides].
__kernel void where_float(__global const uchar* c, __global const float* a, __global const float* b,
                          __global float* y, __global const int* meta, int n, int rank) {
  const int i = get_global_id(0);
  if (i >= n) return;
  long ic = 0, ia = 0, ib = 0, r = i;
  for (int d = rank - 1; d >= 0; --d) {
    const int k = (int)(r % meta[d]);
    r /= meta[d];
    ic += (long)k * meta[rank + d];
    ia += (long)k * meta[2 * rank + d];
    ib += (long)k * meta[3 * rank + d];
  }
  y[i] = c[ic] ? a[ia] : b[ib];
}
