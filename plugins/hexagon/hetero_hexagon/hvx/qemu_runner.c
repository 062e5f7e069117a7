/* A freestanding test program for the HVX kernels under qemu-hexagon (there is no Hexagon libc here): it reads one
 * request from stdin, runs one kernel and writes its outputs to stdout, talking to Linux with raw syscalls.
 *
 * Request: eight int32 (magic, op, args[6]), then the op's input arrays, each starting at a 128-byte boundary of the
 * stream. Reply: the op's output arrays back to back. Exit status 0, or 2 for a malformed request.
 * hetero_hexagon.hvx_qemu writes the requests and reads the replies; the op numbers and array orders are shared
 * with it. */
#include "hvx_kernels.h"

enum { SYS_READ = 63, SYS_WRITE = 64, SYS_EXIT_GROUP = 94 };
enum { OP_MATVEC_I8 = 1, OP_MATVEC_Q4 = 2, OP_RMSNORM = 3, OP_ROPE = 4 };
#define MAGIC 0x31585648 /* "HVX1" */
#define IN_BYTES (24 << 20)
#define OUT_BYTES (8 << 20)

static long syscall3(long number, long a, long b, long c) {
    register long r0 __asm__("r0") = a;
    register long r1 __asm__("r1") = b;
    register long r2 __asm__("r2") = c;
    register long r6 __asm__("r6") = number;
    __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
    return r0;
}

static void finish(int status) {
    syscall3(SYS_EXIT_GROUP, status, 0, 0);
    for (;;) {
    }
}

static unsigned char in_buf[IN_BYTES] __attribute__((aligned(128)));
static unsigned char out_buf[OUT_BYTES] __attribute__((aligned(128)));

static long read_all(void) {
    long total = 0;
    for (;;) {
        const long n = syscall3(SYS_READ, 0, (long)(in_buf + total), IN_BYTES - total);
        if (n < 0) finish(2);
        if (n == 0) return total;
        total += n;
        if (total == IN_BYTES) return total;
    }
}

static void write_all(const void *data, long n) {
    const unsigned char *p = data;
    while (n > 0) {
        const long done = syscall3(SYS_WRITE, 1, (long)p, n);
        if (done <= 0) finish(3);
        p += done;
        n -= done;
    }
}

/* Cursor over one stream of 128-byte aligned arrays (the request's inputs, or the reply buffer). */
typedef struct {
    unsigned char *base;
    long at, size;
} cursor_t;

static void *take(cursor_t *c, long nbytes) {
    c->at = (c->at + 127) & ~127L;
    if (nbytes < 0 || c->at + nbytes > c->size) finish(2);
    void *p = c->base + c->at;
    c->at += nbytes;
    return p;
}

void _start(void) {
    const long got = read_all();
    cursor_t in = {in_buf, 0, got};
    const int32_t *head = take(&in, 8 * sizeof(int32_t));
    if (head[0] != MAGIC) finish(2);
    const int32_t *args = head + 2;
    cursor_t out = {out_buf, 0, OUT_BYTES};
    void *reply = out_buf;
    long reply_bytes = 0;
    switch (head[1]) {
    case OP_MATVEC_I8: {
        const int rows = args[0], cols = args[1];
        if (rows <= 0 || cols <= 0 || cols % HVX_BYTES) finish(2);
        const int8_t *w = take(&in, (long)rows * cols);
        const int8_t *x = take(&in, cols);
        int32_t *y = take(&out, rows * 4L);
        hvx_matvec_i8(w, rows, cols, x, y);
        reply_bytes = rows * 4L;
        break;
    }
    case OP_MATVEC_Q4: {
        /* quantize the float activations, then the product: the decode step's whole q4 linear layer */
        const int rows = args[0], cols = args[1];
        if (rows <= 0 || cols <= 0 || cols % Q4_CHUNK) finish(2);
        const int nblocks = cols / Q4_BLOCK;
        const uint8_t *w = take(&in, (long)rows * cols / 2);
        const float *w_scale = take(&in, (long)rows * nblocks * 4);
        const float *x = take(&in, cols * 4L);
        /* reply: xq (cols int8), x_scale (nblocks float), y (rows float), packed without padding */
        int8_t *xq = take(&out, cols);
        float *x_scale = take(&out, nblocks * 4L);
        float *y = take(&out, rows * 4L);
        hvx_quantize_q8(x, cols, xq, x_scale);
        hvx_matvec_q4(w, w_scale, rows, cols, xq, x_scale, y);
        write_all(xq, cols);
        write_all(x_scale, nblocks * 4L);
        reply = y;
        reply_bytes = rows * 4L;
        break;
    }
    case OP_RMSNORM: {
        const int n = args[0];
        union { int32_t i; float f; } eps = {args[1]};
        if (n <= 0) finish(2);
        const float *x = take(&in, n * 4L);
        const float *weight = take(&in, n * 4L);
        float *y = take(&out, n * 4L);
        hvx_rmsnorm(x, weight, n, eps.f, y);
        reply_bytes = n * 4L;
        break;
    }
    case OP_ROPE: {
        const int dim = args[0];
        if (dim <= 0 || dim % 2) finish(2);
        float *x = take(&in, dim * 4L);
        const float *cos = take(&in, dim / 2 * 4L);
        const float *sin = take(&in, dim / 2 * 4L);
        hvx_rope(x, cos, sin, dim);
        reply = x;
        reply_bytes = dim * 4L;
        break;
    }
    default:
        finish(2);
    }
    write_all(reply, reply_bytes);
    finish(0);
}
