"""The hetero_hvx interface, host side: each kernel as a FastRPC-shaped call (a method number, input buffers, output
buffer sizes), marshalled the same way for the two transports that carry it: ``hvx_qemu`` (the test program under
qemu-hexagon) and ``fastrpc`` (a real cDSP through libcdsprpc.so). Method numbers and buffer orders match
``hvx/remote_abi.h`` and ``hvx/skel.c``; inputs are expected in the layouts of ``layout.py``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from hetero.contract.errors import BackendError

METHOD_MATVEC_I8, METHOD_MATVEC_Q4, METHOD_RMSNORM, METHOD_ROPE, METHOD_MATMUL_Q4 = 2, 3, 4, 5, 6
MAX_ROWS = 16  # activation rows of one matmul_q4 / rmsnorm call (hvx_kernels.h's Q4_MAX_ROWS)
STATUS_NAMES = {122: "bad arguments (HVX_EBADARGS)", 123: "unknown method (HVX_EBADMETHOD)"}


class Transport(Protocol):
    def invoke(self, method: int, inputs: list[np.ndarray], output_sizes: list[int]) -> list[bytes]:
        """Run one call; raise BackendError naming the status when the DSP side refuses it."""
        ...


def status_error(where: str, method: int, status: int) -> BackendError:
    name = STATUS_NAMES.get(status, f"status {status}")
    return BackendError(f"{where}: hetero_hvx method {method} failed: {name}")


def _args(*values: int) -> np.ndarray:
    return np.array(values, np.int32)


class HvxKernels:
    """The HVX kernels over one transport."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def matvec_i8(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """int32 ``w @ x`` for int8 ``w[rows, cols]``, ``x[cols]``, cols a multiple of 128."""
        rows, cols = w.shape
        (y,) = self.transport.invoke(
            METHOD_MATVEC_I8, [_args(rows, cols), w.astype(np.int8), x.astype(np.int8)], [4 * rows])
        return np.frombuffer(y, np.int32)

    def matvec_q4(
        self, w: np.ndarray, w_scale: np.ndarray, x: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Quantize float ``x`` to int8 blocks of 32, then the q4 product (``layout.repack_q4`` weights):
        returns (xq int8[cols], x scales float32[cols / 32], y float32[rows])."""
        rows, cols = w.shape[0], x.shape[0]
        nblocks = cols // 32
        xq, xs, y = self.transport.invoke(
            METHOD_MATVEC_Q4,
            [_args(rows, cols), w, w_scale.astype(np.float32), x.astype(np.float32)],
            [cols, 4 * nblocks, 4 * rows],
        )
        return np.frombuffer(xq, np.int8), np.frombuffer(xs, np.float32), np.frombuffer(y, np.float32)

    def matmul_q4(
        self, w: np.ndarray, w_scale: np.ndarray, x: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``matvec_q4`` for ``x[m, cols]``, 1 <= m <= MAX_ROWS, in one call that reads the weights once: returns
        (xq int8[m, cols], x scales float32[m, cols / 32], y float32[m, rows]); row j is bit for bit ``matvec_q4``
        of ``x[j]``."""
        rows, (m, cols) = w.shape[0], x.shape
        nblocks = cols // 32
        xq, xs, y = self.transport.invoke(
            METHOD_MATMUL_Q4,
            [_args(rows, cols, m), w, w_scale.astype(np.float32), x.astype(np.float32)],
            [m * cols, 4 * m * nblocks, 4 * m * rows],
        )
        return (np.frombuffer(xq, np.int8).reshape(m, cols), np.frombuffer(xs, np.float32).reshape(m, nblocks),
                np.frombuffer(y, np.float32).reshape(m, rows))

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """RMSNorm of ``x[n]`` or of each row of ``x[m, n]`` (m <= MAX_ROWS) in one call."""
        n = x.shape[-1]
        eps_bits = int(np.float32(eps).view(np.int32))
        (y,) = self.transport.invoke(
            METHOD_RMSNORM, [_args(n, eps_bits), x.astype(np.float32), weight.astype(np.float32)], [4 * x.size])
        return np.frombuffer(y, np.float32).reshape(x.shape)

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate-half RoPE of one head ``x[dim]`` or of each head of ``x[heads, dim]``, with one position's cos / sin
        tables (dim / 2 each)."""
        dim = x.shape[-1]
        (y,) = self.transport.invoke(
            METHOD_ROPE, [_args(dim), x.astype(np.float32), cos.astype(np.float32), sin.astype(np.float32)],
            [4 * x.size])
        return np.frombuffer(y, np.float32).reshape(x.shape)
