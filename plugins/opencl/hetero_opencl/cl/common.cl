// Shared by every program (prepended by the host): extension switches and the activation table.
// Arithmetic is fp32 everywhere. The host (hetero_opencl.runtime.kernel_variants) defines HAS_FP16 and
// HAS_SUBGROUPS only when the device reports the extension, so these variants are chosen at run time:
//   HAS_FP16: half tensors (f16 weights, quantization scales, the f16 KV cache) are read and written as native
//     half values instead of through vload_half / vstore_half (same values: conversions are exact, stores round to
//     nearest even either way).
//   HAS_SUBGROUPS (cl_khr_subgroups on OpenCL C 2.0+, or cl_intel_subgroups): work-group reductions reduce
//     within each subgroup first (sub_group_reduce_*), then across the subgroups' partials: two barriers instead of
//     log2(size) rounds through local memory.
#ifdef HAS_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define HALF_LOAD(i, p) ((float)(p)[i])
#define HALF_LOAD4(i, p) convert_float4(vload4((i), (p)))
#define HALF_LOAD16(i, p) convert_float16(vload16((i), (p)))
#define HALF_STORE(x, i, p) ((p)[i] = (half)(x))
#else
#define HALF_LOAD(i, p) vload_half((i), (p))
#define HALF_LOAD4(i, p) vload_half4((i), (p))
#define HALF_LOAD16(i, p) vload_half16((i), (p))
#define HALF_STORE(x, i, p) vstore_half((x), (i), (p))
#endif
#if defined(HAS_SUBGROUPS) && defined(HAS_INTEL_SUBGROUPS)
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
#elif defined(HAS_SUBGROUPS)
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif

// Unary / activation codes: keep in sync with hetero_opencl.kernels.common.UNARY.
#define U_IDENTITY 0
#define U_RELU 1
#define U_LEAKY_RELU 2
#define U_ELU 3
#define U_SELU 4
#define U_CELU 5
#define U_SIGMOID 6
#define U_HARD_SIGMOID 7
#define U_HARD_SWISH 8
#define U_TANH 9
#define U_SOFTPLUS 10
#define U_SOFTSIGN 11
#define U_EXP 12
#define U_LOG 13
#define U_SQRT 14
#define U_NEG 15
#define U_ABS 16
#define U_RECIPROCAL 17
#define U_ERF 18
#define U_FLOOR 19
#define U_CEIL 20
#define U_ROUND 21
#define U_SIN 22
#define U_COS 23
#define U_MISH 24
#define U_CLIP 25
#define U_GELU 26
#define U_GELU_TANH 27
#define U_SILU 28
#define U_SIGN 29
#define U_THRESHOLDED_RELU 30
#define U_TAN 31
#define U_LEAKY_RELU_MIN 32

inline float sigmoidf(float x) { return 1.0f / (1.0f + exp(-x)); }

inline float softplusf(float x) { return x > 20.0f ? x : log1p(exp(x)); }

inline float activate(float x, int op, float a, float b) {
  switch (op) {
    case U_IDENTITY: return x;
    case U_RELU: return fmax(x, 0.0f);
    case U_LEAKY_RELU: return x < 0.0f ? a * x : x;
    case U_LEAKY_RELU_MIN: return isnan(x) ? x : fmax(x < 0.0f ? a * x : x, b);
    case U_ELU: return x < 0.0f ? a * (exp(x) - 1.0f) : x;
    case U_SELU: return x <= 0.0f ? b * (a * exp(x) - a) : b * x;
    case U_CELU: return fmax(0.0f, x) + fmin(0.0f, a * (exp(x / a) - 1.0f));
    case U_SIGMOID: return sigmoidf(x);
    case U_HARD_SIGMOID: return fmax(0.0f, fmin(1.0f, a * x + b));
    case U_HARD_SWISH: return x * fmax(0.0f, fmin(1.0f, x / 6.0f + 0.5f));
    case U_TANH: return tanh(x);
    case U_SOFTPLUS: return softplusf(x);
    case U_SOFTSIGN: return x / (1.0f + fabs(x));
    case U_EXP: return exp(x);
    case U_LOG: return log(x);
    case U_SQRT: return sqrt(x);
    case U_NEG: return -x;
    case U_ABS: return fabs(x);
    case U_RECIPROCAL: return 1.0f / x;
    case U_ERF: return erf(x);
    case U_FLOOR: return floor(x);
    case U_CEIL: return ceil(x);
    case U_ROUND: return rint(x);
    case U_SIN: return sin(x);
    case U_COS: return cos(x);
    case U_MISH: return x * tanh(softplusf(x));
    case U_CLIP: return fmin(fmax(x, a), b);
    case U_GELU: return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f));
    case U_GELU_TANH: return 0.5f * x * (1.0f + tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case U_SILU: return x * sigmoidf(x);
    case U_SIGN: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case U_THRESHOLDED_RELU: return x > a ? x : 0.0f;
    case U_TAN: return tan(x);
    default: return x;
  }
}

// Work-group reduction of one float per work-item (size a power of two, `scratch` has `size` floats). Every
// work-item gets the result; the barriers also publish other local writes made before the call.
#ifdef HAS_SUBGROUPS
// Subgroup variant: one partial per subgroup in scratch, then every work-item combines the (few) partials.
#define GROUP_REDUCE(name, sg_op, combine, identity)                                                            \
  inline float name(float v, __local float* scratch, int lid, int size) {                                      \
    v = sg_op(v);                                                                                              \
    if (get_sub_group_local_id() == 0) scratch[get_sub_group_id()] = v;                                        \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                              \
    float r = identity;                                                                                        \
    const int groups = (int)get_num_sub_groups();                                                              \
    for (int i = 0; i < groups; ++i) r = combine(r, scratch[i]);                                               \
    barrier(CLK_LOCAL_MEM_FENCE);                                                                              \
    return r;                                                                                                  \
  }
inline float add_f(float a, float b) { return a + b; }
GROUP_REDUCE(group_sum, sub_group_reduce_add, add_f, 0.0f)
GROUP_REDUCE(group_max, sub_group_reduce_max, fmax, -INFINITY)
#else
inline float group_sum(float v, __local float* scratch, int lid, int size) {
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = size >> 1; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

inline float group_max(float v, __local float* scratch, int lid, int size) {
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = size >> 1; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] = fmax(scratch[lid], scratch[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}
#endif

// Offset of flat index i (row-major over dims) through strides: meta holds dims[rank] then strides[rank].
inline long strided_offset(long i, __global const int* dims, __global const int* strides, int rank) {
  long off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int n = dims[d];
    off += (long)(i % n) * strides[d];
    i /= n;
  }
  return off;
}
