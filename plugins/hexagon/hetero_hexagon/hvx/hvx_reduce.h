/* Horizontal sums of int32 lanes, shared by the matrix-vector kernels. */
#ifndef HETERO_HVX_REDUCE_H
#define HETERO_HVX_REDUCE_H

#include <hexagon_protos.h>
#include <hexagon_types.h>
#include <stdint.h>

/* Sum of all 32 int32 lanes. */
static inline int32_t hvx_sum_w(HVX_Vector v) {
    for (int shift = 64; shift >= 4; shift /= 2) v = Q6_Vw_vadd_VwVw(v, Q6_V_vror_VR(v, shift));
    union { HVX_Vector v; int32_t w[32]; } lanes;
    lanes.v = v;
    return lanes.w[0];
}

/* Lane 8k (k = 0..3) becomes the sum of lanes 8k .. 8k + 7: the int32 sum of one 32-byte block. */
static inline HVX_Vector hvx_block_sums_w(HVX_Vector v) {
    for (int shift = 16; shift >= 4; shift /= 2) v = Q6_Vw_vadd_VwVw(v, Q6_V_vror_VR(v, shift));
    return v;
}

#endif
