/* The DSP side of the hetero_hvx FastRPC interface: checks each call's buffers against what its method takes and
 * runs the kernel. The same function serves the qemu test program (qemu_runner.c), so the argument checks that a
 * device relies on are the ones the tests run. */
#include "hvx_kernels.h"
#include "remote_abi.h"

#define MAX_COLS 65536
#define MAX_ACTIVATIONS (4 * MAX_COLS) /* the int8 activations of one q4 call: m rows x cols */

static int8_t xq_scratch[MAX_ACTIVATIONS] __attribute__((aligned(128)));
static float x_scale_scratch[MAX_ACTIVATIONS / Q4_BLOCK];

/* The method's argument block: int32 values in the first input buffer. */
static int scalar_args(const remote_arg *args, int count, const int32_t **out) {
    if (args[0].buf.nLen != count * sizeof(int32_t)) return 0;
    *out = (const int32_t *)args[0].buf.pv;
    return 1;
}

static int aligned(const remote_arg *a, size_t nbytes) {
    return a->buf.nLen == nbytes && ((uintptr_t)a->buf.pv & (HVX_BYTES - 1)) == 0;
}

/* A float buffer of a whole number (1..max) of n-float rows: the count, or 0 when it is not one. (By multiplying: the
 * freestanding test program links no runtime library for integer division.) */
static int float_rows(const remote_arg *a, int n, int max) {
    if (n <= 0) return 0;
    for (int count = 1; count <= max; ++count)
        if (a->buf.nLen == (size_t)count * n * 4u) return count;
    return 0;
}

static int matvec_i8(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 2, &p)) return HVX_EBADARGS;
    const int rows = p[0], cols = p[1];
    if (rows <= 0 || cols <= 0 || cols % HVX_BYTES) return HVX_EBADARGS;
    if (!aligned(&args[1], (size_t)rows * cols) || !aligned(&args[2], cols) || args[3].buf.nLen != rows * 4u)
        return HVX_EBADARGS;
    hvx_matvec_i8(args[1].buf.pv, rows, cols, args[2].buf.pv, args[3].buf.pv);
    return 0;
}

/* A q4 linear layer over m activation rows: quantize the float activations to int8 blocks, then the product, the
 * weights read once for all rows. Outputs the quantized activations and their scales too (the tests check them; a
 * device caller may reuse them). */
static int q4_product(remote_arg *args, int rows, int cols, int m) {
    if (rows <= 0 || cols <= 0 || cols % Q4_CHUNK || cols > MAX_COLS || m <= 0 || m > Q4_MAX_ROWS ||
        (long)m * cols > MAX_ACTIVATIONS)
        return HVX_EBADARGS;
    const int nblocks = cols / Q4_BLOCK;
    if (!aligned(&args[1], (size_t)rows * cols / 2) || args[2].buf.nLen != (size_t)rows * nblocks * 4 ||
        args[3].buf.nLen != (size_t)m * cols * 4 || args[4].buf.nLen != (size_t)m * cols ||
        args[5].buf.nLen != (size_t)m * nblocks * 4 || args[6].buf.nLen != (size_t)m * rows * 4)
        return HVX_EBADARGS;
    const float *x = args[3].buf.pv;
    for (int j = 0; j < m; ++j)
        hvx_quantize_q8(x + (long)j * cols, cols, xq_scratch + (long)j * cols, x_scale_scratch + (long)j * nblocks);
    hvx_matmul_q4(args[1].buf.pv, args[2].buf.pv, rows, cols, xq_scratch, x_scale_scratch, m, args[6].buf.pv);
    int8_t *xq = args[4].buf.pv;
    float *x_scale = args[5].buf.pv;
    for (long i = 0; i < (long)m * cols; ++i) xq[i] = xq_scratch[i];
    for (long b = 0; b < (long)m * nblocks; ++b) x_scale[b] = x_scale_scratch[b];
    return 0;
}

/* The decode step's q4 linear layer: one activation row. */
static int matvec_q4(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 2, &p)) return HVX_EBADARGS;
    return q4_product(args, p[0], p[1], 1);
}

/* m activation rows (a block of drafted tokens verified in one pass). */
static int matmul_q4(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 3, &p)) return HVX_EBADARGS;
    return q4_product(args, p[0], p[1], p[2]);
}

/* RMSNorm of each of the rows of x (one or a block of tokens). */
static int rmsnorm(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 2, &p)) return HVX_EBADARGS;
    const int n = p[0];
    union { int32_t i; float f; } eps = {p[1]};
    const int m = float_rows(&args[1], n, Q4_MAX_ROWS);
    if (m == 0 || args[2].buf.nLen != n * 4u || args[3].buf.nLen != args[1].buf.nLen) return HVX_EBADARGS;
    const float *x = args[1].buf.pv;
    float *y = args[3].buf.pv;
    for (int j = 0; j < m; ++j) hvx_rmsnorm(x + (long)j * n, args[2].buf.pv, n, eps.f, y + (long)j * n);
    return 0;
}

/* RoPE of each head in x (the heads of one position: one cos / sin table). */
static int rope(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 1, &p)) return HVX_EBADARGS;
    const int dim = p[0];
    const int heads = float_rows(&args[1], dim, 256);
    if (heads == 0 || dim % 2 || args[2].buf.nLen != dim / 2 * 4u || args[3].buf.nLen != dim / 2 * 4u ||
        args[4].buf.nLen != args[1].buf.nLen)
        return HVX_EBADARGS;
    const float *x = args[1].buf.pv;
    float *y = args[4].buf.pv;
    for (long i = 0; i < (long)heads * dim; ++i) y[i] = x[i];
    for (int h = 0; h < heads; ++h) hvx_rope(y + (long)h * dim, args[2].buf.pv, args[3].buf.pv, dim);
    return 0;
}

typedef struct {
    int nin, nout;
    int (*run)(remote_arg *);
} method_t;

static const method_t METHODS[] = {
    [HVX_METHOD_MATVEC_I8] = {3, 1, matvec_i8},
    [HVX_METHOD_MATVEC_Q4] = {4, 3, matvec_q4},
    [HVX_METHOD_RMSNORM] = {3, 1, rmsnorm},
    [HVX_METHOD_ROPE] = {4, 1, rope},
    [HVX_METHOD_MATMUL_Q4] = {4, 3, matmul_q4},
};

int hetero_hvx_skel_handle_invoke(uint64_t handle, uint32_t scalars, remote_arg *args) {
    (void)handle;
    const uint32_t method = REMOTE_SCALARS_METHOD(scalars);
    if (method == HVX_METHOD_OPEN || method == HVX_METHOD_CLOSE) return 0; /* no per-handle state */
    if (method >= sizeof(METHODS) / sizeof(METHODS[0]) || METHODS[method].run == 0) return HVX_EBADMETHOD;
    const method_t *m = &METHODS[method];
    if ((int)REMOTE_SCALARS_INBUFS(scalars) != m->nin || (int)REMOTE_SCALARS_OUTBUFS(scalars) != m->nout)
        return HVX_EBADARGS;
    return m->run(args);
}
