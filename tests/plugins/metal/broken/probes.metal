// Small kernels that expose the emulator's semantics to the tests: half rounding and the simdgroup functions.

struct ProbeParams {
    uint n;
};

kernel void to_half(device const float* x [[buffer(0)]], device half* y [[buffer(1)]],
                    constant ProbeParams& p [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i < p.n) y[i] = half(x[i]);
}

kernel void half_arithmetic(device const half* a [[buffer(0)]], device const half* b [[buffer(1)]],
                            device half* y [[buffer(2)]], constant ProbeParams& p [[buffer(3)]],
                            uint i [[thread_position_in_grid]]) {
    if (i < p.n) y[4 * i] = a[i] + b[i];
    if (i < p.n) y[4 * i + 1] = a[i] * b[i];
    if (i < p.n) y[4 * i + 2] = a[i] - b[i];
    if (i < p.n) y[4 * i + 3] = a[i] / b[i];
}

// Per lane: simd_sum, simd_max, simd_prefix_exclusive_sum, simd_shuffle_xor(1), simd_broadcast(3),
// simd_shuffle_up(2), simd_shuffle(31 - lane) of x; 7 outputs per thread.
kernel void simd_functions(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           uint i [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]]) {
    const float v = x[i];
    y[7 * i] = simd_sum(v);
    y[7 * i + 1] = simd_max(v);
    y[7 * i + 2] = simd_prefix_exclusive_sum(v);
    y[7 * i + 3] = simd_shuffle_xor(v, ushort(1));
    y[7 * i + 4] = simd_broadcast(v, ushort(3));
    y[7 * i + 5] = simd_shuffle_up(v, ushort(2));
    y[7 * i + 6] = simd_shuffle(v, ushort(31 - lane));
}

// Threads past n return before the simd_sum: the sum covers the live lanes only.
kernel void sum_live_lanes(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           constant ProbeParams& p [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    y[i] = simd_sum(x[i]);
}

// A barrier after some threads returned: on a GPU a hang or undefined; the emulator reports it.
kernel void barrier_after_return(device float* y [[buffer(0)]], constant ProbeParams& p [[buffer(1)]],
                                 uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[i] = 1.0f;
}
