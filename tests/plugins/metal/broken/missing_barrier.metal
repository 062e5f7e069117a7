// softmax_f32 of norm.metal with the barrier after the simdgroups' partials are written taken out: threads read
// partials other simdgroups may not have written yet.

static inline float reduce_without_barrier(float v, bool is_max, TG_PTR(float) partials, uint lane, uint simd,
                                           uint simdgroups) {
    v = is_max ? simd_max(v) : simd_sum(v);
    if (lane == 0) partials[simd] = v;
    float total = partials[0];
    for (uint s = 1; s < simdgroups; ++s) total = is_max ? max(total, float(partials[s])) : total + partials[s];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return total;
}

struct SoftmaxParams {
    uint n;
    uint inner;
    uint log_softmax;
};

kernel void softmax_missing_barrier(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                                    constant SoftmaxParams& p [[buffer(2)]],
                                    uint row [[threadgroup_position_in_grid]],
                                    uint tid [[thread_index_in_threadgroup]], uint threads [[threads_per_threadgroup]],
                                    uint lane [[thread_index_in_simdgroup]],
                                    uint simd [[simdgroup_index_in_threadgroup]],
                                    uint simdgroups [[simdgroups_per_threadgroup]]) {
    TG_ARRAY(float, partials, 32);
    const uint base = row * p.n;
    float m = -INFINITY;
    for (uint j = tid; j < p.n; j += threads) m = max(m, x[base + j]);
    m = reduce_without_barrier(m, true, partials, lane, simd, simdgroups);
    float s = 0.0f;
    for (uint j = tid; j < p.n; j += threads) s += exp(x[base + j] - m);
    s = reduce_without_barrier(s, false, partials, lane, simd, simdgroups);
    for (uint j = tid; j < p.n; j += threads) y[base + j] = exp(x[base + j] - m) / s;
}
