// Weights of the LLM ops: block-quantised (hetero.contract.quant: 8-bit and 4-bit, symmetric or with a per-block
// minimum, blocks of 32/64/128) and float (f32, f16, bf16) rows of W[N, K].
//   qmatvec       decode's y = x W^T (+ bias) for up to 8 rows of x: one simdgroup per output row, lanes walk the
//                 row's blocks, dequantise in registers and accumulate in float, simd_sum folds the lanes.
//   dequant_f32   a prefill of quantised or bf16 weights dequantises W once to float and runs matmul_f32 (f32 and
//                 f16 weights go to matmul_f32 / matmul_f32_f16 as they are).
//   embedding     rows of the table looked up by token id, dequantised to float.

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

// Element j of row `r` of W, whatever its type.
static inline float weight_element(device const uchar* w, uint r, uint j, constant WeightParams& p) {
    device const uchar* row = w + r * p.row_bytes;
    switch (p.wtype) {
        case 0: return ((device const float*)row)[j];
        case 1: return float(((device const half*)row)[j]);
        case 2: return as_type<float>(uint(((device const ushort*)row)[j]) << 16);
        default: return quant_element(row, j, p);
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
    for (uint r = 0; r < MATVEC_MAX_ROWS; ++r) acc[r] = 0.0f;
    device const uchar* row = w + n * p.row_bytes;
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
                for (uint r = 0; r < p.m; ++r) acc[r] += v * x[r * p.k + first + i];
            }
        }
    } else {
        for (uint j = lane; j < p.k; j += SIMD_WIDTH) {
            const float v = weight_element(w, n, j, p);
            for (uint r = 0; r < p.m; ++r) acc[r] += v * x[r * p.k + j];
        }
    }
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
