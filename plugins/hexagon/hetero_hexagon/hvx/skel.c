/* The DSP side of the hetero_hvx FastRPC interface: checks each call's buffers against what its method takes and
 * runs the kernel. The same function serves the qemu test program (qemu_runner.c), so the argument checks that a
 * device relies on are the ones the tests run. */
#include "hvx_kernels.h"
#include "remote_abi.h"

#define MAX_COLS 65536

static int8_t xq_scratch[MAX_COLS] __attribute__((aligned(128)));
static float x_scale_scratch[MAX_COLS / Q4_BLOCK];

/* The method's argument block: int32 values in the first input buffer. */
static int scalar_args(const remote_arg *args, int count, const int32_t **out) {
    if (args[0].buf.nLen != count * sizeof(int32_t)) return 0;
    *out = (const int32_t *)args[0].buf.pv;
    return 1;
}

static int aligned(const remote_arg *a, size_t nbytes) {
    return a->buf.nLen == nbytes && ((uintptr_t)a->buf.pv & (HVX_BYTES - 1)) == 0;
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

/* The decode step's q4 linear layer: quantize the float activations to int8 blocks, then the product. Outputs the
 * quantized activations and their scales too (the tests check them; a device caller may reuse them). */
static int matvec_q4(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 2, &p)) return HVX_EBADARGS;
    const int rows = p[0], cols = p[1];
    if (rows <= 0 || cols <= 0 || cols % Q4_CHUNK || cols > MAX_COLS) return HVX_EBADARGS;
    const int nblocks = cols / Q4_BLOCK;
    if (!aligned(&args[1], (size_t)rows * cols / 2) || args[2].buf.nLen != (size_t)rows * nblocks * 4 ||
        args[3].buf.nLen != cols * 4u || args[4].buf.nLen != (size_t)cols || args[5].buf.nLen != nblocks * 4u ||
        args[6].buf.nLen != rows * 4u)
        return HVX_EBADARGS;
    hvx_quantize_q8(args[3].buf.pv, cols, xq_scratch, x_scale_scratch);
    hvx_matvec_q4(args[1].buf.pv, args[2].buf.pv, rows, cols, xq_scratch, x_scale_scratch, args[6].buf.pv);
    int8_t *xq = args[4].buf.pv;
    float *x_scale = args[5].buf.pv;
    for (int i = 0; i < cols; ++i) xq[i] = xq_scratch[i];
    for (int b = 0; b < nblocks; ++b) x_scale[b] = x_scale_scratch[b];
    return 0;
}

static int rmsnorm(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 2, &p)) return HVX_EBADARGS;
    const int n = p[0];
    union { int32_t i; float f; } eps = {p[1]};
    if (n <= 0 || args[1].buf.nLen != n * 4u || args[2].buf.nLen != n * 4u || args[3].buf.nLen != n * 4u)
        return HVX_EBADARGS;
    hvx_rmsnorm(args[1].buf.pv, args[2].buf.pv, n, eps.f, args[3].buf.pv);
    return 0;
}

static int rope(remote_arg *args) {
    const int32_t *p;
    if (!scalar_args(args, 1, &p)) return HVX_EBADARGS;
    const int dim = p[0];
    if (dim <= 0 || dim % 2 || args[1].buf.nLen != dim * 4u || args[2].buf.nLen != dim / 2 * 4u ||
        args[3].buf.nLen != dim / 2 * 4u || args[4].buf.nLen != dim * 4u)
        return HVX_EBADARGS;
    const float *x = args[1].buf.pv;
    float *y = args[4].buf.pv;
    for (int i = 0; i < dim; ++i) y[i] = x[i];
    hvx_rope(y, args[2].buf.pv, args[3].buf.pv, dim);
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
