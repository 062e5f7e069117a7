/* Activation quantization to int8 blocks of 32 (GGUF Q8_0's rule), scalar: it runs once per token per matrix-vector
 * product and is small next to the weights' traffic. */
#include "hvx_kernels.h"
#include "scalar_math.h"

void hvx_quantize_q8(const float *x, int n, int8_t *q, float *scale) {
    for (int b = 0; b < n / Q4_BLOCK; ++b) {
        const float *xb = x + b * Q4_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < Q4_BLOCK; ++i) {
            const float a = xb[i] < 0.0f ? -xb[i] : xb[i];
            if (a > amax) amax = a;
        }
        const float d = amax * (1.0f / 127.0f);
        const float inv = d != 0.0f ? recip(d) : 0.0f;
        for (int i = 0; i < Q4_BLOCK; ++i) {
            const float v = xb[i] * inv;
            q[b * Q4_BLOCK + i] = (int8_t)(int)(v < 0.0f ? v - 0.5f : v + 0.5f);
        }
        scale[b] = d;
    }
}
