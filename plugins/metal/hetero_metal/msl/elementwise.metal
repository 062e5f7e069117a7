// Elementwise kernels: unary math and activations, and broadcasting binary arithmetic, one element per thread.
// unary_op (common.metal) is shared with the matmul epilogue.

struct UnaryParams {
    uint n;
    uint op;
    float alpha;
    float beta;
};

kernel void unary_f32(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      constant UnaryParams& p [[buffer(2)]], uint i [[thread_position_in_grid]]) {
    if (i < p.n) y[i] = unary_op(x[i], p.op, p.alpha, p.beta);
}

// y = a op b with numpy broadcasting. shape[] holds, for rank r: the output dims, then a's and b's element strides
// per output dim (0 where the input broadcasts).
struct BinaryParams {
    uint n;
    uint op;
    uint rank;
};

static inline float binary_op(float a, float b, uint op) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return pow(a, b);
        case 5: return max(a, b);
        case 6: return min(a, b);
        case 7: return a >= 0.0f ? a : a * b;  // PRelu
        default: return NAN;
    }
}

kernel void binary_f32(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                       device float* y [[buffer(2)]], device const uint* shape [[buffer(3)]],
                       constant BinaryParams& p [[buffer(4)]], uint i [[thread_position_in_grid]]) {
    if (i >= p.n) return;
    uint rest = i, ia = 0, ib = 0;
    for (int d = int(p.rank) - 1; d >= 0; --d) {
        const uint dim = shape[d], coord = rest % dim;
        rest /= dim;
        ia += coord * shape[p.rank + uint(d)];
        ib += coord * shape[2 * p.rank + uint(d)];
    }
    y[i] = binary_op(a[ia], b[ib], p.op);
}

// silu(gate) * up (the LLM SwiGLU op).
kernel void swiglu_f32(device const float* gate [[buffer(0)]], device const float* up [[buffer(1)]],
                       device float* y [[buffer(2)]], constant UnaryParams& p [[buffer(3)]],
                       uint i [[thread_position_in_grid]]) {
    if (i < p.n) {
        const float g = gate[i];
        y[i] = g / (1.0f + exp(-g)) * up[i];
    }
}
