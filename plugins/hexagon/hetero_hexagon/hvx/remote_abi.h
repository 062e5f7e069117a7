/* The FastRPC calling convention as documented in the Hexagon SDK's remote.h, restated for the DSP side of
 * hetero-hexagon: a call carries a 32-bit "scalars" word (method index, counts of input and output buffers) and an
 * array of remote_arg, the input buffers first. On the 32-bit DSP a buffer is a pointer and a 32-bit length. */
#ifndef HETERO_REMOTE_ABI_H
#define HETERO_REMOTE_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *pv;
    size_t nLen;
} remote_buf;

typedef union {
    remote_buf buf;
    uint32_t h;
    uint64_t h64;
} remote_arg;

#define REMOTE_SCALARS_METHOD(sc) (((sc) >> 24) & 0x1f)
#define REMOTE_SCALARS_INBUFS(sc) (((sc) >> 16) & 0xff)
#define REMOTE_SCALARS_OUTBUFS(sc) (((sc) >> 8) & 0xff)
#define REMOTE_SCALARS_MAKE(method, nin, nout) \
    ((((uint32_t)(method) & 0x1f) << 24) | (((uint32_t)(nin) & 0xff) << 16) | (((uint32_t)(nout) & 0xff) << 8))

/* Methods of the hetero_hvx interface. A multi-domain interface reserves 0 (open) and 1 (close); the kernels follow.
 * hetero_hexagon/hvx_ops.py holds the same numbers and the buffers each method takes. */
enum {
    HVX_METHOD_OPEN = 0,
    HVX_METHOD_CLOSE = 1,
    HVX_METHOD_MATVEC_I8 = 2,
    HVX_METHOD_MATVEC_Q4 = 3,
    HVX_METHOD_RMSNORM = 4,
    HVX_METHOD_ROPE = 5,
    HVX_METHOD_MATMUL_Q4 = 6,
};

/* Status codes (0 is success), small enough to be the qemu test program's exit status; the host names them. */
enum { HVX_EBADARGS = 122, HVX_EBADMETHOD = 123 };

int hetero_hvx_skel_handle_invoke(uint64_t handle, uint32_t scalars, remote_arg *args);

#endif
