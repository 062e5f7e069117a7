/* A freestanding test program for the HVX kernels under qemu-hexagon (there is no Hexagon libc here): it reads one
 * FastRPC-shaped call from stdin, passes it to the DSP-side dispatcher (skel.c) exactly as the FastRPC driver
 * would, and writes the output buffers to stdout. It talks to Linux with raw syscalls.
 *
 * Request: int32 magic, method, nin, nout, then nin + nout int32 buffer lengths, then the input buffers, each starting
 * at a 128-byte boundary of the stream. Reply: the output buffers back to back. Exit status: the dispatcher's
 * status (0 on success), or 2 for a malformed request. hetero_hexagon/hvx_qemu.py writes the requests. */
#include "remote_abi.h"

enum { SYS_READ = 63, SYS_WRITE = 64, SYS_EXIT_GROUP = 94 };
#define MAGIC 0x31585648 /* "HVX1" */
#define MAX_BUFFERS 16
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
    while (total < IN_BYTES) {
        const long n = syscall3(SYS_READ, 0, (long)(in_buf + total), IN_BYTES - total);
        if (n < 0) finish(2);
        if (n == 0) break;
        total += n;
    }
    return total;
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

/* The next 128-byte aligned block of nbytes in a stream of size bytes. */
static void *take(unsigned char *base, long *at, long size, long nbytes) {
    *at = (*at + 127) & ~127L;
    if (nbytes < 0 || *at + nbytes > size) finish(2);
    void *p = base + *at;
    *at += nbytes;
    return p;
}

void _start(void) {
    const long got = read_all();
    long in_at = 0, out_at = 0;
    const int32_t *head = take(in_buf, &in_at, got, 4 * sizeof(int32_t));
    const int method = head[1], nin = head[2], nout = head[3];
    if (head[0] != MAGIC || nin < 0 || nout < 0 || nin + nout > MAX_BUFFERS) finish(2);
    const int32_t *lengths = (const int32_t *)(in_buf + in_at);
    in_at += (nin + nout) * (long)sizeof(int32_t);
    if (in_at > got) finish(2);
    remote_arg args[MAX_BUFFERS];
    for (int i = 0; i < nin + nout; ++i) {
        const int is_input = i < nin;
        args[i].buf.nLen = lengths[i];
        args[i].buf.pv = is_input ? take(in_buf, &in_at, got, lengths[i]) : take(out_buf, &out_at, OUT_BYTES, lengths[i]);
    }
    const int status = hetero_hvx_skel_handle_invoke(0, REMOTE_SCALARS_MAKE(method, nin, nout), args);
    if (status != 0) finish(status);
    for (int i = nin; i < nin + nout; ++i) write_all(args[i].buf.pv, args[i].buf.nLen);
    finish(0);
}
