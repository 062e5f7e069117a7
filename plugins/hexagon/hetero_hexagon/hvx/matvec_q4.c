/* The 4-bit block matrix-vector product with int8 activations. The integer dot product of each 32-element block runs
 * in HVX (nibbles unpacked with a mask and a shift, recentred by 8, vrmpy against the activations); the block
 * scales are applied in scalar float because QEMU does not emulate HVX float (and v68 has no IEEE vector float). */
#include "hvx_kernels.h"
#include "hvx_reduce.h"

typedef union {
    HVX_Vector v;
    int32_t w[32];
} lanes_t;

void hvx_matvec_q4(const uint8_t *w, const float *w_scale, int rows, int cols, const int8_t *xq, const float *x_scale,
                   float *y) {
    const HVX_Vector low_nibbles = Q6_V_vsplat_R(0x0F0F0F0F);
    const HVX_Vector eight = Q6_V_vsplat_R(0x08080808);
    const int nchunks = cols / Q4_CHUNK;
    const int nblocks = cols / Q4_BLOCK;
    const HVX_Vector *xv = (const HVX_Vector *)xq;
    for (int r = 0; r < rows; ++r) {
        const HVX_Vector *wv = (const HVX_Vector *)(w + (long)r * (cols / 2));
        const float *ws = w_scale + (long)r * nblocks;
        float acc = 0.0f;
        for (int c = 0; c < nchunks; ++c) {
            const HVX_Vector packed = wv[c];
            const HVX_Vector lo = Q6_Vb_vsub_VbVb(Q6_V_vand_VV(packed, low_nibbles), eight);
            /* a halfword shift moves each byte's high nibble down; the mask drops the bits of the byte above */
            const HVX_Vector hi =
                Q6_Vb_vsub_VbVb(Q6_V_vand_VV(Q6_Vuh_vlsr_VuhR(packed, 4), low_nibbles), eight);
            lanes_t sums_lo, sums_hi;
            sums_lo.v = hvx_block_sums_w(Q6_Vw_vrmpy_VbVb(lo, xv[2 * c]));
            sums_hi.v = hvx_block_sums_w(Q6_Vw_vrmpy_VbVb(hi, xv[2 * c + 1]));
            const int b0 = c * Q4_BLOCKS_PER_CHUNK;
            for (int k = 0; k < 4; ++k) acc = acc + (float)sums_lo.w[8 * k] * (ws[b0 + k] * x_scale[b0 + k]);
            for (int k = 0; k < 4; ++k)
                acc = acc + (float)sums_hi.w[8 * k] * (ws[b0 + 4 + k] * x_scale[b0 + 4 + k]);
        }
        y[r] = acc;
    }
}
