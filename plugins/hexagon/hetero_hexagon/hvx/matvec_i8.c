/* int8 matrix-vector product: vrmpy multiplies 128 byte pairs into 32 int32 lanes per instruction. */
#include "hvx_kernels.h"
#include "hvx_reduce.h"

void hvx_matvec_i8(const int8_t *w, int rows, int cols, const int8_t *x, int32_t *y) {
    const HVX_Vector *xv = (const HVX_Vector *)x;
    const int nvec = cols / HVX_BYTES;
    for (int r = 0; r < rows; ++r) {
        const HVX_Vector *wv = (const HVX_Vector *)(w + (long)r * cols);
        HVX_Vector acc = Q6_V_vzero();
        for (int i = 0; i < nvec; ++i) acc = Q6_Vw_vrmpyacc_VwVbVb(acc, wv[i], xv[i]);
        y[r] = hvx_sum_w(acc);
    }
}
