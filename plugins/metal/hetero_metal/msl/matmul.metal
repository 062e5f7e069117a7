// Matrix products on simdgroup_matrix tiles: MatMul (batched, broadcast batches), Gemm, FusedMatMul (bias and
// activation in the epilogue) and the prefill side of QMatMul. A threadgroup of 4 simdgroups computes a 32x32 tile of C; each simdgroup a 16x16 quarter as 2x2 8x8
// accumulators in float. A and B tiles (32x16 and 16x32, zero-padded at the edges) are staged in threadgroup memory
// in their own type (half inputs stay half: half the threadgroup traffic), and C goes through a float staging tile
// so the edge tiles are written with bounds checks.
//
// Element (m, k) of A is a[a_offset + m * a_row + k * a_col], (k, n) of B is b[b_offset + k * b_row + n * b_col]:
// strides express Gemm's transposes and QMatMul's [N, K] weights without copies. batch_offsets holds the A, B and
// C element offsets of each batch (threadgroup z).

#define TILE_M 32
#define TILE_N 32
#define TILE_K 16
#define MATMUL_THREADS 128

struct MatmulParams {
    uint m;
    uint n;
    uint k;
    uint a_row;
    uint a_col;
    uint b_row;
    uint b_col;
    float alpha;
    float beta;
    uint has_bias;  // C input of Gemm: y = alpha * A B + beta * bias, bias (m, n) at bias[m * bias_row + n * bias_col]
    uint bias_row;
    uint bias_col;
    uint act;  // a fused activation (unary_op code; 0: none) applied last
    float act_alpha;
    float act_beta;
};

template <typename TA, typename TB, typename TC>
static inline void matmul_tiles(device const TA* a, device const TB* b, device const float* bias, device TC* c,
                                device const uint* batch_offsets, constant MatmulParams& p, TG_PTR(TA) as,
                                TG_PTR(TB) bs, TG_PTR(float) cs, uint3 group, uint tid, uint simd) {
    const uint m0 = group.y * TILE_M, n0 = group.x * TILE_N;
    a += batch_offsets[3 * group.z];
    b += batch_offsets[3 * group.z + 1];
    const uint c_offset = batch_offsets[3 * group.z + 2];
    const uint sm = (simd / 2) * 16, sn = (simd % 2) * 16;  // this simdgroup's quarter of the tile
    simdgroup_float8x8 acc[2][2];
    for (uint i = 0; i < 2; ++i)
        for (uint j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k0 = 0; k0 < p.k; k0 += TILE_K) {
        for (uint e = tid; e < TILE_M * TILE_K; e += MATMUL_THREADS) {
            const uint r = e / TILE_K, col = e % TILE_K, gm = m0 + r, gk = k0 + col;
            as[e] = gm < p.m && gk < p.k ? TA(a[gm * p.a_row + gk * p.a_col]) : TA(0.0f);
        }
        for (uint e = tid; e < TILE_K * TILE_N; e += MATMUL_THREADS) {
            const uint r = e / TILE_N, col = e % TILE_N, gk = k0 + r, gn = n0 + col;
            bs[e] = gk < p.k && gn < p.n ? TB(b[gk * p.b_row + gn * p.b_col]) : TB(0.0f);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < TILE_K; kk += 8) {
            simdgroup_matrix<TA, 8, 8> ma[2];
            simdgroup_matrix<TB, 8, 8> mb[2];
            for (uint i = 0; i < 2; ++i) simdgroup_load(ma[i], as + (sm + 8 * i) * TILE_K + kk, TILE_K);
            for (uint j = 0; j < 2; ++j) simdgroup_load(mb[j], bs + kk * TILE_N + sn + 8 * j, TILE_N);
            for (uint i = 0; i < 2; ++i)
                for (uint j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], ma[i], mb[j], acc[i][j]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the tiles are overwritten by the next step
    }
    for (uint i = 0; i < 2; ++i)
        for (uint j = 0; j < 2; ++j) simdgroup_store(acc[i][j], cs + (sm + 8 * i) * TILE_N + sn + 8 * j, TILE_N);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < TILE_M * TILE_N; e += MATMUL_THREADS) {
        const uint r = e / TILE_N, col = e % TILE_N, gm = m0 + r, gn = n0 + col;
        if (gm >= p.m || gn >= p.n) continue;
        float v = p.alpha * cs[e];
        if (p.has_bias != 0) v += p.beta * bias[gm * p.bias_row + gn * p.bias_col];
        c[c_offset + gm * p.n + gn] = TC(p.act != 0 ? unary_op(v, p.act, p.act_alpha, p.act_beta) : v);
    }
}

kernel void matmul_f32(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                       device const float* bias [[buffer(2)]], device float* c [[buffer(3)]],
                       device const uint* batch_offsets [[buffer(4)]], constant MatmulParams& p [[buffer(5)]],
                       uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                       uint simd [[simdgroup_index_in_threadgroup]]) {
    TG_ARRAY(float, as, TILE_M * TILE_K);
    TG_ARRAY(float, bs, TILE_K * TILE_N);
    TG_ARRAY(float, cs, TILE_M * TILE_N);
    matmul_tiles<float, float, float>(a, b, bias, c, batch_offsets, p, as, bs, cs, group, tid, simd);
}

// float activations times half weights (f16 weights, or quantised ones dequantised to half for a prefill).
kernel void matmul_f32_f16(device const float* a [[buffer(0)]], device const half* b [[buffer(1)]],
                           device const float* bias [[buffer(2)]], device float* c [[buffer(3)]],
                           device const uint* batch_offsets [[buffer(4)]], constant MatmulParams& p [[buffer(5)]],
                           uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                           uint simd [[simdgroup_index_in_threadgroup]]) {
    TG_ARRAY(float, as, TILE_M * TILE_K);
    TG_ARRAY(half, bs, TILE_K * TILE_N);
    TG_ARRAY(float, cs, TILE_M * TILE_N);
    matmul_tiles<float, half, float>(a, b, bias, c, batch_offsets, p, as, bs, cs, group, tid, simd);
}

// float16 MatMul / Gemm: half tiles, float accumulation, half result.
kernel void matmul_f16(device const half* a [[buffer(0)]], device const half* b [[buffer(1)]],
                       device const float* bias [[buffer(2)]], device half* c [[buffer(3)]],
                       device const uint* batch_offsets [[buffer(4)]], constant MatmulParams& p [[buffer(5)]],
                       uint3 group [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]],
                       uint simd [[simdgroup_index_in_threadgroup]]) {
    TG_ARRAY(half, as, TILE_M * TILE_K);
    TG_ARRAY(half, bs, TILE_K * TILE_N);
    TG_ARRAY(float, cs, TILE_M * TILE_N);
    matmul_tiles<half, half, half>(a, b, bias, c, batch_offsets, p, as, bs, cs, group, tid, simd);
}
