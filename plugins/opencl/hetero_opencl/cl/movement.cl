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

// pad_T: Pad (mode 0 constant, 1 reflect, 2 edge, 3 wrap) over any rank. meta per axis d, in five blocks of rank:
// output dims, input strides, begin pad (>= 0), begin crop (>= 0, from a negative pad), kept input length L.
// Output coordinate o maps to c = o - pad in the cropped input [0, L); outside it, the mode decides.
inline int pad_index(int c, int len, int mode) {
  if (c >= 0 && c < len) return c;
  switch (mode) {
    case 1: {  // reflect about the edges, without repeating them (period 2 * (len - 1))
      if (len == 1) return 0;
      const int period = 2 * (len - 1);
      int r = c % period;
      if (r < 0) r += period;
      return r < len ? r : period - r;
    }
    case 2: return clamp(c, 0, len - 1);
    case 3: {
      int r = c % len;
      return r < 0 ? r + len : r;
    }
    default: return -1;
  }
}

#define PAD(T)                                                                                                   \
  __kernel void pad_##T(__global const T* x, __global T* y, __global const int* meta, __global const T* value,  \
                        int n, int rank, int mode) {                                                             \
    const int i = get_global_id(0);                                                                              \
    if (i >= n) return;                                                                                          \
    long ix = 0, r = i;                                                                                          \
    for (int d = rank - 1; d >= 0; --d) {                                                                        \
      const int o = (int)(r % meta[d]);                                                                          \
      r /= meta[d];                                                                                              \
      const int c = pad_index(o - meta[2 * rank + d], meta[4 * rank + d], mode);                                 \
      if (c < 0) {                                                                                               \
        y[i] = value[0];                                                                                         \
        return;                                                                                                  \
      }                                                                                                          \
      ix += (long)(c + meta[3 * rank + d]) * meta[rank + d];                                                     \
    }                                                                                                            \
    y[i] = x[ix];                                                                                                \
  }

PAD(uchar)
PAD(ushort)
PAD(uint)
PAD(ulong)
