// Data movement for any element size (T = uchar / ushort / uint / ulong: only the bytes matter).
// copy_nd: y[ybase + sum i_d * ys_d] = x[xbase + sum i_d * xs_d] over `dims` (meta = dims, xstrides, ystrides):
// Transpose, Slice (negative strides for negative steps), Expand (zero strides), Concat (one launch per input).
// gather: out[o, j, p] = data[o, idx[j] (negative wraps), p].

#define MOVEMENT(T)                                                                                              \
  __kernel void copy_nd_##T(__global const T* x, __global T* y, __global const int* meta, int n, int rank,      \
                            int xbase, int ybase) {                                                              \
    const int i = get_global_id(0);                                                                              \
    if (i >= n) return;                                                                                          \
    long ix = xbase, iy = ybase, r = i;                                                                          \
    for (int d = rank - 1; d >= 0; --d) {                                                                        \
      const int k = (int)(r % meta[d]);                                                                          \
      r /= meta[d];                                                                                              \
      ix += (long)k * meta[rank + d];                                                                            \
      iy += (long)k * meta[2 * rank + d];                                                                        \
    }                                                                                                            \
    y[iy] = x[ix];                                                                                               \
  }                                                                                                              \
  __kernel void gather_##T##_long(__global const T* data, __global const long* idx, __global T* y, int n,       \
                                  int nidx, int inner, int axis_dim) {                                           \
    const int i = get_global_id(0);                                                                              \
    if (i >= n) return;                                                                                          \
    const int p = i % inner;                                                                                     \
    const int j = (i / inner) % nidx;                                                                            \
    const int o = i / (inner * nidx);                                                                            \
    long k = idx[j];                                                                                             \
    if (k < 0) k += axis_dim;                                                                                    \
    k = clamp(k, (long)0, (long)(axis_dim - 1));                                                                 \
    y[i] = data[((long)o * axis_dim + k) * inner + p];                                                           \
  }                                                                                                              \
  __kernel void gather_##T##_int(__global const T* data, __global const int* idx, __global T* y, int n,         \
                                 int nidx, int inner, int axis_dim) {                                            \
    const int i = get_global_id(0);                                                                              \
    if (i >= n) return;                                                                                          \
    const int p = i % inner;                                                                                     \
    const int j = (i / inner) % nidx;                                                                            \
    const int o = i / (inner * nidx);                                                                            \
    int k = idx[j];                                                                                              \
    if (k < 0) k += axis_dim;                                                                                    \
    k = clamp(k, 0, axis_dim - 1);                                                                               \
    y[i] = data[((long)o * axis_dim + k) * inner + p];                                                           \
  }

MOVEMENT(uchar)
MOVEMENT(ushort)
MOVEMENT(uint)
MOVEMENT(ulong)
