// Elementwise kernels: unary math and activations, and broadcasting binary arithmetic, one element per thread.
// Unary op codes: hetero_metal/kernels/elementwise.py (UNARY) keeps the same numbering.

struct UnaryParams {
    uint n;
    uint op;
    float alpha;
    float beta;
};

static inline float unary_op(float x, uint op, float alpha, float beta) {
    switch (op) {
        case 0: return x;
        case 1: return max(x, 0.0f);
        case 2: return x >= 0.0f ? x : alpha * x;                           // leaky_relu
        case 3: return x >= 0.0f ? x : alpha * (exp(x) - 1.0f);              // elu
        case 4: return x > 0.0f ? beta * x : beta * alpha * (exp(x) - 1.0f); // selu (alpha, gamma)
        case 5: return max(x, 0.0f) + min(0.0f, alpha * (exp(x / alpha) - 1.0f)); // celu
        case 6: return 1.0f / (1.0f + exp(-x));                             // sigmoid
        case 7: return clamp(alpha * x + beta, 0.0f, 1.0f);                  // hard_sigmoid
        case 8: return x * clamp(x / 6.0f + 0.5f, 0.0f, 1.0f);               // hard_swish
        case 9: return tanh(x);
        case 10: return x > 20.0f ? x : log(1.0f + exp(x));                  // softplus
        case 11: return x / (1.0f + fabs(x));                                // softsign
        case 12: return exp(x);
        case 13: return log(x);
        case 14: return sqrt(x);
        case 15: return -x;
        case 16: return fabs(x);
        case 17: return 1.0f / x;
        case 19: return floor(x);
        case 20: return ceil(x);
        case 21: return rint(x);
        case 22: return sin(x);
        case 23: return cos(x);
        case 24: return x * tanh(x > 20.0f ? x : log(1.0f + exp(x)));      // mish
        case 25: return clamp(x, alpha, beta);                               // clip
        case 27: return 0.5f * x * (1.0f + tanh(0.7978845608f * (x + 0.044715f * x * x * x)));  // gelu_tanh
        case 28: return x / (1.0f + exp(-x));                               // silu
        case 29: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);           // sign (NaN stays NaN)
        case 30: return x > alpha ? x : 0.0f;                                // thresholded_relu
        case 31: return tan(x);
        default: return NAN;
    }
}

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
