// The GatedDeltaRule op of Gated DeltaNet (Qwen3.5, Qwen3-Next), in the order a step runs them:
//   gdn_conv           the depthwise causal convolution over the pre-conv history (K - 1 earlier rows, then the
//                      new ones) with its bias and SiLU;
//   gdn_l2norm         q and k heads normalised in place (one simdgroup per head and token, simd_sum);
//   gdn_gates          decay g and write strength beta from the raw projections (Gated DeltaNet's gating);
//   gated_delta_chunk  the gated delta rule over a chunk of tokens, the recurrent state S[v_head, k_dim, v_dim] in
//                      device memory (float): per token, with decay a = exp(g) and write strength beta,
//                          S = a S;  u = beta (v - S^T k);  S += k u^T;  o = scale S^T q.
//                      A decode step is a chunk of one token. One threadgroup per value head, one thread per value
//                      column j: column j of S is private to thread j, so the recurrence needs no reduction; the
//                      token's q and k (shared by every column) are staged in threadgroup memory, with a barrier
//                      before they are overwritten by the next token's. q, k and v are read in place from the
//                      convolution's rows (row strides qk_row, v_row);
//   gdn_gated_norm     rmsnorm(o_h) * weight * silu(z_h) per value head, in place.

#define GDR_MAX_KDIM 256

struct GatedDeltaParams {
    uint t;
    uint k_heads;
    uint v_heads;
    uint k_dim;
    uint v_dim;
    uint qk_row;  // floats from one token's q (and k) row to the next
    uint v_row;   // floats from one token's v row to the next
    float scale;
};

kernel void gated_delta_chunk(device const float* q [[buffer(0)]], device const float* k [[buffer(1)]],
                              device const float* v [[buffer(2)]], device const float* g [[buffer(3)]],
                              device const float* beta [[buffer(4)]], device float* state [[buffer(5)]],
                              device float* out [[buffer(6)]], constant GatedDeltaParams& p [[buffer(7)]],
                              uint h [[threadgroup_position_in_grid]], uint j [[thread_index_in_threadgroup]],
                              uint threads [[threads_per_threadgroup]]) {
    TG_ARRAY(float, qs, GDR_MAX_KDIM);
    TG_ARRAY(float, ks, GDR_MAX_KDIM);
    const uint kh = h / (p.v_heads / p.k_heads);
    device float* s = state + h * p.k_dim * p.v_dim;
    for (uint t = 0; t < p.t; ++t) {
        for (uint i = j; i < p.k_dim; i += threads) {
            qs[i] = q[t * p.qk_row + kh * p.k_dim + i];
            ks[i] = k[t * p.qk_row + kh * p.k_dim + i];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (j < p.v_dim) {
            const float decay = exp(g[t * p.v_heads + h]), b = beta[t * p.v_heads + h];
            float recalled = 0.0f;
            for (uint i = 0; i < p.k_dim; ++i) recalled += s[i * p.v_dim + j] * ks[i];
            const float u = b * (v[t * p.v_row + h * p.v_dim + j] - decay * recalled);
            float o = 0.0f;
            for (uint i = 0; i < p.k_dim; ++i) {
                const float updated = decay * s[i * p.v_dim + j] + ks[i] * u;
                s[i * p.v_dim + j] = updated;
                o += updated * qs[i];
            }
            out[(t * p.v_heads + h) * p.v_dim + j] = p.scale * o;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // qs / ks are overwritten by the next token
    }
}

struct GdnConvParams {
    uint t;
    uint channels;
    uint taps;
    uint has_bias;
    uint silu;
};

// window: [taps - 1 + t, channels] (history rows, then the new rows); w: [channels, taps]. One thread per output.
kernel void gdn_conv(device const float* window [[buffer(0)]], device const float* w [[buffer(1)]],
                     device const float* bias [[buffer(2)]], device float* out [[buffer(3)]],
                     constant GdnConvParams& p [[buffer(4)]], uint2 pos [[thread_position_in_grid]]) {
    const uint c = pos.x, t = pos.y;
    if (c >= p.channels || t >= p.t) return;
    float acc = p.has_bias ? bias[c] : 0.0f;
    for (uint j = 0; j < p.taps; ++j) acc += window[(t + j) * p.channels + c] * w[c * p.taps + j];
    out[t * p.channels + c] = p.silu ? acc / (1.0f + exp(-acc)) : acc;
}

struct GdnNormParams {
    uint heads;   // heads per row
    uint dim;     // floats per head
    uint row;     // floats from one token's row to the next
    uint has_gate;
    float eps;
};

// x / sqrt(sum(x^2) + eps) per head of dim floats (q and k, contiguous at the start of each row): one simdgroup
// per (head, token).
kernel void gdn_l2norm(device float* x [[buffer(0)]], constant GdnNormParams& p [[buffer(1)]],
                       uint2 group [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
    device float* r = x + group.y * p.row + group.x * p.dim;
    float squares = 0.0f;
    for (uint i = lane; i < p.dim; i += SIMD_WIDTH) squares += r[i] * r[i];
    const float inv = 1.0f / sqrt(simd_sum(squares) + p.eps);
    for (uint i = lane; i < p.dim; i += SIMD_WIDTH) r[i] *= inv;
}

// o = rmsnorm(o) * weight * silu(z) per value head of dim floats, in place: one simdgroup per (head, token).
kernel void gdn_gated_norm(device float* o [[buffer(0)]], device const float* z [[buffer(1)]],
                           device const float* weight [[buffer(2)]], constant GdnNormParams& p [[buffer(3)]],
                           uint2 group [[threadgroup_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
    const uint at = group.y * p.row + group.x * p.dim;
    device float* r = o + at;
    float squares = 0.0f;
    for (uint i = lane; i < p.dim; i += SIMD_WIDTH) squares += r[i] * r[i];
    const float inv = 1.0f / sqrt(simd_sum(squares) / float(p.dim) + p.eps);
    for (uint i = lane; i < p.dim; i += SIMD_WIDTH) {
        const float gate = p.has_gate ? z[at + i] / (1.0f + exp(-z[at + i])) : 1.0f;
        r[i] = r[i] * inv * weight[i] * gate;
    }
}

struct GdnGateParams {
    uint n;       // tokens * heads
    uint heads;
    uint gating;  // 0: a and b are g and beta already
};

// g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b): one thread per (token, head).
kernel void gdn_gates(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                      device const float* a_log [[buffer(2)]], device const float* dt_bias [[buffer(3)]],
                      device float* g [[buffer(4)]], device float* beta [[buffer(5)]],
                      constant GdnGateParams& p [[buffer(6)]], uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    if (p.gating == 0) {
        g[i] = a[i];
        beta[i] = b[i];
        return;
    }
    const uint h = i % p.heads;
    const float x = a[i] + dt_bias[h];
    const float softplus = x > 20.0f ? x : (x < -20.0f ? exp(x) : log(1.0f + exp(x)));
    g[i] = -exp(a_log[h]) * softplus;
    beta[i] = 1.0f / (1.0f + exp(-b[i]));
}
