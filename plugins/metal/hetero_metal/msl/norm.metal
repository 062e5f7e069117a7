// Row reductions, one threadgroup per row: Softmax / LogSoftmax over any axis, LayerNormalization and RMSNorm.
// Each thread folds a strided slice of the row, simd_sum / simd_max fold a simdgroup, and the simdgroups' partials
// meet in threadgroup memory.

struct SoftmaxParams {
    uint n;      // length of the softmax axis
    uint inner;  // product of the dims after it (elements of a row are `inner` apart)
    uint log_softmax;
};

kernel void softmax_f32(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                        constant SoftmaxParams& p [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]], uint threads [[threads_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]], uint simd [[simdgroup_index_in_threadgroup]],
                        uint simdgroups [[simdgroups_per_threadgroup]]) {
    TG_ARRAY(float, partials, 32);
    const uint base = (row / p.inner) * p.n * p.inner + row % p.inner;
    float m = -INFINITY;
    for (uint j = tid; j < p.n; j += threads) m = max(m, x[base + j * p.inner]);
    m = threadgroup_reduce(m, true, partials, lane, simd, simdgroups);
    float s = 0.0f;
    for (uint j = tid; j < p.n; j += threads) s += exp(x[base + j * p.inner] - m);
    s = threadgroup_reduce(s, false, partials, lane, simd, simdgroups);
    const float log_s = log(s), inv_s = 1.0f / s;
    for (uint j = tid; j < p.n; j += threads) {
        const float d = x[base + j * p.inner] - m;
        y[base + j * p.inner] = p.log_softmax != 0 ? d - log_s : exp(d) * inv_s;
    }
}

struct NormParams {
    uint n;           // elements normalised together (the trailing dims)
    float epsilon;
    float offset;     // RMSNorm: y = x * r * (offset + w)
    uint has_bias;
    uint save_stats;  // LayerNormalization's optional Mean / InvStdDev outputs
};

kernel void layernorm_f32(device const float* x [[buffer(0)]], device const float* scale [[buffer(1)]],
                          device const float* bias [[buffer(2)]], device float* y [[buffer(3)]],
                          device float* mean_out [[buffer(4)]], device float* inv_std_out [[buffer(5)]],
                          constant NormParams& p [[buffer(6)]], uint row [[threadgroup_position_in_grid]],
                          uint tid [[thread_index_in_threadgroup]], uint threads [[threads_per_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]], uint simd [[simdgroup_index_in_threadgroup]],
                          uint simdgroups [[simdgroups_per_threadgroup]]) {
    TG_ARRAY(float, partials, 32);
    device const float* xr = x + row * p.n;
    float s = 0.0f;
    for (uint j = tid; j < p.n; j += threads) s += xr[j];
    const float mean = threadgroup_reduce(s, false, partials, lane, simd, simdgroups) / float(p.n);
    float v = 0.0f;
    for (uint j = tid; j < p.n; j += threads) {
        const float d = xr[j] - mean;
        v += d * d;
    }
    const float inv_std = rsqrt(threadgroup_reduce(v, false, partials, lane, simd, simdgroups) / float(p.n) + p.epsilon);
    for (uint j = tid; j < p.n; j += threads) {
        const float b = p.has_bias != 0 ? bias[j] : 0.0f;
        y[row * p.n + j] = (xr[j] - mean) * inv_std * scale[j] + b;
    }
    if (p.save_stats != 0 && tid == 0) {
        mean_out[row] = mean;
        inv_std_out[row] = inv_std;
    }
}

kernel void rmsnorm_f32(device const float* x [[buffer(0)]], device const float* weight [[buffer(1)]],
                        device float* y [[buffer(2)]], constant NormParams& p [[buffer(3)]],
                        uint row [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                        uint threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                        uint simd [[simdgroup_index_in_threadgroup]],
                        uint simdgroups [[simdgroups_per_threadgroup]]) {
    TG_ARRAY(float, partials, 32);
    device const float* xr = x + row * p.n;
    float s = 0.0f;
    for (uint j = tid; j < p.n; j += threads) s += xr[j] * xr[j];
    const float r = rsqrt(threadgroup_reduce(s, false, partials, lane, simd, simdgroups) / float(p.n) + p.epsilon);
    for (uint j = tid; j < p.n; j += threads) y[row * p.n + j] = xr[j] * r * (p.offset + weight[j]);
}
