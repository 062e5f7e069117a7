/* The 4-bit block product with int8 activations, for 1 to Q4_MAX_ROWS activation rows (a decode step, or a block of
 * drafted tokens verified in one pass). The integer dot product of each 32-element block runs
 * in HVX (nibbles unpacked with a mask and a shift, recentred by 8, vrmpy against the activations); the block
 * scales are applied in scalar float because QEMU does not emulate HVX float (and v68 has no IEEE vector float). */
#include "hvx_kernels.h"
#include "hvx_reduce.h"

typedef union {
    HVX_Vector v;
    int32_t w[32];
} lanes_t;

void hvx_matmul_q4(const uint8_t *w, const float *w_scale, int rows, int cols, const int8_t *xq, const float *x_scale,
                   int m, float *y) {
    const HVX_Vector low_nibbles = Q6_V_vsplat_R(0x0F0F0F0F);
    const HVX_Vector eight = Q6_V_vsplat_R(0x08080808);
    const int nchunks = cols / Q4_CHUNK;
    const int nblocks = cols / Q4_BLOCK;
    for (int r = 0; r < rows; ++r) {
        const HVX_Vector *wv = (const HVX_Vector *)(w + (long)r * (cols / 2));
        const float *ws = w_scale + (long)r * nblocks;
        float acc[Q4_MAX_ROWS];
        for (int j = 0; j < m; ++j) acc[j] = 0.0f;
        for (int c = 0; c < nchunks; ++c) {
            /* each weight vector is unpacked once for all m activation rows: the block's weights read once */
            const HVX_Vector packed = wv[c];
            const HVX_Vector lo = Q6_Vb_vsub_VbVb(Q6_V_vand_VV(packed, low_nibbles), eight);
            /* a halfword shift moves each byte's high nibble down; the mask drops the bits of the byte above */
            const HVX_Vector hi =
                Q6_Vb_vsub_VbVb(Q6_V_vand_VV(Q6_Vuh_vlsr_VuhR(packed, 4), low_nibbles), eight);
            const int b0 = c * Q4_BLOCKS_PER_CHUNK;
            for (int j = 0; j < m; ++j) {
                const HVX_Vector *xv = (const HVX_Vector *)(xq + (long)j * cols);
                const float *xs = x_scale + (long)j * nblocks;
                lanes_t sums_lo, sums_hi;
                sums_lo.v = hvx_block_sums_w(Q6_Vw_vrmpy_VbVb(lo, xv[2 * c]));
                sums_hi.v = hvx_block_sums_w(Q6_Vw_vrmpy_VbVb(hi, xv[2 * c + 1]));
                float a = acc[j];
                for (int k = 0; k < 4; ++k) a = a + (float)sums_lo.w[8 * k] * (ws[b0 + k] * xs[b0 + k]);
                for (int k = 0; k < 4; ++k) a = a + (float)sums_hi.w[8 * k] * (ws[b0 + 4 + k] * xs[b0 + 4 + k]);
                acc[j] = a;
            }
        }
        for (int j = 0; j < m; ++j) y[(long)j * rows + r] = acc[j];
    }
}
