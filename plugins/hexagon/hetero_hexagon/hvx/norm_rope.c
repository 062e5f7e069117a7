/* RMSNorm and RoPE for the decode step in scalar float: HVX float (qf32) exists only from v68 and is not emulated by
 * QEMU, and both are O(hidden) next to the O(hidden^2) matrix-vector products. No libm on the DSP side of the
 * tests: scalar_math.h has the inverse square root. */
#include "hvx_kernels.h"
#include "scalar_math.h"

void hvx_rmsnorm(const float *x, const float *weight, int n, float eps, float *y) {
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss = ss + x[i] * x[i];
    const float r = inv_sqrt(ss * recip((float)n) + eps);
    for (int i = 0; i < n; ++i) y[i] = x[i] * r * weight[i];
}

void hvx_rope(float *x, const float *cos, const float *sin, int dim) {
    const int half = dim / 2;
    for (int i = 0; i < half; ++i) {
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * cos[i] - x1 * sin[i];
        x[i + half] = x1 * cos[i] + x0 * sin[i];
    }
}
