// Causal grouped-query attention over a half-precision KV cache (the hetero Attention op, kv_dtype "f16").
//   kv_append       writes the new k / v rows, rounded to half, at cache positions [past_len, past_len + T).
//   attention_f16kv one threadgroup per (query row, query head): 4 simdgroups share the visible positions (every
//                   4th), each keeps an online softmax (running max, sum and weighted values, in float) with lanes
//                   splitting head_dim: a position's score is one simd_sum of the lanes' partial dot products. The
//                   simdgroups' partial results are merged through threadgroup memory.

#define ATTN_SIMDGROUPS 4
#define ATTN_MAX_DIM 256
#define ATTN_DIMS_PER_LANE (ATTN_MAX_DIM / 32)

struct AttentionParams {
    uint t;          // new tokens (query rows)
    uint q_heads;
    uint kv_heads;
    uint dim;        // head_dim (at most 256)
    uint past_len;
    uint context;    // cache length in positions
    float scale;
};

kernel void kv_append(device const float* k [[buffer(0)]], device const float* v [[buffer(1)]],
                      device half* k_cache [[buffer(2)]], device half* v_cache [[buffer(3)]],
                      constant AttentionParams& p [[buffer(4)]], uint3 pos [[thread_position_in_grid]]) {
    // pos: (dim, kv head, token); cache layout [kv_heads, context, dim]
    if (pos.x >= p.dim || pos.y >= p.kv_heads || pos.z >= p.t) return;
    const uint src = (pos.z * p.kv_heads + pos.y) * p.dim + pos.x;
    const uint dst = (pos.y * p.context + p.past_len + pos.z) * p.dim + pos.x;
    k_cache[dst] = half(k[src]);
    v_cache[dst] = half(v[src]);
}

kernel void attention_f16kv(device const float* q [[buffer(0)]], device const half* k_cache [[buffer(1)]],
                            device const half* v_cache [[buffer(2)]], device float* out [[buffer(3)]],
                            constant AttentionParams& p [[buffer(4)]], uint2 group [[threadgroup_position_in_grid]],
                            uint simd [[simdgroup_index_in_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    TG_ARRAY(float, part_max, ATTN_SIMDGROUPS);
    TG_ARRAY(float, part_sum, ATTN_SIMDGROUPS);
    TG_ARRAY(float, part_acc, ATTN_SIMDGROUPS * ATTN_MAX_DIM);
    const uint h = group.x, row = group.y;
    const uint kv_head = h / (p.q_heads / p.kv_heads);
    const uint visible = p.past_len + row + 1;
    device const float* qr = q + (row * p.q_heads + h) * p.dim;
    float qv[ATTN_DIMS_PER_LANE], acc[ATTN_DIMS_PER_LANE];
    for (uint i = 0; i < ATTN_DIMS_PER_LANE; ++i) {
        const uint d = lane + i * SIMD_WIDTH;
        qv[i] = d < p.dim ? qr[d] * p.scale : 0.0f;
        acc[i] = 0.0f;
    }
    float running_max = -INFINITY, running_sum = 0.0f;
    for (uint pos = simd; pos < visible; pos += ATTN_SIMDGROUPS) {
        device const half* kr = k_cache + (kv_head * p.context + pos) * p.dim;
        device const half* vr = v_cache + (kv_head * p.context + pos) * p.dim;
        float partial = 0.0f;
        for (uint i = 0; i < ATTN_DIMS_PER_LANE; ++i) {
            const uint d = lane + i * SIMD_WIDTH;
            if (d < p.dim) partial += qv[i] * float(kr[d]);
        }
        const float score = simd_sum(partial);
        const float new_max = max(running_max, score);
        const float correction = exp(running_max - new_max), weight = exp(score - new_max);
        running_sum = running_sum * correction + weight;
        for (uint i = 0; i < ATTN_DIMS_PER_LANE; ++i) {
            const uint d = lane + i * SIMD_WIDTH;
            acc[i] = acc[i] * correction + (d < p.dim ? weight * float(vr[d]) : 0.0f);
        }
        running_max = new_max;
    }
    if (lane == 0) {
        part_max[simd] = running_max;
        part_sum[simd] = running_sum;
    }
    for (uint i = 0; i < ATTN_DIMS_PER_LANE; ++i) {
        const uint d = lane + i * SIMD_WIDTH;
        if (d < p.dim) part_acc[simd * ATTN_MAX_DIM + d] = acc[i];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (simd != 0) return;  // simdgroup 0 merges (no barrier follows)
    float total_max = part_max[0];
    for (uint s = 1; s < ATTN_SIMDGROUPS; ++s) total_max = max(total_max, float(part_max[s]));
    float total_sum = 0.0f, factors[ATTN_SIMDGROUPS];
    for (uint s = 0; s < ATTN_SIMDGROUPS; ++s) {
        factors[s] = part_sum[s] > 0.0f ? exp(part_max[s] - total_max) : 0.0f;
        total_sum += part_sum[s] * factors[s];
    }
    for (uint i = 0; i < ATTN_DIMS_PER_LANE; ++i) {
        const uint d = lane + i * SIMD_WIDTH;
        if (d >= p.dim) continue;
        float value = 0.0f;
        for (uint s = 0; s < ATTN_SIMDGROUPS; ++s)
            if (factors[s] > 0.0f) value += part_acc[s * ATTN_MAX_DIM + d] * factors[s];
        out[(row * p.q_heads + h) * p.dim + d] = value / total_sum;
    }
}

struct RopeParams {
    uint t;
    uint heads;
    uint dim;
    uint rotary_dim;
    uint past_len;
};

// NeoX (rotate-half) rotary embedding at positions past_len + row. table[position][0 | 1][i]: cos and sin of
// position * inv_freq[i], computed on the host in float64 like the reference. One thread per output element.
kernel void rope(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 device const float* table [[buffer(2)]], constant RopeParams& p [[buffer(3)]],
                 uint3 pos [[thread_position_in_grid]]) {
    const uint d = pos.x, h = pos.y, row = pos.z;
    if (d >= p.dim || h >= p.heads || row >= p.t) return;
    device const float* xr = x + (row * p.heads + h) * p.dim;
    const uint half_rot = p.rotary_dim / 2;
    float value = xr[d];
    if (d < p.rotary_dim) {
        const uint i = d % half_rot;
        device const float* angles = table + (p.past_len + row) * 2 * half_rot;
        const float c = angles[i], s = angles[half_rot + i];
        value = d < half_rot ? xr[d] * c - xr[d + half_rot] * s : xr[d] * c + xr[i] * s;
    }
    y[(row * p.heads + h) * p.dim + d] = value;
}
