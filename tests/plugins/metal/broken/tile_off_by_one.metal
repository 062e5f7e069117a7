// matmul_f32 of matmul.metal with an off-by-one in the A tile: the tile's rows are read one row too far (the
// tile is 32 rows, the loop loads 33), which writes past the threadgroup array.

#define TILE 32
#define TILE_K 16

struct MatmulParams {
    uint m;
    uint n;
    uint k;
};

kernel void matmul_tile_off_by_one(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                                   device float* c [[buffer(2)]], constant MatmulParams& p [[buffer(3)]],
                                   uint2 group [[threadgroup_position_in_grid]],
                                   uint tid [[thread_index_in_threadgroup]],
                                   uint simd [[simdgroup_index_in_threadgroup]]) {
    TG_ARRAY(float, as, TILE * TILE_K);
    TG_ARRAY(float, bs, TILE_K * TILE);
    TG_ARRAY(float, cs, TILE * TILE);
    const uint m0 = group.y * TILE, n0 = group.x * TILE;
    const uint sm = (simd / 2) * 16, sn = (simd % 2) * 16;
    simdgroup_float8x8 acc[2][2];
    for (uint i = 0; i < 2; ++i)
        for (uint j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k0 = 0; k0 < p.k; k0 += TILE_K) {
        for (uint e = tid; e < (TILE + 1) * TILE_K; e += 128) {  // the bug: TILE + 1 rows
            const uint r = e / TILE_K, col = e % TILE_K, gm = m0 + r, gk = k0 + col;
            as[e] = gm < p.m && gk < p.k ? a[gm * p.k + gk] : 0.0f;
        }
        for (uint e = tid; e < TILE_K * TILE; e += 128) {
            const uint r = e / TILE, col = e % TILE, gk = k0 + r, gn = n0 + col;
            bs[e] = gk < p.k && gn < p.n ? b[gk * p.n + gn] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint kk = 0; kk < TILE_K; kk += 8) {
            simdgroup_float8x8 ma[2], mb[2];
            for (uint i = 0; i < 2; ++i) simdgroup_load(ma[i], as + (sm + 8 * i) * TILE_K + kk, TILE_K);
            for (uint j = 0; j < 2; ++j) simdgroup_load(mb[j], bs + kk * TILE + sn + 8 * j, TILE);
            for (uint i = 0; i < 2; ++i)
                for (uint j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], ma[i], mb[j], acc[i][j]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint i = 0; i < 2; ++i)
        for (uint j = 0; j < 2; ++j) simdgroup_store(acc[i][j], cs + (sm + 8 * i) * TILE + sn + 8 * j, TILE);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < TILE * TILE; e += 128) {
        const uint r = e / TILE, col = e % TILE;
        if (m0 + r < p.m && n0 + col < p.n) c[(m0 + r) * p.n + n0 + col] = cs[e];
    }
}

// The product with the C tile's rows shifted by one when written back: no fault for the emulator to see, only
// wrong values (the comparison with numpy catches it).
kernel void matmul_store_shifted(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                                 device float* c [[buffer(2)]], constant MatmulParams& p [[buffer(3)]],
                                 uint2 group [[threadgroup_position_in_grid]],
                                 uint tid [[thread_index_in_threadgroup]],
                                 uint simd [[simdgroup_index_in_threadgroup]]) {
    TG_ARRAY(float, cs, TILE * TILE);
    const uint m0 = group.y * TILE, n0 = group.x * TILE;
    const uint sm = (simd / 2) * 16, sn = (simd % 2) * 16;
    for (uint i = 0; i < 2; ++i)
        for (uint j = 0; j < 2; ++j) {
            simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
            for (uint k0 = 0; k0 < p.k; k0 += 8) {
                // operands straight from device memory (m, n multiples of 32 and k of 8 in the test)
                simdgroup_float8x8 ma, mb;
                simdgroup_load(ma, a + (m0 + sm + 8 * i) * p.k + k0, p.k);
                simdgroup_load(mb, b + k0 * p.n + n0 + sn + 8 * j, p.n);
                simdgroup_multiply_accumulate(acc, ma, mb, acc);
            }
            simdgroup_store(acc, cs + (sm + 8 * i) * TILE + sn + 8 * j, TILE);
        }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint e = tid; e < TILE * TILE; e += 128) {
        const uint r = e / TILE, col = e % TILE;
        const uint src = (r + 1) % TILE;  // the bug: row r takes row r + 1 of the tile
        if (m0 + r < p.m && n0 + col < p.n) c[(m0 + r) * p.n + n0 + col] = cs[src * TILE + col];
    }
}
