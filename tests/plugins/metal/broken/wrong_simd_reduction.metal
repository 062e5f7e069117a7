// Row sums, one simdgroup per row, folded with simd_shuffle_down. The right tree halves the offset from 16; the
// wrong one starts at 8, so lanes 16..31 never reach lane 0.

struct RowParams {
    uint n;
};

kernel void row_sum_shuffle(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                            constant RowParams& p [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                            uint lane [[thread_index_in_simdgroup]]) {
    float v = 0.0f;
    for (uint j = lane; j < p.n; j += 32) v += x[row * p.n + j];
    for (ushort offset = 16; offset > 0; offset /= 2) v += simd_shuffle_down(v, offset);
    if (lane == 0) y[row] = v;
}

kernel void row_sum_wrong_tree(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                               constant RowParams& p [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                               uint lane [[thread_index_in_simdgroup]]) {
    float v = 0.0f;
    for (uint j = lane; j < p.n; j += 32) v += x[row * p.n + j];
    for (ushort offset = 8; offset > 0; offset /= 2) v += simd_shuffle_down(v, offset);  // the bug: from 8
    if (lane == 0) y[row] = v;
}

// simd_sum called by half the lanes only (the others have moved past it): on a GPU the sum covers the lanes that
// are active; here a lane that returned early is inactive too, but lanes that wait elsewhere make it diverge.
kernel void divergent_simd_sum(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                               constant RowParams& p [[buffer(2)]], uint row [[threadgroup_position_in_grid]],
                               uint lane [[thread_index_in_simdgroup]]) {
    float v = x[row * p.n + lane];
    if (lane < 16) v = simd_sum(v);
    else v = simd_max(v);
    if (lane == 0) y[row] = v;
}
