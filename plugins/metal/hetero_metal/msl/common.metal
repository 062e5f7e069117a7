// Shared by every kernel family of hetero-metal: prepended to each family's source for Apple's compiler, included
// before it by the emulator's bindings (which compile it as C++ against src/emu/msl_emu.hpp).
//
// Threadgroup memory is declared with TG_ARRAY (in a kernel's body) and passed to helpers as TG_PTR: plain
// `threadgroup` arrays for Apple's compiler, race-checked arrays for the emulator.
#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
#define TG_ARRAY(T, name, count) threadgroup T name[count]
#define TG_PTR(T) threadgroup T*
#else
#define TG_ARRAY(T, name, count) emu::TgPtr<T> name = emu::threadgroup_array<T>(count)
#define TG_PTR(T) emu::TgPtr<T>
#endif

#define SIMD_WIDTH 32u

// A signed byte from its unsigned storage (MSL's char is signed; the C++ one need not be).
static inline int s8(uchar b) { return int(b) - ((int(b) & 0x80) << 1); }

// The f16 at byte offset `at` of a quantised weight row (block headers are 2-byte aligned).
static inline float f16_at(device const uchar* p, uint at) { return float(*(device const half*)(p + at)); }

// Unary math and activations by code (hetero_metal/kernels/elementwise.py UNARY keeps the numbering): the unary
// kernel and the fused activations of the matmul epilogue.
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
        case 32: return isnan(x) ? x : max(x >= 0.0f ? x : alpha * x, beta);  // leaky_relu_min
        default: return NAN;
    }
}

// Every thread gets the sum (or max) of `v` over the threadgroup. `partials` holds one float per simdgroup.
static inline float threadgroup_reduce(float v, bool is_max, TG_PTR(float) partials, uint lane, uint simd,
                                       uint simdgroups) {
    v = is_max ? simd_max(v) : simd_sum(v);
    if (lane == 0) partials[simd] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = partials[0];
    for (uint s = 1; s < simdgroups; ++s) total = is_max ? max(total, float(partials[s])) : total + partials[s];
    threadgroup_barrier(mem_flags::mem_threadgroup);  // the partials are written again by the next reduction
    return total;
}
