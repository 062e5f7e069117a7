// Convolution and pooling over NCHW (1-D as H = 1): direct, one output element per thread; global pooling one
// threadgroup per (n, c) with simdgroup reductions.

struct ConvParams {
    uint n;
    uint c_in;
    uint h;
    uint w;
    uint c_out;
    uint oh;
    uint ow;
    uint kh;
    uint kw;
    uint stride_h;
    uint stride_w;
    int pad_h;
    int pad_w;
    uint dil_h;
    uint dil_w;
    uint groups;
    uint has_bias;
    uint act;  // a fused activation (unary_op code; 0: none)
    float act_alpha;
    float act_beta;
};

kernel void conv2d_f32(device const float* x [[buffer(0)]], device const float* weight [[buffer(1)]],
                       device const float* bias [[buffer(2)]], device float* y [[buffer(3)]],
                       constant ConvParams& p [[buffer(4)]], uint i [[thread_position_in_grid]]) {
    const uint total = p.n * p.c_out * p.oh * p.ow;
    if (i >= total) return;
    const uint ox = i % p.ow, oy = (i / p.ow) % p.oh, co = (i / (p.ow * p.oh)) % p.c_out, b = i / (p.ow * p.oh * p.c_out);
    const uint per_group_in = p.c_in / p.groups, per_group_out = p.c_out / p.groups;
    const uint g = co / per_group_out;
    float acc = p.has_bias != 0 ? bias[co] : 0.0f;
    for (uint ci = 0; ci < per_group_in; ++ci) {
        device const float* xc = x + (b * p.c_in + g * per_group_in + ci) * p.h * p.w;
        device const float* wc = weight + (co * per_group_in + ci) * p.kh * p.kw;
        for (uint ky = 0; ky < p.kh; ++ky) {
            const int iy = int(oy * p.stride_h + ky * p.dil_h) - p.pad_h;
            if (iy < 0 || iy >= int(p.h)) continue;
            for (uint kx = 0; kx < p.kw; ++kx) {
                const int ix = int(ox * p.stride_w + kx * p.dil_w) - p.pad_w;
                if (ix >= 0 && ix < int(p.w)) acc += xc[uint(iy) * p.w + uint(ix)] * wc[ky * p.kw + kx];
            }
        }
    }
    y[i] = p.act != 0 ? unary_op(acc, p.act, p.act_alpha, p.act_beta) : acc;
}

struct PoolParams {
    uint planes;  // n * c
    uint h;
    uint w;
    uint oh;
    uint ow;
    uint kh;
    uint kw;
    uint stride_h;
    uint stride_w;
    int pad_h;
    int pad_w;
    uint dil_h;
    uint dil_w;
    uint is_max;
    uint count_include_pad;
    uint pad_h_end;  // the input's padded extent ends at h + pad_h_end (AveragePool counts padding up to there)
    uint pad_w_end;
};

kernel void pool2d_f32(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                       constant PoolParams& p [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= p.planes * p.oh * p.ow) return;
    const uint ox = i % p.ow, oy = (i / p.ow) % p.oh, plane = i / (p.ow * p.oh);
    device const float* xp = x + plane * p.h * p.w;
    float acc = p.is_max != 0 ? -INFINITY : 0.0f;
    uint count = 0;
    for (uint ky = 0; ky < p.kh; ++ky) {
        const int iy = int(oy * p.stride_h + ky * p.dil_h) - p.pad_h;
        for (uint kx = 0; kx < p.kw; ++kx) {
            const int ix = int(ox * p.stride_w + kx * p.dil_w) - p.pad_w;
            const bool inside = iy >= 0 && iy < int(p.h) && ix >= 0 && ix < int(p.w);
            if (inside) {
                const float v = xp[uint(iy) * p.w + uint(ix)];
                acc = p.is_max != 0 ? max(acc, v) : acc + v;
                ++count;
            } else if (p.count_include_pad != 0 && iy < int(p.h + p.pad_h_end) && ix < int(p.w + p.pad_w_end)) {
                ++count;  // a padding position inside the padded input
            }
        }
    }
    y[i] = p.is_max != 0 ? acc : acc / float(max(count, 1u));
}

struct GlobalPoolParams {
    uint n;  // elements per (batch, channel) plane
    uint is_max;
};

kernel void global_pool_f32(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                            constant GlobalPoolParams& p [[buffer(2)]], uint plane [[threadgroup_position_in_grid]],
                            uint tid [[thread_index_in_threadgroup]], uint threads [[threads_per_threadgroup]],
                            uint lane [[thread_index_in_simdgroup]], uint simd [[simdgroup_index_in_threadgroup]],
                            uint simdgroups [[simdgroups_per_threadgroup]]) {
    TG_ARRAY(float, partials, 32);
    float acc = p.is_max != 0 ? -INFINITY : 0.0f;
    for (uint j = tid; j < p.n; j += threads) {
        const float v = x[plane * p.n + j];
        acc = p.is_max != 0 ? max(acc, v) : acc + v;
    }
    const float total = threadgroup_reduce(acc, p.is_max != 0, partials, lane, simd, simdgroups);
    if (tid == 0) y[plane] = p.is_max != 0 ? total : total / float(p.n);
}
