/* The HVX decode kernels of hetero-hexagon (128-byte vectors, integer HVX; scalar float where a float is needed).
 *
 * Every vector argument is 128-byte aligned and its length a whole number of vectors (the host pads at load):
 *   int8 matrix-vector:  cols % 128 == 0
 *   q4 product:          cols % 256 == 0, weights in the HVX q4 layout (hetero_hexagon.layout.repack_q4)
 * Floats are computed in a fixed order with no contraction (-ffp-contract=off) so that a numpy float32 loop in the
 * same order gives the same bits. */
#ifndef HETERO_HVX_KERNELS_H
#define HETERO_HVX_KERNELS_H

#include <stdint.h>

#define HVX_BYTES 128
#define Q4_BLOCK 32                    /* elements per scale: GGUF Q4_0 / hetero q4 block size 32 */
#define Q4_CHUNK (2 * HVX_BYTES)       /* elements per vector of packed nibbles */
#define Q4_BLOCKS_PER_CHUNK (Q4_CHUNK / Q4_BLOCK)

/* y[r] = sum_c w[r, c] * x[c], exact in int32. */
void hvx_matvec_i8(const int8_t *w, int rows, int cols, const int8_t *x, int32_t *y);

#define Q4_MAX_ROWS 16                 /* activation rows of one hvx_matmul_q4 call */

/* The 4-bit block product with int8 activations, m (1..Q4_MAX_ROWS) activation rows against the same weights. Per
 * weight row, each chunk of 256 elements is 128 bytes: byte i holds element i in its low nibble and element 128 + i
 * in its high nibble; a nibble q means (q - 8). w_scale[r, b] is the float scale of block b (32 elements) of row r;
 * xq[j, :] / x_scale[j, b] activation row j and its block scales (hvx_quantize_q8).
 * y[j, r] = sum_b float(isum[j, r, b]) * (w_scale[r, b] * x_scale[j, b]), summed in block order: row j's result
 * does not depend on m or on the other rows. */
void hvx_matmul_q4(const uint8_t *w, const float *w_scale, int rows, int cols, const int8_t *xq, const float *x_scale,
                   int m, float *y);

/* Per 32-element block: d = max|x| * (1/127 as a float), q = x * recip(d) rounded half away from zero (0 where d
 * is 0); recip is scalar_math.h's. */
void hvx_quantize_q8(const float *x, int n, int8_t *q, float *scale);

/* y = x * inv_sqrt(sum(x^2) * recip(n) + eps) * weight (scalar_math.h), the sum in index order. */
void hvx_rmsnorm(const float *x, const float *weight, int n, float eps, float *y);

/* Rotary embedding of one head of `dim` (even) elements, rotate-half form (Qwen / NeoX): pairs (i, i + dim / 2)
 * turned by cos[i], sin[i] of this position (the host precomputes the table). In place. */
void hvx_rope(float *x, const float *cos, const float *sin, int dim);

#endif
