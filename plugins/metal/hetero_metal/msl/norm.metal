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

// Reductions over any set of axes (ReduceSum, Mean, Max, Min, L1, L2, SumSquare, LogSum, LogSumExp). The host
// views x with the kept axes first and the reduced ones last; meta holds that view's dims, then its strides
// (elements). One threadgroup per output element: its threads walk the reduced elements, then threadgroup_reduce.
struct ReduceParams {
    uint inner;  // elements reduced into one output
    uint rank;   // dims of the view
    uint kept;   // leading dims of the view that are kept
    uint op;     // 0 sum, 1 mean, 2 max, 3 min, 4 l1, 5 l2, 6 sum_square, 7 log_sum, 8 log_sum_exp
};

static inline int strided_offset(uint j, device const int* dims, device const int* strides, uint from, uint to) {
    int at = 0;
    for (uint d = to; d-- > from;) {
        const uint dim = uint(dims[d]);
        at += int(j % dim) * strides[d];
        j /= dim;
    }
    return at;
}

kernel void reduce_f32(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                       device const int* meta [[buffer(2)]], constant ReduceParams& p [[buffer(3)]],
                       uint row [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                       uint threads [[threads_per_threadgroup]], uint lane [[thread_index_in_simdgroup]],
                       uint simd [[simdgroup_index_in_threadgroup]],
                       uint simdgroups [[simdgroups_per_threadgroup]]) {
    TG_ARRAY(float, partials, 32);
    device const int* dims = meta;
    device const int* strides = meta + p.rank;
    device const float* xr = x + strided_offset(row, dims, strides, 0, p.kept);
    const bool extreme = p.op == 2 || p.op == 3 || p.op == 8;
    const float sign = p.op == 3 ? -1.0f : 1.0f;  // min is -max(-x)
    float m = 0.0f;
    if (extreme) {
        float v = -INFINITY;
        for (uint j = tid; j < p.inner; j += threads) v = max(v, sign * xr[strided_offset(j, dims, strides, p.kept, p.rank)]);
        m = threadgroup_reduce(v, true, partials, lane, simd, simdgroups);
        if (p.op != 8) {
            if (tid == 0) y[row] = sign * m;
            return;
        }
        if (!isfinite(m)) m = 0.0f;
    }
    float s = 0.0f;
    for (uint j = tid; j < p.inner; j += threads) {
        const float v = xr[strided_offset(j, dims, strides, p.kept, p.rank)];
        s += p.op == 8 ? exp(v - m) : p.op == 4 ? fabs(v) : (p.op == 5 || p.op == 6) ? v * v : v;
    }
    s = threadgroup_reduce(s, false, partials, lane, simd, simdgroups);
    if (tid != 0) return;
    y[row] = p.op == 1 ? s / float(p.inner) : p.op == 5 ? sqrt(s) : p.op == 7 ? log(s) : p.op == 8 ? log(s) + m : s;
}
