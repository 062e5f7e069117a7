// The gated delta rule of Gated DeltaNet (Qwen3.5, Qwen3-Next) over a chunk of tokens, with the recurrent state
// S[v_head, k_dim, v_dim] in device memory (float): per token, with decay a = exp(g) and write strength beta,
//     S = a S;  u = beta (v - S^T k);  S += k u^T;  o = scale S^T q.
// A decode step is a chunk of one token. One threadgroup per value head, one thread per value column j: column j
// of S is private to thread j, so the recurrence needs no reduction; the token's q and k (shared by every column)
// are staged in threadgroup memory, with a barrier before they are overwritten by the next token's.

#define GDR_MAX_KDIM 256

struct GatedDeltaParams {
    uint t;
    uint k_heads;
    uint v_heads;
    uint k_dim;
    uint v_dim;
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
            qs[i] = q[(t * p.k_heads + kh) * p.k_dim + i];
            ks[i] = k[(t * p.k_heads + kh) * p.k_dim + i];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (j < p.v_dim) {
            const float decay = exp(g[t * p.v_heads + h]), b = beta[t * p.v_heads + h];
            float recalled = 0.0f;
            for (uint i = 0; i < p.k_dim; ++i) recalled += s[i * p.v_dim + j] * ks[i];
            const float u = b * (v[(t * p.v_heads + h) * p.v_dim + j] - decay * recalled);
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
