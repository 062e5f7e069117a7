// Weights of the LLM ops: block-quantised (hetero.contract.quant: 8-bit and 4-bit, symmetric or with a per-block
// minimum, blocks of 32/64/128) and float (f32, f16, bf16) rows of W[N, K].
//   qmatvec       decode's y = x W^T (+ bias) for up to 8 rows of x: one simdgroup per output row, lanes walk the
//                 row's blocks, dequantise in registers and accumulate in float, simd_sum folds the lanes.
//   dequant_f32   a prefill of quantised or bf16 weights dequantises W once to float and runs matmul_f32 (f32 and
//                 f16 weights go to matmul_f32 / matmul_f32_f16 as they are).
//   embedding     rows of the table looked up by token id, dequantised to float.
//   moe_*         the routed experts of a MoE layer: moe_route (softmax and top-k of the router's logits),
//                 moe_gate_up and moe_down (each chosen (token, expert) pair's SwiGLU MLP, one simdgroup per output
//                 as in qmatvec, reading the expert's rows of the stacked weights), moe_combine (the weighted sum).

#define MATVEC_MAX_ROWS 8

struct WeightParams {
    uint m;             // rows of x
    uint n;             // rows of W (outputs)
    uint k;             // elements per row
    uint row_bytes;
    uint wtype;         // 0 f32, 1 f16, 2 bf16, 3 block-quantised
    uint bits;          // 8 or 4
    uint symmetric;
    uint block_size;
    uint block_bytes;
    uint header_bytes;  // 2 (d) or 4 (d, m)
    uint has_bias;
};

// Element j of one quantised row.
static inline float quant_element(device const uchar* row, uint j, constant WeightParams& p) {
    const uint b = j / p.block_size, i = j % p.block_size;
    device const uchar* block = row + b * p.block_bytes;
    const float d = f16_at(block, 0);
    int q;
    if (p.bits == 8) {
        q = p.symmetric != 0 ? s8(block[p.header_bytes + i]) : int(block[p.header_bytes + i]);
    } else {
        const uint half_block = p.block_size / 2;
        const uchar packed = block[p.header_bytes + (i % half_block)];
        q = int(i < half_block ? (packed & 15) : (packed >> 4));
        if (p.symmetric != 0) q -= 8;
    }
    return p.symmetric != 0 ? d * float(q) : d * float(q) + f16_at(block, 2);
}

// Element j of one row of W, whatever its type.
static inline float row_element(device const uchar* row, uint j, constant WeightParams& p) {
    switch (p.wtype) {
        case 0: return ((device const float*)row)[j];
        case 1: return float(((device const half*)row)[j]);
        case 2: return as_type<float>(uint(((device const ushort*)row)[j]) << 16);
        default: return quant_element(row, j, p);
    }
}

// Element j of row `r` of W.
static inline float weight_element(device const uchar* w, uint r, uint j, constant WeightParams& p) {
    return row_element(w + r * p.row_bytes, j, p);
}

// This lane's share of row `row` of W times `rows` rows of x (p.k apart): acc[r] += W[row, j] * x[r * p.k + j]
// over j in the lane's blocks (quantised: the block header read once) or elements; simd_sum folds the lanes.
static inline void lane_row_products(device const uchar* row, device const float* x, uint rows, uint lane,
                                     constant WeightParams& p, thread float* acc) {
    for (uint r = 0; r < rows; ++r) acc[r] = 0.0f;
    if (p.wtype == 3) {
        // lane l takes blocks l, l + 32, ...: the block header is read once per block
        const uint blocks = (p.k + p.block_size - 1) / p.block_size;
        for (uint b = lane; b < blocks; b += SIMD_WIDTH) {
            device const uchar* block = row + b * p.block_bytes;
            const float d = f16_at(block, 0);
            const float mn = p.symmetric != 0 ? 0.0f : f16_at(block, 2);
            device const uchar* qs = block + p.header_bytes;
            const uint first = b * p.block_size, count = min(p.block_size, p.k - first);
            const uint half_block = p.block_size / 2;
            for (uint i = 0; i < count; ++i) {
                int q;
                if (p.bits == 8) {
                    q = p.symmetric != 0 ? s8(qs[i]) : int(qs[i]);
                } else {
                    const uchar packed = qs[i % half_block];
                    q = int(i < half_block ? (packed & 15) : (packed >> 4)) - (p.symmetric != 0 ? 8 : 0);
                }
                const float v = d * float(q) + mn;
                for (uint r = 0; r < rows; ++r) acc[r] += v * x[r * p.k + first + i];
            }
        }
    } else {
        for (uint j = lane; j < p.k; j += SIMD_WIDTH) {
            const float v = row_element(row, j, p);
            for (uint r = 0; r < rows; ++r) acc[r] += v * x[r * p.k + j];
        }
    }
}

kernel void qmatvec(device const float* x [[buffer(0)]], device const uchar* w [[buffer(1)]],
                    device const float* bias [[buffer(2)]], device float* y [[buffer(3)]],
                    constant WeightParams& p [[buffer(4)]], uint group [[threadgroup_position_in_grid]],
                    uint simd [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]],
                    uint lane [[thread_index_in_simdgroup]]) {
    const uint n = group * simdgroups + simd;
    if (n >= p.n) return;  // a whole simdgroup leaves together: no collective is left waiting
    float acc[MATVEC_MAX_ROWS];
    lane_row_products(w + n * p.row_bytes, x, p.m, lane, p, acc);
    for (uint r = 0; r < p.m; ++r) {
        const float total = simd_sum(acc[r]);
        if (lane == 0) y[r * p.n + n] = total + (p.has_bias != 0 ? bias[n] : 0.0f);
    }
}

kernel void dequant_f32(device const uchar* w [[buffer(0)]], device float* out [[buffer(1)]],
                        constant WeightParams& p [[buffer(2)]], uint2 pos [[thread_position_in_grid]]) {
    if (pos.x < p.k && pos.y < p.n) out[pos.y * p.k + pos.x] = weight_element(w, pos.y, pos.x, p);
}

kernel void embedding(device const long* ids [[buffer(0)]], device const uchar* table [[buffer(1)]],
                      device float* out [[buffer(2)]], constant WeightParams& p [[buffer(3)]],
                      uint2 pos [[thread_position_in_grid]]) {
    // p.m: tokens, p.n: vocabulary (ids are checked on the host), p.k: row length
    if (pos.x < p.k && pos.y < p.m) out[pos.y * p.k + pos.x] = weight_element(table, uint(ids[pos.y]), pos.x, p);
}

// -- MoE: the routed experts ---------------------------------------------------------------------------------------
struct MoeParams {
    uint tokens;
    uint experts;
    uint top_k;
    uint normalize;  // 1: the chosen weights renormalised to sum to 1
    uint hidden;
    uint inter;
};

// One thread per token: softmax over the router's logits [T, E], the top_k experts by descending probability (ties
// to the lower index, as the reference's stable sort) and their weights.
kernel void moe_route(device const float* logits [[buffer(0)]], device uint* chosen [[buffer(1)]],
                      device float* weights [[buffer(2)]], constant MoeParams& p [[buffer(3)]],
                      uint t [[thread_position_in_grid]]) {
    if (t >= p.tokens) return;
    device const float* l = logits + t * p.experts;
    float top = -INFINITY;
    for (uint e = 0; e < p.experts; ++e) top = max(top, l[e]);
    float sum = 0.0f;
    for (uint e = 0; e < p.experts; ++e) sum += exp(l[e] - top);
    float picked = 0.0f, last = INFINITY;
    int last_e = -1;
    for (uint k = 0; k < p.top_k; ++k) {
        int best = -1;
        float best_v = -INFINITY;
        for (uint e = 0; e < p.experts; ++e) {
            const float v = l[e];
            const bool after = v < last || (v == last && int(e) > last_e);  // after the last pick in the order
            if (after && (best < 0 || v > best_v)) {
                best = int(e);
                best_v = v;
            }
        }
        const float w = exp(best_v - top) / sum;
        chosen[t * p.top_k + k] = uint(best);
        weights[t * p.top_k + k] = w;
        picked += w;
        last = best_v;
        last_e = best;
    }
    if (p.normalize != 0)
        for (uint k = 0; k < p.top_k; ++k) weights[t * p.top_k + k] /= picked;
}

// h[r, i] = silu(gate_e[i] . x[t]) * (up_e[i] . x[t]) for pair r = t * top_k + slot and its expert e: one simdgroup
// per i (threadgroup x), the pairs along y. gate / up: [E, I, row_bytes(H)], the format `w` describes (k = H).
kernel void moe_gate_up(device const float* x [[buffer(0)]], device const uint* chosen [[buffer(1)]],
                        device const uchar* gate [[buffer(2)]], device const uchar* up [[buffer(3)]],
                        device float* h [[buffer(4)]], constant WeightParams& w [[buffer(5)]],
                        constant MoeParams& p [[buffer(6)]], uint2 group [[threadgroup_position_in_grid]],
                        uint simd [[simdgroup_index_in_threadgroup]], uint simdgroups [[simdgroups_per_threadgroup]],
                        uint lane [[thread_index_in_simdgroup]]) {
    const uint i = group.x * simdgroups + simd, r = group.y;
    if (i >= p.inter) return;
    const uint offset = (chosen[r] * p.inter + i) * w.row_bytes;
    device const float* xt = x + (r / p.top_k) * p.hidden;
    float g[1], u[1];
    lane_row_products(gate + offset, xt, 1, lane, w, g);
    lane_row_products(up + offset, xt, 1, lane, w, u);
    const float gs = simd_sum(g[0]), us = simd_sum(u[0]);
    if (lane == 0) h[r * p.inter + i] = gs / (1.0f + exp(-gs)) * us;
}

// part[r, j] = down_e[j] . h[r]: down [E, H, row_bytes(I)] in the format `w` describes (k = I).
kernel void moe_down(device const float* h [[buffer(0)]], device const uint* chosen [[buffer(1)]],
                     device const uchar* down [[buffer(2)]], device float* part [[buffer(3)]],
                     constant WeightParams& w [[buffer(4)]], constant MoeParams& p [[buffer(5)]],
                     uint2 group [[threadgroup_position_in_grid]], uint simd [[simdgroup_index_in_threadgroup]],
                     uint simdgroups [[simdgroups_per_threadgroup]], uint lane [[thread_index_in_simdgroup]]) {
    const uint j = group.x * simdgroups + simd, r = group.y;
    if (j >= p.hidden) return;
    float acc[1];
    lane_row_products(down + (chosen[r] * p.hidden + j) * w.row_bytes, h + r * p.inter, 1, lane, w, acc);
    const float total = simd_sum(acc[0]);
    if (lane == 0) part[r * p.hidden + j] = total;
}

// y[t, j] = sum over slots of weight * part[t * top_k + slot, j], the slots in order.
kernel void moe_combine(device const float* part [[buffer(0)]], device const float* weights [[buffer(1)]],
                        device float* y [[buffer(2)]], constant MoeParams& p [[buffer(3)]],
                        uint2 pos [[thread_position_in_grid]]) {
    const uint j = pos.x, t = pos.y;
    if (j >= p.hidden || t >= p.tokens) return;
    float acc = 0.0f;
    for (uint k = 0; k < p.top_k; ++k) acc += weights[t * p.top_k + k] * part[(t * p.top_k + k) * p.hidden + j];
    y[t * p.hidden + j] = acc;
}
