/* Scalar float helpers without libm or a divide instruction (Hexagon has neither in a freestanding build: clang
 * lowers `/` on float to a runtime-library call). Newton's iterations from a bit-level first guess, in a fixed order
 * that hetero_hexagon.hvx_reference repeats in numpy float32. */
#ifndef HETERO_HVX_SCALAR_MATH_H
#define HETERO_HVX_SCALAR_MATH_H

#include <stdint.h>

typedef union {
    float f;
    uint32_t u;
} float_bits_t;

/* 1 / a for a > 0 (normal), within 1 ulp after three steps. */
static inline float recip(float a) {
    float_bits_t g = {a};
    g.u = 0x7EF311C3u - g.u;
    float r = g.f;
    for (int i = 0; i < 3; ++i) r = r * (2.0f - a * r);
    return r;
}

/* 1 / sqrt(a) for a > 0 (normal), within 2 ulp after four steps. */
static inline float inv_sqrt(float a) {
    float_bits_t g = {a};
    g.u = 0x5F375A86u - (g.u >> 1);
    float r = g.f;
    for (int i = 0; i < 4; ++i) r = r * (1.5f - 0.5f * a * r * r);
    return r;
}

#endif
