// Reductions over any set of axes (ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare), float32.
// One work-group per output element; meta = [kept dims (nk), kept strides (nk), reduced dims (nr), reduced strides
// (nr)] in input elements, so no transpose is needed whatever the axes.

// Op codes: keep in sync with hetero_opencl.kernels.reduce.REDUCE.
#define R_SUM 0
#define R_MEAN 1
#define R_MAX 2
#define R_MIN 3
#define R_PROD 4
#define R_L1 5
#define R_L2 6
#define R_LOGSUM 7
#define R_LOGSUMEXP 8
#define R_SUMSQUARE 9

inline float r_identity(int op) {
  switch (op) {
    case R_MAX: return -INFINITY;
    case R_MIN: return INFINITY;
    case R_PROD: return 1.0f;
    default: return 0.0f;
  }
}

inline float r_combine(float a, float b, int op) {
  switch (op) {
    case R_MAX: return fmax(a, b);
    case R_MIN: return fmin(a, b);
    case R_PROD: return a * b;
    default: return a + b;
  }
}

// What each element contributes (shift: the row max, for log-sum-exp).
inline float r_map(float x, int op, float shift) {
  switch (op) {
    case R_L1: return fabs(x);
    case R_L2:
    case R_SUMSQUARE: return x * x;
    case R_LOGSUMEXP: return exp(x - shift);
    default: return x;
  }
}

inline float r_group(float v, __local float* scratch, int lid, int size, int op) {
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = size >> 1; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] = r_combine(scratch[lid], scratch[lid + s], op);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

inline long r_offset(long i, __global const int* dims, __global const int* strides, int rank) {
  long off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (long)(i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

__kernel void reduce_axes(__global const float* x, __global float* y, __global const int* meta, int nk, int nr,
                          int count, int op, __local float* scratch) {
  const int lid = get_local_id(0), size = get_local_size(0), o = get_group_id(0);
  const long base = r_offset(o, meta, meta + nk, nk);
  __global const int* rdims = meta + 2 * nk;
  __global const int* rstrides = rdims + nr;
  float shift = 0.0f;
  if (op == R_LOGSUMEXP) {
    float m = -INFINITY;
    for (int r = lid; r < count; r += size) m = fmax(m, x[base + r_offset(r, rdims, rstrides, nr)]);
    m = r_group(m, scratch, lid, size, R_MAX);
    shift = isfinite(m) ? m : 0.0f;
  }
  float acc = r_identity(op);
  for (int r = lid; r < count; r += size) acc = r_combine(acc, r_map(x[base + r_offset(r, rdims, rstrides, nr)], op, shift), op);
  acc = r_group(acc, scratch, lid, size, op);
  if (lid != 0) return;
  switch (op) {
    case R_MEAN: acc /= (float)count; break;
    case R_L2: acc = sqrt(acc); break;
    case R_LOGSUM: acc = log(acc); break;
    case R_LOGSUMEXP: acc = log(acc) + shift; break;
    default: break;
  }
  y[o] = acc;
}
